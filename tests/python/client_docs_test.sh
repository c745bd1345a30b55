#!/bin/bash
# Runs the client-against-the-docs test with Debian's python3 (python3-zmq, python3-protobuf).
exec /usr/bin/python3 tests/python/client_docs_test.py
