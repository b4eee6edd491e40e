"""`vmgpu setup`: put vmgpu's host pieces in place, each run by the Python of this installed
package (a wheel's, never a checkout's: a moved or deleted checkout would break every VM start
and GPU container):

  vmgpud's systemd unit      /etc/systemd/system/vmgpud.service  (where systemd runs; elsewhere
                             the foreground command to run under the host's own init is shown)
  the libvirt qemu hook      /etc/libvirt/hooks/qemu.d/50-vmgpu   (where libvirt is installed)
  the OCI runtime for docker /usr/local/bin/vmgpu-container-runtime, registered in
                             /etc/docker/daemon.json               (where docker is installed)
  `vmgpu` on PATH            /usr/local/bin/vmgpu                  (where the package's own
                             `vmgpu` is in a virtual environment's bin/)

Every path is under `root` (default /; a test or an image build passes another).  A file is
written under a fresh name and renamed into place (vmgpu/files.py), never through a symbolic
link: a link anywhere on the way below root is refused before anything is written.  A file
already as it should be is left alone (a second run changes nothing), and `dry_run` only says
what would change.  `uninstall` removes what setup wrote, and only that."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import vmgpu
from vmgpu import config, oci
from vmgpu.errors import InvalidArgument, UnsafePath
from vmgpu.files import write_atomic
from vmgpu.virt import hook

UNIT_PATH = "/etc/systemd/system/vmgpud.service"
UNIT_NAME = "vmgpud.service"
BIN_PATH = "/usr/local/bin/vmgpu"
MARK = "# written by `vmgpu setup`"  # a file without it at BIN_PATH is someone else's
UNIT = """{mark}; `vmgpu setup --uninstall` removes it
[Unit]
Description=vmgpud: vmgpu's GPU share ledger for VMs and containers
Before=libvirtd.service docker.service

[Service]
Type=simple
ExecStart={command}
Restart=on-failure
RestartSec=2
# the forwarders vmgpud starts serve on while it stops or restarts (it adopts them again): a
# stop, restart or crash of vmgpud ends vmgpud alone, never every guest's GPU
KillMode=process
NoNewPrivileges=yes
ProtectSystem=full
ProtectKernelTunables=yes
ProtectControlGroups=yes
RestrictRealtime=yes

[Install]
WantedBy=multi-user.target
"""
BIN = """#!{python}
{mark}: the `vmgpu` of {package}
import sys

if __name__ == "__main__":  # a multiprocessing child (spawn) imports this file again
    from vmgpu.cli.main import main

    sys.exit(main())
"""


@dataclass
class Options:
    root: Path = Path("/")
    python: str = sys.executable
    socket: str = config.SOCKET
    backend: str = "cuda"
    init: str = "auto"  # systemd | none | auto (systemd where it runs)
    hook: bool | None = None  # None: where libvirt is installed
    runtime: bool | None = None  # None: where docker is installed
    dry_run: bool = False
    start: bool = True  # enable and start the unit, signal libvirtd (only with root /)
    allow_checkout: bool = False


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    changed: bool = False

    def add(self, action: str, what: str, detail: str = "") -> None:
        self.lines.append(f"{action:<10} {what}" + (f"  ({detail})" if detail else ""))


def package_dir() -> Path:
    return Path(vmgpu.__file__).resolve().parent


def checkout_of(pkg: Path) -> Path | None:
    """The source checkout this package is imported from (an editable install, or a run from the
    tree), or None for an installed one."""
    top = pkg.parent
    return top if (top / "pyproject.toml").exists() or (top / ".git").exists() else None


def daemon_command(opts: Options) -> list[str]:
    cmd = [opts.python, "-m", "vmgpu.cli.main", "daemon"]
    return cmd + (["--socket", opts.socket] if opts.socket != config.SOCKET else [])


def systemd_runs(root: Path) -> bool:
    """Does systemd manage this system (sd_booted(3): /run/systemd/system is a directory)?"""
    return (root / "run/systemd/system").is_dir()


def _under(opts: Options, path: str) -> Path:
    return opts.root / path.lstrip("/")


def _refuse_links(root: Path, path: Path) -> None:
    """Every component of path below root must not be a symbolic link (nothing is written through one)."""
    p = root
    for part in path.relative_to(root).parts:
        p = p / part
        if p.is_symlink():
            raise UnsafePath(
                f"{p} is a symbolic link: vmgpu setup writes no file through a link (replace it with the real "
                "directory or file, or remove it)"
            )


def _write(opts: Options, rep: Report, path: Path, text: str, mode: int, what: str) -> bool:
    """path's content made text (mode), atomically; False: it was so already."""
    _refuse_links(opts.root, path)
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and path.read_text() == text:
            rep.add("unchanged", str(path), what)
            return False
    except FileNotFoundError:
        pass
    if opts.dry_run:
        rep.add("would write", str(path), what)
    else:
        write_atomic(path, text, mode)
        rep.add("wrote", str(path), what)
    rep.changed = True
    return True


