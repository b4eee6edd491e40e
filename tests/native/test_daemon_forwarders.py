"""vmgpud supervising forwarders (simulated backend): a forwarder started for an admitted
guest serves it with its quota, survives kill -9 of vmgpud and is adopted, is restarted if
it dies, and is stopped when the guest is released."""

import json
import os
import re
import signal
import time

import pytest

from tests.forwarder import NATIVE, hold, run_guest, start_daemon, stop_server, wait_for
from tests.unit.test_daemon import INVENTORY
from vmgpu.client import Client
from vmgpu.errors import UnsafePath
from vmgpu.forwarder import is_forwarder

pytestmark = pytest.mark.native


def _paths(tmp_path):
    """A vmgpud's socket, ledger and inventory (written) under tmp_path."""
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    return tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db", inv


def test_forwarder_lifecycle_under_vmgpud(tmp_path, shm_path):
    sock, db, inv = _paths(tmp_path)
    daemon = start_daemon(sock, db, inv)
    pids = []
    try:
        c = Client(str(sock))
        c.admit("guest-a", "container", "gpu=0,mem=1G,compute=50")
        pid = c.start_forwarder("guest-a", str(shm_path), backend="sim", size="256M")
        pids.append(pid)
        assert is_forwarder(pid, shm_path)
        free = run_guest([NATIVE / "hold", 0], shm_path)
        assert free.stdout.split() == ["free", str(1 << 30), str(1 << 30)], free.stdout + free.stderr

        # vmgpud dies hard; the forwarder goes on serving and is adopted by the next vmgpud
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        assert run_guest([NATIVE / "hold", 0], shm_path).returncode == 0
        daemon = start_daemon(sock, db, inv)
        c = Client(str(sock))
        assert [(f.guest, f.pid) for f in c.status().forwarders] == [("guest-a", pid)]

        # a forwarder that dies is started again on the same region
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: [f.pid for f in c.status().forwarders] not in ([], [pid]))
        new = c.status().forwarders[0].pid
        pids.append(new)
        assert wait_for(lambda: run_guest([NATIVE / "hold", 0], shm_path).returncode == 0)

        # release: the forwarder stops and the reservation goes
        assert c.release("guest-a") is True
        assert not is_forwarder(new, shm_path)
        st = c.status()
        assert list(st.forwarders) == [] and list(st.slices) == []
    finally:
        daemon.kill()
        daemon.wait()
        for p in pids:
            if is_forwarder(p, shm_path):
                os.kill(p, signal.SIGKILL)


def test_cli_forwarder_commands(tmp_path, shm_path, monkeypatch):
    from click.testing import CliRunner

    from vmgpu.cli.main import cli
    from vmgpu.daemon import serve

    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")  # as many simulated GPUs as the inventory declares
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    sock = str(tmp_path / "run" / "vmgpud.sock")
    server, ledger = serve(sock, tmp_path / "lib" / "ledger.db", inv)
    run = CliRunner(mix_stderr=False).invoke
    try:
        assert run(cli, ["admit", "g", "gpu=1,mem=512M", "--socket", sock]).exit_code == 0
        r = run(cli, ["forwarder", "start", "g", str(shm_path), "--backend", "sim", "--size", "128M", "--socket", sock])
        assert r.exit_code == 0 and "forwarder for g running" in r.output, r.output + r.stderr
        r = run(cli, ["status", "--json", "--socket", sock])
        assert '"backend": "sim"' in r.output
        r = run(cli, ["status", "--socket", sock])
        assert r.exit_code == 0 and "pid" in r.output and "(sim)" in r.output, r.output + r.stderr
        # what the guest really uses, from the forwarder's statistics page
        p = hold(shm_path, 100)
        assert p.stdout.readline().startswith("held")
        st = json.loads(run(cli, ["status", "--json", "--socket", sock]).output)
        assert st["forwarders"][0]["mem_used_mib"] == [100] and st["forwarders"][0]["processes"] == 1
        assert "100 / 512 MiB" in run(cli, ["status", "--socket", sock]).output
        p.stdin.close()  # the program ends, and its memory is freed with its channel
        p.wait()
        full = ["free", str(512 << 20), str(512 << 20)]
        assert wait_for(lambda: run_guest([NATIVE / "hold", 0], shm_path).stdout.split() == full)
        r = run(cli, ["forwarder", "stop", "g", "--socket", sock])
        assert r.exit_code == 0 and "stopped" in r.output
        r = run(cli, ["forwarder", "start", "nobody", str(shm_path), "--socket", sock])
        assert r.exit_code == 3 and "guest nobody is not admitted" in r.stderr
    finally:
        stop_server(server, ledger)


