"""VMM handles shared as file descriptors between the processes of one guest (NCCL's cuMem path;
host_forwarder/native/ipc.c, vmm.c and fd_broker.c), on the simulated backend and the ASan/UBSan
forwarder: cuMemCreate with requestedHandleTypes = POSIX_FILE_DESCRIPTOR, cuMemExportToShareableHandle,
cuMemImportFromShareableHandle, cuMemRetainAllocationHandle and cuMemGetAllocationPropertiesFromHandle.

The boundary: the guest never holds the driver's descriptor (the supervisor does, only while the
exporter holds the handle, and no worker inherits it); the guest's file holds an opaque handle that
imports only in a process of the same guest, and only while its exporter holds the handle; a
forged, tampered, cut or foreign file imports nothing; an import is charged to the quota.

The simulated backend cannot share bytes between two workers: an import makes memory of its own
of the handle's size (sim/pools.c).  These tests check who may import what; bytes are for the
GPU suite (tests/cuda/vmm_fd_pair.c without "nodata")."""

import os
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, wait_for, worker_pids
from tests.native.test_generator import raw
from tests.native.test_ipc_sim import asan_forwarder, tampered
from vmgpu import shm

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_SUPPORTED = 0, 1, 2, 801
POSIX_FD, FABRIC = 1, 8
DEVICE, HOST_NUMA = 1, 3
MiB = 1 << 20

# A guest process (ctypes on the guest's libcuda.so.1) on GPU argv[2], one command per line read from
# stdin, one line answered: "<CUresult> [value]".
GUEST = r"""
import ctypes, os, sys
cuda = ctypes.CDLL(sys.argv[1])
u64, P, c_int = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int

class Loc(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]
class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", c_int), ("handle_types", c_int), ("loc", Loc), ("win32", P), ("flags", ctypes.c_uint8 * 8)]
class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc", Loc), ("flags", c_int)]

dev = int(sys.argv[2])
ctx = P()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
cuda.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(u64), P, c_int]
cuda.cuMemRetainAllocationHandle.argtypes = [ctypes.POINTER(u64), P]

def prop(types, loctype=1, locid=None):
    return Prop(1, types, Loc(loctype, dev if locid is None else locid), None)

def import_fd(fd, t=1):
    h = u64()
    r = cuda.cuMemImportFromShareableHandle(ctypes.byref(h), P(fd), t)
    return r, h.value

print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], w[1:]
    out = ""
    if op == "create":  # size types [loctype]
        h, p = u64(), prop(int(a[1]), int(a[2]) if len(a) > 2 else 1)
        r = cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(int(a[0])), ctypes.byref(p), ctypes.c_ulonglong(0))
        out = h.value
    elif op == "granularity":  # types loctype
        g, p = ctypes.c_size_t(), prop(int(a[0]), int(a[1]))
        r = cuda.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0)
        out = g.value
    elif op == "map":  # handle size: reserve, map, access for this process's GPU
        va, n = u64(), ctypes.c_size_t(int(a[1]))
        acc = Access(Loc(1, dev), 3)
        r = cuda.cuMemAddressReserve(ctypes.byref(va), n, ctypes.c_size_t(0), u64(0), ctypes.c_ulonglong(0))
        r = r or cuda.cuMemMap(va, n, ctypes.c_size_t(0), u64(int(a[0])), ctypes.c_ulonglong(0))
        r = r or cuda.cuMemSetAccess(va, n, ctypes.byref(acc), ctypes.c_size_t(1))
        out = va.value
    elif op == "unmap":  # va size
        r = cuda.cuMemUnmap(u64(int(a[0])), ctypes.c_size_t(int(a[1])))
        r = r or cuda.cuMemAddressFree(u64(int(a[0])), ctypes.c_size_t(int(a[1])))
    elif op == "memset":  # va n
        r = cuda.cuMemsetD8_v2(u64(int(a[0])), ctypes.c_ubyte(7), ctypes.c_size_t(int(a[1])))
    elif op == "export":  # handle type: the descriptor, kept open here
        fd = c_int(-1)
        r = cuda.cuMemExportToShareableHandle(ctypes.byref(fd), u64(int(a[0])), int(a[1]), ctypes.c_ulonglong(0))
        out = fd.value
    elif op == "file":  # fd: what the file holds, and whether it can be written
        data = os.pread(int(a[0]), 4096, 0)
        try:
            os.pwrite(int(a[0]), b"x", 0)
            writable = 1
        except OSError:
            writable = 0
        r, out = 0, f"{data.hex() or '-'} {writable}"
    elif op == "import_path":  # path [type]: another process's descriptor, opened through /proc
        fd = os.open(a[0], os.O_RDONLY)
        r, out = import_fd(fd, int(a[1]) if len(a) > 1 else 1)
        os.close(fd)
    elif op == "import_bytes":  # hex: a file of this process's own holding these bytes
        fd = os.memfd_create("forged")
        os.write(fd, bytes.fromhex(a[0]) if a[0] != "-" else b"")
        r, out = import_fd(fd)
        os.close(fd)
    elif op == "import_fd":  # a raw descriptor number
        r, out = import_fd(int(a[0]))
    elif op == "release":
        r = cuda.cuMemRelease(u64(int(a[0])))
    elif op == "retain":  # address
        h = u64()
        r = cuda.cuMemRetainAllocationHandle(ctypes.byref(h), P(int(a[0])))
        out = h.value
    elif op == "props":  # handle: "loctype locid types"
        p = Prop()
        r = cuda.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(p), u64(int(a[0])))
        out = f"{p.loc.type} {p.loc.id} {p.handle_types} {p.win32 or 0}"
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""


def vmm_guests(guests, region, *gpus):
    return [guests(region, g, GUEST) for g in gpus]


def path_of(g, fd: str) -> str:
    """Another process's descriptor fd of guest process g, as a path its peers can open."""
    return f"/proc/{g.proc.pid}/fd/{fd}"


