#!/usr/bin/env bash
# assemble-rootfs.sh KVRAIL CONTEXT: the build context of deploy/container/Containerfile in
# CONTEXT: CONTEXT/rootfs holds KVRAIL at /usr/local/bin/kvrail with every shared library it
# links (ldd), UCX's transport modules (dlopened, so ldd does not list them) with theirs, and
# the empty directories a sidecar uses, and sidecar.toml at /etc/kvrail/; CONTEXT also gets the
# Containerfile.
# Nothing is downloaded: the image is this host's binary and libraries, FROM scratch.
set -euo pipefail
kvrail=$(readlink -f "$1")
context=$2
here=$(dirname "$(readlink -f "$0")")
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/kvrail" "$rootfs/run/kvrail" "$rootfs/tmp" \
  "$rootfs/dev/shm" "$rootfs/proc" "$rootfs/sys"
chmod 1777 "$rootfs/tmp"
install -m 0755 "$kvrail" "$rootfs/usr/local/bin/kvrail"

# copy_with_libraries FILE...: each file, and the libraries ldd resolves for it, at their paths.
copy_with_libraries() {
  local file lib
  for file in "$@"; do
    mkdir -p "$rootfs$(dirname "$file")"
    cp -L "$file" "$rootfs$file"
    for lib in $(ldd "$file" | awk '/=> \//{print $3} /^\t\/[^ ]*ld-linux/{print $1}'); do
      [ -e "$rootfs$lib" ] && continue
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
  done
}
copy_with_libraries "$kvrail"
rm -f "$rootfs$kvrail"  # the binary itself lives at /usr/local/bin/kvrail only
ucx_modules=/usr/lib/x86_64-linux-gnu/ucx
if [ -d "$ucx_modules" ]; then
  copy_with_libraries "$ucx_modules"/*.so*
fi
cp "$here/sidecar.toml" "$rootfs/etc/kvrail/sidecar.toml"
cp "$here/Containerfile" "$context/"
echo "$context: $(du -sh "$rootfs" | cut -f1) rootfs; build with: podman build -t kvrail $context"
