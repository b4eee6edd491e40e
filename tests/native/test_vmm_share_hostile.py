"""Hostile use of VMM handles shared as file descriptors (ops 185-188; host_forwarder/native/ipc.c,
vmm.c and fd_broker.c), on the simulated backend and the ASan/UBSan forwarder, written against the
change by someone other than its author: hold counts driven past zero, one file imported many
times, the exporter importing its own file, the 1024-slot IPC table filled with both kinds of
entries, the supervisor made to hold as many descriptors as the table has slots under the usual
descriptor limit, importers and exporters killed mid-way, a supervisor that answers late, and
exporters and importers racing.  After each abuse: the quota is exactly what it was (nothing left
charged, nothing given back twice), no /memfd:sim-vmm descriptor lingers in the supervisor, a
worker or a guest process, and the forwarder still serves new guest processes.

Guest processes run the GUEST script of test_vmm_share_sim.py with the commands below added."""

import contextlib
import os
import resource
import signal
import struct
import threading
import time

import pytest

from tests.forwarder import forwarder, stop_at_rest, wait_for, worker_pids
from tests.native.test_generator import raw
from tests.native.test_ipc_sim import asan_forwarder
from tests.native.test_vmm_share_sim import GUEST as VMM_GUEST
from tests.native.test_vmm_share_sim import path_of, sim_fds
from vmgpu import shm

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, OPERATING_SYSTEM = 0, 1, 2, 304
POSIX_FD = 1
MiB = 1 << 20

# State the added commands keep between lines: handles made by export_n, blocks exported by ipc_fill.
_PRELUDE = r"""
made, blocks = [], []
def tally(codes):
    return ",".join(f"{k}={v}" for k, v in sorted(codes.items())) or "-"
def count(codes, key):
    codes[key] = codes.get(key, 0) + 1
"""

_COMMANDS = r"""
    elif op == "close":  # fd
        os.close(int(a[0]))
        r = 0
    elif op == "headroom":  # cap: 2 MiB handles made until refused (at most cap), then released: "<MiB> <refusal>"
        hs, h, p = [], u64(), prop(0)
        refusal = 0
        while len(hs) < int(a[0]):
            refusal = cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 << 20), ctypes.byref(p), u64(0))
            if refusal:
                break
            hs.append(h.value)
        bad = [x for x in hs if cuda.cuMemRelease(u64(x))]
        r, out = (999 if bad else 0), f"{2 * len(hs)} {refusal}"
    elif op == "export_n":  # n size: handles made and exported (files closed) until n or a refusal: "<n> <refusal>"
        n, size, done, refusal = int(a[0]), int(a[1]), 0, 0
        while done < n:
            h, p, fd = u64(), prop(1), c_int(-1)
            refusal = cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_ulonglong(0))
            if refusal:
                break
            made.append(h.value)
            refusal = cuda.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0))
            if refusal:
                break
            os.close(fd.value)
            done += 1
        r, out = 0, f"{done} {refusal}"
    elif op == "release_made":  # k: the last k handles export_n made, released: the worst CUresult
        codes = [cuda.cuMemRelease(u64(made.pop())) for _ in range(int(a[0]))]
        r = max(codes, default=0)
    elif op == "ipc_fill":  # [cap]: 4 KiB blocks exported with cuIpcGetMemHandle until refused: "<n> <refusal>"
        p, hb = u64(), ctypes.create_string_buffer(64)
        n, cap, refusal = 0, int(a[0]) if a else 1 << 30, 0
        while n < cap:
            refusal = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
            if refusal:
                break
            refusal = cuda.cuIpcGetMemHandle(hb, p)
            if refusal:
                cuda.cuMemFree_v2(p)
                break
            blocks.append(p.value)
            n += 1
        r, out = 0, f"{n} {refusal}"
    elif op == "ipc_one":  # one more 4 KiB block exported with cuIpcGetMemHandle: its CUresult
        p, hb = u64(), ctypes.create_string_buffer(64)
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
        if r == 0:
            r = cuda.cuIpcGetMemHandle(hb, p)
            if r:
                cuda.cuMemFree_v2(p)
            else:
                blocks.append(p.value)
    elif op == "ipc_free":  # k: the last k exported blocks freed
        codes = [cuda.cuMemFree_v2(u64(blocks.pop())) for _ in range(int(a[0]))]
        r = max(codes, default=0)
    elif op == "churn":  # n target: n rounds of a new handle exported onto descriptor target, the one before released
        n, target, prev, codes = int(a[0]), int(a[1]), None, {}
        for _ in range(n):
            h, p, fd = u64(), prop(1), c_int(-1)
            rr = cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 << 20), ctypes.byref(p), ctypes.c_ulonglong(0))
            count(codes, f"create{rr}")
            if rr == 0:
                rr = cuda.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0))
                count(codes, f"export{rr}")
                if rr == 0:
                    os.dup2(fd.value, target)
                    os.close(fd.value)
            if prev is not None:
                count(codes, f"release{cuda.cuMemRelease(u64(prev))}")
            prev = h.value if h.value else None
        if prev is not None:
            count(codes, f"release{cuda.cuMemRelease(u64(prev))}")
        r, out = 0, tally(codes)
    elif op == "import_loop":  # path n: n imports through path, each imported handle released: tally
        codes = {}
        for _ in range(int(a[1])):
            try:
                fd = os.open(a[0], os.O_RDONLY)
            except OSError:
                count(codes, "noopen")
                continue
            rr, h = import_fd(fd)
            os.close(fd)
            count(codes, f"import{rr}")
            if rr == 0:
                count(codes, f"release{cuda.cuMemRelease(u64(h))}")
        r, out = 0, tally(codes)
"""

