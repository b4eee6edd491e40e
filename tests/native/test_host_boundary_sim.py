"""The host holds its side of the boundary against what guest processes and their deaths do,
on the simulated backend with the ASan/UBSan forwarder: quotas hold for processes that only
start, memory comes back at once, every way a worker ends leaves the GPU's scheduler
consistent, a dead guest process does not set off a storm of workers, and the host survives
a guest truncating or growing its region file.  The same quota proof on a GPU, against NVML,
is tests/gpu/test_boundary_gpu.py::test_idle_processes_never_pass_the_quota_by_nvml."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.forwarder import ASAN, NATIVE, forwarder, guest_env, run_guest, wait_for
from vmgpu import stats
from vmgpu.forwarder import Forwarder


def _holder(region: Path, mib: int) -> subprocess.Popen:
    return subprocess.Popen(
        [str(NATIVE / "hold"), str(mib), "stay"],
        env=guest_env(region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _sim_usage(d: Path) -> dict[int, int]:
    """What each live worker holds, as the simulated driver itself accounts it (NVML's part)."""
    out = {}
    for f in d.iterdir():
        if Path(f"/proc/{f.name}").exists():
            out[int(f.name)] = int(f.read_text())
    return out


def _workers(fwd: Forwarder) -> list[int]:
    return [int(w.split()[-1]) for w in fwd.log().splitlines() if "served by worker" in w]


# ---- the quota --------------------------------------------------------------------------


def test_guest_processes_that_do_not_fit_hold_nothing_on_the_gpu(shm_path, tmp_path, monkeypatch):
    """16 processes start at once under a quota that holds three of them (a context is 32 MiB
    here, each process also takes 1 MiB): three run, the others get an out-of-memory error at
    their first call and hold nothing on the GPU while they stay, as the driver counts it."""
    usage = tmp_path / "usage"
    usage.mkdir()
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")
    monkeypatch.setenv("VMGPU_SIM_USAGE_DIR", str(usage))
    page, quota = tmp_path / "stats", 100 << 20
    with forwarder(shm_path, asan=True, mem="100M", extra=("--stats", str(page), "--no-sched")) as fwd:
        procs = [_holder(shm_path, 1) for _ in range(16)]
        try:
            first = [p.stdout.readline().split()[0] for p in procs]
            if first.count("held") != 3 or first.count("alloc") != 13:
                # which error each refused one got (its stderr), and the forwarder's log: each
                # refusal and what the charges held then
                said = [p.communicate("")[1] for p in procs]
                pytest.fail(f"{first}\n{said}\n{fwd.log()}")
            workers = _workers(fwd)
            assert len(workers) == 16 and all(Path(f"/proc/{w}").exists() for w in workers), fwd.log()
            held = _sim_usage(usage)  # workers that never made a context hold nothing
            assert set(held) <= set(workers), (held, workers)
            assert sum(held.values()) == 3 * (33 << 20) <= quota, held
            assert sorted(v for v in held.values() if v) == [33 << 20] * 3, held
            assert stats.read(page)["memory"][0]["used"] == sum(held.values())
        finally:
            for p in procs:
                if p.returncode is None:
                    p.communicate("")
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0), fwd.log()


