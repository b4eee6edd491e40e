"""Hostile raw requests against 2D/3D copies, 2D memsets and texture/surface objects (ops 189-207;
host_forwarder/native/copy2d.c and texture.c), past the guest library, on the simulated backend and
the ASan/UBSan forwarder.  The wire carries what the guest library never would: HOST-typed sides
naming arbitrary heap offsets (off the heap's ends, wrapping, the region's rings), types that
disagree with the pointer fields they carry, extents whose products and sums overflow, reserved
and "must be 0" fields set, structs cut short or flagged absent, array handles of another kind or
of an array the process destroyed.  Each is refused with its CUresult before the driver sees it,
a well-formed request next to it succeeds (and moves the right bytes), and the forwarder serves on
with a clean sanitizer log."""

import ctypes
import struct

import pytest

from tests.forwarder import forwarder
from tests.native.test_generator import raw
from vmgpu import shm
from vmgpu.errors import VmgpuError

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 400, 801
HOST, DEVICE, ARRAY, UNIFIED = 1, 2, 3, 4
RES_ARRAY, RES_MIPMAP, RES_LINEAR, RES_PITCH2D = 0, 1, 2, 3
U8, FLOAT = 0x01, 0x20
OP_MEM_ALLOC, OP_MEMSET_D8, OP_STREAM_CREATE = 22, 26, 30
OP_ARRAY_CREATE, OP_ARRAY_DESTROY, OP_ARRAY_GET_DESC = 99, 101, 102
OP_SET2D8, OP_SET2D16, OP_SET2D32, OP_SET2D8_ASYNC, OP_SET2D16_ASYNC, OP_SET2D32_ASYNC = range(189, 195)
OP_COPY2D, OP_COPY2D_UNALIGNED, OP_COPY2D_ASYNC, OP_COPY3D, OP_COPY3D_ASYNC = range(195, 200)
OP_TEX_CREATE, OP_TEX_DESTROY, OP_TEX_RES, OP_TEX_DESC, OP_TEX_VIEW = range(200, 205)
OP_SURF_CREATE, OP_SURF_DESTROY, OP_SURF_RES = 205, 206, 207

sz, P = ctypes.c_size_t, ctypes.c_uint64


class C2(ctypes.Structure):  # CUDA_MEMCPY2D
    _fields_ = [("srcXInBytes", sz), ("srcY", sz), ("srcMemoryType", ctypes.c_uint), ("srcHost", P),
                ("srcDevice", P), ("srcArray", P), ("srcPitch", sz), ("dstXInBytes", sz), ("dstY", sz),
                ("dstMemoryType", ctypes.c_uint), ("dstHost", P), ("dstDevice", P), ("dstArray", P),
                ("dstPitch", sz), ("WidthInBytes", sz), ("Height", sz)]  # fmt: skip


