"""The quota against what a guest's processes do before they allocate anything, on a real GPU,
measured by NVML: contexts are charged before they exist.  The same on the simulated
backend is tests/native/test_host_boundary_sim.py.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

import subprocess
import threading
import time

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, hidden_devices, log_text, wait_for
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