def _vm_region(path, guest):
    """A VM's region as the qemu hook makes it: poll wait mode (the guest is another kernel)."""
    from vmgpu import shm
    from vmgpu.virt.hook import region_params

    path.unlink(missing_ok=True)
    shm.Region.create(path, 128 << 20, region_params(), guest).close()


def test_a_vms_forwarder_that_dies_is_restarted_with_its_regions_geometry_and_never_dropped(tmp_path, shm_path):
    from click.testing import CliRunner

    from vmgpu.cli.main import cli

    sock, db, inv = _paths(tmp_path)
    daemon = start_daemon(sock, db, inv)
    pids = []
    status = CliRunner(mix_stderr=False).invoke
    try:
        c = Client(str(sock))
        c.admit("vm-a", "vm", "gpu=0,mem=1G")
        _vm_region(shm_path, "vm-a")
        pids.append(c.start_forwarder("vm-a", str(shm_path), backend="sim", size="", wait="poll"))
        assert run_guest([NATIVE / "hold", 0], shm_path).returncode == 0

        os.kill(pids[0], signal.SIGKILL)
        assert wait_for(lambda: [(f.pid != pids[0], f.state) for f in c.status().forwarders] == [(True, "running")])
        pids.append(c.status().forwarders[0].pid)
        r = run_guest([NATIVE / "hold", 0], shm_path)
        assert r.stdout.split() == ["free", str(1 << 30), str(1 << 30)], r.stdout + r.stderr
        log = (db.parent / "forwarders" / "vm-a.log").read_text()
        assert "expected" not in log, log  # no geometry mismatch on the way

        # the region is lost while its forwarder dies: vmgpud keeps trying, and says so
        shm_path.unlink()
        shm_path.write_bytes(b"")
        os.kill(pids[1], signal.SIGKILL)
        assert wait_for(lambda: c.status().forwarders[0].restart_attempt >= 2)
        f = c.status().forwarders[0]
        assert f.state == "restarting" and str(shm_path) in f.restart_error, f
        out = status(cli, ["status", "--socket", str(sock)]).output
        assert "restarting" in out and "(attempt" in out, out
        assert re.search(rf"vm-a: no forwarder, restart attempt \d+: the forwarder for {shm_path}", out), out
        assert (
            json.loads(status(cli, ["status", "--json", "--socket", str(sock)]).output)["forwarders"][0]["state"]
            == "restarting"
        )
        _vm_region(shm_path, "vm-a")  # the region is back: the next attempt serves it
        assert wait_for(lambda: c.status().forwarders[0].state == "running", timeout=40)
        pids.append(c.status().forwarders[0].pid)
        assert wait_for(lambda: run_guest([NATIVE / "hold", 0], shm_path).returncode == 0)

        c.admit("idle", "container", "gpu=1,mem=1G")  # admitted, no forwarder: status says none
        out = status(cli, ["status", "--socket", str(sock)]).output
        assert [ln for ln in out.splitlines() if "idle" in ln and "none" in ln], out
        assert c.release("vm-a") is True
        assert list(c.status().forwarders) == []
    finally:
        daemon.kill()
        daemon.wait()
        for p in pids:
            if is_forwarder(p, shm_path):
                os.kill(p, signal.SIGKILL)