class C3(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [("srcXInBytes", sz), ("srcY", sz), ("srcZ", sz), ("srcLOD", sz), ("srcMemoryType", ctypes.c_uint),
                ("srcHost", P), ("srcDevice", P), ("srcArray", P), ("reserved0", P), ("srcPitch", sz),
                ("srcHeight", sz), ("dstXInBytes", sz), ("dstY", sz), ("dstZ", sz), ("dstLOD", sz),
                ("dstMemoryType", ctypes.c_uint), ("dstHost", P), ("dstDevice", P), ("dstArray", P),
                ("reserved1", P), ("dstPitch", sz), ("dstHeight", sz), ("WidthInBytes", sz), ("Height", sz),
                ("Depth", sz)]  # fmt: skip


def q(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *(w & (2**64 - 1) for w in words))


def opt(body: bytes | None) -> bytes:
    """An in pointer on the wire: present (1) and its bytes, or absent (0)."""
    return q(0) if body is None else q(1) + body


def c2(**kw) -> bytes:
    c = C2()
    for k, v in kw.items():
        setattr(c, k, v & (2**64 - 1))
    return bytes(c)


def c3(**kw) -> bytes:
    c = C3()
    for k, v in kw.items():
        setattr(c, k, v & (2**64 - 1))
    return bytes(c)


def resource(kind: int, *words: int) -> bytes:
    """A CUDA_RESOURCE_DESC (144 bytes): array (hArray), linear (devPtr, format, channels, size) or
    pitch2D (devPtr, format, channels, width, height, pitch)."""
    b = bytearray(144)
    struct.pack_into("<i", b, 0, kind)
    if kind in (RES_ARRAY, RES_MIPMAP) or len(words) == 1:
        struct.pack_into("<Q", b, 8, words[0])
    elif kind == RES_LINEAR:
        struct.pack_into("<QiIQ", b, 8, *words)
    else:
        struct.pack_into("<QiIQQQ", b, 8, *words)
    return bytes(b)


TEX_DESC = struct.pack("<3i", 1, 1, 1) + bytes(92)  # clamp, 104 bytes


class Wire:
    """A raw channel of its own (one guest process): requests numbered in order."""

    def __init__(self, region, fwd):
        self.region, self.fwd = region, fwd
        self.dead = False
        self.chan = shm.GuestChannel(region)
        self.seq = 0
        lay = region.check().layout(region.size)
        self.heap_off, self.heap_end = lay["heap_off"], lay["heap_off"] + lay["heap_size"]

    def __call__(self, op: int, body: bytes) -> tuple[int, bytes]:
        self.seq += 1
        try:
            return raw(self.chan, op, body, seq=self.seq)
        except VmgpuError as e:  # the worker died (a sanitizer report ends it): say why
            self.dead = True
            log = self.fwd.log()
            at = log.find("ERROR: AddressSanitizer")
            pytest.fail(f"op {op}: {e}\n{log[at : at + 3000] if at >= 0 else log[-3000:]}")

    def value(self, op: int, body: bytes) -> int:
        r, rep = self(op, body)
        assert r == SUCCESS, (op, r)
        return struct.unpack_from("<Q", rep)[0]

    def alloc(self, n: int) -> int:
        return self.value(OP_MEM_ALLOC, q(1, n))

    def fill(self, dev: int, byte: int, n: int) -> None:
        assert self(OP_MEMSET_D8, struct.pack("<QB7xQ", dev, byte, n))[0] == SUCCESS

    def array(self, w: int, h: int) -> int:
        return self.value(OP_ARRAY_CREATE, q(1) + opt(struct.pack("<QQII", w, h, U8, 1)))

    def copy2d(self, body: bytes, op: int = OP_COPY2D) -> int:
        extra = q(0) if op == OP_COPY2D_ASYNC else b""  # the stream: the legacy default
        return self(op, opt(body) + extra)[0]

    def copy3d(self, body: bytes, op: int = OP_COPY3D) -> int:
        extra = q(0) if op == OP_COPY3D_ASYNC else b""
        return self(op, opt(body) + extra)[0]

    def tex(self, res: bytes | None, tex: bytes | None = TEX_DESC, view: bytes | None = None) -> tuple[int, int]:
        r, rep = self(OP_TEX_CREATE, q(1) + opt(res) + opt(tex) + opt(view))
        return r, struct.unpack_from("<Q", rep)[0] if r == SUCCESS else 0

    def heap(self, off: int, n: int) -> bytes:
        return bytes(self.region.mm[off : off + n])

    def close(self) -> None:
        self.chan.close()


@pytest.fixture
def wire(shm_path):
    """The ASan/UBSan forwarder and one raw channel; at the end the forwarder must still serve."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        w = Wire(region, fwd)
        try:
            yield w
            assert fwd.proc.poll() is None, fwd.log()
            if not w.dead:  # the channel's worker still serves
                assert w(OP_MEM_ALLOC, q(1, 4096))[0] == SUCCESS, fwd.log()
        finally:
            w.close()
            region.close()


def test_struct_sizes_match_the_drivers():
    assert (ctypes.sizeof(C2), ctypes.sizeof(C3), len(resource(RES_ARRAY, 0)), len(TEX_DESC)) == (128, 200, 144, 104)
    assert C3.srcLOD.offset == 24 and C3.reserved0.offset == 64 and C3.dstLOD.offset == 112
    assert C3.reserved1.offset == 152 and C3.WidthInBytes.offset == 176


ALL_COPY_OPS = [(OP_COPY2D, "2d"), (OP_COPY2D_UNALIGNED, "2d"), (OP_COPY2D_ASYNC, "2d"),
                (OP_COPY3D, "3d"), (OP_COPY3D_ASYNC, "3d")]  # fmt: skip


def send_copy(w: Wire, op: int, kind: str, **kw) -> int:
    if kind == "2d":
        return w.copy2d(c2(**kw), op)
    kw.setdefault("Depth", 1)
    for side in ("src", "dst"):
        kw.setdefault(side + "Height", kw.get("Height", 0))
    return w.copy3d(c3(**kw), op)


@pytest.mark.parametrize("op, kind", ALL_COPY_OPS)
def test_a_host_side_is_an_offset_wholly_inside_the_heap_or_refused(wire, op, kind):
    """HOST-typed sides carry a raw offset: the last 64 bytes of the heap copy (and the right bytes
    arrive, both ways), but a side one byte past the heap's end, a second row past it, an offset
    before the heap (the region's header and rings), an offset whose extent wraps past 2^64, an
    x or y that overflows the offset, a worker-looking address and a huge pitch are each refused
    with CUDA_ERROR_INVALID_VALUE; a zero-sized copy names nothing outside the heap either."""
    w = wire
    dev = w.alloc(4096)
    end = w.heap_end
    w.region.mm[end - 64 : end] = bytes(range(100, 164))
    base = dict(srcMemoryType=HOST, srcHost=end - 64, srcPitch=64, dstMemoryType=DEVICE, dstDevice=dev,
                dstPitch=64, WidthInBytes=64, Height=1)  # fmt: skip
    assert send_copy(w, op, kind, **base) == SUCCESS
    # and back, into the heap's first 64 bytes of a block of ours
    blk = w.chan.heap_alloc(4096)
    back = dict(srcMemoryType=DEVICE, srcDevice=dev, srcPitch=64, dstMemoryType=HOST, dstHost=blk, dstPitch=64,
                WidthInBytes=64, Height=1)  # fmt: skip
    assert send_copy(w, op, kind, **back) == SUCCESS
    assert w.heap(blk, 64) == bytes(range(100, 164))
    refused = {
        "one byte past the heap": dict(base, srcXInBytes=1),
        "a second row past the heap": dict(base, Height=2),
        "an offset at the heap's end": dict(base, srcHost=end),
        "an offset before the heap": dict(base, srcHost=w.heap_off - 64),
        "the region's header": dict(base, srcHost=0),
        "an offset that wraps": dict(base, srcHost=2**64 - 32),
        "an offset near 2^64, x brings it back": dict(base, srcHost=2**64 - 4096, srcXInBytes=4096 + w.heap_off),
        "x that wraps": dict(base, srcHost=w.heap_off, srcXInBytes=2**64 - 16),
        "y that wraps": dict(base, srcHost=w.heap_off, srcY=2**64 - 1, Height=2),
        "a worker's address": dict(base, srcHost=0x7F0000001000),
        "a pitch that runs past": dict(base, srcHost=w.heap_off, srcPitch=1 << 40, Height=2),
        "pitch times row overflows": dict(base, srcHost=w.heap_off, srcPitch=1 << 63, Height=3),
        "the destination past the heap": dict(back, dstHost=end - 32),
        "the destination wraps": dict(back, dstHost=2**64 - 8),
        "nothing copied, an offset far outside": dict(base, srcHost=1 << 50, WidthInBytes=0),
    }
    got = {name: send_copy(w, op, kind, **f) for name, f in refused.items()}
    assert got == {name: INVALID_VALUE for name in refused}, got


def test_a_3d_host_side_with_slices_is_checked_to_its_last_byte(wire):
    """3D HOST sides: slices computed from srcHeight (which may be smaller or larger than Height),
    z that overflows, a slice size that overflows; the last slice ending exactly at the heap's end
    copies."""
    w = wire
    dev = w.alloc(1 << 16)
    end = w.heap_end
    # 4 slices of 4 rows of 64 bytes, pitch 64, srcHeight 8: the last byte is at 3*512 + 3*64 + 64
    span = 3 * 512 + 3 * 64 + 64
    ok = dict(srcMemoryType=HOST, srcHost=end - span, srcPitch=64, srcHeight=8, dstMemoryType=DEVICE,
              dstDevice=dev, dstPitch=64, dstHeight=4, WidthInBytes=64, Height=4, Depth=4)  # fmt: skip
    assert w.copy3d(c3(**ok)) == SUCCESS
    refused = {
        "one more slice": dict(ok, Depth=5),
        "z one further": dict(ok, srcZ=1),
        "srcHeight one larger": dict(ok, srcHeight=9),
        "srcHeight smaller than Height still past": dict(ok, srcHost=end - 64, srcHeight=1),
        "z wraps": dict(ok, srcZ=2**64 - 1, Depth=2),
        "z times slice overflows": dict(ok, srcZ=1 << 40, srcHeight=1 << 30),
        "slice overflows": dict(ok, srcPitch=1 << 40, srcHeight=1 << 30),
        "destination slices past": dict(ok, dstHeight=1 << 20),
    }
    got = {name: w.copy3d(c3(**f)) for name, f in refused.items()}
    assert got == {name: INVALID_VALUE for name in refused}, got


@pytest.mark.parametrize("op, kind", ALL_COPY_OPS)
def test_a_sides_type_decides_which_pointer_is_used_and_the_others_are_dropped(wire, op, kind):
    """Type confusion: a HOST side carrying a device address in its device field (and an array)
    copies from the heap offset; a DEVICE side carrying a wild host pointer copies from its device
    memory; a UNIFIED side is device memory of the process's own (a heap offset or a host field is
    not); an unknown type, 0 and 2^32-1 included, is refused."""
    w = wire
    a, dst = w.alloc(4096), w.alloc(4096)
    w.fill(a, 0xA5, 4096)
    blk = w.chan.heap_alloc(4096)
    out = w.chan.heap_alloc(4096)
    w.region.mm[blk : blk + 64] = b"\x5a" * 64
    arr = w.array(64, 1)

    def copied_to_heap() -> bytes:
        w.region.mm[out : out + 64] = bytes(64)
        assert send_copy(w, op, kind, srcMemoryType=DEVICE, srcDevice=dst, srcPitch=64, dstMemoryType=HOST,
                         dstHost=out, dstPitch=64, WidthInBytes=64, Height=1) == SUCCESS  # fmt: skip
        return w.heap(out, 64)

    common = dict(dstMemoryType=DEVICE, dstDevice=dst, dstPitch=64, srcPitch=64, WidthInBytes=64, Height=1)
    assert send_copy(w, op, kind, srcMemoryType=HOST, srcHost=blk, srcDevice=a, srcArray=arr, **common) == SUCCESS
    assert copied_to_heap() == b"\x5a" * 64
    assert send_copy(w, op, kind, srcMemoryType=DEVICE, srcDevice=a, srcHost=0x7F0000001000, **common) == SUCCESS
    assert copied_to_heap() == b"\xa5" * 64
    assert send_copy(w, op, kind, srcMemoryType=UNIFIED, srcDevice=a, srcHost=blk, **common) == SUCCESS
    assert copied_to_heap() == b"\xa5" * 64
    refused = {
        "unified naming a heap offset": (dict(srcMemoryType=UNIFIED, srcDevice=blk), INVALID_VALUE),
        "unified with its address in the host field": (dict(srcMemoryType=UNIFIED, srcHost=a), INVALID_VALUE),
        "device naming a heap offset": (dict(srcMemoryType=DEVICE, srcDevice=blk), INVALID_VALUE),
        "type 0": (dict(srcMemoryType=0, srcDevice=a), INVALID_VALUE),
        "type 5": (dict(srcMemoryType=5, srcDevice=a), INVALID_VALUE),
        "type 2^32-1": (dict(srcMemoryType=2**32 - 1, srcDevice=a), INVALID_VALUE),
        "array NULL": (dict(srcMemoryType=ARRAY, srcArray=0, srcDevice=a), INVALID_HANDLE),
        "array: a device address": (dict(srcMemoryType=ARRAY, srcArray=a), INVALID_HANDLE),
        "array: a stream's handle": (
            dict(srcMemoryType=ARRAY, srcArray=w.value(OP_STREAM_CREATE, q(1, 0))),
            INVALID_HANDLE,
        ),  # fmt: skip
        "array: its handle with another generation": (
            dict(srcMemoryType=ARRAY, srcArray=arr ^ (1 << 32)),
            INVALID_HANDLE,
        ),  # fmt: skip
    }
    got = {name: send_copy(w, op, kind, **dict(common, **f)) for name, (f, _) in refused.items()}
    assert got == {name: want for name, (_, want) in refused.items()}, got


def three_d_between_two_allocations(w: Wire) -> dict:
    a, b = w.alloc(4096), w.alloc(4096)
    return dict(srcMemoryType=DEVICE, srcDevice=a, srcPitch=64, srcHeight=1, dstMemoryType=DEVICE, dstDevice=b,
                dstPitch=64, dstHeight=1, WidthInBytes=64, Height=1, Depth=1)  # fmt: skip


def test_the_reserved_pointers_are_never_the_guests(wire):
    """CUDA_MEMCPY3D's reserved0/reserved1 ("must be NULL") set to wild pointers: dropped, the copy is
    done, sync and async, and the ASan forwarder reads nothing through them."""
    ok = three_d_between_two_allocations(wire)
    wild = dict(ok, reserved0=0x7F0000001000, reserved1=0xDEADBEEF000)
    assert [wire.copy3d(c3(**wild)), wire.copy3d(c3(**wild), OP_COPY3D_ASYNC)] == [SUCCESS, SUCCESS]


def test_a_nonzero_lod_never_reaches_the_driver(wire):
    """srcLOD/dstLOD "must be set to 0" (cuda.h, cuMemcpy3D): the driver's behaviour for any other
    value is not defined, so a guest's nonzero LOD is refused (CUDA_ERROR_INVALID_VALUE) before the
    driver sees it, as the reserved pointers are cleared; for a device side and for an array side."""
    w = wire
    ok = three_d_between_two_allocations(w)
    arr = w.array(64, 4)
    into_array = dict(ok, dstMemoryType=ARRAY, dstDevice=0, dstArray=arr, dstLOD=1)
    got = [w.copy3d(c3(**dict(ok, srcLOD=1))), w.copy3d(c3(**dict(ok, dstLOD=2**64 - 1)), OP_COPY3D_ASYNC),
           w.copy3d(c3(**into_array))]  # fmt: skip
    assert got == [INVALID_VALUE] * 3, got


def test_copy_requests_cut_short_or_with_no_parameters_are_refused(wire):
    """A CUDA_MEMCPY2D/3D flagged absent, flagged present but cut short (by one byte, by all of it),
    an async request with no stream or a stream not the process's: each refused, none read past
    the request."""
    w = wire
    dev = w.alloc(4096)
    good2 = c2(srcMemoryType=DEVICE, srcDevice=dev, dstMemoryType=DEVICE, dstDevice=dev, WidthInBytes=64, Height=1)
    good3 = c3(srcMemoryType=DEVICE, srcDevice=dev, dstMemoryType=DEVICE, dstDevice=dev, WidthInBytes=64, Height=1,
               Depth=1)  # fmt: skip
    cases = [
        (OP_COPY2D, q(0), INVALID_VALUE),
        (OP_COPY2D, q(1), INVALID_VALUE),
        (OP_COPY2D, q(1) + good2[:127], INVALID_VALUE),
        (OP_COPY2D, q(1) + good2[:64], INVALID_VALUE),
        (OP_COPY2D, b"", INVALID_VALUE),
        (OP_COPY2D_UNALIGNED, q(0), INVALID_VALUE),
        (OP_COPY2D_ASYNC, q(1) + good2, INVALID_VALUE),  # no stream
        (OP_COPY2D_ASYNC, q(0, 0), INVALID_VALUE),
        (OP_COPY2D_ASYNC, q(1) + good2 + q(0x1234), INVALID_HANDLE),
        (OP_COPY3D, q(0), INVALID_VALUE),
        (OP_COPY3D, q(1) + good3[:199], INVALID_VALUE),
        (OP_COPY3D, q(1) + good2, INVALID_VALUE),  # a 2D struct where a 3D one goes
        (OP_COPY3D_ASYNC, q(1) + good3, INVALID_VALUE),
        (OP_COPY3D_ASYNC, q(0, 0), INVALID_VALUE),
        (OP_COPY3D_ASYNC, q(1) + good3 + q(0x1234), INVALID_HANDLE),
    ]
    got = [w(op, body)[0] for op, body, _ in cases]
    assert got == [want for _, _, want in cases], got
    assert w(OP_COPY2D, q(1) + good2)[0] == SUCCESS
    assert w(OP_COPY3D_ASYNC, q(1) + good3 + q(0))[0] == SUCCESS


@pytest.mark.parametrize("op, elsz, asynchronous", [
    (OP_SET2D8, 1, False), (OP_SET2D16, 2, False), (OP_SET2D32, 4, False),
    (OP_SET2D8_ASYNC, 1, True), (OP_SET2D16_ASYNC, 2, True), (OP_SET2D32_ASYNC, 4, True),
])  # fmt: skip
def test_a_raw_2d_memset_reaches_only_its_own_rows(wire, op, elsz, asynchronous):
    """Rows ending exactly at an allocation's end are set; one element more, a heap offset as the
    destination, width * element size or height * pitch overflowing, a start that wraps, and a
    request cut short are refused."""
    w = wire
    dev = w.alloc(4096)
    blk = w.chan.heap_alloc(4096)

    def body(dst, pitch, width, height, stream=0):
        return q(dst, pitch, 0x11, width, height) + (q(stream) if asynchronous else b"")

    per = 64 // elsz
    assert w(op, body(dev, 64, per, 64))[0] == SUCCESS
    assert w(op, body(dev + 4096, 64, 0, 0))[0] == SUCCESS  # nothing, at the end
    cases = {
        "one element past": body(dev, 64, per + 1, 64),
        "one row past": body(dev, 64, per, 65),
        "a heap offset": body(blk, 64, per, 1),
        "width overflows": body(dev, 64, 2**64 // elsz + 1 if elsz > 1 else 2**64 - 1, 1),
        "height times pitch overflows": body(dev, 1 << 62, 1, 5),
        "the start wraps": body(2**64 - 8, 0, per, 1),
        "nothing, at nobody's address": body(0x10000, 64, 0, 0),
        "cut short": body(dev, 64, per, 64)[:32],
    }
    got = {name: w(op, b)[0] for name, b in cases.items()}
    assert got == {name: INVALID_VALUE for name in cases}, got
    if asynchronous:
        assert w(op, body(dev, 64, per, 64, stream=0x1234))[0] == INVALID_HANDLE


def test_a_raw_texture_resource_is_the_processs_own_memory_or_refused(wire):
    """Raw CUDA_RESOURCE_DESCs: linear and pitched resources over heap offsets, sizes and extents
    that wrap or overflow, a last row or a row's end one byte past the allocation; unknown
    resource types; array handles that are NULL, a device address, another kind's handle, a stale
    generation; structs flagged absent or cut short; a surface over linear or pitched memory."""
    w = wire
    dev = w.alloc(1 << 20)
    blk = w.chan.heap_alloc(4096)
    stream = w.value(OP_STREAM_CREATE, q(1, 0))
    arr = w.array(64, 64)
    made = [resource(RES_LINEAR, dev, U8, 1, 1 << 20), resource(RES_PITCH2D, dev, FLOAT, 1, 256, 1024, 1024),
            resource(RES_ARRAY, arr)]  # fmt: skip
    for res in made:
        r, tex = w.tex(res)
        assert r == SUCCESS and tex != 0, r
    end = dev + (1 << 20)
    refused = {
        "linear over a heap offset": (resource(RES_LINEAR, blk, U8, 1, 64), INVALID_VALUE),
        "linear size wraps": (resource(RES_LINEAR, dev, U8, 1, 2**64 - 1), INVALID_VALUE),
        "linear, nothing at the end": (resource(RES_LINEAR, end, U8, 1, 0), INVALID_VALUE),
        "pitched over a heap offset": (resource(RES_PITCH2D, blk, U8, 1, 64, 1, 64), INVALID_VALUE),
        "pitched width overflows": (resource(RES_PITCH2D, dev, FLOAT, 4, 1 << 61, 1, 64), INVALID_VALUE),
        "pitched no rows": (resource(RES_PITCH2D, dev, U8, 1, 64, 0, 64), INVALID_VALUE),
        "pitched rows wrap": (resource(RES_PITCH2D, dev, U8, 1, 64, 1 << 40, 1 << 30), INVALID_VALUE),
        "pitched, the last row past": (resource(RES_PITCH2D, end - 64 * 64, U8, 1, 64, 65, 64), INVALID_VALUE),
        "pitched, the row past the pitch": (resource(RES_PITCH2D, end - 64 * 64, U8, 1, 65, 64, 64), INVALID_VALUE),
        "type 4": (resource(4, dev), INVALID_VALUE),
        "type -1": (resource(-1, dev), INVALID_VALUE),
        "mipmapped": (resource(RES_MIPMAP, arr), NOT_SUPPORTED),
        "array NULL": (resource(RES_ARRAY, 0), INVALID_HANDLE),
        "array: a device address": (resource(RES_ARRAY, dev), INVALID_HANDLE),
        "array: a stream": (resource(RES_ARRAY, stream), INVALID_HANDLE),
        "array: another generation": (resource(RES_ARRAY, arr ^ (1 << 32)), INVALID_HANDLE),
    }
    got = {name: w.tex(res)[0] for name, (res, _) in refused.items()}
    assert got == {name: want for name, (_, want) in refused.items()}, got
    res = resource(RES_ARRAY, arr)
    wire_cases = [
        (OP_TEX_CREATE, q(0) + opt(res) + opt(TEX_DESC) + opt(None), INVALID_VALUE),  # no place for the answer
        (OP_TEX_CREATE, q(1) + opt(None) + opt(TEX_DESC) + opt(None), INVALID_VALUE),
        (OP_TEX_CREATE, q(1) + opt(res) + opt(None) + opt(None), INVALID_VALUE),
        (OP_TEX_CREATE, q(1) + q(1) + res[:100], INVALID_VALUE),
        (OP_TEX_CREATE, q(1) + opt(res) + q(1) + TEX_DESC[:50], INVALID_VALUE),
        (OP_TEX_CREATE, q(1) + opt(res) + opt(TEX_DESC) + q(1) + bytes(40), INVALID_VALUE),  # view cut short
        (OP_TEX_CREATE, q(1) + opt(res) + opt(TEX_DESC), INVALID_VALUE),  # no view flag
        (OP_SURF_CREATE, q(1) + opt(None), INVALID_VALUE),
        (OP_SURF_CREATE, q(0) + opt(res), INVALID_VALUE),
        (OP_SURF_CREATE, q(1) + q(1) + res[:143], INVALID_VALUE),
        (OP_SURF_CREATE, q(1) + opt(resource(RES_LINEAR, dev, U8, 1, 4096)), INVALID_VALUE),
        (OP_SURF_CREATE, q(1) + opt(resource(RES_PITCH2D, dev, U8, 1, 64, 1, 64)), INVALID_VALUE),
        (OP_SURF_CREATE, q(1) + opt(resource(RES_ARRAY, stream)), INVALID_HANDLE),
    ]
    got = [w(op, body)[0] for op, body, _ in wire_cases]
    assert got == [want for _, _, want in wire_cases], got


def test_raw_texture_queries_and_destroys_name_only_the_processs_own_objects(wire):
    """Queries with no place for their answer, of values never made, of a surface as a texture (and
    the reverse), and destroys cut short are refused; a texture's own queries answer."""
    w = wire
    arr = w.array(64, 64)
    r, tex = w.tex(resource(RES_ARRAY, arr))
    assert r == SUCCESS
    surf = w.value(OP_SURF_CREATE, q(1) + opt(resource(RES_ARRAY, arr)))
    cases = [
        (OP_TEX_RES, q(0, tex), INVALID_VALUE),
        (OP_TEX_DESC, q(0, tex), INVALID_VALUE),
        (OP_TEX_VIEW, q(0, tex), INVALID_VALUE),
        (OP_SURF_RES, q(0, surf), INVALID_VALUE),
        (OP_TEX_RES, q(1, surf), INVALID_VALUE),
        (OP_SURF_RES, q(1, tex), INVALID_VALUE),
        (OP_TEX_DESC, q(1, 0x12345678), INVALID_VALUE),
        (OP_TEX_VIEW, q(1, 0), INVALID_VALUE),
        (OP_TEX_RES, q(1), INVALID_VALUE),
        (OP_TEX_DESTROY, b"", INVALID_VALUE),
        (OP_TEX_DESTROY, q(surf), INVALID_VALUE),
        (OP_SURF_DESTROY, b"\1\2\3", INVALID_VALUE),
        (OP_SURF_DESTROY, q(tex), INVALID_VALUE),
    ]
    got = [w(op, body)[0] for op, body, _ in cases]
    assert got == [want for _, _, want in cases], got
    r, rep = w(OP_TEX_RES, q(1, tex))
    assert (r, struct.unpack_from("<iIQ", rep)[::2]) == (SUCCESS, (RES_ARRAY, arr))
    assert w(OP_TEX_DESC, q(1, tex))[0] == SUCCESS
    assert w(OP_TEX_DESTROY, q(tex))[0] == SUCCESS
    assert w(OP_SURF_DESTROY, q(surf))[0] == SUCCESS
    assert w(OP_TEX_DESTROY, q(tex))[0] == INVALID_VALUE


def test_a_query_never_hands_back_a_handle_to_an_array_the_process_destroyed(wire):
    """A texture and a surface over an array, then the array destroyed (its handle gone from the
    table): asking the texture or the surface for its resource must not put the freed array back in
    the table.  Whatever the query answers, the handle it gives names nothing: describing the array,
    copying into it, destroying it, or making a new texture over it is CUDA_ERROR_INVALID_HANDLE,
    and the driver never sees the freed array (the ASan forwarder's log stays clean)."""
    w = wire
    dev = w.alloc(4096)
    arr = w.array(64, 64)
    r, tex = w.tex(resource(RES_ARRAY, arr))
    assert r == SUCCESS
    surf = w.value(OP_SURF_CREATE, q(1) + opt(resource(RES_ARRAY, arr)))
    assert w(OP_ARRAY_DESTROY, q(arr))[0] == SUCCESS
    assert w(OP_ARRAY_GET_DESC, q(1, arr))[0] == INVALID_HANDLE
    handed = set()
    for op, obj in ((OP_TEX_RES, tex), (OP_SURF_RES, surf)):
        r, rep = w(op, q(1, obj))
        if r == SUCCESS:
            kind, h = struct.unpack_from("<i4xQ", rep)
            if kind == RES_ARRAY and h:
                handed.add(h)
    for h in handed:
        assert w(OP_ARRAY_GET_DESC, q(1, h))[0] == INVALID_HANDLE, hex(h)
        into = c3(srcMemoryType=DEVICE, srcDevice=dev, srcPitch=64, srcHeight=1, dstMemoryType=ARRAY, dstArray=h,
                  WidthInBytes=64, Height=1, Depth=1)  # fmt: skip
        assert w.copy3d(into) == INVALID_HANDLE, hex(h)
        assert w.tex(resource(RES_ARRAY, h))[0] == INVALID_HANDLE, hex(h)
        assert w(OP_ARRAY_DESTROY, q(h))[0] == INVALID_HANDLE, hex(h)
    assert w(OP_TEX_DESTROY, q(tex))[0] == SUCCESS
    assert w(OP_SURF_DESTROY, q(surf))[0] == SUCCESS
