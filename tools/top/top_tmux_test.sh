#!/bin/bash
# Runs the tmux test of `kvrail top` with Debian's python3.
exec /usr/bin/python3 tools/top/top_tmux_test.py
