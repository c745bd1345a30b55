#!/bin/bash
# `kvrail soak` for two minutes (KVRAIL_SOAK_DURATION overrides): every check must hold. The
# seed is drawn and printed, so a failure replays with --seed. Logs go to the test's outputs.
set -euo pipefail
kvrail="tools/kvrail"
logs="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}/soak"
exec "$kvrail" soak --duration "${KVRAIL_SOAK_DURATION:-2m}" --epoch 40s --log-dir "$logs"