_ELSE = '    else:\n        raise SystemExit("unknown command " + op)'
assert _ELSE in VMM_GUEST and 'print("ready", flush=True)' in VMM_GUEST
GUEST = VMM_GUEST.replace('print("ready", flush=True)', _PRELUDE + 'print("ready", flush=True)').replace(
    _ELSE, _COMMANDS + _ELSE
)


# ---- helpers ------------------------------------------------------------------------------------


def start(guests, fwd, region, gpu=0):
    """A guest process of the hostile script, and the worker that serves it."""
    before = set(worker_pids(fwd))
    g = guests(region, gpu, GUEST)
    assert wait_for(lambda: len(set(worker_pids(fwd)) - before) == 1), (before, worker_pids(fwd))
    (w,) = set(worker_pids(fwd)) - before
    return g, w


def send(g, *words) -> None:
    """A command written without waiting for its answer."""
    g.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
    g.proc.stdin.flush()


def answer(g) -> tuple[int, str]:
    line = g.proc.stdout.readline()
    assert line, f"the guest process ended: {g.stderr()}"
    r, _, value = line.strip().partition(" ")
    return int(r), value


def tally(text: str) -> dict:
    return {} if text == "-" else {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}


def headroom(g, cap: int = 64) -> int:
    """MiB of 2 MiB handles g can still make before the quota refuses one (all given back)."""
    made, refusal = map(int, g.ok("headroom", cap).split())
    assert refusal == OUT_OF_MEMORY, (made, refusal)
    return made


def driver_fds(fwd, *guest_procs) -> dict:
    """The simulated driver's exported descriptors held anywhere: supervisor, workers, guests."""
    pids = [fwd.proc.pid, *worker_pids(fwd), *(g.proc.pid for g in guest_procs)]
    held = {}
    for pid in pids:
        try:
            n = sim_fds(pid)
        except OSError:
            continue  # ended meanwhile
        if n:
            held[pid] = n
    return held


