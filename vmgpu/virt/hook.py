"""The libvirt qemu hook: libvirt runs it as `qemu DOMAIN OPERATION SUBOPERATION -` with the
domain's XML on stdin, at every step of a domain's life.  A domain without vmgpu's part is
none of its business.  For one with it:

  prepare begin    check the XML, admit the share through vmgpud, create the region file
                   (exact size, initialised header, poll wait mode: the guest is another
                   kernel; root's, mode 0600, readable and writable by QEMU's user and group
                   as libvirt runs it: `qemu_user` in the settings, or qemu.conf's user/group).
                   A refusal exits 1: libvirt refuses to start the domain and shows
                   the reason (this process's stderr) in virsh's error.
  started begin    start the guest's forwarder on the region.  A failure exits 1: libvirt
                   stops the domain again (and calls stopped/release).
  stopped end      stop the forwarder.
  release end      release the share, remove the region file.
  reconnect begin  (libvirtd restarted with the domain running) make sure the forwarder runs.

The domain's name is its guest name, so it must follow vmgpu's one rule (vmgpu/names.py:
letters, digits, '.', '_', '-', at most 64): a vmgpu domain named otherwise is refused at
prepare with that reason (rename it: `virsh domrename`); domains without vmgpu's part are never
looked at.  No name is derived from another: the name in `vmgpu status` is the domain's.

The hook never calls libvirt (libvirtd waits for it: a deadlock), and its calls to vmgpud are
bounded (a few seconds in all).  libvirt gives it no environment to speak of, so its settings
(vmgpud's socket, the backend) are written into the installed script by `vmgpu hooks install`.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import signal
import sys
from pathlib import Path

from vmgpu import config, names, shm
from vmgpu.errors import VmgpuError
from vmgpu.files import write_atomic
from vmgpu.guest_lifecycle import Guest, Lifecycle
from vmgpu.logging import configure_file, get_logger
from vmgpu.virt import domain

KIND = "vm"
HOOK_NAME = "50-vmgpu"
DEFAULTS = {
    "socket": config.SOCKET,
    "backend": "cuda",
    "log": config.HOOK_LOG,
    "shm_dir": config.SHM_DIR,
    "qemu_user": "",  # QEMU's user[:group] as libvirt runs it; default: qemu.conf's, else libvirt's
    "qemu_conf": config.QEMU_CONF,
}
# libvirt's built-in QEMU user where qemu.conf names none (Debian/Ubuntu, then Fedora/RHEL)
LIBVIRT_QEMU_USERS = ("libvirt-qemu", "qemu")


def _client(settings):
    from vmgpu.client import Client

    # bounded: libvirtd waits for the hook, so give up after a few seconds
    return Client(settings["socket"], timeout=5.0, retry_s=3.0)


def region_params() -> shm.Params:
    """A VM's region: the daemon's geometry, waits by polling (no futex across kernels)."""
    return config.region_params("poll")


def _region_path(settings, dev) -> Path:
    return Path(settings["shm_dir"]) / dev["name"]


def _qemu_conf(path: str) -> dict:
    """user and group from a qemu.conf (`user = "NAME"`, `group = "+GID"`), where set."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for key, value in re.findall(r'^\s*(user|group)\s*=\s*"([^"]*)"', text, re.MULTILINE):
        out[key] = value
    return out


def _uid(user: str) -> tuple[int, int]:
    """(uid, primary gid) of a user name or "+UID"."""
    if user.startswith("+") and user[1:].isdigit():
        uid = int(user[1:])
        try:
            return uid, pwd.getpwuid(uid).pw_gid
        except KeyError:
            return uid, uid
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise VmgpuError(f"QEMU's user '{user}' does not exist on this host; set qemu_user in the hook") from None
    return pw.pw_uid, pw.pw_gid


def _gid(group: str) -> int:
    if group.startswith("+") and group[1:].isdigit():
        return int(group[1:])
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise VmgpuError(f"QEMU's group '{group}' does not exist on this host; set qemu_user in the hook") from None


def qemu_identity(settings: dict) -> tuple[int, int]:
    """(uid, gid) QEMU runs as, which must read and write the region: the hook's qemu_user
    setting ("user[:group]"), else qemu.conf's user and group, else libvirt's built-in user."""
    user, group = (settings.get("qemu_user") or "").partition(":")[::2]
    if not user:
        conf = _qemu_conf(settings.get("qemu_conf") or DEFAULTS["qemu_conf"])
        user, group = conf.get("user", ""), group or conf.get("group", "")
    if not user:
        user = next((u for u in LIBVIRT_QEMU_USERS if _exists(u)), "root")
    uid, gid = _uid(user)
    return uid, _gid(group) if group else gid


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _lifecycle(name, dev, settings, log) -> Lifecycle:
    guest = Guest(name, KIND, _region_path(settings, dev), settings["backend"], wait="poll")
    return Lifecycle(_client(settings), guest, log)


def _prepare(name, share, dev, settings, log) -> None:
    """Admit the share (a stale reservation is replaced: the domain is not running, libvirt is
    preparing it) and make the region, exactly the device's size, for QEMU's user only: QEMU
    runs as it (or as root, the owner); its group (kvm, often) has local users in it, who must
    not reach the guests' regions in /dev/shm."""
    uid, _group = qemu_identity(settings)
    with _lifecycle(name, dev, settings, log) as lc:
        size = int(dev["size_mib"]) << 20
        lc.prepare(share.to_text(), size, (uid, None), region_params(), start=False, replace_stale=True)
    log.info("admitted", guest=name, share=share.to_text(), region=str(lc.guest.region))


def _start_forwarder(name, dev, settings, log, only_if_none: bool = False) -> None:
    """Start the guest's forwarder; only_if_none (reconnect): unless one is recorded."""
    with _lifecycle(name, dev, settings, log) as lc:
        pid = lc.ensure_forwarder() if only_if_none else lc.start_forwarder()
    if pid is not None:
        log.info("forwarder started", guest=name, pid=pid)


def _stop(name, dev, settings, log, release: bool) -> None:
    with _lifecycle(name, dev, settings, log) as lc:
        if release:
            lc.release()
        else:
            lc.stop_forwarder()
    log.info("released" if release else "forwarder stopped", guest=name)


def run(args: list[str], xml: str, settings: dict) -> int:
    """One hook call; returns the exit status.  The reason for a refusal goes to stderr."""
    settings = {**DEFAULTS, **settings}
    if len(args) < 2:
        print("vmgpu hook: usage: qemu DOMAIN OPERATION [SUBOPERATION EXTRA]", file=sys.stderr)
        return 2
    name, op = args[0], args[1]
    log = get_logger(hook=op, guest=name)
    if op not in ("prepare", "started", "stopped", "release", "reconnect"):
        return 0
    try:
        share, dev = domain.read(xml)
        if share is None and dev is None:
            return 0  # not a vmgpu guest
        names.check_guest(name, "domain name")
        if op == "prepare":
            share = domain.check(xml)
            _prepare(name, share, dev, settings, log)
        elif op == "started":
            _start_forwarder(name, dev, settings, log)
        elif op == "reconnect":
            _start_forwarder(name, dev, settings, log, only_if_none=True)
        elif dev is not None:
            _stop(name, dev, settings, log, release=(op == "release"))
        return 0
    except VmgpuError as e:
        log.error("failed", error=e.message, code=e.code)
        if op in ("stopped", "release"):
            return 0  # libvirt ignores it anyway; the reason is in the log
        print(f"vmgpu: domain {name} cannot start: {e.message} [{e.code}]", file=sys.stderr)
        return 1


def main(argv: list[str], stdin, settings: dict) -> int:
    """The installed script's entry point (SCRIPT below)."""
    merged = {**DEFAULTS, **settings}
    configure_file(merged["log"])
    return run(argv, stdin.read(), merged)


# ---- installing ------------------------------------------------------------------------


SCRIPT = """#!{python}
# vmgpu's libvirt qemu hook (libvirt runs it as: qemu DOMAIN OPERATION SUBOPERATION EXTRA, with the
# domain's XML on stdin), written by `vmgpu setup` or `vmgpu hooks install`: the first line names
# the Python that has vmgpu (libvirt runs hooks with a bare PATH).  What it does: vmgpu/virt/hook.py.
import sys

SETTINGS = {settings!r}

if __name__ == "__main__":
    from vmgpu.virt.hook import main

    sys.exit(main(sys.argv[1:], sys.stdin, SETTINGS))
"""


def script_text(settings: dict, python: str | None = None) -> str:
    """The hook script as installed: run by python (default: this one), with these settings."""
    return SCRIPT.format(python=python or sys.executable, settings={**DEFAULTS, **settings})


def _libvirtd_pids() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "libvirtd":
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def hook_path(hooks_dir: str | Path) -> Path:
    return Path(hooks_dir) / "qemu.d" / HOOK_NAME


def reload_libvirtd() -> list[int]:
    """Send every running libvirtd SIGHUP: it looks for qemu hooks only at start-up and on SIGHUP
    (a hook added later is otherwise ignored until it restarts).  The pids signalled."""
    signalled = []
    for pid in _libvirtd_pids():
        try:
            os.kill(pid, signal.SIGHUP)
            signalled.append(pid)
        except OSError:
            continue
    return signalled


def install(hooks_dir: str | Path, settings: dict, reload: bool = True, python: str | None = None) -> dict:
    """Write the hook into HOOKS_DIR/qemu.d/ (run by python, default this one) and, if libvirtd
    runs, send it SIGHUP (reload_libvirtd)."""
    path = write_atomic(hook_path(hooks_dir), script_text(settings, python), 0o755)
    return {"path": str(path), "libvirtd_reloaded": reload_libvirtd() if reload else []}


def uninstall(hooks_dir: str | Path) -> bool:
    path = hook_path(hooks_dir)
    if not path.exists():
        return False
    path.unlink()
    return True
