#!/usr/bin/env bash
# `kvrail doctor` end to end on this host: UCX's transports and the missing RDMA device reported
# (exit 0: kvrail runs here over tcp and shared memory), an advertised address that is not this
# host's and a bootstrap nobody serves (exit 1, each with what to change), and --json.
set -u
kvrail="tools/kvrail"
fail=0
expect() {  # expect NAME CONDITION-COMMAND...
  local name=$1
  shift
  if ! "$@"; then echo "FAIL $name"; fail=1; fi
}
out=$("$kvrail" doctor --host 127.0.0.1)
rc=$?
echo "$out"
expect plain-exit test "$rc" -eq 0
expect ucx-line grep -qE '^ok +ucx +UCX [0-9.]+, transports: .*tcp' <<<"$out"
expect rdma-line grep -qE '^(warn|ok) +rdma ' <<<"$out"
expect ready grep -q 'kvrail doctor: ready' <<<"$out"

# 192.0.2.1 (TEST-NET-1) is no address of this host; nothing listens on port 1.
out=$("$kvrail" doctor --host 192.0.2.1 --bootstrap 127.0.0.1:1 --timeout 0.5)
rc=$?
echo "$out"
expect bad-exit test "$rc" -eq 1
expect advertise-fail grep -qE '^FAIL +advertise +"192.0.2.1" cannot be bound here' <<<"$out"
expect advertise-fix grep -q -- '-> give --host one of this host' <<<"$out"
expect bootstrap-fail grep -qE '^FAIL +bootstrap .*127.0.0.1:1' <<<"$out"

# A bootstrap server that runs: doctor reaches its /health.
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
"$kvrail" bootstrap --port 0 --host 127.0.0.1 >"$tmp/bootstrap.out" 2>"$tmp/bootstrap.log" &
pid=$!
port=""
for _ in $(seq 1 400); do
  port=$(sed -n 's/^bootstrap ready host=.* port=\([0-9][0-9]*\)$/\1/p' "$tmp/bootstrap.out")
  [ -n "$port" ] && break
  sleep 0.05
done
out=$("$kvrail" doctor --bootstrap "127.0.0.1:$port")
rc=$?
expect bootstrap-exit test "$rc" -eq 0
expect bootstrap-ok grep -qE "^ok +bootstrap +127.0.0.1:$port answers /health" <<<"$out"
kill "$pid"
wait "$pid" 2>/dev/null

json=$("$kvrail" doctor --json)
expect json python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["ok"] is True; assert any(r["transport"]=="tcp" for r in d["facts"]["ucx"]["resources"]); assert d["findings"]' "$json"
exit $fail
