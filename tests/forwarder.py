"""Test helpers around vmgpu.forwarder: a forwarder per test, programs run through it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vmgpu.errors import ForwarderError
from vmgpu.forwarder import Forwarder, guest_env

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "build" / "native"
GUEST_LIB = NATIVE / "guest"
PTX = ROOT / "tests" / "cuda" / "vadd.ptx"

__all__ = [
    "ASAN",
    "GUEST_LIB",
    "NATIVE",
    "PTX",
    "ROOT",
    "environ",
    "forwarder",
    "guest_env",
    "hidden_devices",
    "hold",
    "log_text",
    "memquota",
    "run_guest",
    "start_daemon",
    "stop_server",
    "wait_for",
    "worker_pids",
]


ASAN = ROOT / "build" / "asan"


@contextlib.contextmanager
def environ(**values: str):
    """os.environ with these values set, as it was again afterwards (what a started process gets)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def forwarder(
    region: Path,
    backend: str = "sim",
    mem: str | None = None,
    size: str | None = "256M",
    extra=(),
    asan: bool = False,
    guest: str | None = None,
    env: dict | None = None,
    may_refuse: bool = False,
    keep_region: bool = False,
):
    """A forwarder serving a fresh region (size None: the region at region); yields it (its .proc
    is the process, .log() what it logged, .stop() its exit status).  asan: the forwarder and
    simulated driver of the ASan/UBSan build, whose log must end free of sanitizer reports and of
    the checks that build adds (a worker's charges changed outside a call).
    env: set in the forwarder's environment.  may_refuse: a forwarder that exits instead of
    serving is yielded (its .proc ended) rather than an error.  keep_region: leave the region
    file at the end (by default it is removed)."""
    fwd = Forwarder(region, backend=backend, mem=mem, size=size, guest=guest, extra=tuple(extra))
    values = dict(env or {})
    if asan:
        if not (ASAN / "vmgpu-forwarder").exists():
            raise RuntimeError("build/asan is missing: run `make native-asan`")
        values["VMGPU_LIBDIR"] = str(ASAN)  # only while it starts: guests use build/native
    try:
        with environ(**values):
            fwd.start()
    except ForwarderError:
        if not may_refuse:
            raise
    try:
        yield fwd
    finally:
        fwd.stop()
        if region.exists() and not keep_region:
            region.unlink()
    if asan:
        text = fwd.log()
        assert "AddressSanitizer" not in text and "runtime error" not in text, text
        assert "outside a call" not in text, text  # (quota.c's in_call, checked in this build)


def log_text(fwd: Forwarder) -> str:
    return fwd.log()


# a guest process on a machine with a GPU sees none of the driver's device files: in a mount
# namespace of its own each is covered by /dev/null, and each directory of them (/dev/nvidia-caps,
# the MIG capabilities) by an empty read-only tmpfs, so only vmgpu can reach the GPU
HIDE_DEVICES = (
    "for f in /dev/nvidia*; do "
    'if [ -d "$f" ]; then mount -t tmpfs -o ro,mode=0 none "$f"; else mount --bind /dev/null "$f"; fi || exit 97; '
    'done; exec "$@"'
)


def hidden_devices(argv: list[str]) -> list[str]:
    """argv run with /dev/nvidia* hidden where this machine has them (root is needed to hide
    them, and a test that must hide them and cannot fails: it never runs with them visible)."""
    if not list(Path("/dev").glob("nvidia*")):
        return argv
    if os.geteuid() != 0:
        raise RuntimeError("hiding /dev/nvidia* from a guest process needs root (a mount namespace)")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", HIDE_DEVICES, "sh", *argv]


