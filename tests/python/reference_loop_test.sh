#!/bin/bash
# Runs the reference engine loop end to end with Debian's python3.
exec /usr/bin/python3 tests/python/reference_loop_test.py
