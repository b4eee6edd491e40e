"""Pinned host memory used as a device address (unified addressing), as XLA uses it: a memset
through the pointer cuMemHostAlloc gave writes the guest's own pinned memory, on the simulated
backend; a range that runs past the region's heap is refused, as is one below it (the region's
rings and bulk areas are never a device address)."""

import sys
import textwrap

import pytest

from tests.forwarder import forwarder, run_guest

pytestmark = pytest.mark.native

GUEST = textwrap.dedent(
    """
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemHostAlloc(ctypes.byref(p), 1 << 16, 0) == 0
    words = (ctypes.c_uint32 * 1024).from_address(p.value)
    out = [cuda.cuMemsetD32_v2(ctypes.c_uint64(p.value), ctypes.c_uint(0xABCD1234), ctypes.c_size_t(1024))]
    out.append(int(words[0] == 0xABCD1234 and words[1023] == 0xABCD1234))
    out.append(cuda.cuMemsetD8_v2(ctypes.c_uint64(p.value), ctypes.c_ubyte(0), ctypes.c_size_t(1 << 40)))
    out.append(cuda.cuMemsetD8_v2(ctypes.c_uint64(p.value - (1 << 20)), ctypes.c_ubyte(0), ctypes.c_size_t(4096)))
    print(*out)
    """
)


def test_a_memset_through_pinned_memorys_pointer_writes_it_and_nothing_beyond_the_heap(shm_path):
    with forwarder(shm_path):
        r = run_guest([sys.executable, "-c", GUEST], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # 0: done and written; 1: CUDA_ERROR_INVALID_VALUE for the range past the heap and the one below it
    assert r.stdout.split() == ["0", "1", "1", "1"], r.stdout + r.stderr
