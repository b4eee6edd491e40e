"""The memory quota on the simulated backend: enforced on every allocation path and reported,
a context charged what it takes (or its reserve where nothing can be measured), memory given
back when a guest process or its worker dies, and the out-of-memory script."""

import os
import signal
import subprocess
import time

import pytest

from tests.forwarder import (
    NATIVE,
    forwarder,
    guest_env,
    hold,
    log_text,
    memquota,
    run_guest,
    wait_for,
    worker_pids,
)
from vmgpu import stats

pytestmark = pytest.mark.native


def test_quota_is_enforced_and_reported(shm_path):
    with forwarder(shm_path, mem="64M"):
        free = run_guest([NATIVE / "hold", 0], shm_path)
        over = run_guest([NATIVE / "hold", 80], shm_path)
    assert free.stdout.split() == ["free", str(64 << 20), str(64 << 20)]
    assert over.returncode == 1 and over.stdout.strip() == "alloc failed"


def test_killed_guest_process_frees_its_memory(shm_path):
    with forwarder(shm_path, mem="1G", extra=["--peer-timeout", "1"]) as fwd:
        p = hold(shm_path, 512)
        held = p.stdout.readline().split()
        assert held == ["held", str(512 << 20), str(1 << 30)]
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert wait_for(lambda: "closed after" in log_text(fwd)), log_text(fwd)
        free = run_guest([NATIVE / "hold", 0], shm_path)
        assert free.stdout.split() == ["free", str(1 << 30), str(1 << 30)]


def test_every_allocation_path_is_held_to_the_quota(shm_path, tmp_path, monkeypatch):
    """Random sizes through cuMemAlloc, pitched, 3D arrays, stream-ordered, an own pool and
    VMM until refused, three times over: the program never holds more than its quota less
    the context's measured overhead, every path is refused at the edge, the charges never pass
    the quota, and what the context took is all that is left at the end."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")  # the simulated driver's context overhead
    quota, ctx = 512 << 20, 32 << 20
    page = tmp_path / "stats"
    seen = []

    def check(what, fields, workers):
        charges = stats.read(page)["memory"][0]["used"]
        seen.append((what, charges))
        assert charges <= quota
        if what == "FULL":
            assert int(fields["held"]) <= quota - ctx
            assert int(fields["total"]) == quota and int(fields["free"]) < (4 << 20)
            assert charges > quota - (4 << 20)  # full to the edge, as the charges say
        else:
            # the context's own memory, measured, charged; blocks freed lately are kept for the
            # guest's next allocation of their size until it has been quiet a second (alloc.c)
            assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == ctx, timeout=5), charges

    with forwarder(shm_path, mem="512M", extra=["--stats", str(page)]) as fwd:
        refused = memquota(fwd, shm_path, 7, 3, NATIVE / "vadd.cubin", "aprsov", check)
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0), log_text(fwd)
    assert [w for w, _ in seen] == ["FULL", "FULL", "FULL", "EMPTY"]
    assert all(refused.get(k, 0) > 0 for k in "aprsov"), refused


def test_where_nothing_can_be_measured_each_context_is_charged_its_reserve(shm_path, monkeypatch):
    """The simulated driver measures its first GPU only: on the second, as under MIG, the charges
    are estimates, and each guest process's context is charged --ctx-reserve."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")
    with forwarder(shm_path, mem="256M", extra=["--gpus", "1", "--ctx-reserve", "100M"]) as fwd:
        free = run_guest([NATIVE / "hold", 0], shm_path)
        fits = run_guest([NATIVE / "hold", 150], shm_path, input="")
        over = run_guest([NATIVE / "hold", 160], shm_path)
        assert "GPU 0: no per-process memory usage to be had here" in log_text(fwd)
    assert free.stdout.split() == ["free", str(156 << 20), str(256 << 20)], free.stdout + free.stderr
    assert fits.returncode == 0 and fits.stdout.split()[0] == "held", fits.stdout + fits.stderr
    assert over.returncode == 1 and over.stdout.strip() == "alloc failed"


