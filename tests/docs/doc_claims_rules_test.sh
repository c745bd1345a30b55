#!/bin/bash
# Runs the unit tests of doc_claims_test.py's rules (doc_claims_rules_test.py) with Debian's python3.
exec /usr/bin/python3 tests/docs/doc_claims_rules_test.py
