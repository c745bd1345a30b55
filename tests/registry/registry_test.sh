#!/bin/bash
# The registry's end-to-end test with Debian's python3 (python3-zmq, python3-protobuf).
exec /usr/bin/python3 tests/registry/registry_test.py
