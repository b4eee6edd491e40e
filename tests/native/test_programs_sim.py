"""Unchanged CUDA programs through the forwarder on the simulated backend (the driver-API
program, an nvcc program with static cudart, several GPUs, `vmgpu demo`), the content cache of
module images, and what a program sees with no region or when the forwarder is lost."""

import json
import signal
import subprocess
import sys

import pytest

from tests.forwarder import (
    NATIVE,
    PTX,
    ROOT,
    forwarder,
    hold,
    log_text,
    run_guest,
    wait_for,
)

pytestmark = pytest.mark.native


def test_driver_api_program_runs_through_the_forwarder(shm_path):
    with forwarder(shm_path, mem="2G") as fwd:
        r = run_guest([NATIVE / "drv_api", PTX, 24], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 unexpected" in r.stdout
    assert "vadd result" in r.stdout and "UNEXPECTED" not in r.stdout and "WRONG" not in r.stdout
    log = log_text(fwd)
    # the simulated backend says so, on every line
    assert all("SIMULATED (no GPU)" in ln for ln in log.splitlines() if ln.startswith("vmgpu-forwarder"))
    assert "closed after" in log and "its memory and objects are freed" in log
    assert "SIMULATED backend" in r.stderr


def test_unchanged_nvcc_program_runs_through_the_forwarder(shm_path):
    """Static cudart: bootstrap through cuGetProcAddress and the export tables, then real work."""
    with forwarder(shm_path):
        r = run_guest([NATIVE / "vecadd_ptx", 300000], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "vecadd ok n=300000"


def test_module_image_crosses_once(shm_path):
    """A second process loading the same fatbin gets it from the forwarder's content cache."""
    with forwarder(shm_path) as fwd:
        for _ in range(2):
            r = run_guest([NATIVE / "vecadd_ptx", 1000], shm_path)
            assert r.returncode == 0, r.stdout + r.stderr
        assert wait_for(lambda: log_text(fwd).count("closed after") == 2)
    log = log_text(fwd)
    assert "module images: 1 sent, 0 from cache" in log
    assert "module images: 0 sent, 1 from cache" in log


def test_guest_gpus_map_to_the_host_gpus_given(shm_path, monkeypatch):
    """--gpus 2,0 on a host with three GPUs: the guest sees two, in that order, each with its quota."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "3")
    with forwarder(shm_path, mem="1G,2G", extra=["--gpus", "2,0"]):
        r = run_guest([NATIVE / "multi"], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "devices 2"
    # the simulated UUIDs end in host ordinal + 1; PCI bus ids are 0x42 + ordinal
    assert lines[1] == f"device 0 uuid_last=3 pci=00000000:44:00.0 total={1 << 30} data=ok"
    assert lines[2] == f"device 1 uuid_last=1 pci=00000000:42:00.0 total={2 << 30} data=ok"


def test_no_region_is_no_device(tmp_path):
    r = run_guest([NATIVE / "hold", 0], tmp_path / "absent")
    assert r.stdout.strip() == "init failed"
    assert "no GPU region at" in r.stderr and "VMGPU_REGION" in r.stderr


def test_lost_forwarder_is_one_sticky_error_not_a_hang(shm_path):
    with forwarder(shm_path) as fwd:
        p = hold(shm_path, 16)
        assert p.stdout.readline().startswith("held")
        fwd.proc.send_signal(signal.SIGKILL)
        fwd.proc.wait()
        out, err = p.communicate("one\ntwo\n", timeout=30)
    # CUDA_ERROR_DEVICE_UNAVAILABLE (46), every time after
    assert out.split("\n")[:2] == ["alloc 46", "alloc 46"]
    assert err.count("lost the host forwarder") == 1


def test_vmgpu_demo_runs_programs_and_says_it_is_simulated():
    r = subprocess.run(
        [sys.executable, "-m", "vmgpu.cli.main", "demo", "--backend", "sim", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["simulated"] is True and [p["ok"] for p in d["programs"]] == [True, True]
    assert all("SIMULATED (no GPU)" in ln for ln in d["forwarder_log"])
