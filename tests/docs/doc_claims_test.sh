#!/bin/bash
# Runs the check of the docs' paths, commands, flags and defaults (doc_claims_test.py) with
# Debian's python3, against the kvrail binary built for this test.
KVRAIL_BIN="$PWD/tools/kvrail" exec /usr/bin/python3 tests/docs/doc_claims_test.py
