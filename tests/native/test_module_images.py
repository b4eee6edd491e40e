"""Module images from a hostile guest, and the forwarder's image cache.

A raw guest (host_forwarder/tests/image_guest.c) sends images whose headers lie to the
ASan/UBSan forwarder on the simulated backend: each is refused, nothing is read past the
bytes received.  The cache is bounded across workers, private, follows no link, and what
a killed forwarder left is removed at the next start."""

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, log_text, wait_for, worker_pids

pytestmark = pytest.mark.native
GUEST = NATIVE / "tests" / "image_guest"
SHM = Path("/dev/shm")


def _caches(pid: int) -> list[Path]:
    """The image cache directories of forwarder pid (named vmgpu-images-<pid>[.XXXXXX])."""
    return [p for p in SHM.glob(f"vmgpu-images-{pid}*") if p.name.split("-")[2].split(".")[0] == str(pid)]


def _lock_holder(cache: Path) -> subprocess.Popen:
    """A worker still ending: a process holding cache's lock, as workers hold it (shared), until
    its stdin is closed; it prints "held" once it holds it."""
    return subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); "
            "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()",
            str(cache),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _dir_bytes(d: Path) -> int:
    total = 0
    try:
        for e in os.scandir(d):
            try:
                total += e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        pass
    return total