def sim_fds(pid: int) -> int:
    """How many of process pid's descriptors are the simulated driver's exported handles."""
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            n += os.readlink(fd).startswith("/memfd:sim-vmm")
        except OSError:
            pass
    return n


def test_a_vmm_handle_is_imported_by_another_process_of_the_guest_through_its_file(shm_path, two_gpus, guests):
    """A (GPU 0) makes a handle exportable as a descriptor and exports it: the guest gets a sealed
    file of 64 bytes (not the driver's descriptor; it cannot be written); exporting again gives the
    same handle.  B (GPU 1) imports it through A's file, maps it and names it in a memset; its
    properties say GPU 0 by the guest's number.  A exporting leaves exactly one driver descriptor on
    the host, held by the supervisor, none by any worker."""
    with asan_forwarder(shm_path) as fwd:
        a, b = vmm_guests(guests, shm_path, 0, 1)
        h = a.ok("create", 2 * MiB, POSIX_FD)
        fd = a.ok("export", h, POSIX_FD)
        data, writable = a.ok("file", fd).split()
        assert len(bytes.fromhex(data)) == 64 and writable == "0"
        assert b"simvmm" not in bytes.fromhex(data), "the driver's own descriptor reached the guest"
        assert a.ok("file", a.ok("export", h, POSIX_FD)).split()[0] == data
        assert sim_fds(fwd.proc.pid) == 1 and all(sim_fds(w) == 0 for w in worker_pids(fwd))
        imported = b.ok("import_path", path_of(a, fd))
        assert b.ok("props", imported).split() == [str(DEVICE), "0", str(POSIX_FD), "0"]
        va = b.ok("map", imported, 2 * MiB)
        assert b("memset", va, 2 * MiB) == (SUCCESS, "")
        assert b("memset", int(va) + 2 * MiB, 16)[0] == INVALID_VALUE  # past the mapping
        assert b("unmap", va, 2 * MiB) == (SUCCESS, "")
        assert b("release", imported) == (SUCCESS, "")
        assert b("release", imported)[0] == INVALID_VALUE
        a.exit()
        b.exit()
        assert fwd.proc.poll() is None, fwd.log()


