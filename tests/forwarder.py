"""Start a vmgpu-forwarder for a test and run programs through it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "build" / "native"
GUEST_LIB = NATIVE / "guest"
PTX = ROOT / "tests" / "cuda" / "vadd.ptx"


@contextlib.contextmanager
def forwarder(region: Path, backend: str = "sim", mem: str | None = None, size: str = "256M", extra=()):
    """A forwarder serving a fresh region; yields the process (its stderr is the log)."""
    if region.exists():
        region.unlink()
    cmd = [
        str(NATIVE / "vmgpu-forwarder"),
        "--region",
        str(region),
        "--create",
        size,
        "--backend",
        backend,
        "--guest",
        region.name,
        *extra,
    ]
    if mem:
        cmd += ["--mem", mem]
    log = open(region.with_suffix(".log") if region.parent != Path("/dev/shm") else f"/tmp/{region.name}.log", "w+")
    proc = subprocess.Popen(cmd, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            log.seek(0)
            text = log.read()
            if "serving" in text:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"forwarder did not start: {text}")
            time.sleep(0.02)
        proc.log = log
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.seek(0)
        proc.final_log = log.read()
        log.close()


def log_text(proc) -> str:
    """The forwarder's log so far (or all of it, once it has stopped)."""
    if getattr(proc, "final_log", None) is not None:
        return proc.final_log
    proc.log.flush()
    proc.log.seek(0)
    return proc.log.read()


def guest_env(region: Path, **extra) -> dict:
    """The environment of an unchanged program whose libcuda.so.1 is vmgpu's."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(GUEST_LIB)
    env["VMGPU_REGION"] = str(region)
    env.update(extra)
    return env


def run_guest(args, region: Path, timeout: float = 120, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], env=guest_env(region, **extra), capture_output=True, text=True, timeout=timeout
    )
