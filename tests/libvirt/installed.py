"""vmgpu as an operator installs it, for the end-to-end suites (tests/libvirt, tests/docker): the
wheel (`make wheel`, built once per test session) pip-installed into a virtual environment outside
the checkout, `vmgpu setup` run by that environment's `vmgpu` into a test root, and the processes
that libvirt, docker and vmgpud start from what it wrote run where the checkout cannot be reached:
a mount namespace of their own in which an empty, read-only tmpfs lies over the checkout, as if it
had been removed.  `native_of(pid)` then says which programs and libraries a process of them runs,
so a test can see that they are the installed package's."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what the installed pieces run with: nothing that points at the checkout (no PYTHONPATH, no cwd in it)
CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
UNIT = "etc/systemd/system/vmgpud.service"
HOOK = "etc/libvirt/hooks/qemu.d/50-vmgpu"
RUNTIME = "usr/local/bin/vmgpu-container-runtime"


def hidden(cmd: list[str], binds: tuple[tuple[Path, str], ...] = (), empty: tuple[str, ...] = ()) -> list[str]:
    """cmd run in a mount namespace of its own where the checkout is an empty read-only tmpfs, each
    (source, target) of binds is bind-mounted (an installed file where a host has it), and each
    directory of empty that exists is an empty tmpfs."""
    script = " && ".join(
        [
            f"mount -t tmpfs -o ro,mode=0555,size=64k vmgpu-checkout-removed {shlex.quote(str(REPO))}",
            *(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in binds),
            *(f"{{ [ ! -d {q} ] || mount -t tmpfs -o size=1m vmgpu-empty {q}; }}" for q in map(shlex.quote, empty)),
            'exec "$@"',
        ]
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *cmd]


@dataclass(frozen=True)
class Installed:
    venv: Path
    package: Path  # the installed vmgpu package: site-packages/vmgpu

    @property
    def python(self) -> Path:
        """The interpreter the installed `vmgpu` runs with (its script's), which setup names."""
        return Path((self.venv / "bin" / "vmgpu").read_text().splitlines()[0].removeprefix("#!"))

    @property
    def native(self) -> Path:
        return self.package / "_native"

    def vmgpu(self, *args, timeout: int = 300) -> subprocess.CompletedProcess:
        """The installed `vmgpu`, run where the checkout is out of reach."""
        return subprocess.run(
            hidden([str(self.venv / "bin" / "vmgpu"), *map(str, args)]),
            cwd="/",
            env=CLEAN_ENV,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def setup(self, root: Path, socket: Path) -> str:
        """`vmgpu setup` into root: vmgpud's unit, the qemu hook and the docker runtime, for vmgpud
        at socket and the simulated backend; checks each names the installed Python, never the
        checkout.  Its output."""
        (root / "etc" / "libvirt").mkdir(parents=True, exist_ok=True)
        (root / "etc" / "docker").mkdir(parents=True, exist_ok=True)
        r = self.vmgpu(
            "setup", "--root", root, "--init", "systemd", "--no-start", "--hook", "--runtime",
            "--socket", socket, "--backend", "sim",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        for f in (UNIT, HOOK, RUNTIME):
            text = (root / f).read_text()
            assert str(self.python) in text and str(REPO) not in text, (f, text)
        return r.stdout

    def start_daemon(self, root: Path, db: Path, inventory: Path, log: Path, sched: Path) -> subprocess.Popen:
        """vmgpud as the unit `vmgpu setup` wrote starts it (its ExecStart), with a test ledger and
        inventory, where the checkout is out of reach; answering once its socket exists.  Its
        forwarders' scheduler pages go in sched (VMGPU_SCHED_DIR), not the host's /dev/shm/vmgpu,
        so that the test leaves nothing in /dev/shm."""
        (line,) = [ln for ln in (root / UNIT).read_text().splitlines() if ln.startswith("ExecStart=")]
        cmd = shlex.split(line.removeprefix("ExecStart="))
        sock = Path(cmd[cmd.index("--socket") + 1])
        sock.unlink(missing_ok=True)
        with open(log, "ab") as out:
            p = subprocess.Popen(
                hidden([*cmd, "--db", str(db), "--inventory", str(inventory), "--metrics-port", "0"]),
                cwd="/",
                env={**CLEAN_ENV, "VMGPU_SCHED_DIR": str(sched)},
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert p.poll() is None and time.monotonic() < deadline, "vmgpud did not start: " + log.read_text()
            time.sleep(0.05)
        return p

    def host(self, tmp: Path, inventory: str) -> tuple[Path, subprocess.Popen]:
        """A test host: `vmgpu setup` into tmp/root (vmgpud at tmp/run/vmgpud.sock), and vmgpud as
        its unit starts it, on the declared inventory.  (root, vmgpud's process)."""
        inv = tmp / "inventory.toml"
        inv.write_text(inventory)
        root = tmp / "root"
        self.setup(root, tmp / "run" / "vmgpud.sock")
        sched = tmp / "sched"
        sched.mkdir(mode=0o700)
        return root, self.start_daemon(root, tmp / "ledger.db", inv, tmp / "vmgpud.log", sched)


def need_namespace() -> None:
    """Skip unless this process may make a mount namespace (root): where the checkout is hidden."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace hiding the checkout")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"needs a mount namespace (the checkout hidden): {probe.stderr.strip()}")


def native_of(pid: int) -> tuple[Path, set[Path]]:
    """The program a process runs and every file it has mapped (its shared libraries)."""
    exe = Path(os.readlink(f"/proc/{pid}/exe"))
    maps = set()
    for ln in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = ln.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            maps.add(Path(parts[5].removesuffix(" (deleted)")))
    return exe, maps


def _under(p: Path, d: Path) -> bool:
    return p == d or d in p.parents


def assert_runs_installed(pid: int, inst: Installed, must_map: tuple[str, ...] = ()) -> None:
    """The process runs a program of the installed package, maps nothing of the checkout, and maps
    each of must_map (names in the package's _native/)."""
    exe, maps = native_of(pid)
    assert _under(exe, inst.native), f"pid {pid} runs {exe}, not a program of {inst.native}"
    assert not [m for m in maps | {exe} if _under(m, REPO)], f"pid {pid} maps files of the checkout {REPO}"
    for name in must_map:
        assert inst.native / name in maps, f"pid {pid} does not map {inst.native / name}: {sorted(map(str, maps))}"


def assert_python_installed(pid: int, inst: Installed) -> None:
    """The process is the installed package's Python (vmgpud), in / and not in the checkout, with
    the extension modules it loaded (grpc's) from the installed environment, none from the checkout."""
    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0 == str(inst.python), f"pid {pid} runs {argv0}, not {inst.python}"
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    _exe, maps = native_of(pid)
    assert not [m for m in maps if _under(m, REPO)], f"pid {pid} maps files of the checkout {REPO}"
    assert [m for m in maps if _under(m, inst.venv)], f"pid {pid} loaded no extension module of {inst.venv}"


def _ended(pid: str) -> bool:
    """Whether a process has ended: gone, or a zombie its parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def assert_serves_installed(client, daemon_pid: int, inst: Installed) -> None:
    """vmgpud is the installed package's, and so are the guest's forwarder and each of its workers
    (a worker runs the guest's CUDA calls on the installed simulated backend): call it while a
    guest process is served."""
    assert_python_installed(daemon_pid, inst)
    (fwd,) = client.status().forwarders
    assert_runs_installed(fwd.pid, inst)
    children = Path(f"/proc/{fwd.pid}/task/{fwd.pid}/children").read_text().split()
    assert children, "no worker serves the guest's process"
    checked = 0
    for w in children:
        try:
            assert_runs_installed(int(w), inst, must_map=("libvmgpu-simcuda.so",))
            checked += 1
        except FileNotFoundError:
            # the worker of a guest process that ended a moment ago, gone while it was looked at
            # (a container's earlier program), or ended and not yet reaped by its forwarder (a
            # zombie has no exe): only a worker that has ended may be passed over
            assert _ended(w), f"worker {w} is there but could not be read"
    assert checked, f"every worker of the forwarder ({children}) ended while they were looked at"


_installed: Installed | None = None


def installed(tmp_path_factory) -> Installed:
    """The wheel, built once per test session (`make wheel`), installed into a fresh virtual
    environment outside the checkout."""
    global _installed
    if _installed is None:
        r = subprocess.run(["make", "wheel"], cwd=REPO, capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, "make wheel failed:\n" + (r.stdout + r.stderr)[-4000:]
        (wheel,) = (REPO / "build" / "dist").glob("vmgpu-*.whl")
        venv = tmp_path_factory.mktemp("installed") / "opt-vmgpu"
        assert not _under(venv, REPO), venv
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd="/")
        pip = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert pip.returncode == 0, pip.stdout + pip.stderr
        where = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import vmgpu, sys; print(vmgpu.__file__); print(*sys.path)"],
            cwd="/",
            env=CLEAN_ENV,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        package = Path(where[0]).parent
        assert _under(package, venv) and str(REPO) not in where[1], where
        _installed = Installed(venv, package)
    return _installed
