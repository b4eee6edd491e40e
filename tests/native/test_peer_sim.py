"""Peer access within one guest's GPUs, on two simulated GPUs: cuDeviceCanAccessPeer,
cuDeviceGetP2PAttribute, cuCtxEnable/DisablePeerAccess, cuMemcpyPeer(Async) and plain copies
between the two GPUs' memory (host_forwarder/native/peer.c).  And the hostile side: a range that
runs past its allocation or lies on the other GPU than its context's, a context or a device the
guest does not have, and memory of another guest process, each refused before the driver sees it."""

import struct
import subprocess
import sys

import pytest

from tests.forwarder import ASAN, NATIVE, forwarder, guest_env, run_guest
from vmgpu import shm

pytestmark = pytest.mark.native

GUEST_LIB = NATIVE / "guest" / "libcuda.so.1"

# CUresult values the tests expect
SUCCESS, INVALID_VALUE, INVALID_DEVICE, INVALID_CONTEXT, INVALID_HANDLE = 0, 1, 101, 201, 400
PEER_UNSUPPORTED, ALREADY_ENABLED, NOT_ENABLED = 217, 704, 705

# A guest program (ctypes on the guest's libcuda.so.1) on two GPUs.  argv: the library, then an
# address of another guest process's memory on GPU 1 (0: none).  Prints "name result [detail]"
# per line.
PEER = r"""
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
other = int(sys.argv[2])
P = ctypes.c_void_p
u64 = ctypes.c_uint64
N = 4096

def out(name, r, detail=""):
    print(name, r, detail)

n = ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value == 2, n.value
ctx = [P(), P()]
for d in range(2):
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx[d]), d) == 0

can = ctypes.c_int(-1)
out("can_access_0_1", cuda.cuDeviceCanAccessPeer(ctypes.byref(can), 0, 1), can.value)
can.value = -1
out("can_access_1_0", cuda.cuDeviceCanAccessPeer(ctypes.byref(can), 1, 0), can.value)
can.value = -1
out("can_access_0_0", cuda.cuDeviceCanAccessPeer(ctypes.byref(can), 0, 0), can.value)
out("can_access_0_7", cuda.cuDeviceCanAccessPeer(ctypes.byref(can), 0, 7))
out("can_access_7_0", cuda.cuDeviceCanAccessPeer(ctypes.byref(can), 7, 0))
v = ctypes.c_int(-1)
out("p2p_access_supported", cuda.cuDeviceGetP2PAttribute(ctypes.byref(v), 2, 0, 1), v.value)
out("p2p_device_7", cuda.cuDeviceGetP2PAttribute(ctypes.byref(v), 2, 7, 0))

def alloc(d):
    p = u64()
    assert cuda.cuCtxSetCurrent(ctx[d]) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(N)) == 0
    return p.value

a0 = alloc(0)
b1, c1, d1 = alloc(1), alloc(1), alloc(1)
pattern = bytes((i * 7 + 3) % 251 for i in range(N))
assert cuda.cuCtxSetCurrent(ctx[0]) == 0
assert cuda.cuMemcpyHtoD_v2(u64(a0), pattern, ctypes.c_size_t(N)) == 0

def read(p):
    buf = ctypes.create_string_buffer(N)
    assert cuda.cuMemcpyDtoH_v2(buf, u64(p), ctypes.c_size_t(N)) == 0
    return buf.raw

def copy_peer(dst, dctx, src, sctx, n=N):
    return cuda.cuMemcpyPeer(u64(dst), dctx, u64(src), sctx, ctypes.c_size_t(n))

out("enable", cuda.cuCtxEnablePeerAccess(ctx[1], 0))
out("enable_again", cuda.cuCtxEnablePeerAccess(ctx[1], 0))
out("peer_copy", copy_peer(b1, ctx[1], a0, ctx[0]), read(b1) == pattern)
r = cuda.cuMemcpyPeerAsync(u64(c1), ctx[1], u64(a0), ctx[0], ctypes.c_size_t(N), None)
out("peer_copy_async", r, cuda.cuCtxSynchronize() == 0 and read(c1) == pattern)
out("dtod_across_gpus", cuda.cuMemcpyDtoD_v2(u64(d1), u64(a0), ctypes.c_size_t(N)), read(d1) == pattern)
out("disable", cuda.cuCtxDisablePeerAccess(ctx[1]))
out("disable_again", cuda.cuCtxDisablePeerAccess(ctx[1]))

# hostile: each refused, and the destination untouched
assert cuda.cuMemsetD8_v2(u64(b1), ctypes.c_ubyte(0), ctypes.c_size_t(N)) == 0
out("src_past_allocation", copy_peer(b1, ctx[1], a0 + 1, ctx[0]))
out("dst_past_allocation", copy_peer(b1 + 1, ctx[1], a0, ctx[0]))
out("src_on_the_other_gpu", copy_peer(b1, ctx[1], a0, ctx[1]))
out("dst_on_the_other_gpu", copy_peer(b1, ctx[0], a0, ctx[0]))
bogus = P(0x1234)
out("context_not_the_guests", copy_peer(b1, ctx[1], a0, bogus))
out("enable_context_not_the_guests", cuda.cuCtxEnablePeerAccess(bogus, 0))
out("untouched", 0, read(b1) == bytes(N))
if other:
    # the same number may name memory of this process too (each process has its own addresses)
    out("other_is_none_of_mine", 0, all(not (p <= other < p + N) for p in (a0, b1, c1, d1)))
    out("other_process_dst", copy_peer(other, ctx[1], a0, ctx[0]))
    out("other_process_src", copy_peer(b1, ctx[1], other, ctx[1]))
    out("other_process_dtod", cuda.cuMemcpyDtoD_v2(u64(other), u64(a0), ctypes.c_size_t(N)))
"""

