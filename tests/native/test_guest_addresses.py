"""Guest addresses at the trust boundary: a hostile guest, writing records straight into its
ring, names host memory of its worker, memory that is not its own and ranges that overrun or
wrap; every one is refused with CUDA_ERROR_INVALID_VALUE before the driver sees it and the
worker goes on serving.  And no reply carries a host address of the worker.  Run against the
ASan/UBSan forwarder on the simulated backend (host_forwarder/tests/guest_addresses.c)."""

import subprocess
import sys

import pytest

from tests.forwarder import ASAN, PTX, ROOT, forwarder, log_text, run_guest

pytestmark = pytest.mark.native


def run_hostile_guest(shm_path, mode):
    guest = ASAN / "tests" / "guest_addresses"
    if not guest.exists():
        pytest.fail("build/asan is missing tests/guest_addresses: run `make native-asan`")
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        r = subprocess.run(
            [str(guest), str(shm_path), str(fwd.proc.pid), mode, str(PTX)], capture_output=True, text=True, timeout=300
        )
        alive = fwd.proc.poll() is None
        status = fwd.stop()
    text = fwd.log()
    assert alive, text
    assert status == 0, text
    return r


def test_a_guest_cannot_name_host_memory_of_its_worker_nor_memory_that_is_not_its_own(shm_path):
    """The worker's stack, heap, static data and its own mapping of the region; an unmapped address; a
    freed allocation; one byte past an allocation; a wrapping range; a range across two allocations;
    another guest process's allocation; past and in an unmapped VMM range: refused by every copy
    (sync, async, HtoD, DtoH, DtoD, unified), memset, address-range and pointer-attribute query and VMM
    call, and pinned memory is not written through the worker's address of it."""
    r = run_hostile_guest(shm_path, "names")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout


def test_no_reply_carries_a_host_address_of_the_worker(shm_path):
    """Allocations, pinned memory's device address (this process's own pointer), pointer attributes,
    VMM handles, address reservations and a module's function tags, compared against the worker's
    /proc/<pid>/maps: none is a host address of the worker."""
    r = run_hostile_guest(shm_path, "replies")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout


def test_pinned_memory_has_the_programs_own_pointer_as_device_address_and_a_kernel_can_use_it(shm_path):
    """cuMemHostGetDevicePointer gives the program its own pointer (natively, with unified addressing,
    the same), a kernel given it computes on pinned memory, and a copy from it works."""
    with forwarder(shm_path) as fwd:
        r = run_guest([sys.executable, ROOT / "tests" / "gpu" / "zero_copy.py", PTX], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr + log_text(fwd)
    assert r.stdout.splitlines() == [
        "device pointer is the host pointer: True",
        "kernel on pinned memory: True",
        "copy from its device address: True",
    ]
