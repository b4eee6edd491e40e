#!/usr/bin/env bash
# Put a guest kernel at OUT/vmlinuz: Debian's current kernel package, downloaded (not
# installed) and unpacked.  Needs apt lists (apt-get update).  Usage: fetch-kernel.sh OUT
set -euo pipefail
out=$1
[ -s "$out/vmlinuz" ] && exit 0
mkdir -p "$out"
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "cannot find Debian's kernel package (apt-get update first?)" >&2; exit 1; }
tmp=$(mktemp -d)
chmod 755 "$tmp"  # apt downloads as _apt
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q "$pkg" >/dev/null)
dpkg-deb --fsys-tarfile "$tmp"/"$pkg"_*.deb | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*'
mv "$tmp"/boot/vmlinuz-* "$out/vmlinuz"
echo "guest kernel: $out/vmlinuz ($pkg)"