def run_guest(
    args, region: Path, timeout: float = 120, input: str | None = None, **extra
) -> subprocess.CompletedProcess:
    """args through vmgpu (the guest library and this region), /dev/nvidia* hidden."""
    return subprocess.run(
        hidden_devices([str(a) for a in args]),
        env=guest_env(region, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def hold(region: Path, mib: int) -> subprocess.Popen:
    """tests/cuda/hold.c through vmgpu: allocates mib MiB, prints "held FREE TOTAL", then one
    more 1 MiB allocation per line written to its stdin, printing "alloc <CUresult>"."""
    p = subprocess.Popen(
        [str(NATIVE / "hold"), str(mib)],
        env=guest_env(region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return p


def wait_for(pred, timeout: float = 15.0) -> bool:
    """Poll pred until it holds or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


# poll(2) and ppoll(2) by machine: the calls a process waits in between its turns
_POLL_CALLS = {"x86_64": {7, 271}, "aarch64": {73}}


def stop_at_rest(pid: int, tries: int = 500) -> None:
    """SIGSTOP pid at a moment every thread of it waits in poll, so that it holds none of the locks
    it shares with its workers (a supervisor stopped inside its 16 ms sweep of the IPC table would
    hang a worker on that table's lock, not on the supervisor's socket, which is what tests of a
    silent supervisor mean).  Stopped elsewhere, it is let go and stopped again."""
    calls = _POLL_CALLS[os.uname().machine]
    tasks = Path(f"/proc/{pid}/task")
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        assert wait_for(lambda: all(_state(t) == "T" for t in tasks.iterdir()), 5), "the process did not stop"
        if all(int((t / "syscall").read_text().split()[0]) in calls for t in tasks.iterdir()):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)
    raise AssertionError(f"process {pid} was never stopped at rest in {tries} tries")


def _state(task: Path) -> str:
    return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]


def start_daemon(sock: Path, db: Path, inventory: Path) -> subprocess.Popen:
    """`vmgpu daemon` as a process (so a test can kill -9 it), answering once its socket exists."""
    if os.path.exists(sock):
        os.unlink(sock)  # what a supervisor restarting vmgpud finds: the dead one's socket
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmgpu.cli.main",
            "daemon",
            "--socket",
            str(sock),
            "--db",
            str(db),
            "--inventory",
            str(inventory),
            "--metrics-port",
            "0",
        ],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        assert p.poll() is None and time.monotonic() < deadline, "vmgpud did not start"
        time.sleep(0.02)
    return p


def worker_pids(fwd: Forwarder) -> list[int]:
    """The forwarder's worker processes (one per guest process it serves)."""
    pid = fwd.proc.pid
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def memquota(fwd: Forwarder, region: Path, seed: int, rounds: int, cubin: Path, paths: str, check) -> dict:
    """Run tests/cuda/memquota.c through fwd: at each stop ("FULL ..." after taking memory
    until refused, "EMPTY" at the end) call check(fields, worker_pids) while the program
    waits.  Returns the refusals per path over all rounds."""
    p = subprocess.Popen(
        [str(NATIVE / "memquota"), str(seed), str(rounds), str(cubin), paths],
        env=guest_env(region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    refused: dict[str, int] = {}
    try:
        for line in p.stdout:
            words = line.split()
            assert words and words[0] in ("FULL", "EMPTY"), line + p.stderr.read() + fwd.log()
            fields = dict(w.split("=", 1) for w in words[1:])
            for item in fields.get("ooms", "").split(","):
                if item:
                    k, n = item.split(":")
                    refused[k] = refused.get(k, 0) + int(n)
            check(words[0], fields, worker_pids(fwd))
            p.stdin.write("\n")
            p.stdin.flush()
        assert p.wait(timeout=60) == 0, p.stderr.read() + fwd.log()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return refused


@contextlib.contextmanager
def vmgpud_in_process(tmp_path: Path, inventory, settings=None):
    """vmgpud (vmgpu.daemon.serve) on tmp_path/run/vmgpud.sock, its ledger and forwarders' logs
    under tmp_path/lib, and a client of it: yields (socket path, client, procs), procs a list for
    the test's guest processes; at the end they are killed, the client closed and vmgpud stopped
    with every forwarder it started."""
    from vmgpu.client import Client
    from vmgpu.daemon import serve

    sock = tmp_path / "run" / "vmgpud.sock"
    server, ledger = serve(sock, tmp_path / "lib" / "ledger.db", inventory, settings=settings)
    c, procs = Client(str(sock)), []
    try:
        yield sock, c, procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
        c.close()
        stop_server(server, ledger)


def stop_server(server, ledger) -> None:
    """Stop an in-process vmgpud (vmgpu.daemon.serve) and every forwarder it started."""
    server.stop(grace=None).wait()
    server.socket_claim.release()
    if getattr(server, "metrics_http", None):
        server.metrics_http.shutdown()
    server.supervisor.close()
    for fwd in list(server.supervisor.children.values()):
        fwd.stop()
    ledger.close()