def test_a_dead_worker_gives_its_memory_back(shm_path, tmp_path):
    """A worker killed outright (as a driver crash would) cannot free anything itself: the
    forwarder returns its charges, and the next guest process gets the whole quota."""
    page = tmp_path / "stats"
    with forwarder(shm_path, mem="1G", extra=["--stats", str(page), "--peer-timeout", "1"]) as fwd:
        p = hold(shm_path, 512)
        assert p.stdout.readline().split()[0] == "held"
        (worker,) = worker_pids(fwd)
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: stats.read(page)["memory"][0]["used"] == 0), log_text(fwd)
        p.kill()
        p.wait()
        free = run_guest([NATIVE / "hold", 0], shm_path)
        assert free.stdout.split() == ["free", str(1 << 30), str(1 << 30)], free.stdout + log_text(fwd)


def test_oom_script_runs_with_the_guests_identity(shm_path, tmp_path):
    out = tmp_path / "oom.env"
    script = tmp_path / "on-oom"
    script.write_text(f"#!/bin/sh\n{{ echo ARG=$1; env | grep ^VMGPU_ | sort; }} > {out}.tmp && mv {out}.tmp {out}\n")
    script.chmod(0o755)
    with forwarder(shm_path, mem="64M", extra=["--guest", "vm-7", "--oom-script", str(script)]) as fwd:
        over = run_guest([NATIVE / "hold", 80], shm_path)
        assert over.returncode == 1 and over.stdout.strip() == "alloc failed"
        assert wait_for(out.exists), log_text(fwd)
        assert "out of memory on GPU 0: cuMemAlloc wanted 83886080 bytes" in log_text(fwd)
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["ARG"] == "vm-7" and env["VMGPU_GUEST"] == "vm-7"
    assert env["VMGPU_CALL"] == "cuMemAlloc" and env["VMGPU_REQUEST"] == str(80 << 20)
    assert env["VMGPU_QUOTA"] == str(64 << 20) and env["VMGPU_GPU"].startswith("GPU-")
    assert int(env["VMGPU_USED"]) <= 64 << 20


