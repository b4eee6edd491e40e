"""The GPU-host halves of the VM (issue 6) and container (issue 8) end-to-end checks: a TCG
guest under a portable QEMU, and the container root file system in its own mount namespace,
each running nvcc-built programs through vmgpu on the real GPU (tests/gpu/hostrun.py).

They need the pack built on a dev machine: `python3 -m tests.gpu.hostrun pack .carry/hostrun`,
carried to the GPU host (or VMGPU_HOSTRUN_PACK naming another folder)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forwarder import ROOT
from vmgpu.forwarder import gpu_present

PACK = Path(os.environ.get("VMGPU_HOSTRUN_PACK", ROOT / ".carry" / "hostrun"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here"),
    pytest.mark.skipif(not (PACK / "guest.cpio").exists(), reason=f"no hostrun pack at {PACK}"),
]


@pytest.mark.parametrize("what", ["vm", "container"])
def test_programs_compute_correctly_through_vmgpu(what):
    r = subprocess.run(
        [sys.executable, "-m", "tests.gpu.hostrun", what, str(PACK)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "all programs correct through vmgpu on the GPU" in r.stdout
