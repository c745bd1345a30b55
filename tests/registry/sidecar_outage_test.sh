#!/bin/bash
# kvrail sidecar --registry with etcd killed mid-run, with Debian's python3.
exec /usr/bin/python3 tests/registry/sidecar_outage_test.py
