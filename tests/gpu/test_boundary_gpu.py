"""The quota against what a guest's processes do before they allocate anything, on a real GPU,
measured by NVML: contexts are charged before they exist.  The same on the simulated
backend is tests/native/test_host_boundary_sim.py.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, hidden_devices, log_text, wait_for
from tests.gpu.programs import SHM, driver_files_of, native_env
from tests.native.guest_process import Guest
from vmgpu import stats
from vmgpu.forwarder import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]


def test_idle_processes_never_pass_the_quota_by_nvml(shm_path, tmp_path):
    """16 guest processes start at once under a 4 GiB quota, each making its context and
    taking 1 MiB.  NVML's per-process usage of the forwarder's workers, sampled all along,
    never passes the quota by one byte; those that do not fit got an out-of-memory error at
    their first call and hold nothing while they stay; the charges equal NVML at rest."""
    import pynvml

    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    quota, page = 4 << 30, tmp_path / "stats"
    peak, stop = [0], threading.Event()

    def workers(fwd) -> set[int]:
        return {int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w}

    def nvml(pids) -> dict[int, int]:
        return {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu) if p.pid in pids}

    with forwarder(shm_path, backend="cuda", size="1G", mem="4G", extra=["--stats", str(page)]) as fwd:

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], sum(nvml(workers(fwd)).values()))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        procs = [
            subprocess.Popen(
                hidden_devices([str(NATIVE / "hold"), "1", "stay"]),
                env=guest_env(shm_path),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(16)
        ]
        try:
            first = [p.stdout.readline().split()[0] for p in procs]
            ran = first.count("held")
            time.sleep(1)  # all of them idle now, holding what they hold
            stop.set()
            sampler.join()
            pids = workers(fwd)
            held = nvml(pids)
            charges = stats.read(page)["memory"][0]["used"]
            print(
                f"idle: {ran} ran, {first.count('alloc')} refused; workers {len(pids)}; NVML {sum(held.values())} "
                f"(peak {peak[0]}); charges {charges}; quota {quota}; per worker {sorted(held.values())}"
            )
            assert len(pids) == 16 and 1 <= ran < 16 and first.count("alloc") == 16 - ran, (first, log_text(fwd))
            assert peak[0] <= quota and sum(held.values()) <= quota
            assert len([v for v in held.values() if v]) == ran  # the refused hold nothing
            assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == sum(nvml(pids).values()), timeout=2)
        finally:
            stop.set()
            for p in procs:
                p.communicate("")


@pytest.mark.parametrize("program", [["hold", "1024", "stay"], ["spin", "30", "1024"]], ids=["idle", "busy"])
def test_a_killed_guest_process_gives_its_memory_back_within_a_second(shm_path, tmp_path, program):
    """kill -9 of a guest process holding 1 GiB, idle or in the middle of its work: the charges
    and NVML both show its memory back within a second, and the next process runs."""
    import pynvml

    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    page = tmp_path / "stats"
    with forwarder(shm_path, backend="cuda", size="1G", mem="4G", extra=["--stats", str(page)]) as fwd:
        p = subprocess.Popen(
            hidden_devices([str(NATIVE / program[0]), *program[1:]]),
            env=guest_env(shm_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] > (1 << 30), timeout=30), log_text(fwd)
        time.sleep(0.5)
        worker = next(int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w)
        t0 = time.monotonic()
        p.kill()

        def back():
            on_gpu = {q.pid for q in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)}
            return stats.read(page)["memory"][0]["used"] == 0 and worker not in on_gpu

        assert wait_for(back, timeout=10), log_text(fwd)
        took = time.monotonic() - t0
        p.wait()
        print(f"{program[0]}: memory back {took * 1000:.0f} ms after kill -9")
        assert took <= 1.0
        r = subprocess.run(
            hidden_devices([str(NATIVE / "hold"), "0"]), env=guest_env(shm_path), capture_output=True, text=True
        )
        words = r.stdout.split()  # free: the quota less the new process's own context
        assert words[0] == "free" and int(words[2]) == 4 << 30 and int(words[1]) > (4 << 30) - (600 << 20), (
            r.stdout,
            log_text(fwd),
        )


def test_a_guest_cannot_make_the_host_keep_the_drivers_event_files(shm_path):
    """The driver keeps a process's interprocess events in a root file in /dev/shm and leaves it
    when the process is killed: natively, a process that makes such an event and exports it, then
    is killed, leaves its file.  A guest that does the same and then truncates its region file
    has its worker killed (the region is formatted afresh), and no file of the worker's stays, so
    a guest doing it again and again cannot fill the host's /dev/shm; a worker killed outright
    has what the driver left removed by the forwarder as it reaps it.  (The same on the simulated
    backend, with the hostile neighbours of such a file: tests/native/test_ipc_sim.py.)"""
    from tests.native.test_ipc_sim import GUEST

    native = Guest(None, 0, GUEST, lib="libcuda.so.1", env=native_env())
    pid = native.proc.pid
    try:
        before = driver_files_of(pid)
        native.ok("event", 6)
        after_event = driver_files_of(pid)
        native.ok("export_event", native.ok("event", 6))
        after_export = driver_files_of(pid)
        native.kill()
        left = driver_files_of(pid)
        print(f"natively: before {before}, after an event {after_event}, after an export {after_export}, killed {left}")
        assert left, "the driver removed a killed process's file itself: this test proves nothing"
    finally:
        native.kill()
        for name in driver_files_of(pid):
            (SHM / name).unlink(missing_ok=True)
    with forwarder(shm_path, backend="cuda", size="1G", mem="4G") as fwd:
        g = Guest(shm_path, 0, GUEST)
        try:
            worker = next(int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w)
            g.ok("export_event", g.ok("event", 6))
            made = driver_files_of(worker)
            print(f"through vmgpu: the worker's files {made}")
            assert made, log_text(fwd)
            os.truncate(shm_path, 4096)
            assert wait_for(lambda: "served again" in log_text(fwd), timeout=30), log_text(fwd)
            assert wait_for(lambda: not os.path.exists(f"/proc/{worker}"), timeout=30), log_text(fwd)
            # (gone either way: removed as the worker was reaped, or by the driver itself where the
            # worker ended on its own before the supervisor killed it)
            assert not driver_files_of(worker), log_text(fwd)
            swept = f"left in /dev/shm for worker {worker}" in log_text(fwd)
            print(f"after the truncation: removed by the forwarder: {swept}")
        finally:
            g.kill()
        # a worker killed outright (as the kernel's OOM killer would): what the driver left goes as
        # the supervisor reaps it
        g = Guest(shm_path, 0, GUEST)
        try:
            g.ok("export_event", g.ok("event", 6))
            worker = [int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w][-1]
            assert driver_files_of(worker), log_text(fwd)
            os.kill(worker, 9)
            assert wait_for(lambda: f"left in /dev/shm for worker {worker}" in log_text(fwd), timeout=30), log_text(fwd)
            assert not driver_files_of(worker), log_text(fwd)
        finally:
            g.kill()


def test_a_killed_forwarders_worker_leaves_no_driver_file(shm_path):
    """A forwarder killed outright (SIGKILL) cannot reap its workers; each, told by its death
    signal that its supervisor is gone, removes the file the driver made for its interprocess
    event, says so, and ends (worker.c: on_orphaned)."""
    from tests.native.test_ipc_sim import GUEST, ended, leave_nothing_of

    with forwarder(shm_path, backend="cuda", size="1G", mem="4G") as fwd:
        g = Guest(shm_path, 0, GUEST)
        worker = 0
        try:
            g.ok("export_event", g.ok("event", 6))
            worker = next(int(w.split()[-1]) for w in log_text(fwd).splitlines() if "served by worker" in w)
            made = driver_files_of(worker)
            print(f"the worker's files before its forwarder is killed: {made}")
            assert made, log_text(fwd)
            fwd.proc.kill()
            fwd.proc.wait()
            assert wait_for(lambda: ended(worker), timeout=30), log_text(fwd)
            assert wait_for(lambda: "its supervisor is gone" in log_text(fwd), timeout=10), log_text(fwd)
            assert not driver_files_of(worker), log_text(fwd)
            print([line for line in log_text(fwd).splitlines() if "supervisor is gone" in line])
        finally:
            g.kill()
            if worker:
                leave_nothing_of(worker, fwd.proc.pid)


# A native process's interprocess events, made and destroyed as a hostile guest might (argv[1]: how
# many kept at once at most), printing each driver file name of its own it has seen in /dev/shm.
_MANY_EVENTS = r"""
import ctypes, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_void_p
ctx = P()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
mine = lambda: {n for n in os.listdir("/dev/shm") if n.split(".")[3:4] == [f"{os.getpid():x}"]}
seen = set()
def make(n):
    evs = []
    for _ in range(n):
        e = P()
        assert cuda.cuEventCreate(ctypes.byref(e), 6) == 0  # CU_EVENT_INTERPROCESS | DISABLE_TIMING
        evs.append(e)
    seen.update(mine())
    return evs
