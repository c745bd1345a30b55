#!/bin/bash
# Runs the --advertise-host end-to-end test with Debian's python3 (python3-zmq, python3-protobuf).
exec /usr/bin/python3 tests/python/advertise_host_test.py