def _remove(opts: Options, rep: Report, path: Path, what: str, ours=lambda text: True) -> bool:
    _refuse_links(opts.root, path)
    if not path.exists():
        rep.add("absent", str(path), what)
        return False
    if not path.is_file() or not ours(path.read_text(errors="replace")):
        rep.add("kept", str(path), f"{what}: not vmgpu setup's, left alone")
        return False
    if opts.dry_run:
        rep.add("would remove", str(path), what)
    else:
        path.unlink()
        rep.add("removed", str(path), what)
    rep.changed = True
    return True


def _run(rep: Report, cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        rep.add("failed", " ".join(cmd), (r.stderr.strip() or r.stdout.strip())[-300:])
    else:
        rep.add("ran", " ".join(cmd))


def _check_python(opts: Options) -> None:
    pkg = package_dir()
    tree = checkout_of(pkg)
    if tree and not opts.allow_checkout:
        raise InvalidArgument(
            f"vmgpu runs from the checkout {tree}: a service, hook and runtime run by it break when the checkout "
            "moves; install the wheel (`make wheel`, then `pip install build/dist/vmgpu-*.whl`, e.g. in a venv at "
            "/opt/vmgpu) and run its `vmgpu setup` (--allow-checkout: point them at this checkout anyway)"
        )


def _want(flag: bool | None, present: bool) -> bool:
    return present if flag is None else flag


def _init(opts: Options) -> str:
    if opts.init == "auto":
        return "systemd" if systemd_runs(opts.root) else "none"
    return opts.init


def _live(opts: Options) -> bool:
    """Act on the running system (systemctl, signals): only for root / and a real run."""
    return opts.root == Path("/") and not opts.dry_run and opts.start


def setup(opts: Options) -> Report:
    """Install every piece (module docstring); the report says what was written where."""
    _check_python(opts)
    rep = Report()
    rep.lines.append(f"vmgpu {vmgpu.__version__} from {package_dir()}, run by {opts.python}")
    # vmgpud
    command = " ".join(daemon_command(opts))
    if _init(opts) == "systemd":
        unit = _under(opts, UNIT_PATH)
        changed = _write(opts, rep, unit, UNIT.format(mark=MARK, command=command), 0o644, "vmgpud's systemd unit")
        if _live(opts):
            if changed:
                _run(rep, ["systemctl", "daemon-reload"])
            _run(rep, ["systemctl", "enable", "--now", UNIT_NAME])
        elif not opts.dry_run:
            rep.lines.append(f"start it: systemctl daemon-reload && systemctl enable --now {UNIT_NAME}")
    else:
        rep.add("skipped", "vmgpud's systemd unit", "systemd does not run here")
        rep.lines.append(f"run vmgpud in the foreground, under this host's init or a supervisor: {command}")
    # the qemu hook
    hooks_dir = _under(opts, config.LIBVIRT_HOOKS_DIR)
    if _want(opts.hook, _under(opts, "/etc/libvirt").is_dir()):
        settings = {"socket": opts.socket, "backend": opts.backend}
        text = hook.script_text(settings, opts.python)
        if _write(opts, rep, hook.hook_path(hooks_dir), text, 0o755, "libvirt's qemu hook") and _live(opts):
            pids = hook.reload_libvirtd()
            rep.lines.append(
                f"sent SIGHUP to libvirtd (pid {', '.join(map(str, pids))})"
                if pids
                else "libvirtd is not running; it will find the hook when it starts"
            )
    else:
        rep.add("skipped", "libvirt's qemu hook", "no /etc/libvirt: libvirt is not installed (--hook: install it)")
    # the docker runtime
    if _want(opts.runtime, _under(opts, "/etc/docker").is_dir() or bool(shutil.which("dockerd"))):
        rt = _under(opts, config.RUNTIME_PATH)
        text = oci.script_text({"socket": opts.socket, "backend": opts.backend}, opts.python)
        changed = _write(opts, rep, rt, text, 0o755, "docker's OCI runtime")
        dj = _under(opts, config.DOCKER_DAEMON_JSON)
        _refuse_links(opts.root, dj)
        changed |= _write(opts, rep, dj, oci.daemon_json_text(dj, config.RUNTIME_PATH), 0o644, "runtime 'vmgpu'")
        if changed and not opts.dry_run:
            rep.lines.append("docker reads daemon.json at start-up and on SIGHUP: kill -HUP $(pidof dockerd)")
    else:
        rep.add("skipped", "docker's OCI runtime", "no /etc/docker or dockerd: docker is not installed (--runtime)")
    # `vmgpu` on PATH
    own = Path(opts.python).parent / "vmgpu"
    binp = _under(opts, BIN_PATH)
    if own.parent.resolve() in {Path("/usr/bin"), Path("/usr/local/bin")}:
        rep.add("skipped", str(binp), f"`vmgpu` is {own} already")
    elif binp.exists() and not binp.is_symlink() and MARK not in binp.read_text(errors="replace"):
        rep.add("kept", str(binp), "someone else's `vmgpu`, left alone")
    else:
        _write(opts, rep, binp, BIN.format(python=opts.python, mark=MARK, package=package_dir()), 0o755, "`vmgpu`")
    return rep


def uninstall(opts: Options) -> Report:
    """Remove what setup writes: the unit (stopped and disabled first), the hook, the runtime and
    its daemon.json entry (the rest kept), the `vmgpu` on PATH; files not setup's are left alone."""
    rep = Report()
    unit = _under(opts, UNIT_PATH)
    if unit.is_file() and not unit.is_symlink() and _live(opts) and shutil.which("systemctl"):
        _run(rep, ["systemctl", "disable", "--now", UNIT_NAME])
    if _remove(opts, rep, unit, "vmgpud's systemd unit", lambda t: MARK in t) and _live(opts):
        _run(rep, ["systemctl", "daemon-reload"])
    _remove(opts, rep, hook.hook_path(_under(opts, config.LIBVIRT_HOOKS_DIR)), "libvirt's qemu hook")
    _remove(opts, rep, _under(opts, config.RUNTIME_PATH), "docker's OCI runtime", lambda t: "vmgpu.oci" in t)
    dj = _under(opts, config.DOCKER_DAEMON_JSON)
    _refuse_links(opts.root, dj)
    if dj.is_file():
        _write(
            opts, rep, dj, oci.daemon_json_text(dj, None), stat.S_IMODE(dj.stat().st_mode), "runtime 'vmgpu' removed"
        )
    _remove(opts, rep, _under(opts, BIN_PATH), "`vmgpu`", lambda t: MARK in t)
    return rep
