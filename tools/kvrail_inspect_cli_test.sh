#!/usr/bin/env bash
# `kvrail inspect` end to end: JSON on stdout and exit 0 for good input; exactly one line
# "error: <category>: ..." on stderr and exit 1 for bad input.
set -u
kvrail="tools/kvrail"
examples="examples"
fail=0
check() {  # check NAME EXPECTED_RC EXPECTED_STDERR_PREFIX -- command...
  local name=$1 want_rc=$2 want_err=$3
  shift 4
  local out err rc
  out=$(mktemp) err=$(mktemp)
  "$@" >"$out" 2>"$err"
  rc=$?
  if [[ $rc -ne $want_rc ]]; then
    echo "FAIL $name: exit $rc, want $want_rc"; cat "$err"; fail=1
  elif [[ $want_err == "-" ]]; then
    :  # only the exit code matters
  elif [[ -n $want_err ]]; then
    if [[ $(wc -l <"$err") -ne 1 ]] || ! grep -q "^$want_err" "$err"; then
      echo "FAIL $name: stderr is not one '$want_err' line:"; cat "$err"; fail=1
    fi
  elif ! python3 -c 'import json,sys; json.loads(open(sys.argv[1]).read())' "$out" 2>/dev/null; then
    echo "FAIL $name: stdout is not JSON:"; head -c 400 "$out"; fail=1
  fi
  rm -f "$out" "$err"
}
check contract 0 "" -- "$kvrail" inspect contract <"$examples/prefill_contract.json"
# Both CachePD revisions (CACHEPD §12.1): a contract printed in the other form reads back, and a
# form that cannot carry it is refused in one line.
check contract-as-snapshot 0 "" -- "$kvrail" inspect contract --as snapshot <"$examples/prefill_contract.json"
check contract-as-2026-09 0 "" -- "$kvrail" inspect contract --as 2026-09 <"$examples/prefill_contract.json"
if ! "$kvrail" inspect contract --as 2026-09 <"$examples/prefill_contract.json" | grep -q '"replayable":false'; then
  echo "FAIL contract-as-2026-09: no replayable member"; fail=1
fi
if "$kvrail" inspect contract --as snapshot <"$examples/prefill_contract.json" | grep -q 'replayable'; then
  echo "FAIL contract-as-snapshot: a replayable member"; fail=1
fi
check sharded-as-snapshot 1 "error: invalid-contract: " -- "$kvrail" inspect contract --as snapshot <"$examples/dcp_prefill_tp4.json"
check contract-peer 0 "" -- "$kvrail" inspect contract --peer "$examples/decode_contract_tp1.json" <"$examples/prefill_contract.json"
check manifest 0 "" -- "$kvrail" inspect manifest --contract "$examples/prefill_contract.json" <"$examples/manifest.json"
check registration 0 "" -- "$kvrail" inspect registration <"$examples/registration.hex"
check preallocation 0 "" -- "$kvrail" inspect preallocation <"$examples/preallocation.hex"
check status 0 "" -- "$kvrail" inspect status <"$examples/status.hex"
check status-args 0 "" -- "$kvrail" inspect status 3432 35 31 313030 ""
check bad-contract 1 "error: invalid-contract: " -- "$kvrail" inspect contract <<<'{"plan":1}'
check bad-manifest 1 "error: invalid-manifest: " -- "$kvrail" inspect manifest <<<'[1]'
check bad-frame 1 "error: invalid-frame: " -- "$kvrail" inspect status 3432 35
check bad-hex 1 "error: invalid-frame: " -- "$kvrail" inspect registration <<<'xyz'
check peer-mismatch 1 "error: incompatible-peer: " -- "$kvrail" inspect contract --peer "$examples/prefill_contract_granularity4.json" <"$examples/prefill_contract.json"
check usage 2 "-" -- "$kvrail" inspect nothing
exit $fail
