#!/bin/bash
# bench/raw/plot_raw.py on real rows (testdata/raw_rows.json, from `kvrail bench raw --json`):
# it writes a PNG; rows it cannot plot are refused with a message naming the file and the rule,
# and no image is written.
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPLCONFIGDIR="$dir/mpl"
source tests/support/cli_checks.sh  # refused
plot() { /usr/bin/python3 bench/raw/plot_raw.py "$@"; }

plot bench/raw/testdata/raw_rows.json -o "$dir/raw.png" | grep -q "wrote $dir/raw.png"
[[ "$(head -c 8 "$dir/raw.png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] ||
  { echo "not a PNG: $dir/raw.png"; exit 1; }
plot - -o "$dir/stdin.svg" <bench/raw/testdata/raw_rows.json >/dev/null
grep -q "<svg" "$dir/stdin.svg"
# Rows written before 2026-12-04 name the link "transport": still plotted.
sed 's/"link":/"transport":/g' bench/raw/testdata/raw_rows.json >"$dir/old.json"
plot "$dir/old.json" -o "$dir/old.png" | grep -q "wrote $dir/old.png"
refused "$dir/bad.json: not JSON" "nope"
refused 'expected {"rows": [...]}' '[1, 2]'
refused "no rows to plot" '{"rows": []}'
refused "row 0 lacks block_bytes, batch, gbps" '{"rows": [{"link": "tcp"}]}'
refused "row 1: block_bytes must be a positive integer" \
  '{"rows": [{"link": "tcp", "block_bytes": 4096, "batch": 1, "gbps": 1},
             {"link": "tcp", "block_bytes": 0, "batch": 1, "gbps": 1}]}'
refused "every row makes no bandwidth claim" \
  '{"rows": [{"link": "verbs", "provider": "softverbs", "bandwidth_claim": false,
              "block_bytes": 4096, "batch": 1, "gbps": null}]}'
# A softverbs row beside real rows is left out, the rest plotted.
python3 - bench/raw/testdata/raw_rows.json >"$dir/mixed.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["rows"].append({"link": "verbs", "provider": "softverbs", "bandwidth_claim": False,
                    "block_bytes": 4096, "batch": 1, "gbps": None})
print(json.dumps(doc))
PY
plot "$dir/mixed.json" -o "$dir/mixed.png" 2>"$dir/err" | grep -q "wrote $dir/mixed.png"
grep -q "left out 1 rows without a bandwidth claim" "$dir/err"
plot "$dir/missing.json" -o "$dir/x.png" 2>"$dir/err" && exit 1
grep -q "No such file" "$dir/err"
echo "plot_raw: ok"
