#!/bin/bash
# pip install ./python into a temporary virtual environment, with Debian's python3.
exec /usr/bin/python3 tests/python/python_package_test.py
