#!/usr/bin/env bash
# `kvrail plan` end to end on the examples: the table, --json in planner.json's `result`
# schema, a room's copies, owner filters, and one-line errors with exit 1.
set -u
kvrail="tools/kvrail"
ex="examples"
fail=0
expect() {  # expect NAME CONDITION-COMMAND...
  local name=$1
  shift
  if ! "$@"; then echo "FAIL $name"; fail=1; fi
}
out=$("$kvrail" plan --prefill-contract "$ex/prefill_contract.json" \
  --decode-contract "$ex/decode_contract_tp1.json" --prefill-tp 2 --decode-tp 1)
expect table-route grep -q "decode rank 0: targets \[0,1\]  expected \[0,1\]  dummies \[\]" <<<"$out"
expect table-registrations grep -q "registrations" <<<"$out"

json=$("$kvrail" plan --prefill-contract "$ex/gqa_prefill_tp8.json" \
  --decode-contract "$ex/gqa_decode_tp2.json" --prefill-tp 8 --decode-tp 2 --json)
expect json-schema python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["ok"] is True
assert [d["dummy_tp_ranks"] for d in r["decode_ranks"]] == [[1, 3, 5, 7], []]
assert len(r["prefill_registrations"]) == 16
assert r["required_counts"]["completions_per_room_by_decode_rank"] == [2, 2]
PY

sharded=$("$kvrail" plan --prefill-contract "$ex/gqa_prefill_tp8.json" \
  --decode-contract "$ex/gqa_decode_tp2.json" --prefill-tp 8 --decode-tp 2 \
  --sharded-group full_attention:2)
expect sharded-targets grep -q "decode rank 0: targets \[0,1,2,3\]  expected \[0,1,2,3\]" <<<"$sharded"
expect sharded-filter grep -q "owner filter: group full_attention, slots s with s % 2 == 1" <<<"$sharded"

room=$("$kvrail" plan --prefill-contract "$ex/prefill_contract.json" \
  --decode-contract "$ex/decode_contract_tp1.json" --prefill-tp 2 --decode-tp 1 \
  --prefill-manifest "$ex/manifest.json" --decode-manifest "$ex/manifest.json" --json)
expect room-copies python3 - "$room" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
pairs = r["room_copies"]
assert [(p["prefill_tp_rank"], p["decode_tp_rank"]) for p in pairs] == [(0, 0), (1, 0)]
for p in pairs:
    assert p["copies_after_coalescing"] <= p["copies_before_coalescing"]
    assert sum(c[2] for c in p["copies"]) == p["bytes"]
PY

err=$("$kvrail" plan --prefill-contract "$ex/prefill_contract.json" \
  --decode-contract "$ex/decode_contract_tp1.json" --prefill-tp 3 --decode-tp 1 2>&1 >/dev/null)
rc=$?
expect error-exit test "$rc" -eq 1
expect error-line grep -qx "error: unsupported-layout: .*" <<<"$err"
expect error-one-line test "$(wc -l <<<"$err")" -eq 1
exit $fail