for _ in range(20):  # one made and destroyed, again and again
    for e in make(1):
        assert cuda.cuEventDestroy_v2(e) == 0
    seen.update(mine())
kept = make(int(sys.argv[1]))  # many at once
print(" ".join(sorted(seen)), flush=True)
"""


def test_the_drivers_event_file_names_stay_within_what_the_forwarder_tries():
    """The forwarder tries the driver's names for a reaped worker (`cuda.shm.<a>.<pid>.<b>`, a and b
    below region_file.h's bounds) rather than listing /dev/shm: natively, a process that makes and
    destroys an interprocess event twenty times, then holds 4,096 of them, gets no name outside
    those bounds, so a guest doing the same cannot get a file past what is removed."""
    header = (Path(__file__).resolve().parents[2] / "host_forwarder" / "native" / "region_file.h").read_text()
    first = int(re.search(r"#define VH_DRIVER_FILES_FIRST (\d+)", header).group(1))
    last = int(re.search(r"#define VH_DRIVER_FILES_LAST (\d+)", header).group(1))
    p = subprocess.run(
        [sys.executable, "-c", _MANY_EVENTS, "4096"], env=native_env(), capture_output=True, text=True, timeout=120
    )
    names = p.stdout.split()
    print(f"natively, the driver's names for one process: {names}")
    try:
        assert p.returncode == 0 and names, p.stderr
        for n in names:
            a, b = (int(x, 16) for x in n.split(".")[2:5:2])
            assert a < first and b < last, (n, first, last)
    finally:
        for n in names:
            (SHM / n).unlink(missing_ok=True)
