#!/usr/bin/env bash
# run-in-rootfs.sh ROOTFS COMMAND...: runs COMMAND inside ROOTFS the way a container runtime
# would start the image (new user, mount and PID namespaces, /dev, /sys and a fresh /proc,
# chroot), without one: how deploy_test tries the image here, where neither podman nor docker
# is installed. The host's network namespace is kept, as with `podman run --network host`.
set -euo pipefail
rootfs=$(readlink -f "$1")
shift
exec unshare --user --map-root-user --mount --pid --fork --kill-child -- \
  /bin/sh -c 'r=$1; shift
    mount --rbind /dev "$r/dev" && mount --rbind /sys "$r/sys" &&
    mount -t proc proc "$r/proc" && exec chroot "$r" "$@"' sh "$rootfs" "$@"
