#!/bin/bash
# Runs the citation and link check of the docs with Debian's python3 (doc_links_test.py).
exec /usr/bin/python3 tests/docs/doc_links_test.py
