#!/bin/bash
# Runs the Python engine client test with Debian's python3 (python3-zmq, python3-protobuf).
exec /usr/bin/python3 tests/python/engine_client_test.py
