#!/usr/bin/env bash
# `kvrail bench kv` end to end with one tiny case (llama3-8b, 1:1, 1k tokens, tcp, 2 rooms): the
# JSON shape of the issue, positive figures and a contiguous baseline (behaviour, never
# timings), CSV and --plot beside it, and one-line flag errors with exit 2.
set -u
kvrail="tools/kvrail"
source tests/support/cli_checks.sh  # expect
check_cases() {  # check_cases JSON
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
doc = json.loads(sys.argv[1])
cases = doc["cases"]
assert [c["mode"] for c in cases] == ["contiguous", "model"], cases
for c in cases:
    for key in ("shape", "prefill_tp", "decode_tp", "tokens", "link", "mode", "bytes",
                "copies", "coalesced_copies", "gbps", "p50_ms", "p99_ms", "first_byte_ms",
                "efficiency"):
        assert key in c, key
    assert c["link"] == "tcp" and c["tokens"] == 1024, c
    assert c["rooms"] == 2 and c["gbps"] > 0 and c["efficiency"] > 0, c
    assert c["p99_ms"] >= c["p50_ms"] > 0, c
    assert c["bytes_checked"] > 0, c
    # Each side's sidecars' CPU seconds per GiB of the warm room (a tick may not pass: >= 0).
    assert c["prefill_cpu_s_per_gib"] >= 0 and c["decode_cpu_s_per_gib"] >= 0, c
base, model = cases
# 1k tokens of 32 layers x (K, V) x 8 heads x 128 dims x bf16: 128 MiB, in both rooms.
assert model["shape"] == "llama3-8b" and model["bytes"] == 128 << 20, model
# The contiguous room coalesces into copies of 4 MiB (plan::kMostMergedBytes).
assert base["bytes"] == model["bytes"] and base["coalesced_copies"] == base["bytes"] >> 22, base
# 64 pages x 64 fields before coalescing; a field's pages are contiguous on both sides.
assert model["copies"] == 64 * 64 and model["coalesced_copies"] == 64, model
PY
}

tiny=(bench kv --presets llama3-8b --tp 1:1 --tokens 1k --link tcp --quiet)
logs="${TEST_TMPDIR:-/tmp}/kv-logs"
rm -rf "$logs"
out=$("$kvrail" "${tiny[@]}" --rooms 2 --json --log-dir "$logs")
expect json-exit test $? -eq 0
expect json-cases check_cases "$out"
# Each run of the case logs in its own directory: the runs have processes of the same names.
case_logs="$logs/llama3-8b-1-1-1024-tokens-tcp"
for run in model contiguous-baseline; do
  expect "logs-$run" grep -q "prefill sidecar rank 0/1" "$case_logs/$run/prefill-sidecar-0.log"
done
expect logs-apart test "$(grep -c "prefill sidecar rank 0/1" "$case_logs/model/prefill-sidecar-0.log")" -eq 1

png="${TEST_TMPDIR:-/tmp}/kv.png"
# --max-arena-gib below the four 128 MiB arenas: the baseline runs after the case (said in a note,
# which CSV leaves out), with the same rows.
csv=$(MPLCONFIGDIR="${TEST_TMPDIR:-/tmp}/mpl" "$kvrail" "${tiny[@]}" --csv --rooms 1 --plot "$png" \
  --max-arena-gib 0.25)
expect csv-exit test $? -eq 0
expect csv-header grep -q "^shape,prefill_tp,decode_tp,tokens,link,mode,bytes," <<<"$csv"
expect csv-rows test "$(wc -l <<<"$csv")" -eq 3
# --plot runs the plot_kv.py compiled into the binary.
expect plot-png test "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a"

err=$("$kvrail" bench kv --tp 2-1 2>&1 >/dev/null)
expect bad-tp-exit test $? -eq 2
expect bad-tp-message grep -q '^error: --tp: "2-1": expected <prefill TP>:<decode TP>' <<<"$err"
expect bad-tp-one-line test "$(wc -l <<<"$err")" -eq 1

err=$("$kvrail" bench kv --presets gpt-9 2>&1 >/dev/null)
expect unknown-preset-exit test $? -eq 2
expect unknown-preset-message grep -q '^error: --presets: "gpt-9": expected one of' <<<"$err"

err=$("$kvrail" bench kv --quick --full 2>&1 >/dev/null)
expect two-sweeps-exit test $? -eq 2