def test_only_a_handle_of_its_own_made_to_be_shared_is_exported(shm_path, two_gpus, guests):
    """A handle made without requestedHandleTypes, another process's handle number, a released
    handle and a number naming nothing are refused (CUDA_ERROR_INVALID_VALUE); a fabric export, a
    fabric or Windows cuMemCreate and memory made on the host are refused as on a GPU without them
    (CUDA_ERROR_NOT_SUPPORTED), while the host's granularity is still answered (NCCL asks it)."""
    with asan_forwarder(shm_path) as fwd:
        a, b = vmm_guests(guests, shm_path, 0, 0)
        plain = a.ok("create", 2 * MiB, 0)
        assert a("export", plain, POSIX_FD)[0] == INVALID_VALUE
        shareable = a.ok("create", 2 * MiB, POSIX_FD)
        assert a("export", shareable, FABRIC)[0] == NOT_SUPPORTED
        assert a("export", shareable, 4)[0] == INVALID_VALUE  # no such type
        b.ok("create", 2 * MiB, POSIX_FD)  # B's first number: A's second (shareable) names nothing of B's
        assert b("export", shareable, POSIX_FD)[0] == INVALID_VALUE
        assert a("export", 0x1234, POSIX_FD)[0] == INVALID_VALUE
        a.ok("release", shareable)
        assert a("export", shareable, POSIX_FD)[0] == INVALID_VALUE
        assert a("create", 2 * MiB, FABRIC)[0] == NOT_SUPPORTED
        assert a("create", 2 * MiB, 2)[0] == NOT_SUPPORTED  # Windows
        assert a("create", 2 * MiB, POSIX_FD, HOST_NUMA)[0] == NOT_SUPPORTED
        assert int(a.ok("granularity", POSIX_FD, HOST_NUMA)) > 0
        assert fwd.proc.poll() is None, fwd.log()


def test_forged_cut_and_foreign_files_import_nothing(shm_path, two_gpus, guests):
    """Two guests, each with its own forwarder.  In guest 2: an empty file, 63 and 65 bytes of the
    true handle, random bytes, the handle with a bit of its token flipped, its slot moved past the
    table, an IPC memory handle of guest 2's presented as a VMM handle's, a descriptor that is no
    file (-1, a closed number), a fabric import, and guest 1's true file (through /proc) are all
    refused; guest 2's true file imports (the refusals are not a broken import); both forwarders
    serve on and nothing is left held by either's workers."""
    other = shm_path.with_name(shm_path.name + "-other")
    try:
        with asan_forwarder(shm_path) as fwd1, asan_forwarder(other) as fwd2:
            g1, a2, b2 = guests(shm_path, 0, GUEST), guests(other, 0, GUEST), guests(other, 0, GUEST)
            fd1 = g1.ok("export", g1.ok("create", 2 * MiB, POSIX_FD), POSIX_FD)
            fd2 = a2.ok("export", a2.ok("create", 2 * MiB, POSIX_FD), POSIX_FD)
            own = a2.ok("file", fd2).split()[0]
            refused = {
                "empty": "-",
                "63 bytes": own[:126],
                "65 bytes": own + "00",
                "random": os.urandom(64).hex(),
                "token flipped": tampered(own, 16),
                "token last byte": tampered(own, 31),
                "slot past the table": own[:24] + (4096).to_bytes(4, "little").hex() + own[32:],
                "kind of an IPC memory handle": own[:16] + (1).to_bytes(4, "little").hex() + own[24:],
                "magic": tampered(own, 0),
            }
            for name, content in refused.items():
                assert b2("import_bytes", content)[0] == INVALID_VALUE, name
            assert b2("import_fd", -1)[0] == INVALID_VALUE
            assert b2("import_fd", 987)[0] == INVALID_VALUE
            assert b2("import_path", path_of(a2, fd2), FABRIC)[0] == NOT_SUPPORTED
            assert b2("import_path", path_of(g1, fd1))[0] == INVALID_VALUE  # another guest's
            assert g1("import_path", path_of(a2, fd2))[0] == INVALID_VALUE
            assert int(b2.ok("import_path", path_of(a2, fd2))) != 0
            assert int(b2.ok("import_bytes", own)) != 0  # the same bytes in a file of its own
            for fwd in (fwd1, fwd2):
                assert fwd.proc.poll() is None, fwd.log()
                assert all(sim_fds(w) == 0 for w in worker_pids(fwd))
    finally:
        if other.exists():
            other.unlink()


