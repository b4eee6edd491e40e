"""vmgpud's MPS control daemon (vmgpu/mps.py, `vmgpu daemon --mps DIR`), with a stand-in for
nvidia-cuda-mps-control on PATH (this machine has no GPU): its directories made root's and reachable
by no one else, or refused; one daemon started and kept, started again if it dies; a pid file that
names another process not taken for it; and vmgpud's forwarders told to make a guest process an MPS
client only while its GPU is shared.  The real daemon on a GPU: tests/gpu/test_partition_gpu.py."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, guest_env, stop_server, vmgpud_in_process, wait_for
from vmgpu.errors import MpsError, UnsafePath
from vmgpu.mps import PID_FILE, Mps

# a stand-in for the control program: `-d` leaves a daemon behind (stdio closed, its pid in the pipe
# directory) that notes its start and its pipe directory in the log directory and then waits
FAKE = f"""#!{sys.executable}
import os, sys, time
pipe, logs = os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]
if sys.argv[1:] != ["-d"] or os.environ.get("FAKE_MPS_FAIL"):
    print("cannot start: no GPU here", file=sys.stderr)
    sys.exit(1)
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
fd = os.open(os.devnull, os.O_RDWR)
for i in (0, 1, 2):
    os.dup2(fd, i)
with open(os.path.join(logs, "control.log"), "a") as f:
    f.write("started " + pipe + "\\n")
with open(os.path.join(pipe, "{PID_FILE}"), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(1)
"""


@pytest.fixture
def control(tmp_path, monkeypatch):
    """The stand-in on PATH; every daemon it left is killed at the end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "nvidia-cuda-mps-control"
    prog.write_text(FAKE)
    prog.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started: list[Mps] = []
    yield started
    for m in started:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((m.pipe / PID_FILE).read_text()), signal.SIGKILL)


def _starts(m: Mps) -> int:
    log = m.logs / "control.log"
    return sum(line.startswith("started ") for line in log.read_text().splitlines()) if log.exists() else 0


def test_the_daemon_is_started_once_in_directories_only_root_can_reach_and_again_once_it_dies(tmp_path, control):
    m = Mps(tmp_path / "run" / "vmgpu" / "mps")  # (the directories above made too)
    control.append(m)
    pid = m.ensure()
    assert pid == m.pid() and _starts(m) == 1
    assert (m.logs / "control.log").read_text() == f"started {m.pipe}\n"
    for d in (m.dir, m.pipe, m.logs):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert m.ensure() == pid and _starts(m) == 1  # (running: kept, not started again)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: m.pid() is None, timeout=5)
    again = m.ensure()
    assert again != pid and _starts(m) == 2


def test_a_pid_file_naming_another_process_or_garbage_is_not_a_running_daemon(tmp_path, control):
    m = Mps(tmp_path / "mps")
    m.prepare()
    (m.pipe / PID_FILE).write_text(str(os.getpid()))  # (this test's process: not the control program)
    assert m.pid() is None
    (m.pipe / PID_FILE).write_text("12ab\n")
    assert m.pid() is None
    # a process started for another pipe directory (another daemon's) is not it; one for this is
    for pipe, ours in (("/run/other/pipe", False), (str(m.pipe), True)):
        p = subprocess.Popen(["sleep", "30"], env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe})
        try:
            (m.pipe / PID_FILE).write_text(str(p.pid))
            assert (m.pid() == p.pid) == ours, pipe
        finally:
            p.kill()
            p.wait()
    control.append(m)
    assert m.ensure() and _starts(m) == 1  # (so one is started)


def test_an_mps_directory_below_one_others_can_write_is_refused(tmp_path):
    """Someone who can write a directory above it could swap the MPS directory for one of theirs
    after it was checked (not so below a sticky one, such as /tmp)."""
    above = tmp_path / "open"
    above.mkdir()
    above.chmod(0o777)
    with pytest.raises(UnsafePath, match=r"above the MPS directory .* mode 0777"):
        Mps(above / "mps").prepare()
    assert not (above / "mps").exists()
    with pytest.raises(UnsafePath, match="not an absolute path"):
        Mps("run/mps").prepare()