def serves_sharing(guests, fwd, region) -> None:
    """The forwarder still serves new guest processes, VMM sharing included."""
    x, _ = start(guests, fwd, region, 0)
    y, _ = start(guests, fwd, region, 1)
    h = x.ok("create", 2 * MiB, POSIX_FD)
    fd = x.ok("export", h, POSIX_FD)
    imported = y.ok("import_path", path_of(x, fd))
    assert y("release", imported) == (SUCCESS, "")
    assert x("release", h) == (SUCCESS, "")
    x.exit()
    y.exit()
    assert fwd.proc.poll() is None, fwd.log()


# ---- holds ----------------------------------------------------------------------------------------


def test_holds_given_back_past_zero_release_the_driver_handle_once_and_the_quota_exactly(shm_path, two_gpus, guests):
    """A handle retained three times through its mapping takes four releases; the fifth, an export
    and its properties are refused; B imports A's file while A holds the handle at all, and not
    after.  Retaining the released (still mapped) handle names it anew: the old number stays
    refused, a new export gives a new file (the old one stays dead).  The quota follows: a released
    handle still mapped is charged, and once unmapped everything is back exactly (B's headroom as
    at the start: nothing left charged, nothing given back twice)."""
    with forwarder(shm_path, mem="64M,64M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        b, _ = start(guests, fwd, shm_path, 0)
        base = headroom(b)
        assert base >= 16, base
        h = a.ok("create", 8 * MiB, POSIX_FD)
        va = int(a.ok("map", h, 8 * MiB))
        for off in (0, 3 * MiB, 8 * MiB - 1):
            assert a.ok("retain", va + off) == h
        fd = a.ok("export", h, POSIX_FD)
        for _ in range(3):
            assert a("release", h) == (SUCCESS, "")
            imported = b.ok("import_path", path_of(a, fd))  # A still holds it
            assert b("release", imported) == (SUCCESS, "")
        assert a("release", h) == (SUCCESS, "")  # the fourth: A's last hold
        assert b("import_path", path_of(a, fd))[0] == INVALID_VALUE
        assert wait_for(lambda: not driver_fds(fwd, a, b)), driver_fds(fwd, a, b)
        assert a("release", h)[0] == INVALID_VALUE
        assert a("export", h, POSIX_FD)[0] == INVALID_VALUE
        assert a("props", h)[0] == INVALID_VALUE
        assert headroom(b) == base - 8  # released but mapped: still charged

        again = a.ok("retain", va + MiB)
        assert again not in ("0", h)
        assert a("release", h)[0] == INVALID_VALUE  # the old number names nothing
        fd2 = a.ok("export", again, POSIX_FD)
        assert b("import_path", path_of(a, fd))[0] == INVALID_VALUE  # the first file stays dead
        imported = b.ok("import_path", path_of(a, fd2))
        assert headroom(b) == base - 16  # B's import is charged too
        assert b("release", imported) == (SUCCESS, "")
        assert b("release", imported)[0] == INVALID_VALUE
        assert a("release", again) == (SUCCESS, "")
        assert a("release", again)[0] == INVALID_VALUE
        assert b("import_path", path_of(a, fd2))[0] == INVALID_VALUE
        third = a.ok("retain", va)
        assert a("release", third) == (SUCCESS, "")
        assert headroom(b) == base - 8
        assert a("unmap", va, 8 * MiB) == (SUCCESS, "")
        assert a("retain", va)[0] == INVALID_VALUE
        assert headroom(b) == base, "the quota is not back exactly where it was"
        assert wait_for(lambda: not driver_fds(fwd, a, b)), driver_fds(fwd, a, b)
        serves_sharing(guests, fwd, shm_path)


def test_one_file_imported_many_times_is_charged_each_time_and_given_back_once_each(shm_path, two_gpus, guests):
    """B imports A's 8 MiB file until the quota refuses: exactly as many imports as fit, each a
    handle of its own; each is released once (a second release is refused), and the quota is back
    exactly.  The exporter importing its own file gets a handle of its own that outlives the one
    it exported, and that it may export in turn."""
    with forwarder(shm_path, mem="64M,64M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        b, _ = start(guests, fwd, shm_path, 0)
        base = headroom(b)
        h = a.ok("create", 8 * MiB, POSIX_FD)
        fd = a.ok("export", h, POSIX_FD)
        fits = (base - 8) // 8
        imports = [b.ok("import_path", path_of(a, fd)) for _ in range(fits)]
        assert b("import_path", path_of(a, fd))[0] == OUT_OF_MEMORY
        assert len(set(imports)) == fits and h not in imports
        assert all(b.ok("props", i).split()[:2] == ["1", "0"] for i in imports)
        for i in imports:
            assert b("release", i) == (SUCCESS, "")
        for i in imports:
            assert b("release", i)[0] == INVALID_VALUE
        assert headroom(b) == base - 8

        own = a.ok("import_path", path_of(a, fd))
        assert own != h
        assert headroom(b) == base - 16
        assert a("release", h) == (SUCCESS, "")
        assert b("import_path", path_of(a, fd))[0] == INVALID_VALUE
        fd2 = a.ok("export", own, POSIX_FD)
        got = b.ok("import_path", path_of(a, fd2))
        assert b("release", got) == (SUCCESS, "")
        assert a("release", own) == (SUCCESS, "")
        assert b("import_path", path_of(a, fd2))[0] == INVALID_VALUE
        assert headroom(b) == base
        assert wait_for(lambda: not driver_fds(fwd, a, b)), driver_fds(fwd, a, b)


# ---- the table ------------------------------------------------------------------------------------


def test_the_ipc_table_is_shared_slot_by_slot_with_cuIpcGetMemHandle(shm_path, two_gpus, guests):
    """A exports one VMM handle fifty times (one slot: the same file each time), then fills the rest
    of the 1024-slot table with cuIpcGetMemHandle exports: exactly 1023 fit.  A second VMM handle's
    export is then refused before the driver is asked (no descriptor made), until one memory block
    is freed; the table full again refuses memory exports too, until the first handle is released.
    B imports what was exported all along; the refusals leave no descriptor anywhere."""
    with asan_forwarder(shm_path) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        b, _ = start(guests, fwd, shm_path, 1)
        h1 = a.ok("create", 2 * MiB, POSIX_FD)
        fd1 = a.ok("export", h1, POSIX_FD)
        content = a.ok("file", fd1).split()[0]
        for _ in range(50):
            fd = a.ok("export", h1, POSIX_FD)
            assert a.ok("file", fd).split()[0] == content
            a.ok("close", fd)
        assert sim_fds(fwd.proc.pid) == 1
        n, refusal = map(int, a.ok("ipc_fill").split())
        assert (n, refusal) == (1023, OUT_OF_MEMORY)
        h2 = a.ok("create", 2 * MiB, POSIX_FD)
        assert a("export", h2, POSIX_FD)[0] == OUT_OF_MEMORY
        assert driver_fds(fwd, a, b) == {fwd.proc.pid: 1}
        assert int(b.ok("import_path", path_of(a, fd1))) != 0
        a.ok("ipc_free", 1)
        fd2 = a.ok("export", h2, POSIX_FD)
        assert a("ipc_one")[0] == OUT_OF_MEMORY
        assert int(b.ok("import_path", path_of(a, fd2))) != 0
        assert driver_fds(fwd, a, b) == {fwd.proc.pid: 2}
        a.ok("release", h1)
        assert b("import_path", path_of(a, fd1))[0] == INVALID_VALUE
        assert wait_for(lambda: driver_fds(fwd, a, b) == {fwd.proc.pid: 1}), driver_fds(fwd, a, b)
        assert a("ipc_one") == (SUCCESS, "")
        assert a("export", a.ok("create", 2 * MiB, POSIX_FD), POSIX_FD)[0] == OUT_OF_MEMORY
        a.ok("ipc_free", 1023)
        a.ok("release", h2)
        a.exit()
        b.exit()
        assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)
        serves_sharing(guests, fwd, shm_path)


def test_a_table_full_of_vmm_exports_under_the_usual_descriptor_limit_leaves_later_processes_sharing(
    shm_path, two_gpus, guests
):
    """The forwarder started with the soft RLIMIT_NOFILE most services get (1024: systemd's
    default, which vmgpud's forwarders inherit).  A guest process fills the IPC table with VMM
    exports: the supervisor must hold one descriptor per slot, so every slot is usable (the 1025th
    export is refused as a full table, not as a failure of the supervisor).  Processes B and C
    connect while the table is full; once A lets go of a few handles, B exports and C imports (a
    worker started while the supervisor had no descriptor to spare must not lose VMM sharing for
    its whole life)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.ExitStack() as stack:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        try:
            fwd = stack.enter_context(asan_forwarder(shm_path))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        a, _ = start(guests, fwd, shm_path, 0)
        filled = tuple(map(int, a.ok("export_n", 1025, 2 * MiB).split()))
        # a guest that keeps trying past a full table gets refused each time, and logged once
        assert tuple(map(int, a.ok("export_n", 1, 2 * MiB).split())) == (0, OUT_OF_MEMORY)
        assert a("export_n", 1, 2 * MiB)[0] == SUCCESS
        b, _ = start(guests, fwd, shm_path, 0)
        c, _ = start(guests, fwd, shm_path, 1)
        assert a("release_made", 16) == (SUCCESS, "")
        h = b.ok("create", 2 * MiB, POSIX_FD)
        exported = b("export", h, POSIX_FD)
        imported = c("import_path", path_of(b, exported[1]))[0] if exported[0] == SUCCESS else None
        # every slot, unless the hard limit itself leaves less (then what it leaves after the
        # 16 workers' sockets and a margin of 64, said in the log): never a failure of the supervisor
        room = min(1024, hard - (2 * 16 + 64))
        assert (filled, exported[0], imported) == ((room, OUT_OF_MEMORY), SUCCESS, SUCCESS), fwd.log()[-2000:]
        assert (room < 1024) == ("VMM handles can be shared" in fwd.log()), fwd.log()[-2000:]
        assert fwd.log().count("IPC table is full") == (room == 1024), fwd.log()[-2000:]
        assert fwd.proc.poll() is None, fwd.log()


# ---- deaths and a late supervisor ----------------------------------------------------------------


def test_an_importer_killed_mid_way_leaves_nothing_behind(shm_path, two_gpus, guests):
    """B imports and releases A's file in a loop; its worker is killed mid-way (it may be holding
    the supervisor's copy of the descriptor, or the table's lock); then C does the same and its
    guest process is killed mid-way.  Whatever they held is gone: the supervisor holds A's one
    descriptor, no worker holds any, the quota is back exactly, A's file still imports, and the
    forwarder serves new processes."""
    with forwarder(shm_path, mem="256M,256M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        d, _ = start(guests, fwd, shm_path, 0)
        base = headroom(d, 256)
        h = a.ok("create", 4 * MiB, POSIX_FD)
        fd = a.ok("export", h, POSIX_FD)
        for victim in ("worker", "guest"):
            g, w = start(guests, fwd, shm_path, 1)
            send(g, "import_loop", path_of(a, fd), 100000)
            time.sleep(0.4)
            assert g.proc.poll() is None, g.stderr()
            if victim == "worker":
                os.kill(w, signal.SIGKILL)
                assert wait_for(lambda: "died (signal 9)" in fwd.log()), fwd.log()
                g.kill()
            else:
                g.kill()
                assert wait_for(lambda w=w: w not in worker_pids(fwd), 30), fwd.log()
            assert wait_for(lambda: driver_fds(fwd, a, d) == {fwd.proc.pid: 1}), driver_fds(fwd, a, d)
            assert headroom(d, 256) == base - 4
            imported = d.ok("import_path", path_of(a, fd))
            assert d("release", imported) == (SUCCESS, "")
        a.ok("release", h)
        assert headroom(d, 256) == base
        assert wait_for(lambda: not driver_fds(fwd, a, d)), driver_fds(fwd, a, d)
        serves_sharing(guests, fwd, shm_path)


def test_an_exporters_worker_killed_while_the_supervisor_has_not_taken_its_descriptor(shm_path, two_gpus, guests):
    """The supervisor is stopped; A asks for an export, and its worker, holding the driver's
    descriptor, waits for the supervisor to take it; the worker is killed there; the supervisor
    goes on.  The descriptor queued for it is not kept (none is held anywhere afterwards), and
    the forwarder serves new processes (whose worker may get the dead one's channel)."""
    with forwarder(shm_path, extra=["--gpus", "0,1", "--peer-timeout", "60"], asan=True) as fwd:
        a, w = start(guests, fwd, shm_path, 0)
        h = a.ok("create", 2 * MiB, POSIX_FD)
        stop_at_rest(fwd.proc.pid)
        try:
            send(a, "export", h, POSIX_FD)
            assert wait_for(lambda: sim_fds(w) == 1, 4), "the worker never held the driver's descriptor"
            os.kill(w, signal.SIGKILL)
            assert wait_for(lambda: not os.path.exists(f"/proc/{w}/fd/0"), 5)
        finally:
            os.kill(fwd.proc.pid, signal.SIGCONT)
        assert wait_for(lambda: "died (signal 9)" in fwd.log()), fwd.log()
        a.kill()
        assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)
        serves_sharing(guests, fwd, shm_path)
        # (the supervisor closes a released handle's descriptor at its next sweep, within 16 ms)
        assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)