def test_a_file_imports_nothing_once_its_exporter_lets_go_or_ends(shm_path, two_gpus, guests):
    """A exports two handles; B imports the first.  A releases it while it is still mapped by
    neither: a new import is refused and the supervisor closes its descriptor, while B's imported
    handle stays B's to map.  A ends cleanly: its second file imports nothing, and the host holds no
    descriptor.  A third exporter's worker is killed: its file is refused too, its descriptor
    closed, and the forwarder serves on."""
    with asan_forwarder(shm_path) as fwd:
        a, b = vmm_guests(guests, shm_path, 0, 1)
        hs = [a.ok("create", 2 * MiB, POSIX_FD) for _ in range(2)]
        fds = [a.ok("export", h, POSIX_FD) for h in hs]
        paths = [path_of(a, fd) for fd in fds]
        imported = b.ok("import_path", paths[0])
        assert sim_fds(fwd.proc.pid) == 2
        a.ok("release", hs[0])
        assert b("import_path", paths[0])[0] == INVALID_VALUE
        assert wait_for(lambda: sim_fds(fwd.proc.pid) == 1), sim_fds(fwd.proc.pid)
        va = b.ok("map", imported, 2 * MiB)
        assert b("memset", va, 4096) == (SUCCESS, "")
        # A's second file, kept open by this test so that it outlives A
        keep = os.open(paths[1], os.O_RDONLY)
        try:
            a.exit()
            assert wait_for(lambda: fwd.log().count("closed after") >= 1), fwd.log()
            assert b("import_path", f"/proc/{os.getpid()}/fd/{keep}")[0] == INVALID_VALUE
        finally:
            os.close(keep)
        assert wait_for(lambda: sim_fds(fwd.proc.pid) == 0), sim_fds(fwd.proc.pid)

        workers = set(worker_pids(fwd))
        (c,) = vmm_guests(guests, shm_path, 0)
        fd = c.ok("export", c.ok("create", 2 * MiB, POSIX_FD), POSIX_FD)
        keep = os.open(path_of(c, fd), os.O_RDONLY)
        try:
            c_worker = set(worker_pids(fwd)) - workers
            assert len(c_worker) == 1, (workers, c_worker)
            assert sim_fds(fwd.proc.pid) == 1
            os.kill(c_worker.pop(), signal.SIGKILL)
            assert wait_for(lambda: "died (signal 9)" in fwd.log()), fwd.log()
            assert b("import_path", f"/proc/{os.getpid()}/fd/{keep}")[0] == INVALID_VALUE
        finally:
            os.close(keep)
        assert wait_for(lambda: sim_fds(fwd.proc.pid) == 0)
        assert fwd.proc.poll() is None, fwd.log()


def test_a_new_worker_inherits_no_descriptor_the_supervisor_holds(shm_path, two_gpus, guests):
    """A exports a handle (the supervisor holds its descriptor); B and C connect after it: neither's
    worker holds a driver descriptor, and neither holds another worker's socket to the supervisor
    (each worker has exactly one Unix socket of the forwarder's)."""
    with asan_forwarder(shm_path) as fwd:
        (a,) = vmm_guests(guests, shm_path, 0)
        a.ok("export", a.ok("create", 2 * MiB, POSIX_FD), POSIX_FD)
        vmm_guests(guests, shm_path, 0, 1)
        workers = worker_pids(fwd)
        assert len(workers) == 3
        for w in workers:
            assert sim_fds(w) == 0
            socks = [fd for fd in Path(f"/proc/{w}/fd").iterdir() if os.readlink(fd).startswith("socket:")]
            assert len(socks) == 1, (w, socks)
        assert sim_fds(fwd.proc.pid) == 1