def test_restarts_back_off_instead_of_storming_and_stop_when_the_guest_is_stopped(tmp_path, shm_path):
    import threading

    from vmgpu.supervisor import Supervisor, restart_policy

    ledger = _ledger_with(tmp_path, "vm-b")
    lock = threading.Lock()
    sup = Supervisor(ledger, lock, tmp_path, policy=restart_policy(first_s=0.2, max_s=0.8, settle_s=1.0))
    _vm_region(shm_path, "vm-b")
    started = []
    try:
        with lock:
            started.append(sup.start("vm-b", str(shm_path), "sim", ""))
        sup.watch(interval=0.1)
        # a forwarder that dies at once, every time: each restart must wait longer than the last
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            f = ledger.forwarder("vm-b")
            if f and f[0] not in started and is_forwarder(f[0], shm_path):
                started.append(f[0])
            for p in started:
                if is_forwarder(p, shm_path):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.01)
        # waits 0, 0.2, 0.4, 0.8, 0.8 ...: at most ~7 starts in 4 s (a storm: one per check)
        assert 3 <= len(started) <= 8, started
        assert ledger.forwarder("vm-b") is not None  # never dropped
        assert sup.state("vm-b", *ledger.forwarder("vm-b")[:2])[0] in ("restarting", "running")
        with lock:
            assert sup.stop("vm-b") is True
        assert ledger.forwarder("vm-b") is None and "vm-b" not in sup.restarts
        time.sleep(1.5)  # nothing restarts a stopped guest's forwarder
        assert ledger.forwarder("vm-b") is None
        assert not [p for p in started if is_forwarder(p, shm_path)]
    finally:
        _end_supervisors([sup], started, shm_path, ledger)