@pytest.mark.parametrize("case", ["open", "link", "file"])
def test_an_mps_directory_others_could_reach_or_a_link_or_a_file_is_refused(tmp_path, case):
    d = tmp_path / "mps"
    if case == "open":
        d.mkdir(mode=0o700)
        d.chmod(0o755)  # (others could reach the control pipe and stop the daemon)
    elif case == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.write_text("")
    with pytest.raises(UnsafePath, match="0755|not a directory"):
        Mps(d).prepare()
    assert not (tmp_path / "elsewhere" / "pipe").exists()


def test_no_control_program_or_one_that_fails_is_one_clear_error(tmp_path, control, monkeypatch):
    m = Mps(tmp_path / "mps")
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(MpsError, match=r"did not start \(.*-d exited 1: cannot start: no GPU here\)"):
        m.ensure()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        m.ensure()


def test_vmgpud_with_mps_starts_the_daemon_makes_clients_only_on_a_shared_gpu_and_restarts_it(tmp_path, control):
    """vmgpud --mps on the simulated backend: the daemon runs as vmgpud starts; a guest's forwarder
    is started with --mps and --mps-when shared, so its process started under weighted is no
    client and one started under shared is; the daemon killed is started again by the watch, and
    it outlives vmgpud."""
    from click.testing import CliRunner

    from vmgpu.cli.main import cli
    from vmgpu.doctor import run_doctor
    from vmgpu.supervisor import HostSettings

    inv = tmp_path / "inventory.toml"
    inv.write_text('[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-00000000000a"\nname = "t"\nmemory = "8G"\n')
    region = tmp_path / "region"
    m = Mps(tmp_path / "mps")
    control.append(m)
    with vmgpud_in_process(tmp_path, inv, HostSettings(mps_dir=str(m.dir))) as (sock, c, _):
        first = m.pid()
        assert first and _starts(m) == 1
        assert (c.status().settings.mps_dir, c.status().settings.mps_pid) == (str(m.dir), first)
        out = CliRunner().invoke(cli, ["status", "--socket", str(sock)]).output
        assert f"MPS control daemon (shared GPUs' guests): {m.dir}, pid {first}" in out, out
        c.admit("g", "process", "gpu=0,mem=1G")
        pid = c.start_forwarder("g", str(region), "sim", "256M")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        i = argv.index(b"--mps")
        assert argv[i + 1 : i + 4] == [str(m.pipe).encode(), b"--mps-when", b"shared"], argv
        log = tmp_path / "lib" / "forwarders" / "g.log"

        def spin():
            p = subprocess.run(
                [str(NATIVE / "spin"), "0.2", "1", "async"], env=guest_env(region), capture_output=True, timeout=60
            )
            assert p.returncode == 0, p.stdout + p.stderr

        spin()
        assert wait_for(lambda: "not an MPS client" in log.read_text(), timeout=10), log.read_text()
        out = CliRunner().invoke(cli, ["policy", "0", "shared", "--socket", str(sock)]).output
        assert "guest processes started from now on run side by side on spans of the SMs" in out, out
        spin()
        time.sleep(0.3)
        assert log.read_text().count("not an MPS client") == 1, log.read_text()

        os.kill(first, signal.SIGKILL)
        # (gone, or already started again: the watch looks every second, and may be quicker than this)
        assert wait_for(lambda: m.pid() != first, timeout=5)
        doctor = {x["name"]: x for x in run_doctor(str(sock))}
        if m.pid() is None:  # (unless the watch was quicker)
            assert doctor["MPS control daemon"]["status"] == "fail", doctor
        assert wait_for(lambda: m.pid() not in (None, first), timeout=10), "the watch starts it again"
        assert _starts(m) == 2
        doctor = {x["name"]: x for x in run_doctor(str(sock))}
        assert doctor["MPS control daemon"]["status"] == "ok", doctor
    assert m.pid(), "the daemon outlives vmgpud (its clients are the running guests' processes)"