def test_an_imported_handle_is_charged_to_the_quota(shm_path, two_gpus, guests):
    """A guest with a 64 MiB quota on GPU 0: A makes and exports 40 MiB; B's import would keep
    those 40 MiB alive on its own after A lets go, so it is charged too, and is refused (over the
    quota); nothing is left behind by the refusal (B can still make 20 MiB).  Once A releases its
    handle, a 40 MiB handle of B's own fits."""
    with forwarder(shm_path, mem="64M,64M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, b = vmm_guests(guests, shm_path, 0, 0)
        h = a.ok("create", 40 * MiB, POSIX_FD)
        fd = a.ok("export", h, POSIX_FD)
        assert b("import_path", path_of(a, fd))[0] == OUT_OF_MEMORY
        small = b.ok("create", 20 * MiB, 0)
        b.ok("release", small)
        a.ok("release", h)
        assert int(b.ok("create", 40 * MiB, 0)) != 0
        assert fwd.proc.poll() is None, fwd.log()


def test_retain_names_only_its_own_mappings_and_holds_count(shm_path, two_gpus, guests):
    """cuMemRetainAllocationHandle: an address inside A's mapping gives A's handle (the same number),
    held once more: A's handle then takes two releases (a third is refused); a released handle that
    is still mapped is retained again under a new number.  An address that is no mapping, one past
    the mapping, or inside B's mapping named by A is refused.  Properties of a handle name the
    guest's GPU (the forwarder's --gpus 1,0: the guest's GPU 0 is the host's 1)."""
    with forwarder(shm_path, extra=["--gpus", "1,0"], asan=True) as fwd:
        a, b = vmm_guests(guests, shm_path, 0, 0)
        h = a.ok("create", 4 * MiB, 0)
        assert a.ok("props", h).split() == [str(DEVICE), "0", "0", "0"]
        va = int(a.ok("map", h, 4 * MiB))
        assert a.ok("retain", va + 3 * MiB) == h
        assert a("release", h) == (SUCCESS, "")
        assert a("release", h) == (SUCCESS, "")
        assert a("release", h)[0] == INVALID_VALUE
        again = a.ok("retain", va)
        assert again != h and int(again) != 0
        assert a("retain", va + 4 * MiB)[0] == INVALID_VALUE
        assert a("retain", 0x10000)[0] == INVALID_VALUE
        # B's second mapping lies past A's (each process's addresses start at the same place here)
        b.ok("map", b.ok("create", 2 * MiB, 0), 2 * MiB)
        bh = b.ok("create", 2 * MiB, 0)
        bva = int(b.ok("map", bh, 2 * MiB))
        assert bva >= va + 4 * MiB, (va, bva)
        assert a("retain", bva)[0] == INVALID_VALUE
        assert a("props", int(bh) + 1)[0] == INVALID_VALUE  # a number A never had
        a.ok("release", again)
        assert a("unmap", va, 4 * MiB) == (SUCCESS, "")
        assert fwd.proc.poll() is None, fwd.log()


def test_vmm_sharing_requests_cut_short_or_naming_nothing_are_refused_on_the_wire(shm_path):
    """Raw requests to the ASan/UBSan forwarder: exports and imports cut short or with unknown
    types, an import of a handle of zeros, a retain with no place for its answer or of no mapping,
    and properties of no handle: each refused with its CUresult, and the forwarder serves on."""
    with forwarder(shm_path, asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
            cases = [
                (185, b"", INVALID_VALUE),
                (185, q(1, POSIX_FD), INVALID_VALUE),  # no flags
                (185, q(1, POSIX_FD, 0), INVALID_VALUE),  # names no handle
                (185, q(1, FABRIC, 0), NOT_SUPPORTED),
                (185, q(1, POSIX_FD, 1), INVALID_VALUE),  # flags
                (186, q(POSIX_FD) + b"\0" * 10, INVALID_VALUE),  # cut short
                (186, q(POSIX_FD) + b"\0" * 64, INVALID_VALUE),
                (186, q(POSIX_FD) + b"\xff" * 64, INVALID_VALUE),
                (186, q(FABRIC) + b"\0" * 64, NOT_SUPPORTED),
                (186, q(0x7FFFFFFF) + b"\0" * 64, INVALID_VALUE),
                (187, q(0, 0x7E0000000000), INVALID_VALUE),  # no answer
                (187, q(1, 0x7E0000000000), INVALID_VALUE),  # no mapping
                (187, q(1), INVALID_VALUE),
                (188, q(1, 0x1234), INVALID_VALUE),
                (188, q(0, 0x1234), INVALID_VALUE),
            ]
            got = [raw(chan, op, body, seq=i + 1)[0] for i, (op, body, _) in enumerate(cases)]
            assert got == [want for _, _, want in cases], got
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()


def test_a_driver_api_program_shares_vmm_memory_between_its_two_processes(shm_path, two_gpus):
    """tests/cuda/vmm_fd_pair.c, the GPU suite's program, through the forwarder with the guest's GPUs
    0 and 1: A makes, maps, fills and exports a handle and sends the descriptor over a Unix socket
    (SCM_RIGHTS); B imports, maps and writes it; each frees as NCCL does (retain from the address,
    release, unmap, release).  Every step succeeds, the byte checks left out ("nodata")."""
    with asan_forwarder(shm_path) as fwd:
        r = subprocess.run(
            [str(NATIVE / "vmm_fd_pair"), "0", "1", "nodata"],
            env=guest_env(shm_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert fwd.proc.poll() is None, fwd.log()
        assert wait_for(lambda: sim_fds(fwd.proc.pid) == 0), sim_fds(fwd.proc.pid)
    steps = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines() if line.startswith(("A ", "B ")))
    for s in ("A create", "A export", "B import", "B properties", "B map", "B overwrite", "B retain", "A release"):
        assert steps.get(s) == "0", (s, r.stdout)
    assert r.stdout.rstrip().endswith("vmm_fd_pair ok"), r.stdout