# Another guest process: memory of its own on GPU 1, its address printed, held until stdin closes.
# Its workers' addresses start where the first process's do: the one printed lies past any of the
# first's (its 16th allocation), so that it names no memory of the first process.
HOLDER = r"""
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
for _ in range(16):
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096)) == 0
print(p.value, flush=True)
sys.stdin.read()
"""


def results(stdout: str) -> dict[str, list[str]]:
    return {w[0]: w[1:] for w in (line.split() for line in stdout.splitlines()) if w}


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")


def test_a_tensor_moves_between_a_guests_two_gpus_by_peer_copy_and_plain_copy(shm_path, two_gpus):
    """Each GPU can reach the other (not itself); access is enabled once (again: already enabled)
    and disabled once (again: not enabled); a peer copy, its async form and a plain
    cuMemcpyDtoD from GPU 0's memory to GPU 1's move the bytes exactly."""
    with forwarder(shm_path, extra=["--gpus", "0,1"], asan=(ASAN / "vmgpu-forwarder").exists()) as fwd:
        r = run_guest([sys.executable, "-c", PEER, GUEST_LIB, 0], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
    got = results(r.stdout)
    assert got["can_access_0_1"] == ["0", "1"] and got["can_access_1_0"] == ["0", "1"], r.stdout
    assert got["can_access_0_0"] == ["0", "0"], r.stdout
    assert got["p2p_access_supported"] == ["0", "1"], r.stdout
    assert got["enable"] == [str(SUCCESS)] and got["enable_again"] == [str(ALREADY_ENABLED)], r.stdout
    assert got["peer_copy"] == ["0", "True"], r.stdout
    assert got["peer_copy_async"] == ["0", "True"], r.stdout
    assert got["dtod_across_gpus"] == ["0", "True"], r.stdout
    assert got["disable"] == [str(SUCCESS)] and got["disable_again"] == [str(NOT_ENABLED)], r.stdout


def test_where_the_gpus_have_no_direct_path_peer_copies_still_move_the_bytes(shm_path, two_gpus):
    """GPUs without a peer path (VMGPU_SIM_NO_PEER_PATH): cuDeviceCanAccessPeer says 0, enabling
    access is the driver's CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, and peer and plain copies between
    the GPUs work, staged by the driver, as PyTorch then copies."""
    env = {"VMGPU_SIM_NO_PEER_PATH": "1"}
    with forwarder(shm_path, extra=["--gpus", "0,1"], env=env) as fwd:
        r = run_guest([sys.executable, "-c", PEER, GUEST_LIB, 0], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
    got = results(r.stdout)
    assert got["can_access_0_1"] == ["0", "0"], r.stdout
    assert got["p2p_access_supported"] == ["0", "0"], r.stdout
    assert got["enable"] == [str(PEER_UNSUPPORTED)], r.stdout
    assert got["peer_copy"] == ["0", "True"] and got["peer_copy_async"] == ["0", "True"], r.stdout
    assert got["dtod_across_gpus"] == ["0", "True"], r.stdout


def test_peer_calls_refuse_ranges_contexts_and_devices_not_the_guests_own(shm_path, two_gpus):
    """Against the ASan/UBSan forwarder: a peer copy whose source or destination runs one byte past
    its allocation, or whose range lies on the other GPU than its context's; a context the guest
    does not have (in a copy and in cuCtxEnablePeerAccess); device 7 of a guest with two; and
    another guest process's memory, by peer copy and by plain copy: each refused, nothing written,
    and the forwarder serves on."""
    if not (ASAN / "vmgpu-forwarder").exists():
        pytest.fail("build/asan is missing: run `make native-asan`")
    with forwarder(shm_path, extra=["--gpus", "0,1"], asan=True) as fwd:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(GUEST_LIB)],
            env=guest_env(shm_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            other = int(holder.stdout.readline() or 0)
            assert other, holder.stderr.read() if holder.poll() is not None else "no address from the holder"
            r = run_guest([sys.executable, "-c", PEER, GUEST_LIB, other], shm_path)
        finally:
            holder.communicate(input="", timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert holder.returncode == 0
        assert fwd.proc.poll() is None, fwd.log()
    got = results(r.stdout)
    assert got["can_access_0_7"] == [str(INVALID_DEVICE)] and got["can_access_7_0"] == [str(INVALID_DEVICE)]
    assert got["p2p_device_7"] == [str(INVALID_DEVICE)], r.stdout
    for name in ("src_past_allocation", "dst_past_allocation", "src_on_the_other_gpu", "dst_on_the_other_gpu"):
        assert got[name] == [str(INVALID_VALUE)], (name, r.stdout)
    assert got["context_not_the_guests"] == [str(INVALID_CONTEXT)], r.stdout
    assert got["enable_context_not_the_guests"] == [str(INVALID_CONTEXT)], r.stdout
    assert got["untouched"] == ["0", "True"], r.stdout
    assert got["other_is_none_of_mine"] == ["0", "True"], r.stdout
    for name in ("other_process_dst", "other_process_src", "other_process_dtod"):
        assert got[name] == [str(INVALID_VALUE)], (name, r.stdout)


def raw(chan, op: int, body: bytes, seq: int, dev: int = 0) -> tuple[int, bytes]:
    """A raw request for guest device dev: (CUresult, reply body)."""
    chan.send(1, struct.pack("<IHHQ", op, dev, 0, seq) + body)  # VG_REC_REQUEST
    rtype, rep = chan.recv(timeout_s=10)
    result, rop, rseq = struct.unpack_from("<iIQ", rep)
    assert (rtype, rop, rseq) == (2, op, seq)  # VG_REC_REPLY
    return result, rep[16:]


def test_raw_peer_requests_naming_contexts_devices_or_memory_not_the_guests_are_refused(shm_path, two_gpus):
    """Written straight into the ring, past the guest library's own checks: a context that is none
    of the process's (0, 3 of a guest with two GPUs, 2^64-1) in a peer copy and in
    cuCtxEnablePeerAccess, device ordinals 2, 7 and -1, and a peer copy of an address the process
    never allocated, or one byte past its own allocation, and the async form's bad ranges, contexts
    and streams (reported at the next synchronisation): each refused, the ASan/UBSan forwarder
    intact; the same copy of its own memory then succeeds."""
    if not (ASAN / "vmgpu-forwarder").exists():
        pytest.fail("build/asan is missing: run `make native-asan`")
    with forwarder(shm_path, extra=["--gpus", "0,1"], asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
            allocs = []
            for seq, dev in ((1, 0), (2, 1)):  # cuMemAlloc_v2(&dptr, 4096) on each GPU
                r, body = raw(chan, 22, q(1, 4096), seq=seq, dev=dev)
                assert r == SUCCESS, (r, fwd.log())
                allocs.append(struct.unpack_from("<Q", body)[0])
            a0, b1 = allocs
            peer = lambda dst, dctx, src, sctx, n=4096: q(dst, dctx, src, sctx, n)  # noqa: E731
            seq = 10
            for ctx in (0, 3, (1 << 64) - 1):
                seq += 1
                assert raw(chan, 134, peer(b1, 2, a0, ctx), seq=seq)[0] == INVALID_CONTEXT, ctx
                seq += 1
                assert raw(chan, 134, peer(b1, ctx, a0, 1), seq=seq)[0] == INVALID_CONTEXT, ctx
                seq += 1
                assert raw(chan, 132, q(ctx, 0), seq=seq)[0] == INVALID_CONTEXT, ctx
            for bad in (2, 7, -1):
                dev = struct.pack("<i", bad) + b"\0" * 4
                seq += 1
                assert raw(chan, 130, q(1) + dev + struct.pack("<i", 0) + b"\0" * 4, seq=seq)[0] == INVALID_DEVICE
                seq += 1
                body = q(1) + struct.pack("<i", 2) + b"\0" * 4 + struct.pack("<i", 0) + b"\0" * 4 + dev
                assert raw(chan, 131, body, seq=seq)[0] == INVALID_DEVICE
            for src, n in ((a0 + 1, 4096), (a0, 4097), (0x7E0000000000 + (1 << 40), 16), (a0, 1 << 63)):
                seq += 1
                assert raw(chan, 134, peer(b1, 2, src, 1, n), seq=seq)[0] == INVALID_VALUE, (hex(src), n)
            seq += 1
            assert raw(chan, 134, peer(b1, 2, a0, 1), seq=seq)[0] == SUCCESS
            seq += 1
            assert raw(chan, 134, peer(b1, 2, a0, 2), seq=seq)[0] == INVALID_VALUE  # a0 is on GPU 0
            # the async form, refused the same: its error is the next synchronisation's
            for body, want in (
                (peer(b1, 2, a0 + 1, 1) + q(0), INVALID_VALUE),
                (peer(b1, 3, a0, 1) + q(0), INVALID_CONTEXT),
                (peer(b1, 2, a0, 1) + q(0x999), INVALID_HANDLE),  # a stream not the process's
            ):
                seq += 1
                chan.send(1, struct.pack("<IHHQ", 135, 0, 2, seq) + body)  # VG_F_NOREPLY
                seq += 1
                assert raw(chan, 16, b"", seq=seq)[0] == want, body  # cuCtxSynchronize
            seq += 1
            chan.send(1, struct.pack("<IHHQ", 135, 0, 2, seq) + peer(b1, 2, a0, 1) + q(0))
            seq += 1
            assert raw(chan, 16, b"", seq=seq)[0] == SUCCESS
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()
