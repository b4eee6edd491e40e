"""`vmgpu demo`: unchanged CUDA programs through a forwarder on this host."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from vmgpu.errors import InvalidArgument
from vmgpu.forwarder import Forwarder, gpu_present, guest_env, native_dir

_CHECKOUT_PTX = Path(__file__).resolve().parent.parent / "tests" / "cuda" / "vadd.ptx"


def _find(name: str, native: Path) -> Path | None:
    """A demo file: an installed package's vmgpu/_native/demo/ (setup.py puts it there), else a
    checkout's build/native (the programs) or tests/cuda (the PTX)."""
    for p in (native / "demo" / name, native / name):
        if p.exists():
            return p
    return _CHECKOUT_PTX if name == "vadd.ptx" and _CHECKOUT_PTX.exists() else None


def demo_programs(backend: str, native: Path) -> tuple[list[list], list[str]]:
    """The command lines the demo runs, and a line for each program it cannot run here.  The
    driver-API program and its PTX are always there; the nvcc-built vector add only where its
    build had nvcc (on the simulated backend the one that carries its kernel as PTX, which the
    simulation runs; on a GPU the native one where it is there)."""
    drv, ptx = _find("drv_api", native), _find("vadd.ptx", native)
    if drv is None or ptx is None:
        raise InvalidArgument(
            f"the demo's driver-API program or its PTX is missing in {native} (and {native / 'demo'}): "
            "reinstall the vmgpu wheel, or run `make native` in a checkout"
        )
    programs = [[drv, ptx, "64"]]
    names = ("vecadd", "vecadd_ptx") if backend == "cuda" else ("vecadd_ptx",)
    vecadd = next((p for p in (_find(n, native) for n in names) if p is not None), None)
    if vecadd is None:
        return programs, [
            f"{names[-1]}: not here (an nvcc-built program: `make cuda-programs` in a checkout, or a wheel "
            "built where nvcc is, `make wheel NVCC=...`)"
        ]
    return [*programs, [vecadd, str(1 << 22)]], []


def run_demo(backend: str = "auto") -> dict:
    if backend == "auto":
        backend = "cuda" if gpu_present() else "sim"
    if backend == "cuda" and not gpu_present():
        raise InvalidArgument("--backend cuda: no NVIDIA GPU and driver on this host (use --backend sim)")
    native = native_dir()
    programs, skipped = demo_programs(backend, native)
    region = Path(f"/dev/shm/vmgpu-demo-{os.getpid()}")
    results = []
    # on the simulated backend, a scheduler page of its own, gone with it (a GPU's page is the
    # host's: the demo's work takes turns with the guests there, and the page stays for them)
    sched = Path(tempfile.mkdtemp(prefix="vmgpu-demo-sched-")) if backend == "sim" else None
    extra = ("--sched-dir", str(sched)) if sched else ()
    fwd = Forwarder(region, backend=backend, size="512M", mem="4G", guest="demo", extra=extra)
    try:
        with fwd:
            for args in programs:
                t0 = time.monotonic()
                r = subprocess.run(
                    [str(a) for a in args], env=guest_env(region), capture_output=True, text=True, timeout=300
                )
                last = (r.stdout.strip().splitlines() or [""])[-1]
                results.append(
                    {
                        "program": " ".join(Path(str(a)).name for a in args),
                        "ok": r.returncode == 0,
                        "detail": last if r.returncode == 0 else (r.stderr.strip() or last)[-300:],
                        "seconds": time.monotonic() - t0,
                    }
                )
            # the forwarder logs each process's end as it reclaims its channel
            deadline = time.monotonic() + 5
            while fwd.log().count("closed after") < len(programs) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        if region.exists():
            region.unlink()
        if sched:
            shutil.rmtree(sched, ignore_errors=True)
    log = fwd.log().strip().splitlines()
    return {
        "backend": backend,
        "simulated": backend == "sim",
        "device": "the simulated backend" if backend == "sim" else "this host's GPU",
        "programs": results,
        "skipped": skipped,
        "forwarder_log": log,
    }
