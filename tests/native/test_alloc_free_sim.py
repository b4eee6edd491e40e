"""cuMemAlloc and cuMemFree through the guest library on the simulated backend: a free of a live
allocation of the process does not wait for its answer (one round trip per pair), yet the memory
is back before the next allocation, and a free of anything else is answered at once, as the
driver answers it."""

import sys
import textwrap

import pytest

from tests.forwarder import forwarder, run_guest
from vmgpu import stats

pytestmark = pytest.mark.native

GUEST = textwrap.dedent(
    """
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    p, q = ctypes.c_uint64(), ctypes.c_uint64()
    for i in range(200):  # 200 x 48 MiB under a 256 MiB quota: each free is back before the next take
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), 48 << 20)
        assert r == 0, (i, r)
        assert cuda.cuMemFree_v2(p) == 0
    out = [cuda.cuMemFree_v2(p)]  # freed already
    out.append(cuda.cuMemFree_v2(ctypes.c_uint64(0xDEAD0000)))  # never an allocation
    assert cuda.cuMemAlloc_v2(ctypes.byref(q), 1 << 20) == 0
    out.append(cuda.cuMemFreeAsync(q, None))  # stream-ordered: cuMemFree after it is a double free
    out.append(cuda.cuCtxSynchronize())
    out.append(cuda.cuMemFree_v2(q))
    print(*out)
    """
)


def test_a_free_of_a_live_allocation_does_not_wait_and_any_other_is_answered_at_once(shm_path, tmp_path):
    page = tmp_path / "stats"
    with forwarder(shm_path, mem="256M", extra=["--stats", str(page)]):
        r = run_guest([sys.executable, "-c", GUEST], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr
        s = stats.read(page)
    # CUDA_ERROR_INVALID_VALUE (1) at once for the two bad frees and the free after cuMemFreeAsync
    assert r.stdout.split() == ["1", "1", "0", "0", "1"], r.stdout
    # the 200 frees went without a reply; the allocations and the bad frees waited for theirs
    assert s["async_calls"] >= 200, s
    assert s["sync_calls"] < 300, s
    assert s["memory"][0]["used"] <= 256 << 20
