"""The CUDA API generator (native/cuda_api/gen.py): its committed output is current, and a bad
spec entry is refused with a message naming it."""

import os
import re
import shlex
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.forwarder import (
    ASAN,
    NATIVE,
    ROOT,
    forwarder,
    run_guest,
)
from vmgpu import shm

pytestmark = pytest.mark.native

GEN = ROOT / "native" / "cuda_api"


def test_generated_code_is_current():
    r = subprocess.run([sys.executable, str(GEN / "gen.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "entry, message",
    [
        ('cuMemAlloc_v2 = { op = 16, class = "sync" }', "pointer parameter dptr (CUdeviceptr *) is not described"),
        ('cuInit = { class = "local" }\ncuCtxSynchronize = { op = 7, class = "sync" }', "needs an op number"),
        (
            'cuCtxSynchronize = { op = 20, class = "sync" }\ncuCtxSetLimit = { op = 20, class = "sync" }',
            "op 20 already used by cuCtxSynchronize",
        ),
        ('cuNotAFunction = { op = 20, class = "sync" }', "not exported by the probed driver"),
        ('cuEventRecord = { op = 20, class = "async", out = ["hEvent"] }', "is not a pointer"),
        (
            'cuInit = { class = "local" }\n[protocol]\nHELLO = { op = 16, name = "hello" }',
            "needs an op number in 1..15",
        ),
        (
            'cuInit = { class = "local" }\n[protocol]\nHELLO = { op = 1, name = "hello" }\n'
            'BYE = { op = 1, name = "bye" }',
            "op 1 already used by HELLO",
        ),
        ('cuInit = { class = "local" }\n[backend]\nextra = ["cuInit"]', "[backend] is derived"),
    ],
)
def test_generator_refuses_a_bad_spec(tmp_path, entry, message):
    spec = tmp_path / "api.toml"
    spec.write_text(f'[handles]\nCUstream = "stream"\nCUevent = "event"\n\n[fn]\n{entry}\n')
    r = subprocess.run(
        [sys.executable, str(GEN / "gen.py"), "--check", "--spec", str(spec)], capture_output=True, text=True
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def protocol_table() -> dict[int, tuple[str, str]]:
    with open(GEN / "api.toml", "rb") as f:
        return {e["op"]: (key, e["name"]) for key, e in tomllib.load(f)["protocol"].items()}


def test_the_protocol_ops_have_one_table_that_c_and_python_take_their_names_from(tmp_path):
    from vmgpu.cuda_ops import PROTOCOL

    table = protocol_table()
    assert {op: name for op, (_, name) in table.items()} == PROTOCOL
    # the C side: each VG_OP_<KEY> is the table's number, and the forwarder's name for it the table's
    prog = tmp_path / "names.c"
    prog.write_text(
        '#include <stdio.h>\n#include "vg_wire.h"\n'
        'int main(void) {\n#define P(op, name) printf("%d %s %s\\n", op, #op, name);\n'
        "VG_PROTO_OP_NAMES(P)\nreturn 0;\n}\n"
    )
    exe = tmp_path / "names"
    subprocess.run(["cc", "-o", str(exe), str(prog), "-I", str(GEN / "include")], check=True)
    rows = [ln.split(" ", 2) for ln in subprocess.run([exe], capture_output=True, text=True).stdout.splitlines()]
    assert {int(op): (ident.removeprefix("VG_OP_"), name) for op, ident, name in rows} == table
    assert table[5] == ("GOODBYE", "goodbye")


def test_no_hand_written_file_keeps_its_own_copy_of_a_protocol_op():
    idents = [key for key, _ in protocol_table().values()]
    names = [name for _, name in protocol_table().values()]
    sources = [*ROOT.glob("guest_agent/libcuda/*.[ch]"), *ROOT.glob("host_forwarder/native/*.[ch]")]
    sources += [ROOT / "native" / "cuda_api" / "include" / "vg_wire.h", *ROOT.glob("vmgpu/**/*.py")]
    for path in sources:
        if path.name == "cuda_ops.py":
            continue
        text = path.read_text()
        for ident in idents:
            assert not re.search(rf"VG_OP_{ident}\s*=", text), f"{path} defines VG_OP_{ident}"
            assert not re.search(rf"case\s+VG_OP_{ident}\s*:\s*return\s*\"", text), f"{path} names VG_OP_{ident}"
        for name in names:
            assert not re.search(rf"\d+\s*:\s*\"{re.escape(name)}\"", text), f"{path} names protocol op {name!r}"


def test_the_backend_list_has_every_driver_function_the_forwarder_calls():
    listed = set(re.findall(r"X\((cu\w+)\)", (GEN / "generated" / "vh_backend_fns.h").read_text()))
    called = set()
    for path in ROOT.glob("host_forwarder/native/*.[ch]"):
        called |= set(re.findall(r"->\s*(cu[A-Z]\w*)\b", path.read_text()))
    called = {n for n in called if not n.endswith("_pt")}
    assert called and called <= listed, sorted(called - listed)
    assert "[backend]" not in (GEN / "api.toml").read_text()  # nothing kept by hand


def compile_line(directory: str, target: str) -> list[str]:
    """The compiler command make runs for target (in directory), as arguments."""
    out = NATIVE
    r = subprocess.run(
        ["make", "-n", "-B", "-C", directory, f"O={out}", target.format(O=out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("cc ") and target.format(O=out) in ln)
    return shlex.split(line)


def compiles(directory: str, target: str, source: Path) -> subprocess.CompletedProcess:
    """Compile source alone with the flags make uses for target."""
    args = compile_line(directory, target)
    keep, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = a == "-o"
        elif not a.endswith((".c", ".a", ".so")) and not a.startswith(("-l", "-Wl,", "-shared")):
            keep.append(a)
    return subprocess.run(
        ["cc", *keep, "-fsyntax-only", str(source)], cwd=ROOT / directory, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "directory, target, path, old, new, message",
    [
        (
            "host_forwarder",
            "{O}/vmgpu-forwarder",
            "host_forwarder/native/pool.c",
            "guarded_cuMemPoolTrimTo(struct vh_chan *ch, CUmemoryPool pool, size_t keep)",
            "guarded_cuMemPoolTrimTo(struct vh_chan *ch, CUmemoryPool pool, int keep)",
            "conflicting types for 'guarded_cuMemPoolTrimTo'",
        ),
        (
            "host_forwarder",
            "{O}/vmgpu-forwarder",
            "host_forwarder/native/launch.c",
            "CUresult handwritten_cuLaunchKernel(",
            "CUresult handwritten_cuLaunchKernelX(",
            "no previous prototype for 'handwritten_cuLaunchKernelX'",
        ),
        (
            "guest_agent",
            "{O}/guest/obj/memory_attributes.o",
            "guest_agent/libcuda/memory_attributes.c",
            "handwritten_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr, unsigned fl)",
            "handwritten_cuPointerGetAttribute(void *data, CUpointer_attribute attr, void *ptr, unsigned fl)",
            "conflicting types for 'handwritten_cuPointerGetAttribute'",
        ),
        (
            "guest_agent",
            "{O}/guest/obj/kernel_cache.o",
            "guest_agent/libcuda/kernel_cache.c",
            "CUresult handwritten_cuKernelGetFunction(",
            "CUresult handwritten_cuKernelGetFunctionX(",
            "no previous prototype for 'handwritten_cuKernelGetFunctionX'",
        ),
    ],
)
def test_a_hand_written_half_that_drifts_from_the_spec_fails_to_build(
    tmp_path, directory, target, path, old, new, message
):
    text = (ROOT / path).read_text()
    assert old in text
    same = tmp_path / Path(path).name
    same.write_text(text)
    assert compiles(directory, target, same).returncode == 0
    drifted = tmp_path / ("drifted_" + Path(path).name)
    drifted.write_text(text.replace(old, new))
    r = compiles(directory, target, drifted)
    assert r.returncode != 0 and message in r.stderr.replace("\u2018", "'").replace("\u2019", "'"), r.stderr


POOL_ATTRS = """
import ctypes, struct, sys
cuda = ctypes.CDLL(sys.argv[1])
ctx, pool, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) == 0 and pool.value
def get(p, attr):
    buf = ctypes.create_string_buffer(b"\\xaa" * 8, 8)
    return cuda.cuMemPoolGetAttribute(p, attr, buf), buf.raw
value = ctypes.c_uint64(1 << 20)
print(get(pool, 1)[0], get(pool, 1)[1].hex())  # REUSE_FOLLOW_EVENT_DEPENDENCIES: an int
print(get(pool, 4)[0], get(pool, 4)[1].hex())  # RELEASE_THRESHOLD: 64 bits
print(cuda.cuMemPoolSetAttribute(pool, 4, ctypes.byref(value)))
print(cuda.cuMemPoolSetAttribute(pool, 4, None), cuda.cuMemPoolGetAttribute(pool, 4, None))
print(get(pool, 0x7777)[0], cuda.cuMemPoolSetAttribute(pool, 0x7777, ctypes.byref(value)))
print(get(None, 4)[0], get(ctypes.c_void_p(0x1234), 4)[0])
print(pool.value)
"""


def test_a_value_sized_by_its_attribute_crosses_at_that_size_and_odd_ones_are_refused(shm_path):
    """cuMemPoolGet/SetAttribute, generated from in_sized/out_sized: an int attribute writes 4
    bytes of the caller's buffer and no more, a 64-bit one 8; a NULL value is refused in the
    guest, an attribute the table does not size is not supported, a NULL or foreign pool is an
    invalid handle; and on the wire, a value of any other size than the table's is refused."""
    with forwarder(shm_path, asan=(ASAN / "vmgpu-forwarder").exists()) as fwd:
        r = run_guest([sys.executable, "-c", POOL_ATTRS, NATIVE / "guest" / "libcuda.so.1"], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        lines = r.stdout.split("\n")
        assert lines[:6] == ["0 01000000aaaaaaaa", "0 0000000000000000", "0", "1 1", "801 801", "400 400"], r.stdout
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            pool = raw(chan, 109, struct.pack("<QQ", 1, 0), seq=1)  # cuDeviceGetDefaultMemPool(&pool, 0)
            assert pool[0] == 0, pool
            handle = struct.unpack_from("<Q", pool[1])[0]
            head = struct.pack("<QQ", handle, 4)  # pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
            bodies = [
                struct.pack("<Q", 3) + b"\0" * 8,  # 3 bytes, not 8
                struct.pack("<Q", 16) + b"\0" * 16,  # 16 bytes
                struct.pack("<Q", 1 << 62),  # more than the request holds
                b"",  # none at all
                struct.pack("<Q", 8),  # a count without its bytes
            ]
            assert [raw(chan, 112, head + b, seq=2 + i)[0] for i, b in enumerate(bodies)] == [1] * len(bodies)
            assert raw(chan, 112, head + struct.pack("<Q", 8) + struct.pack("<Q", 1 << 20), seq=10)[0] == 0
            int_attr = struct.pack("<QQ", handle, 1)  # an int attribute: 4 bytes, not 8
            assert raw(chan, 112, int_attr + struct.pack("<Q", 8) + b"\1" + b"\0" * 7, seq=11)[0] == 1
            assert raw(chan, 113, int_attr, seq=12) == (0, struct.pack("<I", 1) + b"\0" * 4)
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()


def raw(chan, op: int, body: bytes, seq: int) -> tuple[int, bytes]:
    """A raw request on device 0: (CUresult, reply body)."""
    chan.send(1, struct.pack("<IHHQ", op, 0, 0, seq) + body)  # VG_REC_REQUEST
    rtype, rep = chan.recv(timeout_s=10)
    result, rop, rseq = struct.unpack_from("<iIQ", rep)
    assert (rtype, rop, rseq) == (2, op, seq)  # VG_REC_REPLY
    return result, rep[16:]


CLUSTERS = """
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]
class Config(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_uint * 7), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)),
                ("n", ctypes.c_uint)]
ctx, mod, fn, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuModuleLoadData(ctypes.byref(mod), open(sys.argv[2], "rb").read() + b"\\0") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"vadd") == 0
def query(attrs=(), n=None, stream=None, out=True, f=fn, config=True):
    arr = (Attr * max(1, len(attrs)))(*attrs)
    cfg = Config((ctypes.c_uint * 7)(1, 1, 1, 32, 1, 1, 0), stream, arr if attrs else None,
                 len(attrs) if n is None else n)
    k = ctypes.c_int(-1)
    return cuda.cuOccupancyMaxActiveClusters(ctypes.byref(k) if out else None, f,
                                             ctypes.byref(cfg) if config else None)
event = lambda h: Attr(7, b"", (ctypes.c_uint64 * 8)(h))  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT
print(query(), query(out=False), query(config=False), query(f=None), query(n=1))
print(query([Attr()] * 17), query([Attr(0x7FFF)]), query([Attr(13)]), query(stream=0x1234), query([event(0x1234)]))
print(query([Attr()] * 16))
"""


def test_a_launch_configuration_crosses_whole_and_a_bad_one_is_refused(shm_path):
    """cuOccupancyMaxActiveClusters, generated from launch_config: a good configuration is
    answered; a NULL answer or configuration, attributes said but not given, more attributes
    than VG_MAX_LAUNCH_ATTRS or unknown ones are invalid values; a graphs-only attribute is not
    supported; a NULL function, a stream or an event not the guest's are invalid handles."""
    with forwarder(shm_path, asan=(ASAN / "vmgpu-forwarder").exists()) as fwd:
        r = run_guest(
            [sys.executable, "-c", CLUSTERS, NATIVE / "guest" / "libcuda.so.1", ROOT / "tests" / "cuda" / "vadd.ptx"],
            shm_path,
        )
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert r.stdout.split("\n")[:3] == ["0 1 1 400 1", "1 1 801 400 400", "0"], r.stdout
        assert fwd.proc.poll() is None, fwd.log()


GRAPH_NODES = """
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
ctx, mod, fn, dev, s, g = (ctypes.c_void_p() for _ in range(6))
d = ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(d), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuModuleLoadData(ctypes.byref(mod), open(sys.argv[2], "rb").read() + b"\\0") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"vadd") == 0
buf = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)) == 0
n = ctypes.c_uint(16)
args = (ctypes.c_void_p * 4)(*(ctypes.addressof(x) for x in (buf, buf, buf, n)))
assert cuda.cuStreamCreate(ctypes.byref(s), 0) == 0 and cuda.cuStreamBeginCapture_v2(s, 0) == 0
for _ in range(3):
    assert cuda.cuLaunchKernel(fn, 1, 1, 1, 16, 1, 1, 0, s, args, None) == 0
assert cuda.cuStreamEndCapture(s, ctypes.byref(g)) == 0
def nodes(cap, graph=g, array=True, count=True):
    arr = (ctypes.c_void_p * 8)(*([0xAA] * 8))
    num = ctypes.c_size_t(cap)
    r = cuda.cuGraphGetNodes(graph, arr if array else None, ctypes.byref(num) if count else None)
    return r, num.value, [x or 0 for x in arr]
r, total, _ = nodes(0, array=False)
r2, got, two = nodes(2)
r3, got3, three = nodes(1 << 62)  # a capacity far past what exists: bounded by the total on the host
print(r, total, r2, got, two[2] == 0xAA, len(set(two[:2])), 0 not in two[:2])
print(r3, got3, three[:3] == two[:2] + three[2:3], len(set(three[:3])), three[3] == 0xAA)
print(nodes(0)[:2], nodes(3, count=False)[0], nodes(3, graph=ctypes.c_void_p(0x1234))[0])
"""


def test_a_counted_array_gives_at_most_what_exists_as_handles_of_the_guest(shm_path):
    """cuGraphGetNodes, generated from counted_out: the count alone; the first N nodes for a
    capacity of N, writing no further; a capacity past what exists (even 2^62) gives what
    exists, set aside on the host by the total, not by the capacity the guest claims; the same
    node is the same handle each time; a NULL count is an invalid value, a graph not the
    guest's an invalid handle."""
    with forwarder(shm_path, asan=(ASAN / "vmgpu-forwarder").exists()) as fwd:
        r = run_guest(
            [
                sys.executable,
                "-c",
                GRAPH_NODES,
                NATIVE / "guest" / "libcuda.so.1",
                ROOT / "tests" / "cuda" / "vadd.ptx",
            ],
            shm_path,
        )
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert r.stdout.split("\n")[:3] == ["0 3 0 2 True 2 True", "0 3 True 3 True", "(0, 0) 1 400"], r.stdout
        assert fwd.proc.poll() is None, fwd.log()


EXPORTS = (GEN / "export_tables.toml").read_text()


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("slots = 93\n", "slots = 92\n", "TOOLS_CONTEXT: 92 slots, the probed driver's has 93"),
        ("driver_slots = 15\n", "", "CONTEXT_CHECKS: 4 slots, the probed driver's has 15"),
        ('known = { 4 = "context_number",', 'known = { 93 = "context_number",', "known slot 93"),
        ('uuid = "6e163fbe-', 'uuid = "21318c60-9714-3248-8ca6-41ff7324c8f2"\n#', "uuid already used by TOOLS_CONTEXT"),
        ('refuse = "CUDA_ERROR_NOT_FOUND"', 'refuse = "CUDA_SUCCESS"', "refuse must be one of"),
        ('uuid = "766d6770-', 'uuid = "866d6770-', "by VG_NVML_TABLE_UUID's uuid"),
        ("null = [3]\nknown = { 2", "null = [2]\nknown = { 1", "a NULL inside the size word's slots"),
    ],
)
def test_generator_refuses_an_export_table_layout_that_drifts(tmp_path, old, new, message):
    assert old in EXPORTS
    path = tmp_path / "export_tables.toml"
    path.write_text(EXPORTS.replace(old, new, 1))
    r = subprocess.run(
        [sys.executable, str(GEN / "gen.py"), "--check", "--exports", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_every_export_table_the_guest_serves_is_as_long_as_the_probed_drivers():
    """What the guest library hands out (its size word, or the entries before its NULL) is what
    export_tables.toml says, and where the probed driver has the table, the driver's length
    (CONTEXT_CHECKS is served shorter, as export_tables.toml says: driver_slots)."""
    with open(GEN / "export_tables.toml", "rb") as f:
        tables = tomllib.load(f)["table"]
    probed = {}
    for ln in (GEN / "driver" / "export_tables.txt").read_text().splitlines():
        cols = ln.split("\t")
        if len(cols) == 3 and cols[1] == "rc=0":
            w = cols[2].split()
            probed[cols[0]] = int(w[0], 16) // 8 if w[0].startswith("0x") else w.index("0")
    served = {n: t for n, t in tables.items() if "slots" in t}
    code = "".join(
        f"words = table({t['uuid'].replace('-', '')!r}, {t.get('size_word', True)}); print({n!r}, words)\n"
        for n, t in served.items()
    )
    r = subprocess.run(
        [sys.executable, "-c", EXPORT_PROBE.format(lib=str(NATIVE / "guest" / "libcuda.so.1")) + code],
        capture_output=True,
        text=True,
        env={**os.environ, "VMGPU_REGION": "/nonexistent"},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = {ln.split()[0].strip("'"): int(ln.split()[1]) for ln in r.stdout.splitlines()}
    assert got == {n: t["slots"] for n, t in served.items()}
    for n, t in served.items():
        driver = probed.get(t["uuid"])
        assert driver is None or driver in (t["slots"], t.get("driver_slots")), n
    assert probed[tables["CONTEXT_CHECKS"]["uuid"]] == 15  # the one served shorter


EXPORT_PROBE = """
import ctypes
cuda = ctypes.CDLL({lib!r})
def table(hexid, size_word):
    uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex(hexid))
    p = ctypes.c_void_p()
    assert cuda.cuGetExportTable(ctypes.byref(p), ctypes.byref(uuid)) == 0
    words = ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))
    if size_word:
        return words[0] // 8
    return next(i for i in range(4096) if not words[i])
"""
