"""Differential GPU tests: the same unchanged programs natively and through vmgpu on a real GPU.

Run on the GPU host: `make cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

import ctypes
import os
import subprocess

import pytest

from tests.forwarder import NATIVE, PTX, forwarder, guest_env, log_text, run_guest


def _gpu_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return os.path.exists("/dev/nvidia0")


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu_present(), reason="no NVIDIA GPU and driver here")]


def _native(args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    return subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "program",
    [
        pytest.param([NATIVE / "drv_api", PTX, 256], id="drv_api"),
        pytest.param([NATIVE / "vecadd", 1 << 24], id="vecadd"),
        pytest.param([NATIVE / "matmul", 768], id="matmul"),
    ],
)
def test_same_output_natively_and_through_vmgpu(shm_path, program):
    native = _native(program)
    assert native.returncode == 0, native.stdout + native.stderr
    with forwarder(shm_path, backend="cuda", size="1G") as fwd:
        vm = run_guest(program, shm_path)
        assert vm.returncode == 0, vm.stdout + vm.stderr + log_text(fwd)
    assert vm.stdout == native.stdout
    assert "SIMULATED" not in log_text(fwd)


def test_quota_is_what_the_guest_sees_and_enforced(shm_path):
    with forwarder(shm_path, backend="cuda", mem="2G") as fwd:
        p = subprocess.Popen(
            [str(NATIVE / "hold"), "1536"],
            env=guest_env(shm_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        held = p.stdout.readline().split()
        assert held[0] == "held" and int(held[2]) == 2 << 30, held
        assert int(held[1]) == (2 << 30) - (1536 << 20)
        p.stdin.write("x\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "alloc 0"
        p.kill()
        p.wait()
        log_text(fwd)
