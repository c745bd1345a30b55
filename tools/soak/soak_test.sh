#!/bin/bash
# `kvrail soak` for two minutes: every check must hold. The seed is drawn and printed, so a
# failure replays with --seed; each process's stderr is kept in the test's outputs
# (bazel-testlogs/tools/soak/soak_test/test.outputs). KVRAIL_SOAK_DURATION and
# KVRAIL_SOAK_FAULTS (--test_env) override the duration and the fault kinds.
#
# Every fault kind (the soak's default): aborts by either engine, engine restarts and prefill
# sidecar kills (docs/RELIABILITY.md, "Soak").
set -euo pipefail
# The ASan pass runs it with the ASan-built kvrail: its processes free straight back to their
# allocator (no quarantine, 256 MiB by default, which would grow RssAnon whatever kvrail does,
# past the soak's --rss-slack). Nothing changes for a build without ASan.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
logs="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}/soak"
exec tools/kvrail soak --duration "${KVRAIL_SOAK_DURATION:-2m}" --epoch 40s \
  ${KVRAIL_SOAK_FAULTS:+--faults "$KVRAIL_SOAK_FAULTS"} --log-dir "$logs"