# --naive, --digest and --unpopulated: the same rooms again with one write per row per page per
# field (the prefill sidecars' --naive-copies), with --verify-digest on every sidecar, and with
# --no-populate-arena on every sidecar, each checked as the others, beside them.
check_variants() {  # check_variants JSON
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
cases = json.loads(sys.argv[1])["cases"]
assert [c["mode"] for c in cases] == ["contiguous", "naive", "digest", "unpopulated", "model"], cases
base, naive, digest, unpopulated, model = cases
for c in cases:
    assert c["bytes_checked"] > 0 and c["first_room_gbps"] > 0, c
assert unpopulated["coalesced_copies"] == model["coalesced_copies"], unpopulated
assert naive["bytes"] == model["bytes"] and naive["bytes_checked"] > 0, naive
assert (naive["prefill_tp"], naive["decode_tp"]) == (1, 1), naive
# Never merged: the sidecars posted as many copies as the planner expands.
assert naive["coalesced_copies"] == naive["copies"] == model["copies"], naive
assert model["coalesced_copies"] < naive["coalesced_copies"], model
assert model["naive_gain"] > 0 and naive["naive_gain"] is None, model
assert digest["bytes"] == model["bytes"] and digest["bytes_checked"] > 0, digest
assert digest["coalesced_copies"] == model["coalesced_copies"] and digest["gbps"] > 0, digest
PY
}
out=$("$kvrail" bench kv --presets llama3-8b --tp 1:1 --tokens 256 --link tcp --quiet \
  --rooms 2 --naive --digest --unpopulated --json)
expect variants-exit test $? -eq 0
expect variants-cases check_variants "$out"

# --compare: a head-sliced case (2:1) again with each row a copy of its own (the sidecars'
# --no-strided-copies), checked as the others: the same bytes in more copies than the strided
# rooms' (there the rows of a field's pages, back to back on both sides in the bench, are one
# strided copy: 32 layers x k and v x 2 prefill ranks). --streaming-stores: the case again with
# --landing-stores streaming on every sidecar, every byte checked as the others.
check_compare() {  # check_compare JSON
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
cases = json.loads(sys.argv[1])["cases"]
assert [c["mode"] for c in cases] == ["contiguous", "rows", "streaming", "model"], cases
base, rows, streaming, model = cases
assert streaming["bytes"] == model["bytes"] and streaming["bytes_checked"] > 0, streaming
assert streaming["coalesced_copies"] == model["coalesced_copies"], streaming
assert rows["bytes"] == model["bytes"] and rows["bytes_checked"] > 0, rows
assert (rows["prefill_tp"], rows["decode_tp"]) == (2, 1), rows
assert model["coalesced_copies"] == 32 * 2 * 2, model
assert rows["coalesced_copies"] == 32 * 2 * 2 * 16 * 16, rows  # 16 pages of 16 rows a field
PY
}
out=$("$kvrail" bench kv --presets llama3-8b --tp 2:1 --tokens 256 --link tcp --quiet \
  --rooms 2 --compare --streaming-stores --json)
expect compare-exit test $? -eq 0
expect compare-cases check_compare "$out"

# --layerwise: the model's rooms again, streamed layer by layer (LayersReady) behind a
# simulated forward pass, checked as the others, with the exposed time and one layer's share.
check_layerwise() {  # check_layerwise JSON
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
cases = json.loads(sys.argv[1])["cases"]
assert [c["mode"] for c in cases] == ["contiguous", "layerwise", "model"], cases
base, layered, model = cases
assert layered["bytes"] == model["bytes"] and layered["bytes_checked"] > 0, layered
assert layered["coalesced_copies"] >= model["coalesced_copies"], layered
assert layered["exposed_ms"] >= 0 and layered["layer_share_ms"] > 0, layered
assert layered["exposed_ratio"] >= 0, layered
assert model["exposed_ms"] is None and base["exposed_ms"] is None, model
PY
}
out=$("$kvrail" bench kv --presets llama3-8b --tp 1:1 --tokens 256 --link tcp --quiet \
  --rooms 2 --layerwise --json)
expect layerwise-exit test $? -eq 0
expect layerwise-cases check_layerwise "$out"

# At 2:1 over tcp a layer-wise room's layers keep to the route's lane set as its whole rooms do
# (each prefill rank on a lane of its own, decision 0016); the bench's engines check the bytes
# as in every mode, and the layer-wise run's prefill logs the route's set.
logs="${TEST_TMPDIR:-/tmp}/layerwise-2-1"
out=$("$kvrail" bench kv --presets llama3-8b --tp 2:1 --tokens 256 --link tcp --quiet \
  --rooms 2 --layerwise --json --log-dir "$logs")
expect layerwise-2-1-exit test $? -eq 0
expect layerwise-2-1-cases check_layerwise "$out"
expect layerwise-2-1-lanes grep -q 'lanes="lane 0 of 2 (source 1 of the decode.s 2' \
  "$(find "$logs" -path '*layerwise*' -name prefill-sidecar-0.log | head -1)"

# --layer-compute-scale: the simulated compute per layer is that many shares.
out=$("$kvrail" bench kv --presets llama3-8b --tp 1:1 --tokens 256 --link tcp --quiet \
  --rooms 2 --layerwise --layer-compute-scale 2 --json)
expect scaled-exit test $? -eq 0
expect scaled-cases check_layerwise "$out"
expect scaled-compute /usr/bin/python3 -c '
import json, sys
layered = json.loads(sys.argv[1])["cases"][1]
assert abs(layered["layer_compute_ms"] - 2 * layered["layer_share_ms"]) < 1e-6, layered' "$out"
"$kvrail" bench kv --quick --layer-compute-scale 2 >/dev/null 2>&1
expect scale-without-layerwise test $? -ne 0

[[ $fail -eq 0 ]] && echo "kvrail_bench_kv_cli_test: ok"
exit $fail
