#!/usr/bin/env bash
# CI: the README's two commands and the wheel's install, on a clean Debian 12 with neither
# libvirt-dev nor a CUDA toolkit (cuda.h, nvcc and nvml.h come from NVIDIA's wheels; libvirt-python
# is not installed).  A chroot made by debootstrap (bookworm, minbase, plus the README's
# requirements only); docker hub is not reachable from CI, so no container image.  Nothing is
# cached: the chroot is made afresh and removed at the end.  As root; network for apt and PyPI.
#
#   inside, in a copy of this working tree at /src:
#     make demo                              the README's main command
#     make test                              the README's test command (the libvirt, docker, pool and GPU
#                                            tests skip there, each saying why: no libvirtd, dockerd, etcd or GPU)
#     make wheel                             sdist, and the wheel built from it (native parts in it)
#     python3 -m venv /opt/vmgpu && /opt/vmgpu/bin/pip install build/dist/vmgpu-*.whl
#     rm -rf /src                            the checkout gone: all that follows runs the installed package
#     vmgpu setup --root /tmp/host ...       the unit, hook, runtime and `vmgpu` name /opt/vmgpu, never /src
#     the installed region self-test, `vmgpu demo`, a forwarder on the simulated backend, the hook and
#     the runtime run
set -euo pipefail
cd "$(dirname "$0")/.."

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# the README's requirements (g++: nvcc's host compiler), nothing else
PACKAGES=g++,make,python3-venv
t_start=$SECONDS
command -v debootstrap >/dev/null || {
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
}

work=$(mktemp -d /var/tmp/vmgpu-fresh-debian.XXXXXX)
root=$work/root
mounted=()
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" || umount -l "${mounted[i]}" || true; done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM
mnt() { mount "$@" && mounted+=("${*: -1}"); }

echo "== debootstrap bookworm ($PACKAGES) into $root"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 30 "$work/debootstrap.log"; exit 1; }
echo "   $((SECONDS - t_start)) s"
for pkg in libvirt-dev pkg-config cuda-toolkit nvidia-cuda-toolkit; do
    if chroot "$root" dpkg -s "$pkg" >/dev/null 2>&1; then echo "$pkg is in the chroot: not a clean machine" >&2; exit 1; fi
done
if [ -e "$root/usr/local/cuda" ] || chroot "$root" sh -c 'command -v nvcc'; then
    echo "a CUDA toolkit is in the chroot: not a clean machine" >&2; exit 1
fi
# this host's network settings, as a machine on its network would have them: the resolver, a
# proxy, and the CA that pip must trust where TLS to PyPI is intercepted (pip's `cert` setting)
cp /etc/resolv.conf "$root/etc/resolv.conf"
pass=()
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$cert" ] && [ -f "$cert" ]; then
    mkdir -p "$root/etc/ssl" && cp "$cert" "$root/etc/ssl/pip-ca.pem"
    pass+=(PIP_CERT=/etc/ssl/pip-ca.pem)
fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -n "${!v:-}" ] && pass+=("$v=${!v}")
done
mnt -t proc proc "$root/proc"
mnt --bind /dev "$root/dev"
mnt -t tmpfs -o mode=1777,size=2g tmpfs "$root/dev/shm"

# this working tree as a fresh clone would have it (tracked and untracked files, not the ignored ones)
mkdir "$root/src"
git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$root/src" -xf -

cat >"$root/run-fresh.sh" <<'EOF'
set -euo pipefail
step() { echo "== $*  [$((SECONDS - t0)) s]"; }
t0=$SECONDS
cd /src
step "make demo"
make demo
step "make test"
make test
step "make wheel"
make wheel
cp build/dist/vmgpu-*.whl build/dist/vmgpu-*.tar.gz /tmp/
step "pip install the wheel into /opt/vmgpu"
python3 -m venv /opt/vmgpu
/opt/vmgpu/bin/pip install -q --disable-pip-version-check /tmp/vmgpu-*.whl
step "remove the checkout"
cd / && rm -rf /src
export PATH=/opt/vmgpu/bin:$PATH
step "vmgpu setup --root /tmp/host"
mkdir -p /tmp/host/etc/libvirt /tmp/host/etc/docker
vmgpu setup --root /tmp/host --init systemd --no-start
vmgpu setup --root /tmp/host --init systemd --no-start | tail -n 1 | grep -qx "nothing to change"
site=$(/opt/vmgpu/bin/python -c 'import vmgpu, os; print(os.path.dirname(vmgpu.__file__))')
for f in etc/systemd/system/vmgpud.service etc/libvirt/hooks/qemu.d/50-vmgpu usr/local/bin/vmgpu-container-runtime \
    usr/local/bin/vmgpu; do
    grep -q /opt/vmgpu/bin/python "/tmp/host/$f" || { echo "$f does not name /opt/vmgpu/bin/python" >&2; exit 1; }
    if grep -q /src "/tmp/host/$f"; then echo "$f names the checkout" >&2; exit 1; fi
done
grep -q '"path": "/usr/local/bin/vmgpu-container-runtime"' /tmp/host/etc/docker/daemon.json
step "the installed package runs alone"
case "$site" in /opt/vmgpu/lib/python3*/site-packages/vmgpu) ;; *) echo "vmgpu imported from $site" >&2; exit 1 ;; esac
ls -l "$site/_native" "$site/_native/guest"
timeout 120 /tmp/host/usr/local/bin/vmgpu region selftest
timeout 300 vmgpu demo --backend sim   # the demo's programs and PTX from the wheel's vmgpu/_native/demo/
timeout 120 /opt/vmgpu/bin/python - <<'PY'
from pathlib import Path

from vmgpu.forwarder import Forwarder, native_dir

assert "site-packages/vmgpu/_native" in str(native_dir()), native_dir()
with Forwarder(Path("/dev/shm/vmgpu-fresh"), backend="sim", guest="fresh") as f:
    pass
print("forwarder on the simulated backend from", native_dir(), "ran and stopped:", f.log().strip().splitlines()[-1])
PY
# the hook and the runtime, as libvirt and docker run them: a domain and a container that ask for no GPU
echo "<domain type='kvm'><name>plain</name></domain>" |
    /tmp/host/etc/libvirt/hooks/qemu.d/50-vmgpu plain prepare begin - && echo "hook: domain without vmgpu admitted untouched"
step "vmgpu setup --uninstall"
vmgpu setup --root /tmp/host --uninstall
if find /tmp/host -type f ! -name daemon.json | grep .; then echo "setup --uninstall left files" >&2; exit 1; fi
step "done"
EOF
echo "== in the chroot"
timeout 3000 chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb "${pass[@]}" \
    bash /run-fresh.sh
echo "== fresh Debian 12: passed in $((SECONDS - t_start)) s"
