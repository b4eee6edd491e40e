"""MPS on a real GPU: vmgpud's own MPS control daemon (`vmgpu daemon --mps DIR`, vmgpu/mps.py)
serving the guests of a shared GPU side by side on spans of its SMs, and a forwarder without --mps
that no MPS daemon another user started can serve.  (tests/unit/test_mps.py: the same wiring with a
stand-in for the control program.)

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, hidden_devices, log_text, vmgpud_in_process, wait_for
from vmgpu.forwarder import gpu_present
from vmgpu.mps import CONTROL, Mps
from vmgpu.sched import Page

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here"),
    pytest.mark.skipif(not shutil.which(CONTROL), reason=f"no {CONTROL} here"),
]


def _control(env: dict, command: str, timeout: float = 20) -> str:
    """A command to the control daemon whose pipe directory env names; its answer."""
    out = subprocess.run([CONTROL], input=command + "\n", env=env, capture_output=True, text=True, timeout=timeout)
    return out.stdout.strip()


def _spin(region: Path, secs: str) -> subprocess.Popen:
    return subprocess.Popen(
        hidden_devices([str(NATIVE / "spin"), secs, "64", "async"]), env=guest_env(region), stdout=subprocess.PIPE
    )


def _children(pid: int) -> set[int]:
    with contextlib.suppress(OSError):
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    return set()


def test_vmgpud_with_mps_serves_the_guests_of_a_shared_gpu_as_its_daemons_clients_on_spans(tmp_path, sched_dir):
    """vmgpud --mps: two guests' forwarders on GPU 0, its policy shared before their processes
    start.  Each guest process is a client of vmgpud's MPS server (the daemon lists the two
    forwarders' workers), the share controller gives each a span of the SMs, and neither worker
    leaves the spans for the whole GPU."""
    from vmgpu.supervisor import HostSettings

    m = Mps(tmp_path / "mps")
    try:
        with vmgpud_in_process(tmp_path, None, HostSettings(mps_dir=str(m.dir))) as (_, c, procs):
            assert m.pid(), "vmgpud started no MPS control daemon"
            pids = {}
            for g in ("a", "b"):
                c.admit(g, "process", "gpu=0,mem=8G")
                pids[g] = c.start_forwarder(g, str(tmp_path / g), "cuda", "256M")
            c.set_policy("0", "shared")
            procs += [_spin(tmp_path / "a", "20"), _spin(tmp_path / "b", "20")]
            assert wait_for(lambda: list(sched_dir.glob("vmgpu-sched-*")), timeout=30)
            with Page(next(sched_dir.glob("vmgpu-sched-*"))) as pg:
                assert wait_for(lambda: pg.sm_groups > 4, timeout=30), "no SM groups published"

                def spans() -> dict:
                    parts = {x.guest: x.sm_part for x in pg.members()}
                    return parts if len(parts) == 2 and all(parts.values()) else {}

                assert wait_for(spans, timeout=30), f"the share controller gave no spans: {pg.members()}"
                servers = _control(m.env(), "get_server_list").split()
                assert len(servers) == 1, servers
                clients = {int(p) for p in _control(m.env(), f"get_client_list {servers[0]}").split()}
                workers = _children(pids["a"]) | _children(pids["b"])
                assert len(clients & workers) == 2, (clients, workers)
                time.sleep(2)
                assert all(x.whole_ms == 0 for x in pg.members()), pg.members()
            for p in procs:
                out, _ = p.communicate(timeout=120)
                assert p.returncode == 0 and int(out.split()[1]) > 0, out
            logs = tmp_path / "lib" / "forwarders"
            for g in ("a", "b"):
                text = (logs / f"{g}.log").read_text()
                assert "not an MPS client" not in text and "stays on the whole GPU" not in text, text
    finally:
        _control(m.env(), "quit")


NOBODY = 65534
DEFAULT_PIPE = Path("/tmp/nvidia-mps")  # where the driver looks for a control daemon unless told


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a daemon as another user needs root")
@pytest.mark.skipif(DEFAULT_PIPE.exists(), reason=f"{DEFAULT_PIPE} is in use on this host")
def test_no_mps_daemon_another_user_started_in_the_drivers_default_directory_serves_a_guest(tmp_path):
    """A local user (nobody) runs an MPS control daemon in /tmp/nvidia-mps, which anyone may make.
    A forwarder without --mps names a pipe directory no one can make, so its guest's work runs in
    a context of its own and that daemon hears from nobody; a root CUDA program that names none
    reaches it (what the forwarder is kept from)."""
    logs = Path(tempfile.mkdtemp(prefix="vmgpu-test-mps-log-"))  # (in /tmp: nobody reaches it)
    DEFAULT_PIPE.mkdir(mode=0o700)
    for d in (DEFAULT_PIPE, logs):
        os.chown(d, NOBODY, NOBODY)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(DEFAULT_PIPE), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    try:
        subprocess.run([*as_nobody, CONTROL, "-d"], env=env, check=True, timeout=20)
        assert wait_for(lambda: (DEFAULT_PIPE / "control").exists(), timeout=10)
        control_log = logs / "control.log"
        region = tmp_path / "r"
        with forwarder(region, backend="cuda") as fwd:
            p = subprocess.run(
                hidden_devices([str(NATIVE / "spin"), "0.5", "1", "async"]),
                env=guest_env(region),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert p.returncode == 0 and int(p.stdout.split()[1]) > 0, p.stdout + p.stderr + fwd.log()
        heard = control_log.read_text() if control_log.exists() else ""
        assert "NEW CLIENT" not in heard.upper(), heard
        # the same program natively, as root, naming no pipe directory: the driver goes to that daemon
        native_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
        try:
            p = subprocess.run(
                [str(NATIVE / "spin"), "0.5", "1", "async"], env=native_env, capture_output=True, timeout=30
            )
            native = f"exit {p.returncode}: {(p.stdout + p.stderr).decode(errors='replace').strip()[:300]}"
        except subprocess.TimeoutExpired:
            native = "still waiting after 30 s"
        heard = control_log.read_text() if control_log.exists() else ""
        print(f"the native root program: {native}; nobody's control daemon's log:\n{heard}")
        assert "NEW CLIENT" in heard.upper(), "the check cannot fail: the driver did not look in the default directory"
    finally:
        subprocess.run(["sh", "-c", f"echo quit | {CONTROL}"], env=env, timeout=20, check=False)
        shutil.rmtree(DEFAULT_PIPE, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


def test_a_guest_on_mps_cannot_make_the_host_keep_the_drivers_event_files(tmp_path, shm_path):
    """The driver keeps a process's interprocess events in a root file in /dev/shm and leaves it
    when the process is killed (tests/gpu/test_boundary_gpu.py).  With the worker a client of an
    MPS server, which process makes that file (the client or the server) and under which pid was
    not known.  Natively, an MPS client that makes and exports such an event and is killed shows
    which files appear and which stay; through vmgpu with --mps, once the guest has had its worker
    killed (it truncated its region), no file made since is left, under the worker's pid or any
    other (the MPS server's, which lives on), so a guest doing it again and again cannot fill the
    host's /dev/shm."""
    from tests.gpu.programs import driver_files, maker_gone, native_env
    from tests.native.guest_process import Guest
    from tests.native.test_ipc_sim import GUEST

    m = Mps(tmp_path / "mps")
    m.ensure()
    start = before = driver_files()
    try:
        native = Guest(None, 0, GUEST, lib="libcuda.so.1", env=native_env(**{"CUDA_MPS_PIPE_DIRECTORY": str(m.pipe)}))
        try:
            native.ok("export_event", native.ok("event", 6))
            made = driver_files() - before
            native.kill()
            time.sleep(1)
            stayed = driver_files() - before
            print(f"natively on MPS (client {native.proc.pid:x}): made {sorted(made)}, after the kill {sorted(stayed)}")
        finally:
            native.kill()
        servers = _control(m.env(), "get_server_list").split()
        assert servers, "no MPS server started for the native client: this test proves nothing"
        before = driver_files()
        with forwarder(shm_path, backend="cuda", size="1G", mem="4G", extra=("--mps", str(m.pipe))) as fwd:
            g = Guest(shm_path, 0, GUEST)
            try:
                worker = next(int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w)
                g.ok("export_event", g.ok("event", 6))
                clients = _control(m.env(), f"get_client_list {servers[0]}").split()
                assert str(worker) in clients, (worker, clients, log_text(fwd))
                made = driver_files() - before
                print(f"through vmgpu on MPS (worker {worker:x}): made {sorted(made)}")
                os.truncate(shm_path, 4096)
                assert wait_for(lambda: "served again" in log_text(fwd), timeout=30), log_text(fwd)
                assert wait_for(lambda: not os.path.exists(f"/proc/{worker}"), timeout=30), log_text(fwd)
                time.sleep(1)
                left = driver_files() - before
                print(f"after the worker was reaped: new files {sorted(left)}")
                assert not left, (left, log_text(fwd))  # (none kept under the MPS server's pid either)
            finally:
                g.kill()
    finally:
        _control(m.env(), "quit")
        wait_for(lambda: not m.pid(), timeout=20)
        for name in driver_files() - start:
            if maker_gone(name):
                (Path("/dev/shm") / name).unlink(missing_ok=True)
