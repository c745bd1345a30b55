#!/bin/bash
# Runs the client's room ledger test with Debian's python3.
exec /usr/bin/python3 tests/python/liveness_test.py
