#!/bin/bash
# kvrail bootstrap --registry with etcd lost mid-run, with Debian's python3.
exec /usr/bin/python3 tests/registry/bootstrap_outage_test.py
