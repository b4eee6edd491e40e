"""Starting and stopping a host forwarder (`vmgpu-forwarder`, C) for one guest region.

vmgpud will supervise forwarders through this; `vmgpu demo` and the tests use it now.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from vmgpu.errors import ForwarderError, NativeLibraryMissing
from vmgpu.files import open_ours, private_dir

_REPO_ROOT = Path(__file__).resolve().parent.parent


def native_dirs() -> list[Path]:
    """Where the native programs are looked for, in order: $VMGPU_LIBDIR, the installed package's
    vmgpu/_native/ (a wheel's, setup.py), then a checkout's build/native (development)."""
    dirs = [Path(os.environ["VMGPU_LIBDIR"])] if os.environ.get("VMGPU_LIBDIR") else []
    return [*dirs, Path(__file__).resolve().parent / "_native", _REPO_ROOT / "build" / "native"]


def native_dir() -> Path:
    """Where the forwarder, the simulated backend and the guest library are."""
    dirs = native_dirs()
    for d in dirs:
        if (d / "vmgpu-forwarder").exists():
            return d
    raise NativeLibraryMissing(
        "vmgpu-forwarder not found (looked in: " + ", ".join(map(str, dirs)) + "); install the vmgpu wheel, "
        "or run `make native` in a checkout, or set VMGPU_LIBDIR"
    )


def gpu_present() -> bool:
    """Is there an NVIDIA driver with a device this process can open?"""
    if not os.path.exists("/dev/nvidia0"):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@dataclass
class Forwarder:
    """One running forwarder serving `region` on `backend` ("cuda" or "sim")."""

    region: Path
    backend: str = "cuda"
    gpus: str = "0"
    mem: str | None = None
    size: str | None = "256M"  # create the region with this size; None: serve an existing one
    guest: str | None = None
    extra: tuple = ()
    log_path: Path | None = None  # keep the log in this file (default: a temporary one)
    preexec_fn: object = field(default=None, repr=False)  # run in the child before it execs
    proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: object = field(default=None, repr=False)
    _final: str | None = field(default=None, repr=False)
    _log_start: int = field(default=0, repr=False)  # where this run's lines begin in a kept log

    def start(self, timeout: float = 20.0) -> Forwarder:
        exe = native_dir() / "vmgpu-forwarder"
        cmd = [
            str(exe),
            "--region",
            str(self.region),
            "--backend",
            self.backend,
            "--gpus",
            self.gpus,
            "--guest",
            self.guest or self.region.name,
            *self.extra,
        ]
        args = list(self.extra)
        if "--stats" in args[:-1]:  # the statistics page: also in a private directory
            # (kept: the forwarder reads the workers an earlier one's page names before it makes
            # the page afresh, to remove what the driver left for them: stats_abi.h)
            private_dir(Path(args[args.index("--stats") + 1]).parent, create=False)
        if self.size:  # the forwarder replaces whatever is at the path in one step (region_file.c)
            cmd += ["--create", self.size]
        if self.mem:
            cmd += ["--mem", self.mem]
        # O_APPEND: the forwarder writes at the end whatever offset log() last sought to (the file
        # description, and so its offset, is shared with it)
        self._log = self._open_log() if self.log_path else tempfile.TemporaryFile("a+")
        self._log_start = self._log.tell()
        self.proc = subprocess.Popen(cmd, stderr=self._log, text=True, preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + timeout
        while not self._started(self.log()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = self.log().strip()
                self.stop()
                raise ForwarderError(f"the forwarder for {self.region} did not start: {text or 'no output'}")
            time.sleep(0.02)
        return self

    def _started(self, text: str) -> bool:
        """Whether the log holds the forwarder's start line (`serving REGION (`, after its
        timestamp, its guest's name, which `extra` may set, and on the simulated backend that
        mark), not just the word: other lines may say it (an earlier forwarder's workers, a
        region's path)."""
        head = r"vmgpu-forwarder\[[^\]\n]*\](?: SIMULATED \(no GPU\):)?"
        return re.search(rf"^\S+ {head} serving {re.escape(str(self.region))} \(", text, re.MULTILINE) is not None

    def _open_log(self):
        """The kept log: in a directory only this user can change, never through a link."""
        private_dir(self.log_path.parent, create=False)
        fd = open_ours(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        return os.fdopen(fd, "a+")

    def log(self) -> str:
        """Everything the forwarder logged so far (all of it once stopped)."""
        if self._final is not None:
            return self._final
        self._log.flush()
        self._log.seek(self._log_start)
        text = self._log.read()
        self._log.seek(0, os.SEEK_END)
        return text

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._final is None:
            self._final = self.log()
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def sweep(guest: str, after: int = 0, stats: Path | None = None, log_path: Path | None = None) -> subprocess.Popen:
    """Start `vmgpu-forwarder --sweep`: what forwarders that are gone left in /dev/shm and no
    forwarder starting would remove (this user's module image caches of forwarders killed, and
    with stats, the page of guest's last forwarder, what the CUDA driver left for the workers it
    names), once process `after` (that forwarder) is gone.  It waits, two minutes at most for
    each, for that and while workers still ending hold what it would remove, so the caller reaps
    it later; its lines, named by guest, are appended to log_path (in a private directory, as a
    forwarder's kept log).  stats must be in a private directory too."""
    cmd = [str(native_dir() / "vmgpu-forwarder"), "--sweep", "--guest", guest]
    if after:
        cmd += ["--after", str(after)]
    if stats is not None:
        private_dir(stats.parent, create=False)
        cmd += ["--stats", str(stats)]
    log = subprocess.DEVNULL
    if log_path is not None:
        private_dir(log_path.parent, create=False)
        log = open_ours(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    finally:
        if log_path is not None:
            os.close(log)


def guest_env(region: Path, base: dict | None = None, **extra: str) -> dict:
    """The environment of an unchanged CUDA program whose libcuda.so.1 is vmgpu's."""
    env = dict(os.environ if base is None else base)
    guest = native_dir() / "guest"
    env["LD_LIBRARY_PATH"] = str(guest) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["VMGPU_REGION"] = str(region)
    env.update(extra)
    return env


def is_forwarder(pid: int, region: str | Path) -> bool:
    """Is pid a running vmgpu-forwarder serving region?  (Re-adoption after a vmgpud restart.)"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"vmgpu-forwarder") and str(region).encode() in argv
