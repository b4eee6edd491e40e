"""IPC between the processes of one guest (host_forwarder/native/ipc.c), on the simulated backend
and the ASan/UBSan forwarder: cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle,
cuIpcGetEventHandle and cuIpcOpenEventHandle between two guest processes of one guest (each its
own worker), and the boundary: only the base of a process's own cuMemAlloc block is exported, and
a forged handle, one whose token is wrong, one made by another guest's forwarder, or one whose
block was freed or whose process ended opens nothing.

The simulated backend cannot share bytes between two workers (each keeps its device memory in its
own host memory): an open maps a new, zeroed block of the exported block's size at an address of
the opener's (sim/ipc.c).  These tests check who may open what, and that an opened block is the
opener's to name in copies and memsets, not that bytes written by one process are read by the
other; that is for the GPU suite."""

import contextlib
import ctypes
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.forwarder import ASAN, NATIVE, forwarder, guest_env, wait_for, worker_pids
from tests.gpu.programs import driver_files_of
from tests.native.test_generator import raw
from vmgpu import abi, shm

pytestmark = pytest.mark.native

GUEST_LIB = NATIVE / "guest" / "libcuda.so.1"

# CUresult values the tests expect
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_HANDLE = 0, 1, 2, 400

# A guest process (ctypes on the guest's libcuda.so.1) on GPU argv[2] that runs one command per line
# read from stdin and answers one line: "<CUresult> [value]".  Handles cross as 128 hex digits.
GUEST = r"""
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
u64, P = ctypes.c_uint64, ctypes.c_void_p

class Handle(ctypes.Structure):  # CUipcMemHandle and CUipcEventHandle: 64 bytes, by value
    _fields_ = [("reserved", ctypes.c_char * 64)]

def handle(hexs):
    h = Handle()
    ctypes.memmove(ctypes.byref(h), bytes.fromhex(hexs), 64)
    return h

cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(u64), Handle, ctypes.c_uint]
cuda.cuIpcOpenEventHandle.argtypes = [ctypes.POINTER(P), Handle]
ctx = P()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), int(sys.argv[2])) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, args = w[0], w[1:]
    out = ""
    if op == "alloc":
        p = u64()
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(args[0])))
        out = p.value
    elif op == "free":
        r = cuda.cuMemFree_v2(u64(int(args[0])))
    elif op == "export_mem":
        h = Handle()
        r = cuda.cuIpcGetMemHandle(ctypes.byref(h), u64(int(args[0])))
        out = bytes(h).hex()
    elif op == "export_many":  # blocks taken and exported until one is refused: "<that CUresult> <exported> <a block>"
        p, h, n = u64(), Handle(), 0
        while True:
            r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
            r = r or cuda.cuIpcGetMemHandle(ctypes.byref(h), p)
            if r or n == int(args[0]):
                break
            n += 1
        out = f"{n} {p.value}"
    elif op == "open_mem":
        p = u64()
        r = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), handle(args[0]), 1)
        out = p.value
    elif op == "close_mem":
        r = cuda.cuIpcCloseMemHandle(u64(int(args[0])))
    elif op == "memset":  # the address named in a memset: only the process's own memory
        r = cuda.cuMemsetD8_v2(u64(int(args[0])), ctypes.c_ubyte(7), ctypes.c_size_t(int(args[1])))
    elif op == "event":  # flags: 6 = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING
        e = P()
        r = cuda.cuEventCreate(ctypes.byref(e), int(args[0]))
        out = e.value or 0
    elif op == "export_event":
        h = Handle()
        r = cuda.cuIpcGetEventHandle(ctypes.byref(h), P(int(args[0])))
        out = bytes(h).hex()
    elif op == "open_event":
        e = P()
        r = cuda.cuIpcOpenEventHandle(ctypes.byref(e), handle(args[0]))
        out = e.value or 0
    elif op == "record":
        r = cuda.cuEventRecord(P(int(args[0])), None)
        r = r or cuda.cuCtxSynchronize()
    elif op == "wait":
        r = cuda.cuStreamWaitEvent(None, P(int(args[0])), 0)
        r = r or cuda.cuStreamSynchronize(None)
    elif op == "query":
        r = cuda.cuEventQuery(P(int(args[0])))
    elif op == "destroy_event":
        r = cuda.cuEventDestroy_v2(P(int(args[0])))
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""


def asan_forwarder(region, **kw):
    if not (ASAN / "vmgpu-forwarder").exists():
        pytest.fail("build/asan is missing: run `make native-asan`")
    return forwarder(region, extra=["--gpus", "0,1"], asan=True, **kw)


def tampered(hexs: str, byte: int) -> str:
    b = bytearray(bytes.fromhex(hexs))
    b[byte] ^= 0x01
    return b.hex()


def test_a_guest_process_opens_and_closes_memory_another_process_of_its_guest_exported(shm_path, two_gpus, guests):
    """A (GPU 0) exports the base of a block of its own; B (GPU 1) opens it, and the mapping is B's
    to name in a memset; opening it again gives the same address, and each close takes one open
    back (the driver's counting): a third close, or a memset after the last, is refused.  A
    exporting the same block twice gets the same handle; the handle is not the simulated driver's
    (the guest never sees the real one)."""
    with asan_forwarder(shm_path) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 1, GUEST)
        block = a.ok("alloc", 1 << 20)
        h = a.ok("export_mem", block)
        assert a.ok("export_mem", block) == h
        assert b"simipc" not in bytes.fromhex(h), "the driver's own handle reached the guest"
        opened = b.ok("open_mem", h)
        assert int(opened) != 0
        assert b("memset", opened, 1 << 20) == (SUCCESS, "")
        assert b("memset", opened, (1 << 20) + 1)[0] == INVALID_VALUE  # one byte past the block
        assert b.ok("open_mem", h) == opened
        assert b("close_mem", opened) == (SUCCESS, "")
        assert b("memset", opened, 16) == (SUCCESS, "")  # still open once
        assert b("close_mem", opened) == (SUCCESS, "")
        assert b("close_mem", opened)[0] == INVALID_VALUE
        assert b("memset", opened, 16)[0] == INVALID_VALUE
        assert b("free", opened)[0] == INVALID_VALUE  # never B's to free
        a.exit()
        b.exit()
        assert fwd.proc.poll() is None, fwd.log()


def test_only_the_base_of_a_block_of_its_own_is_exported(shm_path, two_gpus, guests):
    """An address inside A's block (not its base), an address that is none of A's memory, B's
    memory named by A (the same number in A names nothing), a block B opened by IPC (not B's
    cuMemAlloc block) and a freed block: each export refused with CUDA_ERROR_INVALID_VALUE."""
    with asan_forwarder(shm_path) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        block = int(a.ok("alloc", 4096))
        assert a("export_mem", block + 256)[0] == INVALID_VALUE
        assert a("export_mem", 0x1234000)[0] == INVALID_VALUE
        for _ in range(15):  # B's addresses start where A's do: its 16th lies past any of A's
            b_block = b.ok("alloc", 4096)
        assert a("export_mem", b_block)[0] == INVALID_VALUE
        opened = b.ok("open_mem", a.ok("export_mem", block))
        assert b("export_mem", opened)[0] == INVALID_VALUE
        freed = a.ok("alloc", 8192)
        a.ok("free", freed)
        assert a("export_mem", freed)[0] == INVALID_VALUE
        assert fwd.proc.poll() is None, fwd.log()


def test_forged_and_foreign_handles_open_nothing(shm_path, two_gpus, guests):
    """Two guests, each with its own forwarder and region.  In guest 2: random bytes, guest 2's own
    handle with one bit of its token flipped, with its slot moved to another used slot or past the
    table, a memory handle presented as an event's, and a handle guest 1 made for a block of its
    own (the same slot as guest 2's, another forwarder's token) are all refused with
    CUDA_ERROR_INVALID_VALUE; guest 2's true handle opens (the refusals are not a broken open);
    both forwarders serve on."""
    other = shm_path.with_name(shm_path.name + "-other")
    try:
        with asan_forwarder(shm_path) as fwd1, asan_forwarder(other) as fwd2:
            g1, a2, b2 = guests(shm_path, 0, GUEST), guests(other, 0, GUEST), guests(other, 0, GUEST)
            foreign = g1.ok("export_mem", g1.ok("alloc", 4096))
            own = a2.ok("export_mem", a2.ok("alloc", 4096))
            second = a2.ok("export_mem", a2.ok("alloc", 4096))
            assert foreign[:32] == own[:32], "both handles should name slot 0 of their own table"
            refused = {
                "random": os.urandom(64).hex(),
                "token_flipped": tampered(own, 16),
                "token_last_byte": tampered(own, 31),
                "other_slot": own[:24] + second[24:32] + own[32:],
                "slot_past_table": own[:24] + (4096).to_bytes(4, "little").hex() + own[32:],
                "magic": tampered(own, 0),
                "foreign": foreign,
            }
            for name, h in refused.items():
                assert b2("open_mem", h)[0] == INVALID_VALUE, name
            assert b2("open_event", own)[0] == INVALID_VALUE
            assert int(b2.ok("open_mem", own)) != 0
            assert g1("open_mem", own)[0] == INVALID_VALUE  # guest 2's handle in guest 1
            assert fwd1.proc.poll() is None and fwd2.proc.poll() is None, fwd1.log() + fwd2.log()
    finally:
        if other.exists():
            other.unlink()


def test_a_handle_opens_nothing_new_once_its_block_is_freed_or_its_process_ends(shm_path, two_gpus, guests):
    """A exports two blocks; B opens the first.  A frees it: a new open of its handle is refused,
    B's open mapping stays B's to name (the driver's semantics), and A's next block of its size is
    new memory, not the freed block kept for reuse.  A ends cleanly: its second
    block's handle is refused.  A second exporter's worker is killed (the supervisor removes what
    it exported): its handle is refused too, and the forwarder serves on."""
    with asan_forwarder(shm_path) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 1, GUEST)
        blocks = [a.ok("alloc", 4096) for _ in range(2)]
        handles = [a.ok("export_mem", p) for p in blocks]
        opened = b.ok("open_mem", handles[0])
        a.ok("free", blocks[0])
        # (the guest library sends a free without waiting for it: a call that waits for its answer
        # makes sure A's worker has done the free before B tries again)
        a.ok("event", 0)
        assert b("open_mem", handles[0])[0] == INVALID_VALUE
        # the freed block is not kept for A's next allocation of its size, as a block never exported
        # is (alloc.c): B still maps it, and A's new memory must not alias it
        assert a.ok("alloc", 4096) != blocks[0]
        plain = a.ok("alloc", 4096)
        a.ok("free", plain)
        assert a.ok("alloc", 4096) == plain
        assert b("memset", opened, 4096) == (SUCCESS, "")
        assert b.ok("close_mem", opened) == ""
        a.exit()
        assert wait_for(lambda: fwd.log().count("closed after") >= 1), fwd.log()
        assert b("open_mem", handles[1])[0] == INVALID_VALUE

        workers = set(worker_pids(fwd))
        c = guests(shm_path, 0, GUEST)
        h = c.ok("export_mem", c.ok("alloc", 4096))
        c_worker = set(worker_pids(fwd)) - workers
        assert len(c_worker) == 1, (workers, c_worker)
        os.kill(c_worker.pop(), signal.SIGKILL)
        assert wait_for(lambda: "died (signal 9)" in fwd.log()), fwd.log()
        assert b("open_mem", h)[0] == INVALID_VALUE
        assert fwd.proc.poll() is None, fwd.log()


def test_an_interprocess_event_is_exported_opened_recorded_and_waited_on(shm_path, two_gpus, guests):
    """A creates an event with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING and exports it (one
    with timing is refused, as the driver refuses it); B opens it, records it, waits on it and
    queries it, as A does with its own; a tampered event handle, or a memory handle presented as an
    event's, is refused; B destroys its opened event."""
    with asan_forwarder(shm_path) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 1, GUEST)
        timing = a.ok("event", 0)
        assert a("export_event", timing)[0] == INVALID_VALUE
        ev = a.ok("event", 6)
        h = a.ok("export_event", ev)
        opened = b.ok("open_event", h)
        assert int(opened) != 0
        for who, e in ((b, opened), (a, ev)):
            assert who("record", e) == (SUCCESS, "")
            assert who("wait", e) == (SUCCESS, "")
            assert who("query", e) == (SUCCESS, "")
        assert b("open_event", tampered(h, 20))[0] == INVALID_VALUE
        assert b("open_mem", h)[0] == INVALID_VALUE
        assert b("destroy_event", opened) == (SUCCESS, "")
        assert b("query", opened)[0] != SUCCESS  # a destroyed handle names nothing
        assert fwd.proc.poll() is None, fwd.log()


SHM = "/dev/shm"


@contextlib.contextmanager
def worker_with_its_neighbours(fwd, shm_path, guests):
    """A guest process's worker holding an interprocess event (so the driver has made its file),
    and beside that file names of its pattern that are not the worker's to remove: a link to it,
    another pid's, the pid spelled otherwise and, where the test runs as root to make it, another
    user's.  Yields (worker, {what: path}); the planted names are removed after."""
    g = guests(shm_path, 0, GUEST)
    assert wait_for(lambda: worker_pids(fwd)), fwd.log()
    (worker,) = worker_pids(fwd)
    g.ok("event", 6)
    made = driver_files_of(worker)
    assert made == {f"cuda.shm.0.{worker:x}.1"}, fwd.log()
    planted = {
        "link": f"{SHM}/cuda.shm.0.{worker:x}.3",
        "other pid": f"{SHM}/cuda.shm.0.{worker:x}0.1",
        "spelled otherwise": f"{SHM}/cuda.shm.0.0{worker:x}.1",
    }
    if os.geteuid() == 0:
        planted["foreign"] = f"{SHM}/cuda.shm.1.{worker:x}.2"
    try:
        for what, path in planted.items():
            if what == "link":
                os.symlink(f"{SHM}/{next(iter(made))}", path)
            else:
                with open(path, "x"):
                    pass
                if what == "foreign":
                    os.chown(path, 65534, 65534)
        yield worker, planted
    finally:
        for path in planted.values():
            if os.path.lexists(path):
                os.unlink(path)


def only_the_workers_files_went(worker: int, planted: dict, log: str) -> None:
    assert not (driver_files_of(worker) - {Path(p).name for p in planted.values()}), log
    for what, path in planted.items():
        assert os.path.lexists(path), what


def test_what_the_driver_left_in_dev_shm_for_a_killed_worker_is_removed(shm_path, two_gpus, guests):
    """The driver keeps a process's interprocess events in a root file in /dev/shm and leaves it
    behind when the process is killed (on the simulated backend: sim/ipc.c, as on an H100).  A
    guest that makes such an event and then truncates its region file has its workers killed
    (the region is formatted afresh): their files go as they are reaped, so a guest cannot fill the
    host's /dev/shm by doing it again and again.  Only the files of that worker, regular and the
    forwarder's user's, are removed: one another user made under such a name (where the test runs
    as root, to make it), a link, another pid's and the pid spelled otherwise stay."""
    with asan_forwarder(shm_path) as fwd:
        with worker_with_its_neighbours(fwd, shm_path, guests) as (worker, planted):
            os.truncate(shm_path, 4096)
            assert wait_for(lambda: "served again" in fwd.log()), fwd.log()
            assert wait_for(lambda: not Path(f"/proc/{worker}").exists()), fwd.log()
            only_the_workers_files_went(worker, planted, fwd.log())
            assert f"removed 1 file(s) the CUDA driver left in /dev/shm for worker {worker}" in fwd.log()
        assert fwd.proc.poll() is None, fwd.log()


def test_a_worker_that_ends_holding_an_interprocess_event_leaves_no_driver_file(shm_path, two_gpus, guests):
    """A guest process that ends without destroying its interprocess event: its worker destroys what
    it held (channel.c), the driver's file with it, so an ordinary end leaves nothing in /dev/shm
    whether or not the supervisor looks after it."""
    with asan_forwarder(shm_path) as fwd:
        g = guests(shm_path, 0, GUEST)
        (worker,) = worker_pids(fwd)
        g.ok("event", 6)
        assert driver_files_of(worker), fwd.log()
        g.exit()
        assert wait_for(lambda: not Path(f"/proc/{worker}").exists()), fwd.log()
        assert not driver_files_of(worker), fwd.log()


def ended(pid: int) -> bool:
    """pid has ended: no such process, or a zombie (whoever adopted it may not reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return True


def leave_nothing_of(worker: int, forwarder: int) -> None:
    """After a test that killed forwarder: its worker, should it live on, is killed, and what the
    two left in /dev/shm is removed (the driver's files of a worker that failed to remove them, and
    the module image cache, which is the next forwarder's to remove at its start:
    test_module_images.py), so that the test leaves nothing behind."""
    if not ended(worker):
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: ended(worker))
    for name in driver_files_of(worker):
        path = Path(SHM) / name
        if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.geteuid():
            path.unlink()
    for cache in Path(SHM).glob(f"vmgpu-images-{forwarder}.*"):
        shutil.rmtree(cache)


def test_a_worker_whose_forwarder_is_killed_removes_what_the_driver_left_for_it(shm_path, two_gpus, guests):
    """A forwarder killed outright (SIGKILL: it cannot reap its workers, and init, which adopts
    them, does not look in /dev/shm) must not leave the driver's file of a worker holding an
    interprocess event: the worker, told by its death signal that its supervisor is gone, removes
    it itself, says so, and ends, as before, at once.  The names beside it that are not its own
    stay, as when the supervisor removes them."""
    with asan_forwarder(shm_path) as fwd:
        with worker_with_its_neighbours(fwd, shm_path, guests) as (worker, planted):
            try:
                fwd.proc.kill()
                fwd.proc.wait()
                assert wait_for(lambda: ended(worker)), fwd.log()
                only_the_workers_files_went(worker, planted, fwd.log())
                said = f"worker {worker}: its supervisor is gone: removed 1 file(s) the CUDA driver made"
                assert wait_for(lambda: said in fwd.log()), fwd.log()
            finally:
                leave_nothing_of(worker, fwd.proc.pid)


def _page_names_worker(page: Path, channel: int, pid: int, forked_ns: int, started: int) -> None:
    """Write channel's worker entry of a statistics page (stats_abi.h) as a forwarder would."""
    with open(page, "r+b") as f:
        f.seek(abi.StatsPage.worker.offset + channel * ctypes.sizeof(abi.StatsWorker))
        f.write(struct.pack("<QQII", forked_ns, started, pid, 0))


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields from the third (the state) on."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _started(pid: int) -> int:
    """A process's start in clock ticks after boot (/proc/PID/stat's field 22)."""
    return int(_stat(pid)[19])


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_workers_killed_with_their_forwarder_at_one_stroke_have_their_files_removed_by_the_next(
    shm_path, two_gpus, guests, tmp_path
):
    """A forwarder killed together with its workers (SIGKILL to all at once, as a cgroup is killed:
    the worker cannot remove its files, nor the forwarder reap it) leaves the driver's files of its
    workers.  The statistics page outlives it and names the workers serving when it ended, when
    each was forked and started; the next forwarder given the page removes their files as it
    starts, and only theirs: the names beside them that are not the worker's stay, and so do the
    files of a pid the page names that another process has now (the test's own, started at another
    time) and of a dead pid made before the page says its worker was forked.  A worker still
    ending (a process that is the pid the page names, ending two seconds later) is looked at again
    while the forwarder serves, and its file removed once it has ended."""
    tmp_path.chmod(0o700)
    page = tmp_path / "guest.stats"
    extra = ["--gpus", "0,1", "--stats", str(page)]
    ending, reaper, files = None, None, {}
    with forwarder(shm_path, extra=extra, asan=True, keep_region=True) as fwd:
        first = fwd.proc.pid
        with worker_with_its_neighbours(fwd, shm_path, guests) as (worker, planted):
            try:
                os.kill(first, signal.SIGSTOP)  # (the stroke: neither can act before both are dead)
                assert wait_for(lambda: _stat(first)[0] == "T"), fwd.log()
                os.kill(worker, signal.SIGKILL)
                assert wait_for(lambda: ended(worker)), fwd.log()
                os.kill(first, signal.SIGKILL)
                fwd.proc.wait()
                assert wait_for(lambda: not Path(f"/proc/{worker}").exists()), fwd.log()
                assert driver_files_of(worker) - {Path(p).name for p in planted.values()}, "nothing was left"
                ending = subprocess.Popen(["sleep", "2"])  # (ends while the next forwarder starts)
                reaper = threading.Thread(target=ending.wait)  # (so that it is gone once it ends, not a zombie)
                reaper.start()
                named = {  # what: (pid, forked_ns, started, the file stays)
                    "live": (os.getpid(), 0, _started(os.getpid()) + 1, True),
                    "older": (_dead_pid(), time.time_ns() + 3600 * 10**9, 0, True),
                    "ending": (ending.pid, time.time_ns() - 10**9, _started(ending.pid), False),
                }
                for channel, (what, (pid, forked, started, _)) in enumerate(named.items(), start=100):
                    path = Path(SHM) / f"cuda.shm.0.{pid:x}.1"
                    assert not path.exists(), path
                    path.touch()
                    files[what] = path
                    _page_names_worker(page, channel, pid, forked, started)
                with forwarder(shm_path, extra=extra, asan=True, size=None) as again:
                    only_the_workers_files_went(worker, planted, again.log())
                    # (the process still ending when the forwarder looked, or already ended)
                    later = f"worker {ending.pid} of an earlier forwarder has ended: removed 1 file(s)"
                    at_once = "ended with 4 worker(s) at work; removed 2 file(s)"
                    assert wait_for(lambda: later in again.log() or at_once in again.log(), timeout=10), again.log()
                    log = again.log()
                    for what, (*_, stays) in named.items():
                        assert files[what].exists() == stays, (what, log)
                    assert (
                        at_once in log
                        or "at work; removed 1 file(s) the CUDA driver left in /dev/shm for them; 1 still ending" in log
                    ), log
                    assert "serving" not in log.split("serving /dev/shm", 1)[0], "a line before the start says serving"
                    assert f"worker {os.getpid()} of an earlier forwarder: another process has its pid" in log
                    assert f"worker {named['older'][0]} of" not in log, log
            finally:
                if ending:
                    ending.kill()
                    reaper.join()
                for path in files.values():
                    path.unlink(missing_ok=True)
                leave_nothing_of(worker, first)


@pytest.mark.parametrize("boot", ["this", "another"])
def test_a_page_of_an_earlier_boot_names_no_workers(shm_path, tmp_path, boot):
    """The statistics page is kept on disk, /dev/shm is emptied when the host starts, and pids
    begin again: a page made before the host last started names no worker whose files are for
    the forwarder to remove (only a page of this boot does)."""
    tmp_path.chmod(0o700)
    page = tmp_path / "guest.stats"
    data = bytearray(ctypes.sizeof(abi.StatsPage))
    struct.pack_into("<QI", data, 0, abi.STATS_MAGIC, abi.STATS_VERSION)
    this = Path("/proc/sys/kernel/random/boot_id").read_bytes()
    struct.pack_into("48s", data, abi.StatsPage.boot_id.offset, this if boot == "this" else b"0" * 36 + b"\n")
    page.write_bytes(bytes(data))
    page.chmod(0o600)
    pid = _dead_pid()
    _page_names_worker(page, 0, pid, 0, 0)
    left = Path(SHM) / f"cuda.shm.0.{pid:x}.1"
    left.touch()
    try:
        with forwarder(shm_path, extra=["--stats", str(page)], asan=True) as fwd:
            assert left.exists() == (boot == "another"), fwd.log()
            said = "an earlier forwarder ended with 1 worker(s) at work; removed 1 file(s)"
            assert (said in fwd.log()) == (boot == "this"), fwd.log()
    finally:
        left.unlink(missing_ok=True)


def test_an_opened_block_is_charged_to_its_exporter_not_to_the_opener(shm_path, two_gpus, guests):
    """A guest with a 64 MiB quota on GPU 0: A takes 40 MiB and exports it; B opens it (were it
    charged again the guest would be at 80 MiB, over its quota) and can still take 16 MiB, while
    24 MiB more than that is refused: the quota counts A's block once."""
    with forwarder(shm_path, mem="64M,64M", extra=["--gpus", "0,1"], asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        h = a.ok("export_mem", a.ok("alloc", 40 << 20))
        assert int(b.ok("open_mem", h)) != 0
        assert int(b.ok("alloc", 16 << 20)) != 0
        assert b("alloc", 24 << 20)[0] == OUT_OF_MEMORY
        assert fwd.proc.poll() is None, fwd.log()


def test_ipc_requests_cut_short_or_naming_nothing_are_refused_on_the_wire(shm_path):
    """Raw requests to the ASan/UBSan forwarder: an open whose handle is cut short (or absent, or
    whose flags are missing), an export or open with no place for its answer, an event export of
    a NULL or unknown event, a close of an address never opened, and a whole handle of zeros: each
    refused with its CUresult, and the forwarder serves on."""
    if not (ASAN / "vmgpu-forwarder").exists():
        pytest.fail("build/asan is missing: run `make native-asan`")
    with forwarder(shm_path, asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            yes = struct.pack("<Q", 1)
            cases = [
                (181, yes + b"\0" * 10, INVALID_VALUE),  # handle cut short
                (181, yes, INVALID_VALUE),  # no handle
                (181, yes + b"\0" * 64, INVALID_VALUE),  # no flags
                (181, struct.pack("<Q", 0) + b"\0" * 64 + struct.pack("<I", 1), INVALID_VALUE),  # no answer
                (181, yes + b"\0" * 64 + struct.pack("<I", 1), INVALID_VALUE),  # zeros: no handle of ours
                (184, yes + b"\0" * 30, INVALID_VALUE),
                (184, yes + b"\xff" * 64, INVALID_VALUE),
                (180, struct.pack("<QQ", 0, 0x7E0000000000), INVALID_VALUE),  # no answer
                (180, yes + struct.pack("<Q", 0x7E0000000000), INVALID_VALUE),  # none of its memory
                (183, yes + struct.pack("<Q", 0), INVALID_HANDLE),
                (183, yes + struct.pack("<Q", 0x1234), INVALID_HANDLE),
                (182, struct.pack("<Q", 0x7E0000000000), INVALID_VALUE),
                (182, b"", INVALID_VALUE),
            ]
            got = [raw(chan, op, body, seq=i + 1)[0] for i, (op, body, _) in enumerate(cases)]
            assert got == [want for _, _, want in cases], got
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()


def test_a_driver_api_program_shares_a_block_and_an_event_between_its_two_processes(shm_path, two_gpus):
    """tests/cuda/ipc_pair.c, the GPU suite's program, through the forwarder with the guest's GPUs 0
    and 1: the exporter on GPU 0, the opener (a forked process, its own channel) on GPU 1; every
    step succeeds, the byte checks left out ("nodata": the simulated backend shares no bytes)."""
    with asan_forwarder(shm_path) as fwd:
        r = subprocess.run(
            [str(NATIVE / "ipc_pair"), "0", "1", "nodata"],
            env=guest_env(shm_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert fwd.proc.poll() is None, fwd.log()
    steps = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines() if line.startswith(("A ", "B ")))
    for s in (
        "A export_mem",
        "A export_event",
        "B open_mem",
        "B open_event",
        "B record",
        "B close_mem",
        "A wait_event",
    ):
        assert steps.get(s) == "0", (s, r.stdout)
    assert r.stdout.rstrip().endswith("ipc_pair ok"), r.stdout


def test_the_table_of_exported_handles_is_bounded_and_a_full_one_refuses_only_new_exports(shm_path, guests):
    """One process exports blocks until refused: the 1025th export is CUDA_ERROR_OUT_OF_MEMORY
    (the forwarder's table holds 1024), logged once; handles already given still open in another
    process, and once the first process ends its slots are free again for the guest's others."""
    with forwarder(shm_path, asan=True) as fwd:
        a, b = guests(shm_path, 0, GUEST), guests(shm_path, 0, GUEST)
        first = a.ok("export_mem", a.ok("alloc", 4096))
        r, rest = a("export_many", 5000)
        exported, _ = rest.split()
        assert (r, int(exported)) == (OUT_OF_MEMORY, 1023), (r, rest)
        assert a("export_many", 1)[0] == OUT_OF_MEMORY
        assert fwd.log().count("IPC table is full") == 1, fwd.log()
        assert int(b.ok("open_mem", first)) != 0
        a.exit()
        assert wait_for(lambda: fwd.log().count("closed after") >= 1), fwd.log()
        assert b.ok("export_mem", b.ok("alloc", 4096))
        assert fwd.proc.poll() is None, fwd.log()
