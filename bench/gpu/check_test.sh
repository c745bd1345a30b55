#!/usr/bin/env bash
# bench/gpu/check without a GPU run: `--dry-run` builds gpu_check with nvcc and runs its first
# step, which must either pass (a GPU is present) or say "no GPU: ..." in one line and exit 2;
# the report lands in $OUT/gpu_check.txt; a bad flag is refused with exit 3. Passes, saying so,
# where no CUDA toolkit is installed: there is nothing to build.
set -u
source tests/support/cli_checks.sh  # expect
if ! command -v nvcc >/dev/null && [[ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
  echo "no CUDA toolkit (nvcc): nothing to check"
  exit 0
fi
export TMPDIR="${TEST_TMPDIR:-/tmp}"
out="$TMPDIR/out"

output="$(OUT="$out" bash bench/gpu/check --dry-run 2>&1)"
rc=$?
echo "$output"
expect "dry run exits 0" test "$rc" -eq 0
expect "dry run says ok" grep -q '^dry run: ok (' <<<"$output"
expect "the report holds the table" grep -q '^dry run: ok (' "$out/gpu_check.txt"
if grep -q '^no GPU' <<<"$output"; then
  # Exactly one line from the binary, between the step's title and the verdict.
  expect "one no-GPU line" test "$(grep -c '^no GPU: cudaGetDeviceCount ' <<<"$output")" -eq 1
fi

bash bench/gpu/check --bogus >/dev/null 2>&1
expect "a bad flag exits 3" test $? -eq 3
exit $fail
