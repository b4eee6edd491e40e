"""Guest addresses on a real GPU.  With unified addressing the driver takes any address of the
worker for host memory, so these are the tests that matter: a raw hostile guest names the
worker's own memory (its stack, heap, static data, its mapping of the region not named as pinned
memory), unmapped addresses and memory that is not its own, and every call is refused with
CUDA_ERROR_INVALID_VALUE while the worker survives; no reply carries a host address of the
worker; and a program whose kernel works on pinned memory (zero copy) gives the native output.

    make native native-asan && python3 -m pytest -m gpu tests/gpu/test_guest_addresses_gpu.py
"""

import subprocess

import pytest

from tests.forwarder import NATIVE, PTX, forwarder, hidden_devices, log_text, run_guest
from tests.gpu.programs import PROGRAMS, run_native
from vmgpu.forwarder import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]


@pytest.mark.parametrize("mode", ["names", "replies"])
def test_a_hostile_guest_cannot_reach_host_memory_of_its_worker_on_a_gpu(shm_path, mode):
    guest = NATIVE / "tests" / "guest_addresses"
    assert guest.exists(), "run `make native` first"
    with forwarder(shm_path, backend="cuda", size="1G") as fwd:
        r = subprocess.run(
            hidden_devices([str(guest), str(shm_path), str(fwd.proc.pid), mode, str(PTX)]),
            capture_output=True,
            text=True,
            timeout=300,
        )
        alive = fwd.proc.poll() is None
        log = log_text(fwd)
    assert alive, log
    assert r.returncode == 0, r.stdout + r.stderr + log
    assert "0 failed" in r.stdout
    assert "SIMULATED" not in log


def test_a_kernel_on_pinned_memory_gives_the_native_output(shm_path):
    program = PROGRAMS["zero-copy"]
    native = run_native(program)
    assert native.returncode == 0, native.stdout + native.stderr
    with forwarder(shm_path, backend="cuda", size="1G") as fwd:
        vm = run_guest(program, shm_path, timeout=300)
        assert vm.returncode == 0, vm.stdout + vm.stderr + log_text(fwd)
    assert vm.stdout == native.stdout
    assert "kernel on pinned memory: True" in vm.stdout
