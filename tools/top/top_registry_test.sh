#!/bin/bash
# Runs the registry test of `kvrail top` with Debian's python3.
exec /usr/bin/python3 tools/top/top_registry_test.py