def test_a_missing_oom_script_is_refused_at_start(shm_path):
    r = subprocess.run(
        [str(NATIVE / "vmgpu-forwarder"), "--region", str(shm_path), "--oom-script", "/nonexistent/script"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "--oom-script: /nonexistent/script is not an executable file" in r.stderr


def test_a_guest_starting_process_after_process_runs_the_root_oom_script_once_not_once_each(shm_path, tmp_path):
    """Each guest process has a worker of its own: a guest that starts processes that each ask
    for too much made every worker run the (root's) script at once, as fast as it could start
    them, and a slow script piled up.  Reported once a second per forwarder, one script at a time."""
    out = tmp_path / "runs"
    script = tmp_path / "on-oom"
    script.write_text(f"#!/bin/sh\necho $$ >> {out}\nsleep 3\n")
    script.chmod(0o755)
    with forwarder(shm_path, mem="64M", extra=["--oom-script", str(script)]) as fwd:
        for _ in range(4):
            over = run_guest([NATIVE / "hold", 80], shm_path)
            assert over.returncode == 1 and over.stdout.strip() == "alloc failed"
        assert wait_for(out.exists), log_text(fwd)
        time.sleep(1.5)  # past the second: a script still running is not started again
        over = run_guest([NATIVE / "hold", 80], shm_path)
        assert over.returncode == 1
        assert wait_for(lambda: "is still running: not started again" in log_text(fwd)), log_text(fwd)
    assert len(out.read_text().split()) == 1


def test_the_oom_script_gets_no_descriptor_of_the_worker_and_an_environment_of_its_own(shm_path, tmp_path):
    """The script (root's) is given /dev/null, the log, and nothing else of the worker's; its
    environment is PATH and the VMGPU_* variables, none of the forwarder's own."""
    out = tmp_path / "seen"
    script = tmp_path / "on-oom"
    script.write_text(  # the shell's descriptors as it starts, seen by a child of its own
        f"#!/bin/sh\nfind /proc/$$/fd -mindepth 1 -printf 'FD %f %l\\n' > {out}.tmp\n"
        f"env >> {out}.tmp\nmv {out}.tmp {out}\n"
    )
    script.chmod(0o755)
    with forwarder(shm_path, mem="64M", extra=["--oom-script", str(script)], env={"LEAKED_SETTING": "1"}) as fwd:
        over = run_guest([NATIVE / "hold", 80], shm_path)
        assert over.returncode == 1
        assert wait_for(out.exists), log_text(fwd)
    lines = out.read_text().splitlines()
    fds = {int(n): target for _, n, target in (line.split(" ", 2) for line in lines if line.startswith("FD "))}
    assert fds[0] == "/dev/null"
    others = {n: t for n, t in fds.items() if n > 2 and t not in (str(script), fds[2])}  # the shell keeps copies
    assert others == {}, fds
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("FD "))
    assert "LEAKED_SETTING" not in env and env["VMGPU_GUEST"]
    assert set(env) - {"PATH", "PWD", "SHLVL", "_", "OLDPWD"} <= {k for k in env if k.startswith("VMGPU_")}


def test_an_oom_script_replaced_by_a_link_after_the_start_is_not_run(shm_path, tmp_path):
    """The script is opened never through a link and run from what was checked."""
    out = tmp_path / "ran"
    script = tmp_path / "on-oom"
    script.write_text(f"#!/bin/sh\ntouch {out}\n")
    script.chmod(0o755)
    other = tmp_path / "other"
    other.write_text(f"#!/bin/sh\ntouch {out}\n")
    other.chmod(0o755)
    with forwarder(shm_path, mem="64M", extra=["--oom-script", str(script)]) as fwd:
        script.unlink()
        script.symlink_to(other)
        over = run_guest([NATIVE / "hold", 80], shm_path)
        assert over.returncode == 1
        assert wait_for(lambda: "cannot run the OOM script" in log_text(fwd)), log_text(fwd)
    assert not out.exists()


def test_a_freed_block_is_kept_for_the_process_charged_and_named_by_nothing(shm_path, tmp_path, monkeypatch):
    """cuMemFree keeps the block for the process's next cuMemAlloc of its size (alloc.c): the
    guest's address no longer names it, it stays charged (NVML sees it held), the
    guest's cuMemGetInfo counts it as free, the next allocation of that size gets it, a double
    or bogus free is still refused, and once the guest is quiet a second it goes back, inside a
    call as every change of the charges (the checked forwarder ends a worker that gives memory
    back outside one: a reading of the meter begun before would be taken after)."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")
    ctx, n = 32 << 20, 4 << 20
    page = tmp_path / "stats"

    def used():
        return stats.read(page)["memory"][0]["used"]

    with forwarder(shm_path, mem="512M", extra=["--stats", str(page)], asan=True) as fwd:
        p = subprocess.Popen(
            [str(NATIVE / "reuse")],
            env=guest_env(shm_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out = {}
            for line in p.stdout:
                key, value = line.split()
                out[key] = value
                if key != "wait":
                    continue
                if value == "freed":
                    assert used() == ctx + n, log_text(fwd)  # kept, and charged
                else:
                    assert wait_for(lambda: used() == ctx, timeout=5), (used(), log_text(fwd))
                p.stdin.write("\n")
                p.stdin.flush()
            assert p.wait(timeout=30) == 0, p.stderr.read()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert out["freed_memset"] == "1", out  # CUDA_ERROR_INVALID_VALUE: the address names nothing
    assert out["info_delta"] == "0", out
    assert out["reuse"] == "same", out
    assert out["memset_again"] == "0" and out["free"] == "0", out
    assert out["double_free"] == "1" and out["bogus_free"] == "1", out


def test_a_kept_block_gives_way_to_the_processs_other_allocations_near_its_quota(shm_path, monkeypatch):
    """A block cuMemFree kept for reuse is the guest's free memory as the driver would have it: a
    pitched or stream-ordered allocation that fits only without it is served (the kept block goes
    back to the driver first), not refused."""
    monkeypatch.setenv("VMGPU_SIM_CTX_MIB", "32")
    with forwarder(shm_path, mem="512M") as fwd:
        r = run_guest([NATIVE / "reuse", "others", 448], shm_path, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + log_text(fwd)
    assert r.stdout.split() == ["pitch", "0", "async", "0"], r.stdout + log_text(fwd)


def test_a_forked_child_freeing_its_parents_block_is_refused_at_once(shm_path):
    """A child connects afresh, so its parent's cuMemAlloc blocks are not its own: its cuMemFree of
    one is answered CUDA_ERROR_INVALID_VALUE there and then, as an address of no allocation is,
    and its next synchronisation is not charged with that error."""
    with forwarder(shm_path, mem="512M") as fwd:
        r = run_guest([NATIVE / "reuse", "fork"], shm_path, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + log_text(fwd)
    assert r.stdout.split() == ["child_free", "1", "child_sync", "0"], r.stdout + log_text(fwd)
