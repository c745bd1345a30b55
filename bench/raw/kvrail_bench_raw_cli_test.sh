#!/usr/bin/env bash
# `kvrail bench raw` end to end over shared memory and tcp with tiny windows: the JSON shape of
# the issue, positive figures on every row (behaviour, never timings), and one-line flag errors
# with exit 2. And over the verbs backend on the software provider (softverbs): a functional run
# whose rows carry the provider's note and never a bandwidth figure.
set -u
kvrail="tools/kvrail"
source tests/support/cli_checks.sh  # expect
check_rows() {  # check_rows LINK JSON
  python3 - "$1" "$2" <<'PY'
import json, sys
link, text = sys.argv[1], sys.argv[2]
doc = json.loads(text)
assert list(doc) == ["rows"], doc
rows = doc["rows"]
assert len(rows) == 1, rows
r = rows[0]
for key in ("link", "block_bytes", "batch", "gbps", "ops_per_s", "peer_gbps", "ratio"):
    assert key in r, key
assert r["link"] == link, r
assert r["block_bytes"] == 65536 and r["batch"] == 1, r
assert r["gbps"] > 0 and r["ops_per_s"] > 0, r
assert r["peer_gbps"] is not None and r["peer_gbps"] > 0, r
assert abs(r["ratio"] - r["gbps"] / r["peer_gbps"]) < 1e-9 * max(1, r["ratio"]), r
assert abs(r["ops_per_s"] * 65536 / 1e9 - r["gbps"]) < 1e-6 * r["gbps"], r
assert r["memcpy_gbps"] > 0 and r["memcpy_threads"] == r["lanes"], r
assert r["one_lane_gbps"] is not None and r["one_lane_gbps"] > 0, r
assert r["like_ratio"] is not None and r["like_ratio"] > 0, r
PY
}

for link in shm tcp; do
  out=$("$kvrail" bench raw --link "$link" --block-sizes 64KiB --batch-sizes 1 \
    --seconds 0.05 --json --quiet)
  rc=$?
  expect "$link-exit" test "$rc" -eq 0
  expect "$link-json" check_rows "$link" "$out"
done

# Streaming stores on both sides (the initiator's stores over shared memory, the target's copies
# over tcp): every window's bytes are checked at the target, as with the default plain stores.
for link in shm tcp; do
  table=$("$kvrail" bench raw --link "$link" --block-sizes 4KiB,64KiB --batch-sizes 1,3 \
    --landing-stores streaming --seconds 0.05 --no-peer --quiet)
  expect "$link-streaming-exit" test $? -eq 0
  expect "$link-streaming-rows" test "$(grep -c "^$link " <<<"$table")" -eq 4
done
err=$("$kvrail" bench raw --landing-stores fast 2>&1 >/dev/null)
expect bad-stores-exit test $? -eq 2
expect bad-stores-message grep -q -- "--landing-stores" <<<"$err"

table=$("$kvrail" bench raw --link shm --block-sizes 4KiB --batch-sizes 2 --seconds 0.05 \
  --no-peer --quiet)
expect table-header grep -q "kvrail GB/s" <<<"$table"
expect table-row grep -q "^shm *4 KiB *2 " <<<"$table"

# verbs on softverbs: the run succeeds (its windows' bytes are verified at the target), the row
# is named with its provider, shows n/a for kvrail's rates and carries the note.
table=$(KVRAIL_VERBS_PROVIDER=softverbs "$kvrail" bench raw --link verbs --block-sizes 64KiB \
  --batch-sizes 1 --seconds 0.05 --repeat 1 --quiet)
rc=$?
expect verbs-exit test "$rc" -eq 0
expect verbs-row grep -q "^verbs(softverbs) *64 KiB *1 *n/a *n/a .* \[1\]$" <<<"$table"
expect verbs-note grep -qF "[1] software verbs provider: a functional run through the verbs backend, not a bandwidth figure" <<<"$table"

check_softverbs_rows() {  # check_softverbs_rows JSON
  python3 - "$1" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])["rows"]
assert len(rows) == 1, rows
r = rows[0]
assert r["link"] == "verbs" and r["provider"] == "softverbs", r
assert r["bandwidth_claim"] is False, r
for key in ("gbps", "ops_per_s", "one_lane_gbps", "peer_gbps", "ratio", "like_ratio"):
    assert r[key] is None, (key, r)
assert "not a bandwidth figure" in r["note"], r
PY
}
out=$(KVRAIL_VERBS_PROVIDER=softverbs "$kvrail" bench raw --link verbs --block-sizes 64KiB \
  --batch-sizes 1 --seconds 0.05 --repeat 1 --json --quiet)
rc=$?
expect verbs-json-exit test "$rc" -eq 0
expect verbs-json check_softverbs_rows "$out"

err=$(KVRAIL_VERBS_PROVIDER=bogus "$kvrail" bench raw --link verbs --block-sizes 64KiB \
  --batch-sizes 1 --seconds 0.05 --quiet 2>&1 >/dev/null)
expect bad-provider-exit test $? -eq 1
expect bad-provider-message grep -q 'KVRAIL_VERBS_PROVIDER "bogus" is unknown' <<<"$err"

err=$("$kvrail" bench raw --block-sizes 64KB 2>&1 >/dev/null)
rc=$?
expect bad-size-exit test "$rc" -eq 2
expect bad-size-message grep -q '^error: --block-sizes: "64KB": .*KiB' <<<"$err"
expect bad-size-one-line test "$(wc -l <<<"$err")" -eq 1

err=$("$kvrail" bench raw --block-sizes 128MiB 2>&1 >/dev/null)
expect too-big-exit test $? -eq 2
expect too-big-message grep -q "between 1 B and 64 MiB" <<<"$err"

err=$("$kvrail" bench raw --batch-sizes 0 2>&1 >/dev/null)
expect bad-batch-exit test $? -eq 2
expect bad-batch-message grep -q "^error: --batch-sizes: .*between 1 and 1024" <<<"$err"

err=$("$kvrail" bench raw --link rdma 2>&1 >/dev/null)
expect bad-link-exit test $? -eq 2
expect bad-link-message grep -q '^error: --link: "rdma": .*tcp, shm, netns or verbs$' <<<"$err"
expect bad-link-one-line test "$(wc -l <<<"$err")" -eq 1

exit $fail