def _create(chan, seq, size=2 * MiB, types=POSIX_FD) -> int:
    """cuMemCreate (op 115) on a raw channel, on the guest's GPU 0: the handle's number."""
    prop = struct.pack("<iiii8s8s", 1, types, 1, 0, b"", b"")  # CUmemAllocationProp: pinned, on GPU 0
    r, body = raw(chan, 115, struct.pack("<QQQ", 1, size, 1) + prop + struct.pack("<Q", 0), seq)
    assert r == SUCCESS and len(body) == 8, (r, body)
    return struct.unpack("<Q", body)[0]


def _request(chan, op: int, body: bytes, seq: int) -> None:
    chan.send(1, struct.pack("<IHHQ", op, 0, 0, seq) + body)  # VG_REC_REQUEST


def _reply(chan, op: int, seq: int, timeout_s: float = 15) -> tuple[int, bytes]:
    rtype, rep = chan.recv(timeout_s=timeout_s)
    result, rop, rseq = struct.unpack_from("<iIQ", rep)
    assert (rtype, rop, rseq) == (2, op, seq)
    return result, rep[16:]


def test_exports_and_imports_the_supervisor_answers_too_late_are_refused_and_leave_nothing(shm_path, two_gpus, guests):
    """Two raw channels (which, unlike the guest library, wait a minute for a silent host).  The
    supervisor is stopped past the workers' 5 s wait while R1 exports a new handle and R2 imports
    R1's earlier one: the export is refused (CUDA_ERROR_OPERATING_SYSTEM), the import refused
    (CUDA_ERROR_INVALID_VALUE).  The supervisor then answers both late: the late answers are
    dropped by the workers (the descriptor sent late to R2's worker is not kept), the descriptor
    R1's worker sent late is not kept by the supervisor, and the next export and imports work: the
    supervisor holds exactly the two live exports' descriptors, then none."""
    q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
    with forwarder(shm_path, extra=["--gpus", "0,1", "--peer-timeout", "60"], asan=True) as fwd:
        region = shm.Region.open(shm_path)
        r1 = shm.GuestChannel(region, opts=shm.wait_opts(peer_timeout_s=60))
        r2 = shm.GuestChannel(region, opts=shm.wait_opts(peer_timeout_s=60))
        try:
            h0, h1 = _create(r1, 1), _create(r1, 2)
            r, g0 = raw(r1, 185, q(h0, POSIX_FD, 0), 3)
            assert r == SUCCESS and len(g0) == 64, (r, g0)
            stop_at_rest(fwd.proc.pid)
            try:
                _request(r1, 185, q(h1, POSIX_FD, 0), 4)
                _request(r2, 186, q(POSIX_FD) + g0, 5)
                late = [_reply(r1, 185, 4)[0], _reply(r2, 186, 5)[0]]  # each after the worker's 5 s wait
            finally:
                os.kill(fwd.proc.pid, signal.SIGCONT)
            assert late == [OPERATING_SYSTEM, INVALID_VALUE]
            time.sleep(0.2)  # the supervisor answers what was queued
            r, g1 = raw(r1, 185, q(h1, POSIX_FD, 0), 6)
            assert r == SUCCESS and len(g1) == 64 and g1 != g0, (r, g1)
            seq = 7
            for g in (g0, g1):
                r, body = raw(r2, 186, q(POSIX_FD) + g, seq)
                assert r == SUCCESS, r
                assert raw(r2, 116, body, seq + 1)[0] == SUCCESS
                seq += 2
            assert wait_for(lambda: driver_fds(fwd) == {fwd.proc.pid: 2}), driver_fds(fwd)
            for h in (h0, h1):
                assert raw(r1, 116, q(h), seq)[0] == SUCCESS
                seq += 1
            assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)
        finally:
            r1.close()
            r2.close()
            region.close()
        serves_sharing(guests, fwd, shm_path)
        # (the supervisor closes a released handle's descriptor at its next sweep, within 16 ms)
        assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)


