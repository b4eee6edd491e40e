"""Texture and surface objects (host_forwarder/native/texture.c) on the simulated backend and the
ASan/UBSan forwarder: a texture or surface reads or writes its resource whenever a kernel uses it,
so the resource is checked when the object is made: an array of the process's own, or device memory
wholly inside one of its objects (linear: its size; pitched 2D: to the end of its last row).  Only
values the process made go back to the driver; a query answers the guest's own array handle."""

import struct

import pytest

from tests.forwarder import forwarder
from tests.native.guest_process import PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 400, 801
ARRAY, MIPMAP, LINEAR, PITCH2D = 0, 1, 2, 3
U8, FLOAT = 0x01, 0x20
MiB = 1 << 20

# A guest process: one command per line, "<CUresult> [value]".  Resource descriptions are built
# here from words: "array H", "linear PTR FORMAT CHANNELS SIZE", "pitch PTR FORMAT CHANNELS W H PITCH",
# "mipmap H".
GUEST = (
    PRELUDE
    + r"""

def resource(kind, a):
    b = bytearray(144)
    if kind == "array":
        struct.pack_into("<iQ", b, 0, 0, 0); struct.pack_into("<Q", b, 8, a[0])
    elif kind == "mipmap":
        struct.pack_into("<i", b, 0, 1); struct.pack_into("<Q", b, 8, a[0])
    elif kind == "linear":
        struct.pack_into("<i", b, 0, 2); struct.pack_into("<QiIQ", b, 8, *a)
    else:
        struct.pack_into("<i", b, 0, 3); struct.pack_into("<QiIQQQ", b, 8, *a)
    return ctypes.create_string_buffer(bytes(b), 144)

print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], w[1:]
    out = ""
    if op == "alloc":
        p = u64()
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), sz(int(a[0])))
        out = p.value
    elif op == "array":  # width height
        d = struct.pack("<QQiI", int(a[0]), int(a[1]), 1, 1)  # CUDA_ARRAY_DESCRIPTOR, u8, 1 channel
        h = P()
        r = cuda.cuArrayCreate_v2(ctypes.byref(h), ctypes.c_char_p(d))
        out = h.value or 0
    elif op in ("tex", "surf"):  # kind values...
        res = resource(a[0], [int(x, 0) for x in a[1:]])
        o = u64()
        if op == "tex":
            tex = ctypes.create_string_buffer(struct.pack("<3i", 1, 1, 1) + bytes(92), 104)  # clamp
            r = cuda.cuTexObjectCreate(ctypes.byref(o), res, tex, None)
        else:
            r = cuda.cuSurfObjectCreate(ctypes.byref(o), res)
        out = o.value
    elif op in ("tex_destroy", "surf_destroy"):
        fn = cuda.cuTexObjectDestroy if op == "tex_destroy" else cuda.cuSurfObjectDestroy
        r = fn(u64(int(a[0])))
    elif op in ("tex_res", "surf_res"):  # the resource's type and its first word
        b = ctypes.create_string_buffer(144)
        fn = cuda.cuTexObjectGetResourceDesc if op == "tex_res" else cuda.cuSurfObjectGetResourceDesc
        r = fn(b, u64(int(a[0])))
        kind, first = struct.unpack_from("<i4xQ", b.raw)
        out = f"{kind} {first}"
    elif op == "tex_desc":
        b = ctypes.create_string_buffer(104)
        r = cuda.cuTexObjectGetTextureDesc(b, u64(int(a[0])))
        out = ",".join(str(x) for x in struct.unpack_from("<3i", b.raw))
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)


def test_a_texture_or_surface_is_made_only_over_the_processs_own_resource(shm_path, guests):
    """Linear memory within a 1 MiB allocation, pitched memory to the end of its last row and an
    array of its own make textures; one byte past the allocation, a row longer than the pitch that
    runs past it, an extent that overflows, another process's allocation or array, an address that
    is nobody's, and a mipmapped array are refused.  A surface takes an array only."""
    with forwarder(shm_path, asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        dev = int(a.ok("alloc", MiB))
        for _ in range(2):
            other = int(b.ok("alloc", MiB))
        arr = int(a.ok("array", 256, 64))
        b.ok("array", 16, 16)
        other_arr = int(b.ok("array", 256, 64))  # B's second: a handle A's table does not have
        made = [
            ("linear", dev, U8, 1, MiB),
            ("pitch", dev, FLOAT, 1, 256, 1024, 1024),
            ("array", arr),
        ]
        for kind, *v in made:
            assert int(a.ok("tex", kind, *v)) != 0, kind
        refused = {
            "linear one byte past": (("linear", dev, U8, 1, MiB + 1), INVALID_VALUE),
            "pitch one row past": (("pitch", dev, FLOAT, 1, 256, 1025, 1024), INVALID_VALUE),
            "row longer than the pitch": (("pitch", dev, FLOAT, 1, 257, 1024, 1024), INVALID_VALUE),
            "a format whose rows are not measured here": (("pitch", dev, 0xB0, 1, 64, 1024, 1024), NOT_SUPPORTED),
            "three channels": (("pitch", dev, U8, 3, 64, 1024, 1024), INVALID_VALUE),
            "no channels": (("pitch", dev, U8, 0, 64, 1024, 1024), INVALID_VALUE),
            "pitch times height overflows": (("pitch", dev, U8, 1, 16, 8, 1 << 62), INVALID_VALUE),
            "another process's memory": (("linear", other, U8, 1, 4096), INVALID_VALUE),
            "nobody's": (("linear", 0x10000, U8, 1, 4096), INVALID_VALUE),
            "another process's array": (("array", other_arr), INVALID_HANDLE),
            "no array": (("array", 0), INVALID_HANDLE),
            "mipmapped": (("mipmap", arr), NOT_SUPPORTED),
        }
        for name, (words, want) in refused.items():
            assert a("tex", *words)[0] == want, name
        assert int(a.ok("surf", "array", arr)) != 0
        assert a("surf", "linear", dev, U8, 1, 4096)[0] == INVALID_VALUE
        assert a("surf", "array", other_arr)[0] == INVALID_HANDLE
        assert fwd.proc.poll() is None, fwd.log()


def test_only_objects_the_process_made_reach_the_driver_and_queries_answer_in_its_terms(shm_path, guests):
    """A texture over an array answers the guest's own array handle and its texture description;
    a destroyed texture, a surface named as a texture (and the reverse), another process's
    texture and guessed values are refused (CUDA_ERROR_INVALID_VALUE) without reaching the driver."""
    with forwarder(shm_path, asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        arr = int(a.ok("array", 256, 64))
        tex = int(a.ok("tex", "array", arr))
        surf = int(a.ok("surf", "array", arr))
        assert a("tex_res", tex) == (SUCCESS, f"{ARRAY} {arr}")
        assert a("surf_res", surf) == (SUCCESS, f"{ARRAY} {arr}")
        assert a("tex_desc", tex) == (SUCCESS, "1,1,1")
        assert a("tex_destroy", surf)[0] == INVALID_VALUE
        assert a("surf_destroy", tex)[0] == INVALID_VALUE
        b_tex = int(b.ok("tex", "array", int(b.ok("array", 16, 16))))
        for value in (b_tex, 0, 1, 12345, tex + 8):
            if value not in (tex, surf):
                assert a("tex_res", value)[0] == INVALID_VALUE, value
                assert a("tex_destroy", value)[0] == INVALID_VALUE, value
        assert a("tex_destroy", tex) == (SUCCESS, "")
        assert a("tex_destroy", tex)[0] == INVALID_VALUE
        assert a("tex_res", tex)[0] == INVALID_VALUE
        assert a("surf_destroy", surf) == (SUCCESS, "")
        assert fwd.proc.poll() is None, fwd.log()
    assert struct.calcsize("<QiIQQQ") == 40
