#!/usr/bin/env bash
# `kvrail bootstrap` end to end: start it on a free port, register a prefill rank with curl,
# read the sync answer, the rank's endpoint and /health, refuse a bad registration, refuse a
# busy port, and exit 0 on SIGTERM and on SIGINT; --cachepd-revision pins a revision.
set -u
kvrail="tools/kvrail"
ex="examples"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
expect() {  # expect NAME CONDITION-COMMAND...
  local name=$1
  shift
  if ! "$@"; then echo "FAIL $name"; fail=1; fi
}

# start LOG [ARGS...]: runs the server in the background (stdout to LOG.out); sets pid and
# port (from its ready line).
start() {
  local log=$1
  shift
  : >"$log"
  "$kvrail" bootstrap "$@" 2>"$log" >"$log.out" &
  pid=$!
  port=""
  for _ in $(seq 1 400); do
    port=$(sed -n 's/^bootstrap ready host=.* port=\([0-9][0-9]*\)$/\1/p' "$log.out")
    [ -n "$port" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "FAIL start: no ready line"; cat "$log" "$log.out"; exit 1
}

log="$tmp/bootstrap.log"
start "$log" --port 0 --host 127.0.0.1
url="http://127.0.0.1:$port"
# stdout holds the one ready line (logs stay on stderr), and it names the port the log names.
expect ready-line test "$(cat "$log.out")" = "bootstrap ready host=127.0.0.1 port=$port"
expect listening-line grep -q "event=listening host=127.0.0.1 port=$port " "$log"

"$py" - "$ex/prefill_contract.json" >"$tmp/put.json" <<'PY'
import json, sys
print(json.dumps({"role": "Prefill", "world_size": 2, "dp_size": 1, "rank_ip": "127.0.0.1",
                  "rank_port": 17001, "engine_rank": 1, "cache_layout": open(sys.argv[1]).read()}))
PY
put=$(curl -sS -o "$tmp/put.out" -w '%{http_code}' -X PUT -H 'Content-Type: application/json' \
  --data-binary @"$tmp/put.json" "$url/route")
expect put-status test "$put" = 200
expect put-body test "$(cat "$tmp/put.out")" = OK

sync=$(curl -sS "$url/route?engine_rank=-1&target_dp_group=-1")
expect sync-json "$py" - "$sync" "$ex/prefill_contract.json" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
# auto: the 2026-09 answer (CACHEPD §12.4), its placement one stage holding every field.
assert list(d) == ["prefill_tp_size", "prefill_dp_size", "prefill_pp_size", "cache_layout",
                   "cache_fields_by_stage"], d
assert d["prefill_tp_size"] == 2 and d["prefill_dp_size"] == 1 and d["prefill_pp_size"] == 1
fields = [f["field_id"] for f in json.load(open(sys.argv[2]))["plan"]["fields"]]
assert d["cache_fields_by_stage"] == [fields], d["cache_fields_by_stage"]
assert json.loads(d["cache_layout"]) == json.load(open(sys.argv[2]))
assert " " not in d["cache_layout"] and "\n" not in d["cache_layout"]  # canonical (§4.2)
PY

expect lookup test "$(curl -sS "$url/route?engine_rank=1&target_dp_group=0")" \
  = '{"rank_ip": "127.0.0.1", "rank_port": 17001}'
expect health test "$(curl -sS "$url/health")" = OK
expect missing test "$(curl -sS "$url/route?engine_rank=1")" = "Missing inputs for bootstrap server."

bad=$(curl -sS -o "$tmp/bad.out" -w '%{http_code}' -X PUT --data-binary '{"role": "Prefill"}' \
  "$url/route")
expect bad-status test "$bad" = 500
expect bad-one-line test "$(wc -l <"$tmp/bad.out")" -eq 0
expect bad-names-member grep -q "world_size" "$tmp/bad.out"

"$kvrail" bootstrap --port "$port" --host 127.0.0.1 2>"$tmp/busy.log"
expect busy-exit test $? -eq 1
expect busy-error grep -qx "error: .*127.0.0.1:$port.*" "$tmp/busy.log"

kill -TERM "$pid"
wait "$pid"
expect sigterm-exit test $? -eq 0
expect log-registered grep -q \
  "event=registered engine_rank=1 dp_group=0 rank_in_group=1 rank_ip=127.0.0.1 rank_port=17001 registered=1/2" \
  "$log"
expect log-refused grep -q "event=registration_refused http_status=500" "$log"
expect log-stopping grep -q "event=stopping signal=SIGTERM" "$log"

start "$tmp/sigint.log" --port 0 --host 127.0.0.1
kill -INT "$pid"
wait "$pid"
expect sigint-exit test $? -eq 0

"$kvrail" bootstrap --host 127.0.0.1 2>/dev/null
expect port-required test $? -eq 2

# Bounds: a body over --max-body-bytes is refused 413 and logged; refusals from one peer are
# logged once per --log-interval, and the count held back is logged at the latest on exit.
start "$tmp/limits.log" --port 0 --host 127.0.0.1 --max-body-bytes 1000 --log-interval 600
url="http://127.0.0.1:$port"
big=$(head -c 2000 /dev/zero | tr '\0' ' ' | curl -sS -o "$tmp/big.out" -w '%{http_code}' \
  -X PUT --data-binary @- "$url/route")
expect big-status test "$big" = 413
expect big-names-limit grep -q "exceeds the 1000 bytes" "$tmp/big.out"
for _ in 1 2 3 4; do
  curl -sS -o /dev/null -X PUT --data-binary '[]' "$url/route"
done
expect limits-health test "$(curl -sS "$url/health")" = OK
kill -TERM "$pid"
wait "$pid"
expect limits-exit test $? -eq 0
expect log-413 grep -q \
  "event=request_refused kind=body_too_large http_status=413 peer=127.0.0.1:" "$tmp/limits.log"
expect log-one-line-per-peer test "$(grep -c 'refused' "$tmp/limits.log")" -eq 1
expect log-held-back grep -q "event=refusals_held_back peer=127.0.0.1 count=4" "$tmp/limits.log"

# --bearer-token-file: PUT /route needs the bearer token; GETs do not. --world-size and --dp-size fix
# the node, so a stray registration with other sizes is refused and fixes nothing.
printf 's3cret-token\n' >"$tmp/token"
start "$tmp/token.log" --port 0 --host 127.0.0.1 --bearer-token-file "$tmp/token" --world-size 2 \
  --dp-size 1
url="http://127.0.0.1:$port"
expect token-listening grep -q "event=listening .*bearer_token=required" "$tmp/token.log"
none=$(curl -sS -o "$tmp/none.out" -w '%{http_code}' -X PUT --data-binary @"$tmp/put.json" \
  "$url/route")
expect token-missing test "$none" = 401
expect token-missing-names-rule grep -q "Authorization: Bearer <token>" "$tmp/none.out"
"$py" - "$tmp/put.json" >"$tmp/stray.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["world_size"] = 4
print(json.dumps(d))
PY
stray=$(curl -sS -o "$tmp/stray.out" -w '%{http_code}' -X PUT \
  -H 'Authorization: Bearer s3cret-token' --data-binary @"$tmp/stray.json" "$url/route")
expect stray-status test "$stray" = 409
expect stray-names-flag grep -q -- "--world-size" "$tmp/stray.out"
ok=$(curl -sS -o /dev/null -w '%{http_code}' -X PUT -H 'Authorization: Bearer s3cret-token' \
  --data-binary @"$tmp/put.json" "$url/route")
expect token-ok test "$ok" = 200
expect token-get test "$(curl -sS "$url/route?engine_rank=1&target_dp_group=0")" \
  = '{"rank_ip": "127.0.0.1", "rank_port": 17001}'
kill -TERM "$pid"
wait "$pid"
expect token-log grep -q "event=registration_refused http_status=401" "$tmp/token.log"
expect token-log-registered grep -q "event=registered engine_rank=1" "$tmp/token.log"

# --cachepd-revision snapshot: the snapshot's three-member sync answer (CACHEPD §2.2).
start "$tmp/snapshot.log" --port 0 --host 127.0.0.1 --cachepd-revision snapshot
url="http://127.0.0.1:$port"
expect snapshot-listening grep -q "event=listening .*cachepd_revision=snapshot" "$tmp/snapshot.log"
expect snapshot-put test "$(curl -sS -X PUT --data-binary @"$tmp/put.json" "$url/route")" = OK
expect snapshot-sync "$py" -c 'import json, sys
assert list(json.loads(sys.argv[1])) == ["prefill_tp_size", "prefill_dp_size", "cache_layout"]' \
  "$(curl -sS "$url/route?engine_rank=-1&target_dp_group=-1")"
kill -TERM "$pid"
wait "$pid"
# --cachepd-revision 2026-09: a snapshot-era registration is refused with 500 naming the
# revision mismatch, as the newer reference refuses it (CACHEPD §12.3, §12.11).
start "$tmp/r2.log" --port 0 --host 127.0.0.1 --cachepd-revision 2026-09
url="http://127.0.0.1:$port"
r2=$(curl -sS -o "$tmp/r2.out" -w '%{http_code}' -X PUT --data-binary @"$tmp/put.json" \
  "$url/route")
expect r2-refuses-snapshot test "$r2" = 500
expect r2-names-mismatch grep -q "revision mismatch" "$tmp/r2.out"
kill -TERM "$pid"
wait "$pid"
"$kvrail" bootstrap --port 0 --cachepd-revision 2025 2>/dev/null
expect bad-revision-exit test $? -eq 2

printf 'two words\n' >"$tmp/bad-token"
"$kvrail" bootstrap --port 0 --host 127.0.0.1 --bearer-token-file "$tmp/bad-token" 2>"$tmp/bad-token.log"
expect bad-token-exit test $? -eq 1
expect bad-token-error grep -q "^error: token file $tmp/bad-token: " "$tmp/bad-token.log"

[ "$fail" -eq 0 ] || { echo "--- server log"; cat "$log"; }
exit $fail
