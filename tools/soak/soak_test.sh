#!/bin/bash
# `kvrail soak` for two minutes, every fault kind: every check must hold. The seed is drawn and
# printed, so a failure replays with --seed; each process's stderr is kept in the test's outputs
# (bazel-testlogs/tools/soak/soak_test/test.outputs). KVRAIL_SOAK_DURATION and
# KVRAIL_SOAK_FAULTS (--test_env) override the duration and the fault kinds.
set -euo pipefail
logs="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}/soak"
exec tools/kvrail soak --duration "${KVRAIL_SOAK_DURATION:-2m}" --epoch 40s \
  --faults "${KVRAIL_SOAK_FAULTS:-prefill-aborts,decode-aborts,engine-restarts,sidecar-kills}" \
  --log-dir "$logs"