# ---- races ----------------------------------------------------------------------------------------


def test_exporters_and_importers_racing_keep_the_charges(shm_path, two_gpus, guests):
    """A churns (a new handle exported onto one descriptor number, the one before released), while
    B and C import through that descriptor in loops and a fourth process fills and empties most of
    the table with memory exports (the lock contended).  Every answer is a success or
    CUDA_ERROR_INVALID_VALUE (the file named a handle already let go); at least some imports
    succeed; afterwards the quota is back exactly, no descriptor is held anywhere, and the
    forwarder serves new processes."""
    with forwarder(shm_path, mem="1024M,1024M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        b, _ = start(guests, fwd, shm_path, 1)
        c, _ = start(guests, fwd, shm_path, 0)
        f, _ = start(guests, fwd, shm_path, 1)
        base = headroom(c, 1024)
        target = 777
        results: dict = {}

        def run(name, g, *words):
            results[name] = g(*words)

        threads = [
            threading.Thread(target=run, args=("a", a, "churn", 1000, target)),
            threading.Thread(target=run, args=("b", b, "import_loop", path_of(a, str(target)), 400)),
            threading.Thread(target=run, args=("c", c, "import_loop", path_of(a, str(target)), 400)),
        ]
        threads[0].start()
        assert wait_for(lambda: os.path.exists(path_of(a, str(target))) or not threads[0].is_alive())
        for t in threads[1:]:
            t.start()
        fills = []
        while threads[0].is_alive():
            n, refusal = map(int, f.ok("ipc_fill", 1000).split())
            fills.append((n, refusal))
            f.ok("ipc_free", n)
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert all(r == SUCCESS for r, _ in results.values()), results
        churn = tally(results["a"][1])
        assert set(churn) <= {"create0", "export0", "release0"}, churn
        assert churn["export0"] == churn["release0"] == 1000, churn
        assert fills and set(fills) == {(1000, SUCCESS)}, fills
        imported = 0
        for name in ("b", "c"):
            got = tally(results[name][1])
            assert set(got) <= {"import0", "import1", "release0", "noopen"}, (name, got)
            assert got.get("import0", 0) == got.get("release0", 0), (name, got)
            imported += got.get("import0", 0)
        assert imported > 0, results
        assert headroom(c, 1024) == base
        assert wait_for(lambda: not driver_fds(fwd, a, b, c, f)), driver_fds(fwd, a, b, c, f)
        serves_sharing(guests, fwd, shm_path)


def test_an_exporter_killed_in_the_middle_of_a_churn_frees_the_table_and_the_lock(shm_path, two_gpus, guests):
    """A churns exports while B imports through its descriptor; A's worker is killed at some
    point of it (it may hold the table's robust lock, an entry still pending, or a descriptor
    on its way to the supervisor).  The supervisor serves on: its descriptors close, the whole
    table is free again (1024 memory exports fit), and new processes share VMM handles."""
    with asan_forwarder(shm_path) as fwd:
        a, wa = start(guests, fwd, shm_path, 0)
        b, _ = start(guests, fwd, shm_path, 1)
        target = 777
        send(a, "churn", 100000, target)
        send(b, "import_loop", path_of(a, str(target)), 100000)
        time.sleep(0.6)
        os.kill(wa, signal.SIGKILL)
        assert wait_for(lambda: "died (signal 9)" in fwd.log()), fwd.log()
        a.kill()
        b.kill()
        assert wait_for(lambda: not driver_fds(fwd)), driver_fds(fwd)
        (g, _) = start(guests, fwd, shm_path, 0)
        n, refusal = map(int, g.ok("ipc_fill").split())
        assert (n, refusal) == (1024, OUT_OF_MEMORY)
        g.ok("ipc_free", n)
        g.exit()
        serves_sharing(guests, fwd, shm_path)


# ---- the wire --------------------------------------------------------------------------------------


def test_a_raw_channel_without_a_context_imports_a_file_many_times_and_its_end_gives_all_back(
    shm_path, two_gpus, guests
):
    """A raw channel (no context of its own) imports A's true handle (the bytes of A's file) twenty
    times: twenty different numbers, each released once and refused the second time (op 116); its
    holds of a number never cross to another: A's own number, released through the raw channel,
    is refused.  Ten more imports are left held when the channel closes: the quota is back
    exactly, and nothing is held anywhere once A lets go."""
    with forwarder(shm_path, mem="256M,256M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, _ = start(guests, fwd, shm_path, 0)
        base = headroom(a, 256)
        h = a.ok("create", 4 * MiB, POSIX_FD)
        handle = bytes.fromhex(a.ok("file", a.ok("export", h, POSIX_FD)).split()[0])
        q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        seq = iter(range(1, 1 << 20))
        try:
            numbers = []
            for _ in range(30):
                r, body = raw(chan, 186, q(POSIX_FD) + handle, next(seq))
                assert r == SUCCESS and len(body) == 8, (r, body)
                numbers.append(struct.unpack("<Q", body)[0])
            assert len(set(numbers)) == 30 and int(h) not in numbers
            assert headroom(a, 256) == base - 4 - 30 * 4
            assert raw(chan, 116, q(int(h)), next(seq))[0] == INVALID_VALUE  # A's number is A's
            for n in numbers[:20]:
                assert raw(chan, 116, q(n), next(seq))[0] == SUCCESS
                assert raw(chan, 116, q(n), next(seq))[0] == INVALID_VALUE
            assert headroom(a, 256) == base - 4 - 10 * 4
        finally:
            chan.close()
            region.close()
        assert wait_for(lambda: headroom(a, 256) == base - 4), headroom(a, 256)
        a.ok("release", h)
        assert headroom(a, 256) == base
        assert wait_for(lambda: not driver_fds(fwd, a)), driver_fds(fwd, a)
        assert fwd.proc.poll() is None, fwd.log()
