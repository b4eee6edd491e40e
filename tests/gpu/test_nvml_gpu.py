"""The guest NVML on a real GPU: a guest with an 8 GiB slice, its /dev/nvidia* hidden, runs pynvml,
the driver's own nvidia-smi and PyTorch's NVML helpers and sees its quota, its usage and its
processes, and nothing of another guest holding memory on the same GPU beside it.

Run on the GPU host: `make native && python3 -m pytest -m gpu tests/gpu/test_nvml_gpu.py`
(VMGPU_GPU_OUT=DIR keeps every program's output there, for the record).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.forwarder import HIDE_DEVICES, NATIVE, forwarder, guest_env, log_text
from vmgpu.forwarder import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]
MIB = 1 << 20

# the guest's view: the driver's device files bound over with /dev/null in a private mount namespace
HIDDEN = ["unshare", "-m", "--propagation", "private", "sh", "-c", HIDE_DEVICES, "sh"]

HOLD = (
    "import sys, torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
    "print('held', flush=True)\nsys.stdin.read()"
)
BUSY = (
    "import time, torch\na = torch.randn(4096, 4096, device='cuda')\nprint('busy', flush=True)\nt = time.time()\n"
    "while time.time() - t < 6:\n    a = (a @ a).clamp_(-1, 1)\ntorch.cuda.synchronize()"
)
PYNVML = r"""
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
print(json.dumps({"count": n.nvmlDeviceGetCount(), "name": n.nvmlDeviceGetName(h), "total": m.total, "used": m.used,
    "free": m.free, "procs": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
    "util": n.nvmlDeviceGetUtilizationRates(h).gpu, "temp": n.nvmlDeviceGetTemperature(h, 0),
    "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000, "driver": n.nvmlSystemGetDriverVersion()}))
"""
# the platform check vLLM does with pynvml before it picks CUDA
VLLM = r"""
import pynvml
pynvml.nvmlInit()
try:
    hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    print("cuda", [pynvml.nvmlDeviceGetName(h) for h in hs], [pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in hs])
finally:
    pynvml.nvmlShutdown()
"""
TORCH = r"""
import json, os, torch
x = torch.ones(1 << 20, device="cuda")
print(json.dumps({"pid": os.getpid(), "used": torch.cuda.device_memory_used(), "procs": torch.cuda.list_gpu_processes(),
    "util": torch.cuda.utilization()}))
"""


def guest(region: Path, *args, timeout=120, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [*HIDDEN, *[str(a) for a in args]], env=guest_env(region), capture_output=True, text=True, timeout=timeout
    )
    keep(" ".join(str(a) for a in args)[:60], r.stdout + r.stderr)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def keep(name: str, text: str) -> None:
    out = os.environ.get("VMGPU_GPU_OUT")
    if out:
        safe = "".join(c if c.isalnum() else "_" for c in name)
        Path(out, f"nvml-{safe}.txt").write_text(text)


def start(region: Path, *args) -> subprocess.Popen:
    p = subprocess.Popen(
        [*HIDDEN, *[str(a) for a in args]],
        env=guest_env(region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    assert line.startswith("held"), line + p.stderr.read()
    return p


def host_utilization() -> int:
    """The whole GPU's utilization as the host's own NVML sees it (for the record)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0)).gpu
    finally:
        pynvml.nvmlShutdown()


def guest_pid(p: subprocess.Popen) -> int:
    """The pid of the program unshare's sh exec'd: the Popen's own pid."""
    return p.pid


def test_a_guest_sees_its_own_slice_through_pynvml_nvidia_smi_and_pytorch(shm_path, tmp_path):
    smi = shutil.which("nvidia-smi")
    assert smi, "nvidia-smi is not on PATH on this GPU host"
    other = Path(f"{shm_path}-other")
    with (
        forwarder(shm_path, backend="cuda", size="1G", mem="8G") as fwd,
        forwarder(other, backend="cuda", size="1G", mem="4G"),
    ):
        stranger = start(other, sys.executable, "-c", HOLD)  # another guest, 1 GiB
        mine = start(shm_path, sys.executable, "-c", HOLD)  # this guest: a 1 GiB tensor
        small = start(shm_path, NATIVE / "hold", 256)  # and a driver-API program holding 256 MiB
        try:
            view = json.loads(guest(shm_path, sys.executable, "-c", PYNVML).stdout)
            table = guest(shm_path, smi).stdout
            listing = guest(shm_path, smi, "-L").stdout
            query = guest(
                shm_path, smi, "--query-gpu=name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"
            ).stdout
            apps = guest(shm_path, smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv").stdout
            vllm = guest(shm_path, sys.executable, "-c", VLLM).stdout
            torch_view = json.loads(guest(shm_path, sys.executable, "-c", TORCH).stdout.splitlines()[-1])
            own = guest(shm_path, NATIVE / "guest" / "vmgpu-smi").stdout
        finally:
            for p in (stranger, mine, small):
                p.stdin.close()
                p.wait(timeout=60)
        # the share of the GPU's time: a busy guest process, sampled while it runs
        busy = subprocess.Popen(
            [*HIDDEN, sys.executable, "-c", BUSY], env=guest_env(shm_path), stdout=subprocess.PIPE, text=True
        )
        assert busy.stdout.readline().strip() == "busy"
        time.sleep(1.5)  # a second of samples of it at work
        util = json.loads(guest(shm_path, sys.executable, "-c", PYNVML).stdout)["util"]
        host_util = host_utilization()
        busy.wait(timeout=60)
        log = log_text(fwd)
    keep(
        "summary",
        json.dumps({"pynvml": view, "torch": torch_view, "busy_util": util, "host_util": host_util}, indent=1),
    )
    assert "SIMULATED" not in log
    pids = {p: b for p, b in view["procs"]}
    # the slice: 8 GiB total; used = what its two processes hold (contexts included), nothing else
    assert view["count"] == 1 and view["total"] == 8 << 30
    assert set(pids) == {guest_pid(mine), guest_pid(small)}, view
    assert pids[guest_pid(mine)] >= 1 << 30 and pids[guest_pid(small)] >= 256 * MIB
    assert view["used"] == sum(pids.values()) and view["free"] == view["total"] - view["used"]
    assert guest_pid(stranger) not in pids
    assert view["temp"] > 0 and view["power_w"] > 0 and view["driver"].count(".") == 2
    # the driver's nvidia-smi on top of it
    assert re.search(rf"\b{view['used'] >> 20}MiB /\s+8192MiB", table), table
    assert f"{guest_pid(mine)}" in table and f"{guest_pid(small)}" in table and f"{guest_pid(stranger)}" not in table
    assert listing.startswith("GPU 0: " + view["name"]), listing
    name, total, used, free = query.strip().split(", ")
    assert (name, int(total), int(used), int(free)) == (
        view["name"],
        8192,
        view["used"] >> 20,
        8192 - (view["used"] >> 20),
    )
    assert f"{guest_pid(mine)}, python" in apps and f"{guest_pid(small)}, hold, " in apps, apps
    assert f"{guest_pid(stranger)}," not in apps
    assert vllm.startswith("cuda ['" + view["name"]) and "(9, 0)" in vllm, vllm
    # PyTorch's NVML helpers: its own process appears, with the others of this guest only
    assert torch_view["used"] >= view["used"] and str(torch_view["pid"]) in torch_view["procs"]
    assert str(guest_pid(stranger)) not in torch_view["procs"]
    assert "quota MiB" in own and "8192" in own
    # a guest alone on the card, busy with matrix products: the card's time is its time
    assert util > 0 and abs(util - host_util) <= 10, (util, host_util)
