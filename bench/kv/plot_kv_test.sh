#!/bin/bash
# bench/kv/plot_kv.py on a real sweep (testdata/kv_cases.json, from `kvrail bench kv --json`): it
# writes a PNG; input it cannot plot is refused with a message naming the file and the rule,
# and no image is written.
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPLCONFIGDIR="$dir/mpl"
source tests/support/cli_checks.sh  # refused
plot() { /usr/bin/python3 bench/kv/plot_kv.py "$@"; }

plot bench/kv/testdata/kv_cases.json -o "$dir/kv.png" | grep -q "wrote $dir/kv.png"
[[ "$(head -c 8 "$dir/kv.png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] ||
  { echo "not a PNG: $dir/kv.png"; exit 1; }
# Cases written before 2026-12-04 name the link "transport": still plotted.
sed 's/"link":/"transport":/g' bench/kv/testdata/kv_cases.json >"$dir/old.json"
plot "$dir/old.json" -o "$dir/old.png" | grep -q "wrote $dir/old.png"
refused "$dir/bad.json: not JSON" "nope"
refused 'expected {"cases": [...]}' '{"rows": []}'
refused "no cases to plot" '{"cases": []}'
refused "case 0 lacks prefill_tp, decode_tp, tokens, link, mode, gbps" \
  '{"cases": [{"shape": "llama3-8b"}]}'
echo "plot_kv: ok"
