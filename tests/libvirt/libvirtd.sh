#!/usr/bin/env bash
# Start or stop libvirtd (and virtlogd) by hand, for tests on a machine without systemd.
#   tests/libvirt/libvirtd.sh up|down        (root; Debian 12's libvirt-daemon packages)
# `up` is idempotent.  `down` destroys and undefines the test domains (names vmgpu-e2e-*)
# and stops the daemons it started.
#
# VMGPU_LIBVIRT_ETC=DIR: libvirtd runs in a mount namespace of its own where DIR is its
# /etc/libvirt (a copy of the system's, but for hooks/: DIR/hooks is the tests' own).  libvirt
# looks for hooks only in the /etc/libvirt/hooks it was built with, so this is how a test
# libvirtd gets a private hooks directory: the system's hooks are never read nor touched.
# VMGPU_LIBVIRT_HIDE=DIR (with VMGPU_LIBVIRT_ETC): in that namespace an empty read-only tmpfs
# lies over DIR, so that libvirtd, its hooks and its QEMUs cannot reach it (a removed checkout).
set -euo pipefail
STATE=${VMGPU_LIBVIRT_STATE:-/run/vmgpu-test-libvirt}
ETC=${VMGPU_LIBVIRT_ETC:-}
HIDE=${VMGPU_LIBVIRT_HIDE:-}
case "${1:-}" in
up)
    mkdir -p "$STATE" /etc/libvirt /var/log/libvirt
    # the qemu driver resolves its built-in user and group even when qemu.conf names root
    getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
    getent passwd libvirt-qemu >/dev/null || useradd --system --gid libvirt-qemu --no-create-home \
        --home-dir /var/lib/libvirt --shell /usr/sbin/nologin libvirt-qemu
    [ -f /etc/libvirt/qemu.conf ] || cat > /etc/libvirt/qemu.conf <<'CONF'
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
CONF
    [ -f /etc/libvirt/libvirtd.conf ] || cat > /etc/libvirt/libvirtd.conf <<'CONF'
unix_sock_group = "root"
unix_sock_rw_perms = "0770"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
CONF
    if ! { [ -f "$STATE/virtlogd.pid" ] && kill -0 "$(cat "$STATE/virtlogd.pid")" 2>/dev/null; }; then
        /usr/sbin/virtlogd -d --pid-file "$STATE/virtlogd.pid"
    fi
    if [ -f "$STATE/libvirtd.pid" ] && kill -0 "$(cat "$STATE/libvirtd.pid")" 2>/dev/null; then
        if [ "$(cat "$STATE/libvirtd.etc" 2>/dev/null)" != "$ETC" ]; then
            echo "a libvirtd started by $0 runs with another /etc/libvirt ($(cat "$STATE/libvirtd.etc" 2>/dev/null)):" \
                "run '$0 down' first" >&2
            exit 1
        fi
    elif [ -n "$ETC" ]; then
        mkdir -p "$ETC/hooks"
        for f in /etc/libvirt/*; do  # the system's settings, never its hooks
            [ "$(basename "$f")" = hooks ] || cp -a "$f" "$ETC/"
        done
        unshare --mount --propagation private -- /bin/sh -c \
            'mount --bind "$1" /etc/libvirt && { [ -z "$3" ] || mount -t tmpfs -o ro,mode=0555,size=64k hidden "$3"; } &&
             exec /usr/sbin/libvirtd -d --pid-file "$2"' \
            sh "$ETC" "$STATE/libvirtd.pid" "$HIDE"
        printf '%s' "$ETC" > "$STATE/libvirtd.etc"
    else
        /usr/sbin/libvirtd -d --pid-file "$STATE/libvirtd.pid"
        printf '' > "$STATE/libvirtd.etc"
    fi
    for _ in $(seq 1 600); do virsh -q -c qemu:///system version >/dev/null 2>&1 && exit 0; sleep 0.1; done
    echo "libvirtd did not answer within 60 s (see /var/log/libvirt/libvirtd.log)" >&2
    exit 1
    ;;
down)
    V="virsh -q -c qemu:///system"
    if [ -f "$STATE/libvirtd.pid" ] && kill -0 "$(cat "$STATE/libvirtd.pid")" 2>/dev/null; then
        for d in $($V list --all --name | grep '^vmgpu-e2e-' || true); do
            $V destroy "$d" >/dev/null 2>&1 || true
            $V undefine "$d" >/dev/null 2>&1 || true
        done
    fi
    for p in libvirtd virtlogd; do
        f="$STATE/$p.pid"
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        if kill -TERM "$pid" 2>/dev/null; then
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$f"
    done
    rm -f "$STATE/libvirtd.etc"
    ;;
*)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
