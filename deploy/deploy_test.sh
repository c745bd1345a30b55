#!/usr/bin/env bash
# deploy/ tried here: systemd-analyze verify on both units (ExecStart pointed at the built
# kvrail, since verify checks that it is executable), the example config files read by the
# commands they configure, and the container image's root filesystem (assemble-rootfs.sh) run
# the way a runtime would start it (run-in-rootfs.sh: namespaces and chroot; no podman or docker
# here): its config printed, a sidecar started in it, ready, JSON logs, stopped with SIGTERM.
set -u
kvrail="$PWD/tools/kvrail"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/support/cli_checks.sh

# systemd-analyze verify exits 0 on a directive it cannot parse (it only warns), so its
# output must be empty too.
verify() {  # verify UNIT-FILE...
  local out
  out=$(systemd-analyze verify --man=no "$@" 2>&1) || { echo "$out"; return 1; }
  [ -z "$out" ] || { echo "$out"; return 1; }
}
units="$tmp/units"
mkdir -p "$units"
for unit in deploy/systemd/*.service; do
  sed "s#^ExecStart=/usr/local/bin/kvrail #ExecStart=$kvrail #" "$unit" >"$units/$(basename "$unit")"
done
# A template is verified as an instance of it.
cp "$units/kvrail-sidecar@.service" "$units/kvrail-sidecar@prefill0.service"
expect verify-units verify "$units/kvrail-sidecar@prefill0.service" "$units/kvrail-bootstrap.service"
expect sidecar-unit-config grep -q '^ExecStart=/usr/local/bin/kvrail sidecar --config /etc/kvrail/sidecar-%i.toml$' deploy/systemd/kvrail-sidecar@.service
expect sidecar-unit-memlock grep -q '^LimitMEMLOCK=infinity$' deploy/systemd/kvrail-sidecar@.service
expect sidecar-unit-restart grep -q '^Restart=on-failure$' deploy/systemd/kvrail-sidecar@.service
# The check itself: a misspelt value is caught.
sed 's/^Restart=on-failure/Restart=sometimes/' "$units/kvrail-bootstrap.service" >"$units/broken.service"
expect verify-catches-a-bad-value bash -c \
  "systemd-analyze verify --man=no '$units/broken.service' 2>&1 | grep -q 'Failed to parse'"

# The example configs, read by the commands they are for.
for config in deploy/config/sidecar-*.toml; do
  "$kvrail" sidecar --config "$config" --print-config >"$tmp/printed.toml" 2>"$tmp/err"
  expect "$(basename "$config")" test $? -eq 0
  expect "$(basename "$config")-advertise" grep -q "^advertise-host = '10\.0\.0\.[0-9]*'$" "$tmp/printed.toml"
done
"$kvrail" bootstrap --config deploy/config/bootstrap.toml --print-config >"$tmp/printed.toml"
expect bootstrap.toml test $? -eq 0
expect bootstrap.toml-port grep -q '^port = 8998$' "$tmp/printed.toml"

# The container image's root filesystem, run in namespaces.
deploy/container/assemble-rootfs.sh "$kvrail" "$tmp/image" >/dev/null
expect rootfs-binary test -x "$tmp/image/rootfs/usr/local/bin/kvrail"
expect rootfs-containerfile test -f "$tmp/image/Containerfile"
if ! deploy/container/run-in-rootfs.sh "$tmp/image/rootfs" /bin/true 2>/dev/null &&
  ! deploy/container/run-in-rootfs.sh "$tmp/image/rootfs" /usr/local/bin/kvrail --help >/dev/null 2>&1; then
  echo "SKIP container run: user namespaces are not available here"
  exit $fail
fi
rootfs="$tmp/image/rootfs"
deploy/container/run-in-rootfs.sh "$rootfs" /usr/local/bin/kvrail sidecar \
  --config /etc/kvrail/sidecar.toml --print-config >"$tmp/container.toml"
expect container-config grep -q "^engine-endpoint = 'ipc:///run/kvrail/engine.sock'$" "$tmp/container.toml"
# As `podman run --network host kvrail sidecar --config ... --advertise-host ...` would.
deploy/container/run-in-rootfs.sh "$rootfs" /usr/local/bin/kvrail sidecar \
  --config /etc/kvrail/sidecar.toml --advertise-host 127.0.0.1 \
  >"$tmp/container.out" 2>"$tmp/container.err" &
runner=$!
ready=0
for _ in $(seq 1 600); do
  grep -q '^sidecar ready ' "$tmp/container.out" && { ready=1; break; }
  kill -0 "$runner" 2>/dev/null || break
  sleep 0.05
done
expect container-ready test $ready -eq 1
expect container-session grep -q ' session=127\.0\.0\.1:[0-9]*$' "$tmp/container.out"
# unshare waits on its child and ignores SIGTERM: the sidecar is its child (sh exec'd chroot,
# chroot exec'd kvrail), and stops on SIGTERM as under systemd.
sidecar=$(pgrep -P "$runner" | head -1)
[ -n "$sidecar" ] && kill -TERM "$sidecar"
wait "$runner"
expect container-stops test $? -eq 0
expect container-json-logs "$py" -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines and all(isinstance(json.loads(l), dict) for l in lines), lines' "$tmp/container.err"
exit $fail
