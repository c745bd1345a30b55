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

# A page-sharded prefill group (CACHEPD §12.8), read from the contract's shard_count: the
# worked example of docs/owner-filters.md.
sharded=$("$kvrail" plan --prefill-contract "$ex/dcp_prefill_tp4.json" \
  --decode-contract "$ex/dcp_decode.json" --prefill-tp 4 --decode-tp 2)
expect sharded-targets grep -q "decode rank 0: targets \[0,1\]  expected \[0,1\]  dummies \[\]" <<<"$sharded"
expect sharded-targets-1 grep -q "decode rank 1: targets \[2,3\]  expected \[2,3\]  dummies \[\]" <<<"$sharded"
expect sharded-filter grep -q \
  "owner filter: group history, owner 1 of 2: virtual ids v with (v - 1) % 2 == 1" <<<"$sharded"
sharded_room=$("$kvrail" plan --prefill-contract "$ex/dcp_prefill_tp4.json" \
  --decode-contract "$ex/dcp_decode.json" --prefill-tp 4 --decode-tp 2 \
  --prefill-manifest "$ex/dcp_prefill_manifest.json" \
  --decode-manifest "$ex/dcp_decode_manifest.json" --json)
expect sharded-room python3 - "$sharded_room" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["sharded_group_ids"] == ["history"]
src = r["decode_ranks"][0]["fragments_by_prefill_rank"][1]
assert src["owner_filters"] == {"history": {"owner_rank": 1, "owner_count": 2}}
# Owners 0 and 1 each send 2 of the 4 blocks of each of the 2 fields to each decode rank.
pairs = r["room_copies"]
assert [(p["prefill_tp_rank"], p["decode_tp_rank"]) for p in pairs] == [(0, 0), (1, 0), (2, 1), (3, 1)]
for p in pairs:
    assert p["bytes"] == 2 * 2 * 20, p
PY

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