def test_a_daemon_that_cannot_be_started_again_is_logged_once_per_outage_not_every_look(tmp_path, monkeypatch):
    """The watch tries every second; while the start keeps failing the same way it says so once."""
    from structlog.testing import capture_logs

    from vmgpu.ledger import Ledger
    from vmgpu.supervisor import HostSettings, Supervisor

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        sup = Supervisor(
            ledger, threading.Lock(), tmp_path / "state", settings=HostSettings(mps_dir=str(tmp_path / "m"))
        )
        with capture_logs() as logs:
            for _ in range(5):
                sup._watch_mps()
        events = [(e["log_level"], e["event"]) for e in logs]
        assert events == [
            ("warning", "mps control daemon restarting"),
            ("error", "mps control daemon restart failed"),
        ], events
    finally:
        ledger.close()


def test_vmgpud_with_mps_gives_two_guests_of_a_shared_gpu_spans_of_its_sms(tmp_path, control, sched_dir):
    """The chain the GPU test runs (tests/gpu/test_mps_gpu.py), on the simulated backend: vmgpud
    --mps, two guests' forwarders, the GPU's policy shared before their processes start; their
    workers are (simulated) MPS clients, so they partition, the page publishes its groups, and
    vmgpud's share controller gives each guest a span, which their work keeps to."""
    from vmgpu.sched import Page
    from vmgpu.supervisor import HostSettings

    inv = tmp_path / "inventory.toml"
    inv.write_text('[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-00000000000b"\nname = "t"\nmemory = "8G"\n')
    m = Mps(tmp_path / "mps")
    control.append(m)
    with vmgpud_in_process(tmp_path, inv, HostSettings(mps_dir=str(m.dir))) as (_, c, procs):
        for g in ("a", "b"):
            c.admit(g, "process", "gpu=0,mem=1G")
            c.start_forwarder(g, str(tmp_path / g), "sim", "256M")
        c.set_policy("0", "shared")
        procs += [
            subprocess.Popen(
                [str(NATIVE / "spin"), "30", "1", "async"], env=guest_env(tmp_path / g), stdout=subprocess.PIPE
            )
            for g in ("a", "b")
        ]
        assert wait_for(lambda: list(sched_dir.glob("vmgpu-sched-*")), timeout=10)
        with Page(next(sched_dir.glob("vmgpu-sched-*"))) as pg:

            def spans() -> bool:
                parts = [x.sm_part for x in pg.members()]
                return pg.sm_groups > 0 and len(parts) == 2 and all(parts)

            assert wait_for(spans, timeout=20), (pg.sm_groups, pg.members())
            calls = {x.guest: x.work_calls for x in pg.members()}
            time.sleep(0.5)
            assert all(x.whole_ms == 0 and x.work_calls > calls[x.guest] for x in pg.members()), pg.members()
        assert all(p.poll() is None for p in procs), "both guests were at work throughout"


def test_vmgpud_told_to_run_an_mps_daemon_it_cannot_start_does_not_start(tmp_path, monkeypatch):
    """vmgpud does not start with settings it cannot apply: --mps with no control program is
    [MPS], and the socket is let go (a vmgpud without --mps then starts on it)."""
    from vmgpu.daemon import serve
    from vmgpu.supervisor import HostSettings

    inv = tmp_path / "inventory.toml"
    inv.write_text('[[gpu]]\nindex = 0\nuuid = "GPU-00000000-0000-0000-0000-00000000000c"\nname = "t"\nmemory = "8G"\n')
    sock, db = tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        serve(sock, db, inv, settings=HostSettings(mps_dir=str(tmp_path / "mps")))
    assert not sock.exists()
    server, ledger = serve(sock, db, inv)
    stop_server(server, ledger)
