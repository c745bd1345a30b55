#!/bin/bash
# Runs the tokenspeed connector's unit tests with Debian's python3.
exec /usr/bin/python3 tests/tokenspeed/connector_test.py
