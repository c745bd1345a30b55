#!/usr/bin/env bash
# `--transport`, renamed on 2026-12-04: `--backend` on `kvrail sidecar` (the data-plane backend)
# and `--link` on the deployment and bench commands (what carries the bytes between the ranks).
# The old flag is hidden and fails at once, before anything starts: one line naming the new flag,
# exit 2 (a usage error). A sidecar config file's old key fails the same way.
set -u
kvrail="$PWD/tools/kvrail"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/support/cli_checks.sh  # expect

# renamed NAME MESSAGE ARGS...: `kvrail ARGS` prints exactly "error: MESSAGE", exits 2.
renamed() {
  local name=$1 message=$2
  shift 2
  local err
  err=$("$kvrail" "$@" 2>&1 >/dev/null)
  expect "$name-exit" test $? -eq 2
  expect "$name-line" test "$err" = "error: $message"
}

renamed sidecar "kvrail sidecar: --transport was renamed --backend (ucx or verbs)" \
  sidecar --role decode --engine-endpoint ipc:///tmp/unused.sock --transport verbs
# Before the required flags are checked: the old flag alone names the new one.
renamed sidecar-alone "kvrail sidecar: --transport was renamed --backend (ucx or verbs)" \
  sidecar --transport ucx
printf 'role = "decode"\ntransport = "verbs"\n' >"$tmp/old.toml"
renamed sidecar-config "kvrail sidecar: --transport was renamed --backend (ucx or verbs)" \
  sidecar --config "$tmp/old.toml" --engine-endpoint ipc:///tmp/unused.sock
renamed demo "kvrail demo: --transport was renamed --link (shm, tcp or verbs)" \
  demo --transport tcp
renamed soak "kvrail soak: --transport was renamed --link (shm or tcp)" soak --transport shm
renamed bench-kv "kvrail bench kv: --transport was renamed --link (a comma list of tcp, shm, netns)" \
  bench kv --transport tcp,shm
renamed bench-control "kvrail bench control: --transport was renamed --link (tcp or shm)" \
  bench control --transport sm
renamed bench-raw \
  "kvrail bench raw: --transport was renamed --link (a comma list of tcp, shm, netns, verbs)" \
  bench raw --transport shm
renamed bench-raw-target \
  "kvrail bench raw-target: --transport was renamed --link (tcp, shm, netns or verbs)" \
  bench raw-target --transport shm --arena-bytes 4096
# `--rooms` of `kvrail bench raw`, renamed on 2026-12-05: what it bounds are the scheduler's
# transfers (engine/transfer/scheduler.h), not rooms.
renamed bench-raw-rooms "kvrail bench raw: --rooms was renamed --transfers (in flight per lane)" \
  bench raw --rooms 8
expect bench-raw-help-transfers grep -q -- '^  --transfers' <<<"$("$kvrail" bench raw --help)"
expect bench-raw-help-hides-rooms test "$(grep -c -- '--rooms' <<<"$("$kvrail" bench raw --help)")" -eq 0

# The bootstrap server's secret, renamed on 2026-12-05: a "bootstrap token" is CachePD's first
# output token (a room's); the secret PUT /route carries is a bearer token (a deployment's).
renamed bootstrap-token-file "kvrail bootstrap: --token-file was renamed --bearer-token-file" \
  bootstrap --token-file /dev/null
renamed sidecar-bootstrap-token-file \
  "kvrail sidecar: --bootstrap-token-file was renamed --bootstrap-bearer-token-file (a bootstrap token is CachePD's first output token)" \
  sidecar --bootstrap-token-file /dev/null

# The new names are what --help shows; the old one is hidden everywhere.
for command in sidecar demo soak "bench kv" "bench control" "bench raw"; do
  # shellcheck disable=SC2086
  help=$("$kvrail" $command --help)
  expect "help-$command-hides-transport" test "$(grep -c -- '--transport' <<<"$help")" -eq 0
done
expect sidecar-help-backend grep -q -- '^  --backend' <<<"$("$kvrail" sidecar --help)"
expect demo-help-link grep -q -- '^  --link' <<<"$("$kvrail" demo --help)"
# --print-config leaves the hidden flag out (every key it prints is a flag --help shows).
printed=$("$kvrail" sidecar --role decode --print-config)
expect print-config-backend grep -q "^backend = 'ucx'$" <<<"$printed"
expect print-config-no-transport test "$(grep -c '^# transport\|^transport' <<<"$printed")" -eq 0

# bench control: "sm" (UCX's own name for shared memory) is refused in one line asking for shm.
err=$("$kvrail" bench control --link sm 2>&1 >/dev/null)
expect control-sm-exit test $? -eq 2
expect control-sm-line test "$err" = \
  'error: control bench: link "sm": write shm (UCX shared memory; sm is UCX'"'"'s own name for it)'

[[ $fail -eq 0 ]] && echo "kvrail_renamed_flags_cli_test: ok"
exit $fail
