"""cuMemHostRegister in a guest (guest_agent/libcuda/hostmem.c): the host cannot pin memory the program
allocated itself, so registration is kept in the guest library, honestly: copies from and to
registered memory give the right bytes (moved as pageable memory is), its flags and pointer
attributes are answered, a kernel cannot be given it (cuMemHostGetDevicePointer refuses, said once),
and registrations that overlap, cover pinned memory, or name I/O memory are refused as the driver
refuses them.  On the simulated backend and the ASan/UBSan forwarder."""

import pytest

from tests.forwarder import forwarder
from tests.native.guest_process import PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 801
ALREADY_REGISTERED, NOT_REGISTERED = 712, 713
PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY = 1, 2, 4, 8
MEMORY_TYPE, RANGE_START, RANGE_SIZE, HOST_TYPE = 2, 11, 12, 1

GUEST = (
    PRELUDE
    + r"""
bufs = {}
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], [int(x, 0) for x in w[1:]]
    out = ""
    if op == "buffer":  # size: pageable memory of this process, filled with a pattern
        b = ctypes.create_string_buffer(bytes((i * 31 + 7) & 255 for i in range(a[0])), a[0])
        bufs[ctypes.addressof(b)] = b
        r, out = 0, ctypes.addressof(b)
    elif op == "pinned":
        p = P()
        r = cuda.cuMemAllocHost_v2(ctypes.byref(p), sz(a[0]))
        out = p.value
    elif op == "register":  # ptr size flags
        r = cuda.cuMemHostRegister_v2(P(a[0]), sz(a[1]), ctypes.c_uint(a[2]))
    elif op == "unregister":
        r = cuda.cuMemHostUnregister(P(a[0]))
    elif op == "flags":
        f = ctypes.c_uint()
        r = cuda.cuMemHostGetFlags(ctypes.byref(f), P(a[0]))
        out = f.value
    elif op == "devptr":
        d = u64()
        r = cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(d), P(a[0]), 0)
    elif op == "attr":  # attribute ptr
        v = u64()
        r = cuda.cuPointerGetAttribute(ctypes.byref(v), a[0], u64(a[1]))
        out = v.value
    elif op == "roundtrip":  # src dst n: src -> device -> dst, then whether dst equals src
        d = u64()
        r = cuda.cuMemAlloc_v2(ctypes.byref(d), sz(a[2]))
        r = r or cuda.cuMemcpyHtoD_v2(d, P(a[0]), sz(a[2]))
        r = r or cuda.cuMemcpyDtoH_v2(P(a[1]), d, sz(a[2]))
        r = r or cuda.cuMemFree_v2(d)
        out = int(ctypes.string_at(a[0], a[2]) == ctypes.string_at(a[1], a[2]))
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)


def test_registered_memory_copies_correctly_and_is_answered_as_host_memory(shm_path, guests):
    """A registered pageable buffer round-trips through device memory into another registered
    buffer byte for byte; cuMemHostGetFlags gives its flags; its pointer attributes say host
    memory, with its range; cuMemHostGetDevicePointer refuses it (and the log says why, once)."""
    with forwarder(shm_path, asan=True) as fwd:
        g = guests(shm_path, 0, GUEST)
        src, dst = int(g.ok("buffer", 1 << 20)), int(g.ok("buffer", 1 << 20))
        assert g("register", src, 1 << 20, PORTABLE | DEVICEMAP) == (SUCCESS, "")
        assert g("register", dst, 1 << 20, READ_ONLY) == (SUCCESS, "")
        assert g("roundtrip", src, dst, 1 << 20) == (SUCCESS, "1")
        assert g("flags", src + 4096) == (SUCCESS, str(PORTABLE | DEVICEMAP))
        assert g("attr", MEMORY_TYPE, src + 100) == (SUCCESS, str(HOST_TYPE))
        assert g("attr", RANGE_START, src + 100) == (SUCCESS, str(src))
        assert g("attr", RANGE_SIZE, src + 100) == (SUCCESS, str(1 << 20))
        assert g("devptr", src)[0] == NOT_SUPPORTED
        assert g("devptr", dst)[0] == NOT_SUPPORTED
        g.exit()
        assert fwd.proc.poll() is None, fwd.log()
    assert g.proc.returncode == 0


def test_registrations_that_the_driver_refuses_are_refused(shm_path, guests):
    """Overlapping an existing registration (at its start, inside, around it), memory from
    cuMemAllocHost, I/O memory, an unknown flag, NULL, zero bytes and a range that wraps are
    refused with the driver's codes; unregistering anything but a registration's start is
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, and after an unregister the range is plain memory again
    (its flags refused) and may be registered anew."""
    with forwarder(shm_path, asan=True) as fwd:
        g = guests(shm_path, 0, GUEST)
        buf = int(g.ok("buffer", 1 << 16))
        pinned = int(g.ok("pinned", 4096))
        assert g("register", buf + 4096, 8192, 0) == (SUCCESS, "")
        for start, size in ((buf + 4096, 4096), (buf + 8192, 64), (buf, 1 << 16), (buf, 4097)):
            assert g("register", start, size, 0)[0] == ALREADY_REGISTERED, (start - buf, size)
        assert g("register", buf, 4096, 0) == (SUCCESS, "")  # next to it, not over it
        assert g("register", pinned, 4096, 0)[0] == ALREADY_REGISTERED
        assert g("register", buf + 32768, 4096, IOMEMORY)[0] == NOT_SUPPORTED
        assert g("register", buf + 32768, 4096, 0x100)[0] == INVALID_VALUE
        assert g("register", 0, 4096, 0)[0] == INVALID_VALUE
        assert g("register", buf + 32768, 0, 0)[0] == INVALID_VALUE
        assert g("register", (1 << 64) - 4096, 8192, 0)[0] == INVALID_VALUE
        assert g("unregister", buf + 4097)[0] == NOT_REGISTERED
        assert g("unregister", buf + 4096) == (SUCCESS, "")
        assert g("unregister", buf + 4096)[0] == NOT_REGISTERED
        assert g("flags", buf + 4096)[0] == INVALID_VALUE
        assert g("register", buf + 4096, 8192, 0) == (SUCCESS, "")
        assert fwd.proc.poll() is None, fwd.log()
