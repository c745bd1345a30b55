#!/usr/bin/env bash
# `kvrail sidecar` and `kvrail bootstrap` as an operator deploys them: flags from a TOML
# --config file (flags win), --log-format json (every stderr line one JSON object), and
# --advertise-host (the session id peers are told; an address nobody reaches refused at start).
set -u
kvrail="$PWD/tools/kvrail"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/support/cli_checks.sh

# ipc:// paths must fit a sockaddr_un (108 bytes): $TEST_TMPDIR under Bazel's sandbox does not.
sockets=$(mktemp -d /tmp/kvrail-config.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$sockets"
}
trap cleanup EXIT

# start NAME READY-PREFIX ARGS...: runs kvrail ARGS in the background (stdout NAME.out, stderr
# NAME.err) until its stdout has a line starting with READY-PREFIX; sets pid.
start() {
  local name=$1 ready=$2
  shift 2
  "$kvrail" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 600); do
    grep -q "^$ready" "$tmp/$name.out" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "FAIL start $name: no ready line"; cat "$tmp/$name.out" "$tmp/$name.err"; exit 1
}

# stop PID: SIGTERM, then its exit status must be 0.
stop() { kill -TERM "$1"; wait "$1"; }

all_json() {  # all_json FILE: every line of FILE is one JSON object with ts, level and msg
  "$py" - "$1" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
assert lines, "no log lines"
for line in lines:
    o = json.loads(line)
    assert isinstance(o, dict) and {"ts", "level", "msg"} <= o.keys(), line
PY
}

# The bootstrap server from a config file, JSON logs.
cat >"$tmp/bootstrap.toml" <<'TOML'
port = 0
host = "127.0.0.1"
log-format = "json"
TOML
start bootstrap "bootstrap ready" bootstrap --config "$tmp/bootstrap.toml"
bootstrap_pid=$pid
port=$(sed -n 's/^bootstrap ready host=127.0.0.1 port=\([0-9]*\).*/\1/p' "$tmp/bootstrap.out")
expect bootstrap-port test -n "$port"

# A decode sidecar: its file says tp-size 2, the command line 2 too but rank 1 wins over the
# file's 0; it binds every interface and advertises 127.0.0.5 (on lo, reachable).
cat >"$tmp/decode.toml" <<TOML
role = "decode"
engine-endpoint = "ipc://$sockets/decode.sock"
tp-size = 2
tp-rank = 0
host = "0.0.0.0"
advertise-host = "127.0.0.5"
log-format = "json"
TOML
start decode "sidecar ready" sidecar --config "$tmp/decode.toml" --tp-rank 1
decode_pid=$pid
expect decode-session-advertised grep -q ' session=127\.0\.0\.5:[0-9]*$' "$tmp/decode.out"
expect decode-rank-from-flag grep -q '"role":"decode","rank":1,' "$tmp/decode.err"

# A prefill sidecar registered with the bootstrap server, text logs by default from its file.
cat >"$tmp/prefill.toml" <<TOML
role = "prefill"
engine-endpoint = "ipc://$sockets/prefill.sock"
bootstrap = "127.0.0.1:$port"
TOML
start prefill "sidecar ready" sidecar --config "$tmp/prefill.toml" --log-format json
prefill_pid=$pid
expect prefill-cachepd-default-host grep -q ' cachepd=tcp://127\.0\.0\.1:' "$tmp/prefill.out"

expect decode-stops stop "$decode_pid"
expect prefill-stops stop "$prefill_pid"
expect bootstrap-stops stop "$bootstrap_pid"
# A sidecar that stopped on SIGTERM took its engine API socket file with it.
expect decode-socket-removed test ! -e "$sockets/decode.sock"
expect prefill-socket-removed test ! -e "$sockets/prefill.sock"
pids=()
for name in bootstrap decode prefill; do
  expect "$name-json-logs" all_json "$tmp/$name.err"
done

# An advertised address that is not this host's and that nobody reaches: refused in one line.
"$kvrail" sidecar --role decode --engine-endpoint "ipc://$sockets/refused.sock" --host 127.0.0.1 \
  --advertise-host 198.51.100.1 >"$tmp/refused.out" 2>"$tmp/refused.err"
expect refused-exit test $? -eq 1
expect refused-one-line test "$(wc -l <"$tmp/refused.err")" -eq 1
expect refused-names-address grep -q -- '--advertise-host 198.51.100.1 is neither an address of this host' "$tmp/refused.err"
expect refused-names-host-addresses grep -q "this host's addresses: .*127.0.0.1" "$tmp/refused.err"
# An address of this host the bind does not cover (127.0.0.1 only) is refused too.
"$kvrail" sidecar --role decode --engine-endpoint "ipc://$sockets/refused2.sock" --host 127.0.0.1 \
  --advertise-host 127.0.0.5 >/dev/null 2>"$tmp/refused2.err"
expect refused-uncovered test $? -eq 1

# Config errors name the file, the line and the key; the command line is not reached.
printf 'role = "decode"\n\nno-such-flag = 1\n' >"$tmp/unknown.toml"
"$kvrail" sidecar --config "$tmp/unknown.toml" --print-config >/dev/null 2>"$tmp/unknown.err"
expect unknown-exit test $? -eq 2
expect unknown-named grep -q "$tmp/unknown.toml:3:1: unknown key 'no-such-flag'" "$tmp/unknown.err"
printf 'port = "8998"\n' >"$tmp/type.toml"
"$kvrail" bootstrap --config "$tmp/type.toml" --print-config >/dev/null 2>"$tmp/type.err"
expect type-exit test $? -eq 2
expect type-named grep -q "type.toml:1:1: key 'port' wants an integer" "$tmp/type.err"

# --print-config: every flag of --help is in it, and it reads back to itself.
"$kvrail" sidecar --role decode --tp-size 4 --print-config >"$tmp/printed.toml"
expect print-exit test $? -eq 0
for flag in $("$kvrail" sidecar --help | grep -o -- '^  --[a-z0-9-]*' | sed 's/^  --//'); do
  case $flag in help | config | print-config) continue ;; esac
  expect "printed-$flag" grep -Eq "^(# )?$flag = " "$tmp/printed.toml"
done
"$kvrail" sidecar --config "$tmp/printed.toml" --print-config >"$tmp/again.toml"
expect print-round-trip cmp -s "$tmp/printed.toml" "$tmp/again.toml"

# The help states how fast a dead prefill rank is noticed: at the next probe, within one
# --heartbeat-interval; --heartbeat-failures is for a node's bootstrap server gone silent.
help=$("$kvrail" sidecar --help)
expect help-heartbeat-interval grep -q "is dead at that probe, so within one interval" <<<"$help"
expect help-heartbeat-failures grep -q "a rank whose socket refuses is found at the first probe" \
  <<<"$help"
exit $fail
