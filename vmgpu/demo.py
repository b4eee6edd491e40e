"""`vmgpu demo`: unchanged CUDA programs through a forwarder on this host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from vmgpu.errors import InvalidArgument
from vmgpu.forwarder import Forwarder, gpu_present, guest_env, native_dir

_PTX = Path(__file__).resolve().parent.parent / "tests" / "cuda" / "vadd.ptx"


def run_demo(backend: str = "auto") -> dict:
    if backend == "auto":
        backend = "cuda" if gpu_present() else "sim"
    if backend == "cuda" and not gpu_present():
        raise InvalidArgument("--backend cuda: no NVIDIA GPU and driver on this host (use --backend sim)")
    native = native_dir()
    # the simulated backend runs kernels it can read: PTX, alone or in an uncompressed fatbin
    vecadd = "vecadd" if backend == "cuda" else "vecadd_ptx"
    programs = [[native / "drv_api", _PTX, "64"], [native / vecadd, str(1 << 22)]]
    for p in programs:
        if not Path(p[0]).exists():
            raise InvalidArgument(f"{p[0]} is missing: run `make native cuda-programs`")
    region = Path(f"/dev/shm/vmgpu-demo-{os.getpid()}")
    results = []
    fwd = Forwarder(region, backend=backend, size="512M", mem="4G", guest="demo")
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
    log = fwd.log().strip().splitlines()
    return {
        "backend": backend,
        "simulated": backend == "sim",
        "device": "the simulated backend" if backend == "sim" else "this host's GPU",
        "programs": results,
        "forwarder_log": log,
    }
