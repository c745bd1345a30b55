#!/bin/bash
# Runs the tokenspeed end-to-end test with Debian's python3 (its torch: python3-torch).
exec /usr/bin/python3 tests/tokenspeed/e2e_test.py