def test_stopping_a_killed_forwarder_removes_what_it_left_in_dev_shm(tmp_path, shm_path):
    """A forwarder killed leaves its module image cache in /dev/shm; the next forwarder to start
    on the host would remove it, but a guest stopped then may have none after it: stopping it
    sweeps (vmgpu-forwarder --sweep, in the background, once the forwarder is gone), and says so
    in the guest's log; so does stopping one that a later vmgpud adopted (not its child).  A
    forwarder started for the guest ends a sweep under way, which is no error."""
    import threading
    from pathlib import Path

    from vmgpu.supervisor import Supervisor

    ledger = _ledger_with(tmp_path, "vm-c")
    lock = threading.Lock()
    sup = Supervisor(ledger, lock, tmp_path)
    later = None
    _vm_region(shm_path, "vm-c")
    pids = []
    try:
        # vmgpud's own child, killed
        with lock:
            pids.append(sup.start("vm-c", str(shm_path), "sim", ""))
        (cache,) = Path("/dev/shm").glob(f"vmgpu-images-{pids[-1]}.*")
        os.kill(pids[-1], signal.SIGKILL)
        with lock:
            assert sup.stop("vm-c") is True
        assert wait_for(lambda: not cache.exists(), timeout=10), sup.logs.joinpath("vm-c.log").read_text()
        assert wait_for(lambda: not sup.sweeps, timeout=10)  # (reaped)
        log = sup.logs.joinpath("vm-c.log").read_text()
        assert f"vmgpu-forwarder[vm-c] removing the module image cache {cache} of forwarder {pids[-1]}" in log

        # one a later vmgpud adopted, killed (here still a zombie of this process's: it is gone)
        with lock:
            pids.append(sup.start("vm-c", str(shm_path), "sim", ""))
        (cache,) = Path("/dev/shm").glob(f"vmgpu-images-{pids[-1]}.*")
        later = Supervisor(ledger, lock, tmp_path)
        later.adopt()
        os.kill(pids[-1], signal.SIGKILL)
        with lock:
            assert later.stop("vm-c") is True
        assert wait_for(lambda: not cache.exists(), timeout=10), later.logs.joinpath("vm-c.log").read_text()
        assert wait_for(lambda: not later.sweeps, timeout=10)

        # a sweep under way (waiting for a cache held by workers still ending) ended by a start
        import fcntl

        from structlog.testing import capture_logs

        with lock:
            sup.children.pop("vm-c").stop()
            pids.append(sup.start("vm-c", str(shm_path), "sim", ""))
        (cache,) = Path("/dev/shm").glob(f"vmgpu-images-{pids[-1]}.*")
        held = os.open(cache, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(held, fcntl.LOCK_SH)  # (a worker still ending)
        try:
            with capture_logs() as logs:
                os.kill(pids[-1], signal.SIGKILL)
                with lock:
                    assert sup.stop("vm-c") is True
                    (sweep, _) = sup.sweeps["vm-c"]
                assert not wait_for(lambda: sweep.poll() is not None, timeout=0.5)
                with lock:
                    pids.append(sup.start("vm-c", str(shm_path), "sim", ""))
                assert sweep.poll() is not None and "vm-c" not in sup.sweeps
                time.sleep(0.3)
            assert not [e for e in logs if e["log_level"] == "error"], logs
        finally:
            os.close(held)
        # (the new forwarder removes it, once free)
        assert wait_for(lambda: not cache.exists(), timeout=10)
    finally:
        _end_supervisors([sup, later], pids, shm_path, ledger)


def _ledger_with(tmp_path, guest: str):
    """A ledger under tmp_path of the test inventory's GPUs, guest admitted as a VM with 1 GiB."""
    from vmgpu import gpu
    from vmgpu.ledger import Ledger
    from vmgpu.spec import parse

    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.sync_gpus(gpu.inventory(inv))
    ledger.admit(guest, "vm", parse("gpu=0,mem=1G"))
    return ledger


def _end_supervisors(sups: list, pids: list[int], region, ledger) -> None:
    """A test's end: its Supervisors closed (None: not made), every forwarder it started on region
    killed, their children stopped, the ledger closed."""
    for sup in sups:
        if sup is not None:
            sup.close()
    for p in pids:
        if is_forwarder(p, region):
            os.kill(p, signal.SIGKILL)
    for sup in sups:
        for fwd in list(sup.children.values()) if sup is not None else ():
            fwd.stop()
    ledger.close()


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def _oom_scripts(tmp_path):
    """An operator's OOM-script directory (this user's, 0755) with `notify`, which writes what it
    was run with to tmp_path/oom-<guest>.env."""
    d = tmp_path / "oom-scripts"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    script = d / "notify"
    out = tmp_path / "oom"
    script.write_text(
        f"#!/bin/sh\n{{ echo ARG=$1; env | grep ^VMGPU_ | sort; }} > {out}-$1.tmp && mv {out}-$1.tmp {out}-$1.env\n"
    )
    script.chmod(0o755)
    return d, out


def test_the_managed_settings_reach_every_forwarder_vmgpud_starts_and_the_oom_script_runs(
    tmp_path, shm_path, monkeypatch
):
    """The host's settings (vmgpud's options, here by its environment) and the guest's own (its
    share spec) are on the command line of the forwarder vmgpud starts, of the one it restarts
    after a death and of the one it adopts after its own kill -9; the OOM script really runs on
    a refusal, with the guest's identity; `vmgpu status` shows what each forwarder has."""
    from click.testing import CliRunner

    from vmgpu.cli.main import cli

    scripts, _ = _oom_scripts(tmp_path)
    monkeypatch.setenv("VMGPU_OOM_SCRIPTS_DIR", str(scripts))
    monkeypatch.setenv("VMGPU_CTX_RESERVE", "32M")
    monkeypatch.setenv("VMGPU_PEER_TIMEOUT", "7")
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")  # as many simulated GPUs as the inventory declares
    sock, db, inv = _paths(tmp_path)
    daemon = start_daemon(sock, db, inv)
    pids = []
    run = CliRunner(mix_stderr=False).invoke
    try:
        c = Client(str(sock))
        c.admit("guest-s", "container", "gpu=0,mem=256M;oom-script=notify,peer-timeout=30")
        pids.append(c.start_forwarder("guest-s", str(shm_path), backend="sim", size="128M"))
        want = ["--oom-script", str(scripts / "notify"), "--ctx-reserve", str(32 << 20), "--peer-timeout", "30"]

        def has_settings(pid):
            argv = _cmdline(pid)
            return all(argv[argv.index(k) + 1] == v for k, v in zip(want[::2], want[1::2], strict=True))

        assert has_settings(pids[0]), _cmdline(pids[0])
        # a refusal runs the guest's script, with its identity (the context reserve is charged too)
        over = run_guest([NATIVE / "hold", 300], shm_path)
        assert over.returncode == 1 and over.stdout.strip() == "alloc failed", over.stdout + over.stderr
        env_file = tmp_path / "oom-guest-s.env"
        assert wait_for(env_file.exists)
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert env["ARG"] == "guest-s" and env["VMGPU_GUEST"] == "guest-s" and env["VMGPU_QUOTA"] == str(256 << 20)

        # a forwarder that dies is started again with the same settings
        os.kill(pids[0], signal.SIGKILL)
        assert wait_for(lambda: [f.pid for f in c.status().forwarders] not in ([], [pids[0]]))
        pids.append(c.status().forwarders[0].pid)
        assert wait_for(lambda: is_forwarder(pids[1], shm_path)) and has_settings(pids[1]), _cmdline(pids[1])

        # vmgpud dies hard: the next one adopts the forwarder and shows what it was started with
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        daemon = start_daemon(sock, db, inv)
        c = Client(str(sock))
        (f,) = c.status().forwarders
        assert (f.pid, f.oom_script, f.ctx_reserve_bytes, f.peer_timeout_s) == (pids[1], "notify", 32 << 20, 30)
        text = run(cli, ["status", "--socket", str(sock)]).output
        assert f"guest-s (pid {pids[1]}): oom script notify, ctx reserve 32 MiB, peer timeout 30 s" in text, text
        host = "forwarder settings (host): oom script none, ctx reserve 32 MiB, peer timeout 7 s"
        assert f"{host}; OOM scripts in {scripts}" in text, text
        st = json.loads(run(cli, ["status", "--json", "--socket", str(sock)]).output)
        assert st["guests"][0]["settings"] == "oom-script=notify,peer-timeout=30"
        assert st["settings"]["peer_timeout_s"] == 7

        # the forwarder dies while vmgpud is down: the next vmgpud starts it again, settings and all
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        os.kill(pids[1], signal.SIGKILL)
        assert wait_for(lambda: not is_forwarder(pids[1], shm_path))
        daemon = start_daemon(sock, db, inv)
        c = Client(str(sock))
        assert wait_for(lambda: [(f.pid != pids[1], f.state) for f in c.status().forwarders] == [(True, "running")])
        pids.append(c.status().forwarders[0].pid)
        assert has_settings(pids[-1]), _cmdline(pids[-1])

        # a guest without settings of its own gets the host's
        c.admit("guest-h", "container", "gpu=1,mem=256M")
        h = tmp_path / "h.region"
        pids.append(c.start_forwarder("guest-h", str(h), backend="sim", size="128M"))
        argv = _cmdline(pids[-1])
        assert "--oom-script" not in argv and argv[argv.index("--peer-timeout") + 1] == "7", argv
        assert argv[argv.index("--ctx-reserve") + 1] == str(32 << 20), argv
        assert c.release("guest-h") and c.release("guest-s")
    finally:
        daemon.kill()
        daemon.wait()
        for p in pids:
            if is_forwarder(p, shm_path) or is_forwarder(p, tmp_path / "h.region"):
                os.kill(p, signal.SIGKILL)


def test_an_oom_script_made_unsafe_after_admission_stops_the_forwarder_from_starting(tmp_path, shm_path, monkeypatch):
    """The script is checked again at every start: one made writable by others (or replaced by a
    link) after the guest was admitted is refused with the reason, and no forwarder runs it."""
    scripts, _ = _oom_scripts(tmp_path)
    monkeypatch.setenv("VMGPU_OOM_SCRIPTS_DIR", str(scripts))
    sock, db, inv = _paths(tmp_path)
    daemon = start_daemon(sock, db, inv)
    try:
        c = Client(str(sock))
        c.admit("guest-u", "container", "gpu=0,mem=256M;oom-script=notify")
        (scripts / "notify").chmod(0o777)
        with pytest.raises(UnsafePath, match=r"OOM script .*notify belongs to uid \d+ with mode 0777"):
            c.start_forwarder("guest-u", str(shm_path), backend="sim", size="128M")
        assert list(c.status().forwarders) == []
        (scripts / "notify").unlink()
        (scripts / "notify").symlink_to("/bin/sh")
        with pytest.raises(UnsafePath, match="is not a regular file"):
            c.start_forwarder("guest-u", str(shm_path), backend="sim", size="128M")
        assert list(c.status().forwarders) == []
    finally:
        daemon.kill()
        daemon.wait()
