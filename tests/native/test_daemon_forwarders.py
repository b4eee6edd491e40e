"""vmgpud supervising forwarders (simulated backend): a forwarder started for an admitted
guest serves it with its quota, survives kill -9 of vmgpud and is adopted, is restarted if
it dies, and is stopped when the guest is released."""

import json
import os
import signal

import pytest

from tests.forwarder import NATIVE, hold, run_guest, start_daemon, wait_for
from tests.unit.test_daemon import INVENTORY
from vmgpu.client import Client
from vmgpu.forwarder import is_forwarder

pytestmark = pytest.mark.native


def test_forwarder_lifecycle_under_vmgpud(tmp_path, shm_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    sock, db = tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db"
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
        server.stop(grace=None).wait()
        server.supervisor.close()
        for fwd in list(server.supervisor.children.values()):
            fwd.stop()
        ledger.close()