def _image_guest(region: Path, *args, timeout=600) -> subprocess.CompletedProcess:
    if not GUEST.exists():
        pytest.fail("build/native/tests/image_guest is missing: run `make native`")
    return subprocess.run([str(GUEST), str(region), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _assert_clean(text: str):
    assert "AddressSanitizer" not in text and "runtime error" not in text, text
    assert "died (signal" not in text, text


def test_images_whose_headers_lie_are_refused_and_the_forwarder_stays_clean(shm_path):
    """Sizes past the bytes sent, truncated headers, lying back-to-back containers, wrapping
    offsets, huge counts, PTX without NUL, a wrapper holding a pointer: each gets
    CUDA_ERROR_INVALID_IMAGE from the same worker, which then loads valid images."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        r = _image_guest(shm_path, "hostile")
        text = fwd.log()
        assert r.returncode == 0, r.stdout + r.stderr + text
        assert "NOT REFUSED" not in r.stdout
        assert r.stdout.count("refused (200)") >= 30
        assert "every hostile image refused; valid images load" in r.stdout
        assert "module image of 4096 bytes refused (CUDA_ERROR_INVALID_IMAGE): a fatbin container at 0" in text
        assert fwd.proc.poll() is None
    _assert_clean(text)


def test_mutated_images_never_hurt_the_forwarder(shm_path):
    """A bounded mutation fuzzer of valid cubin, fatbin and PTX images (and nvcc's, where
    built): every image is answered, valid images still load, ASan and UBSan stay silent."""
    real = [p for p in (NATIVE / "vadd.cubin", NATIVE / "bigglobal.cubin", NATIVE / "vecadd_ptx") if p.exists()]
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        for seed in (1, 2, 3):
            r = _image_guest(shm_path, "fuzz", 3000, seed, *real)
            assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
            assert "forwarder healthy" in r.stdout
            m = re.search(r"(\d+) loaded, (\d+) refused", r.stdout)
            loaded, refused = int(m[1]), int(m[2])
            assert loaded > 0 and refused > 0, r.stdout  # both sides of the check were reached
        assert fwd.proc.poll() is None
        text = fwd.log()
    _assert_clean(text)


def test_images_nvcc_makes_pass_the_check():
    """The check refuses no real image: nvcc's cubins and fatbins (cuda-programs)."""
    files = [NATIVE / n for n in ("vadd.cubin", "bigglobal.cubin", "vecadd", "vecadd_ptx", "matmul", "streams", "oob")]
    present = [f for f in files if f.exists()]
    if not present:
        pytest.skip("no nvcc-built programs in build/native: run `make cuda-programs` (needs nvcc)")
    r = subprocess.run([str(GUEST), "check", *map(str, present)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == len(present)


def test_the_image_cache_keeps_its_limit_when_workers_fill_it_at_once(shm_path):
    """Eight guest processes load distinct images at once against a 4 MiB cache: the cache
    directory never holds more than 4 MiB, measured while they run and after."""
    limit = 4 << 20
    env = {"VMGPU_IMAGE_CACHE_MIB": "4"}
    with forwarder(shm_path, size="128M", asan=True, env=env) as fwd:
        (cache,) = _caches(fwd.proc.pid)
        most, stop = [0], threading.Event()

        def watch():
            while not stop.is_set():
                most[0] = max(most[0], _dir_bytes(cache))

        t = threading.Thread(target=watch)
        t.start()
        try:
            guests = [
                subprocess.Popen(
                    [str(GUEST), str(shm_path), "many", "6", "384", str(seed)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for seed in range(8)
            ]
            outs = [g.communicate(timeout=300) for g in guests]
        finally:
            stop.set()
            t.join()
        for g, (out, err) in zip(guests, outs, strict=True):
            assert g.returncode == 0, out + err + fwd.log()
        final = _dir_bytes(cache)
        text = fwd.log()
    assert final <= limit, f"the cache holds {final} bytes against a limit of {limit}"
    assert most[0] <= limit, f"the cache held {most[0]} bytes against a limit of {limit}"
    assert final > limit // 2  # it was used, not merely left empty
    _assert_clean(text)


def test_a_killed_forwarders_image_cache_is_removed_at_the_next_start(shm_path):
    """SIGKILL leaves the cache behind; the next forwarder to start removes it."""
    with forwarder(shm_path) as fwd:
        r = subprocess.run([str(GUEST), str(shm_path), "many", "2", "16", "1"], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr + log_text(fwd)
        pid = fwd.proc.pid
        left = _caches(pid)
        assert left and any(left[0].iterdir())
        workers = worker_pids(fwd)
        fwd.proc.send_signal(signal.SIGKILL)
        for w in workers:
            os.kill(w, signal.SIGKILL)
        fwd.proc.wait()
        assert wait_for(lambda: all(not Path(f"/proc/{w}").exists() for w in workers))
        assert all(p.exists() for p in left)
    other = SHM / f"{shm_path.name}-2"
    try:
        with forwarder(other) as second:
            gone = not any(p.exists() for p in left)
            text = log_text(second)
    finally:
        for p in left:  # what a failing forwarder left, cleaned here so the test leaves nothing
            if p.exists():
                for f in p.iterdir():
                    f.unlink()
                p.rmdir()
    assert gone, f"{left} is still there after the next forwarder started:\n{text}"
    assert f"of forwarder {pid}, which is gone" in text


def test_the_cache_sweep_follows_no_link_and_removes_no_file(shm_path, tmp_path):
    """Names of the cache's pattern that are a link to a directory or a plain file are left
    alone, and nothing behind the link is removed; the forwarder's own cache is a private
    directory of its user with private files."""
    dead = 2**22 + 12345  # above the largest pid_max: no process has it
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    planted = [SHM / f"vmgpu-images-{dead}.aaaaaa", SHM / f"vmgpu-images-{dead + 1}.bbbbbb"]
    planted[0].symlink_to(victim)
    planted[1].write_text("not a directory")
    try:
        with forwarder(shm_path) as fwd:
            r = subprocess.run([str(GUEST), str(shm_path), "many", "1", "8", "3"], capture_output=True, text=True)
            assert r.returncode == 0, r.stdout + r.stderr
            (mine,) = _caches(fwd.proc.pid)
            st = mine.lstat()
            assert oct(st.st_mode & 0o7777) == "0o700" and st.st_uid == os.geteuid() and mine.is_dir()
            files = [f for f in mine.iterdir() if not f.name.startswith(".")]
            assert files and all(f.lstat().st_mode & 0o077 == 0 for f in files)
        assert (victim / "keep").exists()
        assert planted[0].is_symlink() and planted[1].is_file()
    finally:
        for p in planted:
            p.unlink()


def test_a_cache_held_by_workers_still_ending_is_removed_once_they_have_ended(shm_path):
    """A forwarder killed leaves its cache; its workers hold the cache's lock until they end (one
    holding a GPU context can take seconds in the driver's teardown).  A forwarder that starts
    meanwhile leaves that cache, looks again while it serves, and removes it once nobody holds
    it (vmgpud restarts a killed forwarder within a second, before its workers have ended)."""
    dead = 2**22 + 12349  # above the largest pid_max: no process has it
    held = SHM / f"vmgpu-images-{dead}.dddddd"
    held.mkdir(mode=0o700)
    (held / "image").write_bytes(b"x" * 4096)
    # a worker still ending: a process holding the cache's lock, as workers hold it (shared)
    holder = _lock_holder(held)
    try:
        assert holder.stdout.readline().strip() == "held"
        with forwarder(shm_path) as fwd:
            assert held.is_dir()  # (held at the start: left)
            holder.stdin.close()  # (the worker ends)
            holder.wait(timeout=10)
            assert wait_for(lambda: not held.exists(), timeout=10), log_text(fwd)
            assert f"removing the module image cache /dev/shm/{held.name} of forwarder {dead}" in log_text(fwd)
            assert fwd.proc.poll() is None
    finally:
        holder.kill()
        holder.wait()
        if held.exists():
            (held / "image").unlink(missing_ok=True)
            held.rmdir()


def test_the_cache_of_a_forwarder_killed_but_not_yet_reaped_is_removed(shm_path):
    """A forwarder vmgpud killed is a zombie until vmgpud reaps it, and vmgpud starts the next
    one meanwhile: that one's sweep takes the zombie for gone (its lock, free, says no worker of
    it is left) and removes its cache."""
    zombie = subprocess.Popen(["true"])  # (exits, and is not waited for until the end)
    assert wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] == "Z", timeout=10)
    left = SHM / f"vmgpu-images-{zombie.pid}.zzzzzz"
    left.mkdir(mode=0o700)
    (left / "image").write_bytes(b"x" * 4096)
    try:
        with forwarder(shm_path) as fwd:
            assert not left.exists(), log_text(fwd)
            assert f"of forwarder {zombie.pid}, which is gone" in log_text(fwd)
    finally:
        zombie.wait()
        if left.exists():
            (left / "image").unlink(missing_ok=True)
            left.rmdir()


def test_the_cache_sweep_leaves_another_users_directory(shm_path):
    """A directory of the cache's pattern made by another user (here nobody) is not removed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory as another user (CI runs as root)")
    foreign = SHM / f"vmgpu-images-{2**22 + 12347}.cccccc"
    foreign.mkdir()
    (foreign / "theirs").write_text("x")
    os.chown(foreign / "theirs", 65534, 65534)
    os.chown(foreign, 65534, 65534)
    try:
        with forwarder(shm_path):
            pass
        assert (foreign / "theirs").exists()
    finally:
        (foreign / "theirs").unlink()
        foreign.rmdir()


def test_each_forwarders_jit_cache_is_its_own_and_goes_with_it(tmp_path):
    """The driver keeps the PTX it compiles in a JIT cache, by default root's ~/.nv/ComputeCache,
    shared by every guest: one guest could tell by how fast its PTX loads whether another loaded
    the same.  Each forwarder's workers are given one of their own, jit/ in the forwarder's image
    cache directory, at most 128 MiB, whatever the forwarder's environment says (a cache path of
    its own, caching off: the simulated driver logs each cuInit's CUDA_CACHE_PATH and
    CUDA_CACHE_MAXSIZE); at the forwarder's end it goes, its tree too (the driver makes
    subdirectories), without following a link out of it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the cache's")
    seen = {}
    for name in ("a", "b"):
        region, log = tmp_path / name, tmp_path / f"{name}.init"
        env = {"VMGPU_SIM_INIT_LOG": str(log), "CUDA_CACHE_PATH": "/root/.nv/ComputeCache", "CUDA_CACHE_DISABLE": "1"}
        with forwarder(region, env=env) as fwd:
            p = subprocess.run(
                [str(NATIVE / "spin"), "0.1", "1", "async"], env=guest_env(region), capture_output=True, timeout=60
            )
            assert p.returncode == 0, p.stdout + p.stderr
            (cache,) = _caches(fwd.proc.pid)
            jit = cache / "jit"
            assert log.read_text().splitlines()[-1].split()[3:] == [str(jit), str(128 << 20)]  # (the worker's)
            (jit / "0" / "1").mkdir(parents=True)  # (what the driver makes there)
            (jit / "0" / "1" / "entry").write_bytes(b"compiled")
            (jit / "index").write_bytes(b"index")
            (jit / "0" / "out").symlink_to(outside)
            seen[name] = jit
        assert not cache.exists(), sorted(str(p) for p in cache.rglob("*"))
    assert seen["a"].parent.name != seen["b"].parent.name
    assert (outside / "keep").read_text() == "not the cache's"


def test_sweep_mode_removes_what_forwarders_that_are_gone_left_and_nothing_else(shm_path, tmp_path):
    """`vmgpu-forwarder --sweep` (what vmgpud runs when it stops a forwarder, where no next one
    starts to sweep) removes this user's caches of forwarders that are gone, waits while workers
    still ending hold one and removes it once they have ended, and leaves a running forwarder's
    cache, a link of the pattern (and what is behind it) and a plain file; it serves no region."""
    exe = str(NATIVE / "vmgpu-forwarder")
    for serving in (["--region", str(shm_path)], ["--backend", "nonsense"], ["--create", "1M"]):
        refused = subprocess.run([exe, "--sweep", *serving], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "--sweep serves no region" in refused.stderr, serving
    dead = 2**22 + 12351  # above the largest pid_max: no process has it
    gone, held = SHM / f"vmgpu-images-{dead}.eeeeee", SHM / f"vmgpu-images-{dead + 1}.ffffff"
    link, plain = SHM / f"vmgpu-images-{dead + 2}.gggggg", SHM / f"vmgpu-images-{dead + 3}.hhhhhh"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    holder = sweeper = None
    try:
        # (planted once the forwarder serves: its own start sweep has looked already)
        with forwarder(shm_path) as fwd:
            (mine,) = _caches(fwd.proc.pid)
            for d in (gone, held):
                d.mkdir(mode=0o700)
                (d / "image").write_bytes(b"x" * 4096)
            link.symlink_to(victim)
            plain.write_text("not a directory")
            # a worker still ending: a process holding the cache's lock, as workers hold it (shared)
            holder = _lock_holder(held)
            assert holder.stdout.readline().strip() == "held"
            sweeper = subprocess.Popen(
                [exe, "--sweep", "--guest", "vm-9"], stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
            )
            assert wait_for(lambda: not gone.exists(), timeout=10)
            assert held.is_dir() and sweeper.poll() is None  # (held: it waits)
            holder.stdin.close()  # (the worker ends)
            holder.wait(timeout=10)
            assert sweeper.wait(timeout=10) == 0
            err = sweeper.stderr.read()
            assert not held.exists(), err
            assert f"vmgpu-forwarder[vm-9] removing the module image cache /dev/shm/{held.name} of forwarder" in err
            assert mine.is_dir() and fwd.proc.poll() is None
        assert (victim / "keep").exists() and link.is_symlink() and plain.is_file()
    finally:
        for p in (holder, sweeper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for d in (gone, held):
            if d.exists():
                (d / "image").unlink(missing_ok=True)
                d.rmdir()
        link.unlink(missing_ok=True)
        plain.unlink(missing_ok=True)


def test_sweep_mode_waits_for_the_forwarder_it_comes_after_and_sweeps_when_its_page_is_refused(tmp_path):
    """vmgpud starts `--sweep --after PID` as soon as it has killed a forwarder, which is not gone
    until its memory is: the sweep waits for PID to be gone (a cache whose forwarder lives is
    left, and not looked for again), then removes its cache.  A statistics page it may not read
    (a link) is refused, said, and the caches are swept all the same (exit 1)."""
    exe = str(NATIVE / "vmgpu-forwarder")
    stopping = subprocess.Popen(["sleep", "60"])  # (the forwarder killed, still ending)
    cache = SHM / f"vmgpu-images-{stopping.pid}.iiiiii"
    cache.mkdir(mode=0o700)
    (cache / "image").write_bytes(b"x" * 4096)
    page = tmp_path / "guest.stats"
    page.symlink_to(tmp_path / "elsewhere")
    sweeper = None
    try:
        sweeper = subprocess.Popen(
            [exe, "--sweep", "--after", str(stopping.pid), "--stats", str(page)],
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert not wait_for(lambda: sweeper.poll() is not None, timeout=0.5)  # (waits for it)
        assert cache.is_dir()
        stopping.kill()
        stopping.wait()
        assert sweeper.wait(timeout=10) == 1
        err = sweeper.stderr.read()
        assert not cache.exists(), err
        assert f"error: --stats {page}:" in err and f"of forwarder {stopping.pid}, which is gone" in err
    finally:
        for p in (stopping, sweeper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if cache.exists():
            (cache / "image").unlink(missing_ok=True)
            cache.rmdir()
