"""TMA descriptors at the trust boundary (host_forwarder/native/tensormap.c), on the simulated
backend, whose encoding puts what it was given in the map's bytes and, like the real driver,
never looks at the memory a map names.  A map is encoded only when the whole region it reaches
is the calling process's own device memory, and the driver's rules for its geometry are kept;
cuTensorMapReplaceAddress moves only a map the host encoded for that process, and only to
memory of its own that holds the map's whole reach."""

import struct
import subprocess
import sys

import pytest

from tests.forwarder import NATIVE, ROOT, forwarder, run_guest
from tests.native.test_generator import raw
from vmgpu import shm

pytestmark = pytest.mark.native

OP_MEM_ALLOC, OP_TILED, OP_REPLACE = 22, 122, 125

GUEST = r"""
import ctypes, sys
from ctypes import POINTER, c_int, c_uint32, c_uint64, c_void_p
cuda = ctypes.CDLL(sys.argv[1])
other = int(sys.argv[2])  # an allocation of another guest process
class Map(ctypes.Structure):
    _fields_ = [("q", c_uint64 * 16)]
P64, P32, PI = POINTER(c_uint64), POINTER(c_uint32), POINTER(c_int)
cuda.cuTensorMapEncodeTiled.argtypes = [POINTER(Map), c_int, c_uint32, c_void_p, P64, P64, P32, P32] + [c_int] * 4
cuda.cuTensorMapEncodeIm2col.argtypes = [POINTER(Map), c_int, c_uint32, c_void_p, P64, P64, PI, PI, c_uint32,
                                         c_uint32, P32] + [c_int] * 4
cuda.cuTensorMapEncodeIm2colWide.argtypes = [POINTER(Map), c_int, c_uint32, c_void_p, P64, P64, c_int, c_int,
                                             c_uint32, c_uint32, P32] + [c_int] * 5
cuda.cuTensorMapReplaceAddress.argtypes = [POINTER(Map), c_void_p]
ctx, dev = c_void_p(), c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
buf, buf2 = c_uint64(), c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(buf2), ctypes.c_size_t(4096)) == 0
A, B = buf.value, buf2.value
def arr(t, xs):
    return (t * len(xs))(*xs) if xs is not None else None
def tiled(addr, dims, strides=(), dtype=0, rank=None, box=None, elem=None, interleave=0, out=True):
    m = Map((c_uint64 * 16)(*[0xAA] * 16))
    n = len(dims)
    r = cuda.cuTensorMapEncodeTiled(ctypes.byref(m) if out else None, dtype, n if rank is None else rank, addr,
                                    arr(c_uint64, dims), arr(c_uint64, list(strides)) if strides else None,
                                    arr(c_uint32, box or [16] * n), arr(c_uint32, elem or [1] * n), interleave, 0, 0, 0)
    return r, m
def im2col(addr, dims, strides, dtype=6):
    m = Map()
    n = len(dims)
    corner = [0] * max(1, n - 2)
    r = cuda.cuTensorMapEncodeIm2col(ctypes.byref(m), dtype, n, addr, arr(c_uint64, dims), arr(c_uint64, strides),
                                     arr(c_int, corner), arr(c_int, corner), 16, 32, arr(c_uint32, [1] * n),
                                     0, 0, 0, 0)
    return r, m
def wide(addr, dims, strides, dtype=6):
    m = Map()
    n = len(dims)
    r = cuda.cuTensorMapEncodeIm2colWide(ctypes.byref(m), dtype, n, addr, arr(c_uint64, dims),
                                         arr(c_uint64, strides), -1, 1, 16, 32, arr(c_uint32, [1] * n), 0, 0, 0, 0, 0)
    return r, m
def replace(m, addr):
    return cuda.cuTensorMapReplaceAddress(ctypes.byref(m) if m is not None else None, addr)
r, m = tiled(A, [4096])
print("whole allocation", r, m.q[0] == A, m.q[2], hex(m.q[1] & 0xFFFFFFFF))
r, m = tiled(A, [16, 64], [64], dtype=7)
print("2d over all of it", r, m.q[2:4], m.q[7], (m.q[11] & 0xFFFF) == 0x0F0F)
print("one byte past", tiled(A, [4097])[0], tiled(A, [1, 257], [16])[0], tiled(A + 16, [4081])[0],
      tiled(A + 16, [4080])[0])
print("not its own", tiled(other, [16])[0], tiled(0x1000, [16])[0], tiled(None, [16])[0],
      tiled(A, [16, 2], [0x10000])[0], tiled(A + 4096, [16])[0])
print("overflow", tiled(A, [1 << 32] * 5, [(1 << 40) - 16] * 4)[0], tiled(A, [(1 << 32) + 1])[0],
      tiled(A, [16, 2], [1 << 40])[0], tiled(A, [16, 1 << 32], [1 << 32])[0])
print("geometry", tiled(A + 8, [16])[0], tiled(A, [16, 2], [24])[0], tiled(A, [0])[0], tiled(A, [16], box=[257])[0],
      tiled(A, [16], box=[0])[0], tiled(A, [16, 2], [16], elem=[1, 9])[0], tiled(A, [16], dtype=99)[0],
      tiled(A + 16, [16, 2, 2], [16, 32], interleave=2)[0], tiled(A, [16, 2], [16], interleave=1)[0],
      tiled(A, [16], interleave=7)[0])
print("dimension 0's element stride, which the driver ignores", tiled(A, [16], elem=[0])[0])
print("rank", tiled(A, [16], rank=0)[0], tiled(A, [16] * 6, [16] * 5)[0], tiled(A, [16], out=False)[0])
r, m = im2col(A, [16, 16, 4], [32, 512])
r2, _ = im2col(A, [16, 16, 9], [32, 512])  # 4608 bytes
print("im2col", r, m.q[0] == A, (m.q[1] >> 32) & 0xF, r2, im2col(A, [16, 16], [32])[0],
      im2col(A + 8, [16, 16, 4], [32, 512])[0])
r, m = wide(A, [16, 16, 4], [32, 512])
print("wide", r, (m.q[1] >> 32) & 0xF, wide(A, [16, 16, 9], [32, 512])[0],
      wide(other, [16, 16, 4], [32, 512])[0])
r, m = tiled(A, [2048])
moved = Map(m.q)
print("replace", r, replace(moved, B), moved.q[0] == B, moved.q[2], replace(moved, A + 2048), moved.q[0] == A + 2048)
print("replace refused", replace(moved, A + 2064), replace(moved, other), replace(moved, A + 8), replace(None, A),
      moved.q[0] == A + 2048)
forged = Map(m.q)
forged.q[2] = 1 << 20  # the same map, said to reach a MiB
print("forged", replace(forged, B), forged.q[0] == B, forged.q[2])
seen = Map(m.q)
print("unchanged map again", replace(seen, B), replace(Map(moved.q), A))
print("map", bytes(m).hex())
"""


