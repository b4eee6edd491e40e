"""2D and 3D copies and 2D memsets (host_forwarder/native/copy2d.c, guest_agent/libcuda/copy2d.c) on
the simulated backend and the ASan/UBSan forwarder: the GPU suite's program (tests/cuda/copy2d.c,
results checked against the CPU), and the boundary: every byte a pitched side reaches is this guest
process's own device memory, its own array, or its own pinned memory; extents that overflow, rows
past an allocation, another process's memory and host memory past the heap are refused before
the driver sees them, for the async variants too (the error is reported at the next synchronising
call, as CUDA does).  The simulated backend has no arrays: the program runs with "noarray", and an
array side is checked only for being the process's own."""

import subprocess

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env
from tests.native.guest_process import PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 400, 801
HOST, DEVICE, ARRAY, UNIFIED = 1, 2, 3, 4

# A guest process (ctypes on the guest's libcuda.so.1): one command per line, "<CUresult> [value]".
GUEST = (
    PRELUDE
    + r"""

class C2(ctypes.Structure):  # CUDA_MEMCPY2D
    _fields_ = [("srcXInBytes", sz), ("srcY", sz), ("srcMemoryType", ctypes.c_int), ("srcHost", P),
                ("srcDevice", u64), ("srcArray", P), ("srcPitch", sz), ("dstXInBytes", sz), ("dstY", sz),
                ("dstMemoryType", ctypes.c_int), ("dstHost", P), ("dstDevice", u64), ("dstArray", P),
                ("dstPitch", sz), ("WidthInBytes", sz), ("Height", sz)]

class C3(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [("srcXInBytes", sz), ("srcY", sz), ("srcZ", sz), ("srcLOD", sz), ("srcMemoryType", ctypes.c_int),
                ("srcHost", P), ("srcDevice", u64), ("srcArray", P), ("reserved0", P), ("srcPitch", sz),
                ("srcHeight", sz), ("dstXInBytes", sz), ("dstY", sz), ("dstZ", sz), ("dstLOD", sz),
                ("dstMemoryType", ctypes.c_int), ("dstHost", P), ("dstDevice", u64), ("dstArray", P),
                ("reserved1", P), ("dstPitch", sz), ("dstHeight", sz), ("WidthInBytes", sz), ("Height", sz),
                ("Depth", sz)]

keep = []
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], w[1:]
    out = ""
    if op == "alloc":
        p = u64()
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), sz(int(a[0])))
        out = p.value
    elif op == "pinned":
        p = P()
        r = cuda.cuMemAllocHost_v2(ctypes.byref(p), sz(int(a[0])))
        out = p.value
    elif op == "pageable":
        b = ctypes.create_string_buffer(int(a[0]))
        keep.append(b)
        r, out = 0, ctypes.addressof(b)
    elif op in ("copy2d", "copy2d_async", "copy3d", "copy3d_async"):  # field=value ...
        c = (C2 if op.startswith("copy2d") else C3)()
        for kv in a:
            k, v = kv.split("=")
            setattr(c, k, int(v, 0))
        if op == "copy2d":
            r = cuda.cuMemcpy2D_v2(ctypes.byref(c))
        elif op == "copy2d_async":
            r = cuda.cuMemcpy2DAsync_v2(ctypes.byref(c), None) or cuda.cuCtxSynchronize()
        elif op == "copy3d":
            r = cuda.cuMemcpy3D_v2(ctypes.byref(c))
        else:
            r = cuda.cuMemcpy3DAsync_v2(ctypes.byref(c), None) or cuda.cuCtxSynchronize()
    elif op in ("memset8", "memset32", "memset8_async", "memset16_async"):  # dst pitch value width height
        dst, pitch, v, wd, ht = (int(x, 0) for x in a)
        fn = {"memset8": cuda.cuMemsetD2D8_v2, "memset32": cuda.cuMemsetD2D32_v2,
              "memset8_async": cuda.cuMemsetD2D8Async, "memset16_async": cuda.cuMemsetD2D16Async}[op]
        args = [u64(dst), sz(pitch), ctypes.c_uint(v), sz(wd), sz(ht)]
        r = fn(*args, None) or cuda.cuCtxSynchronize() if op.endswith("async") else fn(*args)
    elif op == "null2d":
        r = cuda.cuMemcpy2D_v2(None)
    elif op == "sync":
        r = cuda.cuCtxSynchronize()
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)

MiB = 1 << 20


def test_the_gpu_suites_program_copies_and_sets_rectangles_as_the_cpu_does(shm_path):
    """tests/cuda/copy2d.c through the ASan/UBSan forwarder: pageable and pinned host memory,
    pitched device memory at offsets, 2D memsets of 8 and 32 bits (one async), a device-to-device
    rectangle, the unaligned variant and a 3D copy of three slices; every result equals the CPU's."""
    with forwarder(shm_path, asan=True) as fwd:
        r = subprocess.run(
            [str(NATIVE / "copy2d"), "noarray"], env=guest_env(shm_path), capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert fwd.proc.poll() is None, fwd.log()
    for s in (
        "result_2d",
        "result_pageable",
        "result_3d",
        "memset2d32_async",
        "dtoh_pinned_async",
        "texture_resource_same",
    ):
        assert f"\n{s} 0\n" in "\n" + r.stdout, (s, r.stdout)
    assert r.stdout.rstrip().endswith("copy2d ok")


def fields(**kw) -> list[str]:
    return [f"{k}={v}" for k, v in kw.items()]


def test_a_pitched_side_is_refused_unless_every_byte_it_reaches_is_the_processs_own(shm_path, guests):
    """Device sides: rows that run past a 1 MiB allocation (by y, by x, by pitch), a pitch times a
    height that overflows, an x offset that wraps, a 3D slice past the end, another process's
    allocation, and an address that is nobody's: each refused with CUDA_ERROR_INVALID_VALUE, sync
    and async alike, and the same copy within bounds succeeds.  An array side that is not the
    process's own is CUDA_ERROR_INVALID_HANDLE; an unknown memory type INVALID_VALUE."""
    with forwarder(shm_path, asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        dev = int(a.ok("alloc", MiB))
        src = int(a.ok("alloc", MiB))
        for _ in range(3):  # B's third allocation lies past A's two (both start at the same place)
            other = int(b.ok("alloc", MiB))
        base = dict(
            srcMemoryType=DEVICE,
            srcDevice=src,
            srcPitch=1024,
            dstMemoryType=DEVICE,
            dstDevice=dev,
            dstPitch=1024,
            WidthInBytes=1024,
            Height=1024,
        )
        assert a("copy2d", *fields(**base)) == (SUCCESS, "")
        assert a("copy2d_async", *fields(**base)) == (SUCCESS, "")
        refused = {
            "one row too many": dict(base, Height=1025),
            "y past the end": dict(base, dstY=1),
            "x past the row": dict(base, dstXInBytes=1),
            "pitch too long": dict(base, dstPitch=1025),
            "pitch times height overflows": dict(base, dstPitch=1 << 62, Height=8),
            "x wraps": dict(base, srcXInBytes=(1 << 64) - 512, WidthInBytes=1024, Height=1),
            "another process's": dict(base, dstDevice=other),
            "nobody's": dict(base, srcDevice=0x10000),
        }
        for name, f in refused.items():
            assert a("copy2d", *fields(**f))[0] == INVALID_VALUE, name
            assert a("copy2d_async", *fields(**f))[0] == INVALID_VALUE, name
        assert a("copy2d", *fields(**dict(base, srcMemoryType=ARRAY, srcArray=0x1234)))[0] == INVALID_HANDLE
        assert a("copy2d", *fields(**dict(base, srcMemoryType=9)))[0] == INVALID_VALUE
        assert a("null2d")[0] == INVALID_VALUE
        slab = dict(
            srcMemoryType=DEVICE,
            srcDevice=src,
            srcPitch=512,
            srcHeight=512,
            dstMemoryType=DEVICE,
            dstDevice=dev,
            dstPitch=512,
            dstHeight=512,
            WidthInBytes=512,
            Height=512,
            Depth=4,
        )
        assert a("copy3d", *fields(**slab)) == (SUCCESS, "")
        assert a("copy3d", *fields(**dict(slab, dstZ=1)))[0] == INVALID_VALUE  # the 5th slice
        assert a("copy3d", *fields(**dict(slab, Depth=5)))[0] == INVALID_VALUE
        assert a("copy3d_async", *fields(**dict(slab, dstHeight=1 << 61)))[0] == INVALID_VALUE
        assert a("copy3d", *fields(**dict(slab, srcZ=(1 << 64) - 1)))[0] == INVALID_VALUE
        assert fwd.proc.poll() is None, fwd.log()


def test_host_memory_is_its_own_pinned_memory_or_moved_by_the_guest_library(shm_path, guests):
    """A pinned side whose rows run past the region's heap is refused (the host reaches no memory
    but the guest's own pinned memory); pageable memory, which the host cannot reach, is moved by
    the guest library (rows through the 1D copies), including a NULL pageable pointer (refused)."""
    with forwarder(shm_path, asan=True) as fwd:
        (a,) = [guests(shm_path, 0, GUEST)]
        dev = int(a.ok("alloc", MiB))
        pinned = int(a.ok("pinned", 4096))
        pageable = int(a.ok("pageable", 64 * 1024))
        ok = dict(
            srcMemoryType=HOST,
            srcHost=pinned,
            srcPitch=64,
            dstMemoryType=DEVICE,
            dstDevice=dev,
            dstPitch=64,
            WidthInBytes=64,
            Height=64,
        )
        assert a("copy2d", *fields(**ok)) == (SUCCESS, "")
        assert a("copy2d", *fields(**dict(ok, srcPitch=1 << 40, Height=2)))[0] == INVALID_VALUE
        assert a("copy2d_async", *fields(**dict(ok, srcPitch=1 << 40, Height=2)))[0] == INVALID_VALUE
        assert a("copy2d", *fields(**dict(ok, srcY=1 << 50, Height=1)))[0] == INVALID_VALUE
        moved = dict(ok, srcHost=pageable, srcPitch=1024)
        assert a("copy2d", *fields(**moved)) == (SUCCESS, "")
        assert a("copy2d_async", *fields(**moved)) == (SUCCESS, "")
        assert a("copy2d", *fields(**dict(moved, srcHost=0)))[0] == INVALID_VALUE
        assert a("copy2d", *fields(**dict(moved, srcPitch=32)))[0] == INVALID_VALUE  # rows overlap
        assert a("copy2d", *fields(**dict(moved, dstY=16384 - 63)))[0] == INVALID_VALUE  # the last row past 1 MiB
        assert fwd.proc.poll() is None, fwd.log()


def test_a_2d_memset_reaches_only_the_processs_own_memory(shm_path, guests):
    """2D memsets: within a 1 MiB allocation they succeed; a row past it, a 32-bit width whose byte
    count overflows, a height times pitch that overflows, another process's allocation and, with
    nothing to set, an address that is nobody's are refused (async too)."""
    with forwarder(shm_path, asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        dev = int(a.ok("alloc", MiB))
        for _ in range(2):
            other = int(b.ok("alloc", MiB))
        assert a("memset8", dev, 1024, 7, 1024, 1024) == (SUCCESS, "")
        assert a("memset32", dev, 1024, 7, 256, 1024) == (SUCCESS, "")
        assert a("memset8_async", dev, 1024, 7, 1024, 1024) == (SUCCESS, "")
        assert a("memset8", dev, 1024, 7, 1024, 1025)[0] == INVALID_VALUE
        assert a("memset8", dev + 1, 1024, 7, 1024, 1024)[0] == INVALID_VALUE
        assert a("memset32", dev, 1024, 7, 257, 1024)[0] == INVALID_VALUE
        assert a("memset32", dev, 1 << 62, 7, 1 << 62, 1)[0] == INVALID_VALUE  # width * 4 overflows
        assert a("memset8", dev, 1 << 62, 7, 16, 8)[0] == INVALID_VALUE
        assert a("memset8", other, 1024, 7, 16, 1)[0] == INVALID_VALUE
        assert a("memset16_async", other, 1024, 7, 16, 1)[0] == INVALID_VALUE
        assert a("memset8", 0x10000, 1024, 7, 0, 0)[0] == INVALID_VALUE
        assert a("memset8", dev, 1024, 7, 0, 0) == (SUCCESS, "")
        assert fwd.proc.poll() is None, fwd.log()