def test_memory_a_process_gave_back_is_free_for_the_next_one_at_once(shm_path, monkeypatch):
    """A process takes most of the quota and exits; the next, started at once, takes it again,
    eight times over (the charges used to count the first until its worker was reaped)."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "16")
    with forwarder(shm_path, asan=True, mem="256M", extra=("--no-sched",)) as fwd:
        for i in range(8):
            r = run_guest([NATIVE / "hold", 200], shm_path, input="")
            assert r.returncode == 0 and r.stdout.startswith("held"), (i, r.stdout, fwd.log())


# ---- workers that end, every way ----------------------------------------------------------


def _spin(region: Path, secs: float, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [str(NATIVE / "spin"), str(secs)],
        env=guest_env(region, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("how", ["exit status", "SIGKILL", "SIGABRT", "SIGTERM"])
def test_a_worker_ending_any_way_leaves_the_other_guest_on_the_gpu_running(sched_dir, tmp_path, how):
    """Guests a and b share a GPU under the weighted policy, both busy.  a's worker ends while
    the two take turns (an exit status from inside the driver, or a signal); b keeps getting
    the GPU, a's next process runs, and a's forwarder still stops at SIGTERM."""
    a, b = tmp_path / "a", tmp_path / "b"
    env = {"VMGPU_SIM_EXIT_AT_MEMSET": "300"} if how == "exit status" else {}  # a's worker: exit(3) inside a call
    with (
        forwarder(b, asan=True, extra=("--compute", "50")),
        forwarder(a, asan=True, extra=("--compute", "50"), env=env) as fa,
    ):
        pb = _spin(b, 4)
        pa = _spin(a, 10)
        assert wait_for(lambda: _workers(fa), timeout=10), fa.log()
        time.sleep(0.5)  # both are taking turns now
        if how != "exit status":
            os.kill(_workers(fa)[0], getattr(signal, how))
        out, _ = pb.communicate(timeout=60)  # b finishes: it was not left waiting for a
        assert pb.returncode == 0 and int(out.split()[1]) > 0, out
        pa.kill()
        pa.wait()
        assert wait_for(
            lambda: "worker" in fa.log() and ("died" in fa.log() or "failed" in fa.log() or "closed after" in fa.log())
        ), fa.log()
        # (memsets of 64 MiB: a's next worker, whose driver has the same knob, makes far fewer
        # than 300 in its half second, even where memory is fast)
        again = run_guest([NATIVE / "spin", "0.5", "64"], a, timeout=60)
        assert again.returncode == 0 and int(again.stdout.split()[1]) > 0, (again.stdout, fa.log())
        t0 = time.monotonic()
        rc = fa.stop(timeout=20)
        assert rc == 0 and time.monotonic() - t0 < 20, fa.log()
    text = fa.log()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text


def test_a_dead_guest_process_gets_one_worker_and_its_memory_back(shm_path, tmp_path, monkeypatch):
    """kill -9 of a guest process in the middle of its calls: one worker served it, no worker
    is started again for the dead owner, and its memory and channel come back."""
    page = tmp_path / "stats"
    with forwarder(shm_path, asan=True, mem="256M", extra=("--stats", str(page), "--no-sched")) as fwd:
        for _ in range(3):
            p = _holder(shm_path, 64)
            assert p.stdout.readline().startswith("held")
            p.stdin.write("x\n" * 200)  # allocations under way as it dies
            p.stdin.flush()
            p.kill()
            p.wait()
            assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0, timeout=10), fwd.log()
        time.sleep(1)  # a storm shows as workers started for the dead owners
        assert len(_workers(fwd)) == 3, fwd.log()
        r = run_guest([NATIVE / "hold", 0], shm_path)
        assert r.stdout.split() == ["free", str(256 << 20), str(256 << 20)], (r.stdout, fwd.log())


# ---- the region file ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 4096, 1 << 20])
def test_the_host_survives_a_guest_truncating_its_region_file(shm_path, monkeypatch, size):
    """A container guest truncates its bind-mounted region file while a process is connected:
    the forwarder stays up, gives the file its size back, and the next process is served."""
    with forwarder(shm_path, asan=True, extra=("--no-sched",)) as fwd:
        p = _holder(shm_path, 16)
        assert p.stdout.readline().startswith("held"), fwd.log()
        full = shm_path.stat().st_size
        os.truncate(shm_path, size)
        p.stdin.write("x\n")  # the guest and the host touch the pages that are gone
        p.stdin.flush()
        assert wait_for(lambda: "changed the size of its region" in fwd.log()), fwd.log()
        p.kill()
        p.communicate()
        assert fwd.proc.poll() is None, fwd.log()
        assert wait_for(lambda: "served again" in fwd.log()), fwd.log()
        assert shm_path.stat().st_size == full
        r = run_guest([NATIVE / "hold", 0], shm_path)
        assert r.stdout.startswith("free"), (r.stdout, r.stderr, fwd.log())


def test_a_grown_region_file_is_cut_back_at_once(shm_path, monkeypatch):
    """Growing the file would add host memory nobody counts: the host cuts it back, and the
    connected process goes on."""
    with forwarder(shm_path, asan=True, extra=("--no-sched",)) as fwd:
        p = _holder(shm_path, 16)
        assert p.stdout.readline().startswith("held"), fwd.log()
        full = shm_path.stat().st_size
        os.truncate(shm_path, full + (64 << 20))
        assert wait_for(lambda: shm_path.stat().st_size == full), fwd.log()
        out, _ = p.communicate("x\n")
        assert out.split() == ["alloc", "0"], (out, fwd.log())


# ---- GPUs whose kernels reach the worker's memory ------------------------------------------


def test_a_gpu_whose_kernels_reach_pageable_host_memory_is_refused_unless_the_operator_accepts(shm_path, monkeypatch):
    """With HMM/ATS a kernel can read and write any memory of the worker that runs it, which no
    address check can stop: the forwarder refuses such a GPU, saying what to do, and serves it
    only with --allow-pageable-access, warning in its log."""
    monkeypatch.setenv("VMGPU_SIM_PAGEABLE_ACCESS", "1")
    with pytest.raises(Exception, match="uvm_disable_hmm=1, or pass --allow-pageable-access"):
        Forwarder(shm_path, backend="sim").start()
    assert not shm_path.exists()
    with forwarder(shm_path, asan=True, extra=("--allow-pageable-access", "--no-sched")) as fwd:
        assert "kernels reach pageable host memory" in fwd.log()
        r = run_guest([NATIVE / "hold", 0], shm_path)
        assert r.stdout.startswith("free"), (r.stdout, fwd.log())


# ---- the forwarder's own files ---------------------------------------------------------------


@pytest.mark.parametrize("planted", ["link", "hard link", "someone else's"])
def test_the_forwarder_never_writes_a_statistics_file_through_a_link_or_someone_elses(shm_path, tmp_path, planted):
    """vmgpu-forwarder --stats PATH where PATH is a symbolic link to a file of root's, a second
    name of it, or a file another user made: the forwarder refuses to start and the file keeps
    its bytes."""
    target, stats_path = tmp_path / "precious", tmp_path / "stats"
    target.write_bytes(b"root's own bytes\n")
    if planted == "link":
        stats_path.symlink_to(target)
    elif planted == "hard link":
        os.link(target, stats_path)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root (a file of another user's)")
        stats_path.write_bytes(b"nobody's bytes\n")
        os.chown(stats_path, 65534, 65534)
        target = stats_path
    before = target.read_bytes()
    # the binary itself, as vmgpud's Forwarder runs it
    cmd = [ASAN / "vmgpu-forwarder", "--region", shm_path, "--create", "128M", "--backend", "sim", "--no-sched"]
    env = dict(os.environ, VMGPU_SIMCUDA=str(ASAN / "libvmgpu-simcuda.so"))
    p = subprocess.Popen([str(a) for a in (*cmd, "--stats", stats_path)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        err = p.communicate(timeout=15)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        err = "it started serving: " + p.communicate()[1]
    finally:
        shm_path.unlink(missing_ok=True)
    assert p.returncode == 1 and "--stats" in err, err
    assert target.read_bytes() == before