def tiled_request(rank: int, addr: int, dims, strides, box, elem, dtype: int = 0) -> bytes:
    """cuTensorMapEncodeTiled's request body as the generated guest half writes it."""

    def array(fmt: str, xs) -> bytes:
        b = struct.pack(f"<Q{len(xs)}{fmt}", len(xs), *xs)
        return b + b"\0" * (-len(b) % 8)

    head = struct.pack("<QIxxxxIxxxxQ", 1, dtype, rank, addr)
    tail = struct.pack("<IxxxxIxxxxIxxxxIxxxx", 0, 0, 0, 0)
    return head + array("Q", dims) + array("Q", strides) + array("I", box) + array("I", elem) + tail


def test_a_tensor_map_is_encoded_only_over_the_processs_own_memory_and_moved_only_as_the_host_encoded_it(shm_path):
    """Through the guest library, against the ASan/UBSan forwarder: a map over all of an allocation
    comes back with the simulated driver's bytes (address, geometry); one byte past the end, another
    process's allocation, an unknown or NULL address, a stride that leaves the allocation, strides and
    dimensions whose reach overflows 64 bits, a misaligned address or stride, a zero or too large
    dimension, box or element stride, an unknown type or interleave, rank 0 or 6 are all
    CUDA_ERROR_INVALID_VALUE and the forwarder stays up; im2col and im2col-wide the same;
    cuTensorMapReplaceAddress moves a map the host encoded to memory that holds its whole reach, and
    again, and refuses any other address, a map whose bytes were changed and a map another process
    was given (logged once per process)."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)  # another guest process, holding three allocations
        try:
            allocs = [raw(chan, OP_MEM_ALLOC, struct.pack("<QQ", 1, 4096), seq=1 + i) for i in range(3)]
            assert all(r == 0 for r, _ in allocs), allocs
            other = struct.unpack_from("<Q", allocs[2][1])[0]  # beyond what the guest below allocates
            r = run_guest([sys.executable, "-c", GUEST, NATIVE / "guest" / "libcuda.so.1", str(other)], shm_path)
            assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
            lines = r.stdout.splitlines()
            assert lines[:-1] == [
                "whole allocation 0 True 4096 0x50414d54",
                "2d over all of it 0 [16, 64] 64 True",
                "one byte past 1 1 1 0",
                "not its own 1 1 1 1 1",
                "overflow 1 1 1 1",
                "geometry 1 1 1 1 1 1 1 1 1 1",
                "dimension 0's element stride, which the driver ignores 0",
                "rank 1 1 1",
                "im2col 0 True 2 1 1 1",
                "wide 0 3 1 1",
                "replace 0 0 True 2048 0 True",
                "replace refused 1 1 1 1 True",
                "forged 1 False 1048576",
                "unchanged map again 0 0",
            ], r.stdout
            # a map the guest process was given is no map of this one's
            guest_map = bytes.fromhex(lines[-1].split()[1])
            assert raw(chan, OP_REPLACE, struct.pack("<Q", 1) + guest_map + struct.pack("<Q", other), seq=10)[0] == 1
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            chan.close()
            region.close()
    # once for each process that gave one (the guest's forged map, the other process's borrowed one)
    assert fwd.log().count("cuTensorMapReplaceAddress refused a tensor map this forwarder did not encode") == 2


def test_a_hostile_guest_cannot_pass_the_rank_or_array_checks_on_the_wire(shm_path):
    """Raw requests, past the guest library's own checks: rank 0 and 6, arrays shorter or longer than
    the rank says, a request cut short, and a NULL map are CUDA_ERROR_INVALID_VALUE on the host; the
    same request well formed is encoded and its 128 bytes come back; the ASan/UBSan forwarder stays up."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            r, rep = raw(chan, OP_MEM_ALLOC, struct.pack("<QQ", 1, 4096), seq=1)
            assert r == 0, rep
            a = struct.unpack_from("<Q", rep)[0]
            good = tiled_request(2, a, [16, 4], [16], [16, 4], [1, 1])
            bad = [
                tiled_request(0, a, [], [], [], []),
                tiled_request(6, a, [16] * 6, [16] * 5, [16] * 6, [1] * 6),
                tiled_request(2, a, [16, 4, 1], [16], [16, 4], [1, 1]),
                tiled_request(2, a, [16, 4], [], [16, 4], [1, 1]),
                tiled_request(2, a, [16, 4], [16, 16], [16, 4], [1, 1]),
                tiled_request(2, a, [16, 4], [16], [16, 4], [1]),
                tiled_request(2, a, [16, 4], [16], [16, 4], [1, 1])[:40],
                struct.pack("<Q", 0) + good[8:],
                tiled_request(1, a, [1 << 62], [], [16], [1]),
            ]
            assert [raw(chan, OP_TILED, b, seq=2 + i)[0] for i, b in enumerate(bad)] == [1] * len(bad)
            r, rep = raw(chan, OP_TILED, good, seq=20)
            assert r == 0 and len(rep) == 128, (r, rep)
            q = struct.unpack("<16Q", rep)
            assert q[0] == a and q[2:4] == (16, 4) and q[7] == 16
            # that map, moved to the end of the allocation it fits in exactly
            r, rep = raw(chan, OP_REPLACE, struct.pack("<Q", 1) + rep + struct.pack("<Q", a + 4096 - 64), seq=21)
            assert r == 0 and struct.unpack_from("<Q", rep)[0] == a + 4096 - 64
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            chan.close()
            region.close()


