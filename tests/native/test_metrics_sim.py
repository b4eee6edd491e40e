"""What an operator monitors, on the simulated backend: vmgpud's Prometheus metrics of what
guests use (memory used, GPU time, throttled time, OOM refusals, forwarder restarts), read from
the forwarders it runs, and the forwarder's log lines, each stamped with the time."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.forwarder import NATIVE, forwarder, guest_env, hold, run_guest, stop_server, wait_for
from tests.unit.test_daemon import INVENTORY
from vmgpu import stats
from vmgpu.client import Client
from vmgpu.daemon import serve

pytestmark = pytest.mark.native

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"


@pytest.fixture
def vmgpud(tmp_path, sched_dir, monkeypatch):
    """An in-process vmgpud with its metrics endpoint; yields (client, server, scrape), where
    scrape() is {(sample name, sorted label items): value} of one scrape."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")  # each simulated context takes 32 MiB, measured
    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    server, ledger = serve(tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db", inv, metrics_port=0)
    url = f"http://127.0.0.1:{server.metrics_http.server_port}/metrics"

    def scrape() -> dict:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    try:
        yield Client(str(tmp_path / "run" / "vmgpud.sock")), server, scrape
    finally:
        stop_server(server, ledger)


def _key(name: str, guest: str, gpu: str = "0", uuid: str = UUID0) -> tuple:
    return (name, (("gpu", gpu), ("guest", guest), ("uuid", uuid)))


def test_metrics_show_the_memory_a_guest_holds_exactly_as_its_forwarders_charges(vmgpud, shm_path):
    c, server, scrape = vmgpud
    c.admit("g", "container", "gpu=0,mem=1G,compute=50")
    c.start_forwarder("g", str(shm_path), backend="sim", size="256M")
    used = _key("vmgpu_guest_memory_used_bytes", "g")
    assert scrape()[used] == 0  # a guest that has run nothing holds nothing
    p = hold(shm_path, 64)
    try:
        assert p.stdout.readline().startswith("held"), p.stderr.read()
        charges = stats.read(server.supervisor.stats_path("g"))["memory"][0]["used"]
        assert charges == (64 + 32) << 20  # its allocation and its context
        assert scrape()[used] == charges
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert wait_for(lambda: scrape()[used] == 0)  # given back when the process ends


def test_metrics_count_gpu_time_and_the_time_a_capped_guest_waited_for_its_turn(vmgpud, shm_path):
    c, _server, scrape = vmgpud
    c.admit("g", "container", "gpu=0,mem=1G,compute=30")
    c.start_forwarder("g", str(shm_path), backend="sim", size="256M")
    gpu_time, throttled = (
        _key("vmgpu_guest_gpu_time_seconds_total", "g"),
        _key("vmgpu_guest_throttled_seconds_total", "g"),
    )
    before = scrape()
    assert before[gpu_time] == 0 and before[throttled] == 0
    assert c.set_policy("0", "fixed").live  # a hard cap of 30% of the time, even alone on the card
    spin = run_guest([NATIVE / "spin", 2], shm_path, timeout=60)
    assert spin.returncode == 0 and int(spin.stdout.split()[1]) > 0, spin.stdout + spin.stderr
    after = scrape()
    assert after[gpu_time] > 0
    # capped at 30%, a guest that wants the GPU all of 2 s waits for most of them (about 1.4 s)
    assert after[throttled] > 0.3, after


def test_a_busy_guest_alone_on_the_gpu_shows_its_gpu_time_while_it_runs(vmgpud, shm_path):
    c, _server, scrape = vmgpud
    c.admit("g", "container", "gpu=0,mem=1G,compute=50")
    c.start_forwarder("g", str(shm_path), backend="sim", size="256M")
    gpu_time = _key("vmgpu_guest_gpu_time_seconds_total", "g")
    spin = subprocess.Popen([str(NATIVE / "spin"), "4"], env=guest_env(shm_path), stdout=subprocess.PIPE, text=True)
    try:
        # alone and busy, it keeps one turn the whole run: that turn counts before it ends
        assert wait_for(lambda: scrape()[gpu_time] > 0.5 and spin.poll() is None, timeout=3.5), scrape()[gpu_time]
    finally:
        spin.communicate(timeout=60)
    assert spin.returncode == 0


def test_an_allocation_over_the_quota_is_counted_as_an_oom_refusal(vmgpud, shm_path):
    c, _server, scrape = vmgpud
    c.admit("g", "container", "gpu=0,mem=256M,compute=50")
    c.start_forwarder("g", str(shm_path), backend="sim", size="256M")
    refusals = _key("vmgpu_guest_oom_refusals_total", "g")
    assert scrape()[refusals] == 0
    r = run_guest([NATIVE / "hold", 512], shm_path)
    assert r.stdout.split() == ["alloc", "failed"], r.stdout + r.stderr
    assert scrape()[refusals] == 1
    ok = run_guest([NATIVE / "hold", 0], shm_path)  # what fits is not counted
    assert ok.returncode == 0 and scrape()[refusals] == 1


def test_a_forwarder_killed_under_vmgpud_is_counted_as_restarted(vmgpud, shm_path):
    c, _server, scrape = vmgpud
    c.admit("g", "container", "gpu=0,mem=1G,compute=50")
    pid = c.start_forwarder("g", str(shm_path), backend="sim", size="256M")
    restarts = ("vmgpu_forwarder_restarts_total", (("guest", "g"),))
    assert scrape()[restarts] == 0
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: [f.pid for f in c.status().forwarders if f.state == "running"] not in ([], [pid]))
    assert scrape()[restarts] == 1
    assert wait_for(lambda: run_guest([NATIVE / "hold", 0], shm_path).returncode == 0)
    assert c.release("g") is True
    assert restarts not in scrape()  # a released guest's series goes


STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z vmgpu-forwarder\[stamped\] SIMULATED \(no GPU\): ")


def test_every_forwarder_log_line_starts_with_its_utc_time_to_the_millisecond(shm_path):
    start = datetime.now(UTC)
    with forwarder(shm_path, mem="256M", guest="stamped") as fwd:
        assert run_guest([NATIVE / "hold", 512], shm_path).returncode == 1  # an OOM line, among others
        assert wait_for(lambda: "out of memory" in fwd.log() and "closed after" in fwd.log()), fwd.log()
    lines = fwd.log().splitlines()
    assert len(lines) >= 3, lines
    for line in lines:
        m = STAMP.match(line)
        assert m, line
        when = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC)
        assert start - timedelta(seconds=1) <= when <= datetime.now(UTC), line
    assert any(STAMP.sub("", ln).startswith("channel ") and "out of memory on GPU 0" in ln for ln in lines), lines


def test_metrics_show_each_guests_weight_guarantee_cap_and_priority_by_their_own_names(vmgpud):
    c, _server, scrape = vmgpud
    c.admit("a", "container", "gpu=0,mem=1G,weight=30,guarantee=20%,cap=60%,priority=high")
    c.admit("b", "container", "gpu=0,mem=1G,compute=50")  # the old name of weight: reserves nothing

    def share(guest: str, name: str, **extra) -> float | None:
        return scrape().get((name, tuple(sorted({"gpu": "0", "guest": guest, **extra}.items()))))

    assert share("a", "vmgpu_guest_compute_weight") == 30
    assert share("a", "vmgpu_guest_compute_guarantee_percent") == 20
    assert share("a", "vmgpu_guest_compute_cap_percent") == 60
    assert share("a", "vmgpu_guest_compute_priority", priority="high") == 1
    assert share("b", "vmgpu_guest_compute_weight") == 50
    assert share("b", "vmgpu_guest_compute_guarantee_percent") == 0
    assert share("b", "vmgpu_guest_compute_cap_percent") is None  # no cap: no sample, never "0%"
    assert share("b", "vmgpu_guest_compute_priority", priority="normal") == 1
    assert scrape()[("vmgpu_gpu_compute_reserved_percent", (("gpu", "0"), ("uuid", UUID0)))] == 20
    assert not any(name == "vmgpu_guest_compute_percent" for name, _ in scrape())  # the old, misleading name
    # a live change is what the next scrape shows
    c.set_weight("a", "0", 70)
    c.set_priority("a", "0", "low")
    assert share("a", "vmgpu_guest_compute_weight") == 70
    assert share("a", "vmgpu_guest_compute_priority", priority="low") == 1
    assert share("a", "vmgpu_guest_compute_priority", priority="high") is None
