#!/usr/bin/env bash
# `kvrail bench kv --link netns`: the prefill node (bootstrap and sidecars) in one network
# namespace and the decode node in another, joined by a veth pair, the bench engine in this one
# (behaviour, never timings). Needs root; runs unsandboxed.
set -u
kvrail="tools/kvrail"
source tests/support/cli_checks.sh  # expect
check_netns() {  # check_netns JSON
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
doc = json.loads(sys.argv[1])
cases = doc["cases"]
assert [c["mode"] for c in cases] == ["contiguous", "model", "contiguous", "model"], cases
for c in cases:
    assert c["link"] == "netns", c
    assert c["rooms"] == 2 and c["gbps"] > 0 and c["bytes_checked"] > 0, c
assert [(c["prefill_tp"], c["decode_tp"]) for c in cases[1::2]] == [(1, 1), (2, 1)], cases
assert not any(n.startswith("netns") for n in doc["notes"]), doc["notes"]
PY
}
out_file="${TEST_TMPDIR:-/tmp}/bench_kv_netns.json"
"$kvrail" bench kv --presets llama3-8b --tp 1:1,2:1 --tokens 256 --link netns \
  --rooms 2 --quiet --json >"$out_file" &
bench_pid=$!
wait "$bench_pid"
expect netns-exit test $? -eq 0
expect netns-cases check_netns "$(cat "$out_file")"
# No namespace of this bench's is left behind (they are named kvrail-bench-<pid>-a and -b; other
# tests beside this one make their own).
expect netns-removed test "$(ip netns list | grep -c "^kvrail-bench-$bench_pid-" || true)" -eq 0

[[ $fail -eq 0 ]] && echo "kvrail_bench_kv_netns_test: ok"
exit $fail