def test_the_maps_a_process_may_move_are_bounded_and_the_oldest_is_forgotten(shm_path):
    """A guest that encodes map after map holds at most VH_TMAP_KEEP (4096) of them on the host: once
    4096 newer maps were encoded, the first can no longer be moved (refused, logged), the newest can."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            r, rep = raw(chan, OP_MEM_ALLOC, struct.pack("<QQ", 1, 1 << 16), seq=1)
            assert r == 0, rep
            a = struct.unpack_from("<Q", rep)[0]
            maps = []
            for i in range(4097):  # all different: a row of 1..4097 bytes
                r, rep = raw(chan, OP_TILED, tiled_request(1, a, [i + 1], [], [16], [1]), seq=2 + i)
                assert r == 0, (i, r)
                maps.append(rep)
            moved = [
                raw(chan, OP_REPLACE, struct.pack("<Q", 1) + m + struct.pack("<Q", a + 16), seq=5000 + i)[0]
                for i, m in enumerate([maps[0], maps[1], maps[-1]])
            ]
            assert moved == [1, 0, 0]
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            chan.close()
            region.close()
    assert "cuTensorMapReplaceAddress refused a tensor map this forwarder did not encode" in fwd.log()


TILED = (
    'cuTensorMapEncodeTiled = {{ op = 122, class = "sync", host = "custom", out = ["tensorMap"], '
    'address = ["globalAddress"], {} in_array = {{ globalDim = "tensorRank", globalStrides = {}, '
    'boxDim = "tensorRank", elementStrides = "tensorRank" }} }}'
)


@pytest.mark.parametrize(
    "entry, message",
    [
        (TILED.format("bounds = { tensorRank = [0, 5] },", '"tensorRank-1"'), "must keep tensorRank at 1 or more"),
        (TILED.format("", '"tensorRank-1"'), "bounds must keep tensorRank at 1 or more"),
        (TILED.format("bounds = { tensorRank = [1, 5] },", '"tensorRank+1"'), "is not 'count' or 'count-k'"),
        (TILED.format("bounds = { tensorRank = [6, 5] },", '"tensorRank"'), "6 is above 5"),
        (TILED.format("bounds = { globalDim = [1, 5] },", '"tensorRank"'), "which is not a value parameter"),
        (TILED.format("bounds = { tensorRank = [-1, 5] },", '"tensorRank"'), "two numbers >= 0"),
        (TILED.format("", '"tensorRank"').replace('host = "custom", ', ""), 'needs host = "custom"'),
        (
            'cuTensorMapReplaceAddress = { op = 125, class = "sync", host = "custom", address = ["tensorMap"], '
            'inout = ["globalAddress"] }',
            "which is not a void * parameter",
        ),
    ],
)
def test_the_generator_refuses_a_bad_address_bounds_or_count(tmp_path, entry, message):
    """api.toml's kinds for TMA descriptors: a count less a constant needs bounds that keep it at
    zero or more, bounds are two numbers in order on a value parameter, and an address is a void *
    whose range only a hand-written host half can check."""
    spec = tmp_path / "api.toml"
    spec.write_text(f"[handles]\n\n[fn]\n{entry}\n")
    gen = ROOT / "native" / "cuda_api" / "gen.py"
    r = subprocess.run([sys.executable, str(gen), "--check", "--spec", str(spec)], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr, r.stderr
