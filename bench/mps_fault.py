#!/usr/bin/env python3
"""Why vmgpu does not run untrusted tenants under MPS: does one tenant's kernel fault reach its
neighbour?  A victim (PyTorch matmuls for a few seconds, counting them) runs beside an attacker
(build/native/oob: a kernel that writes far outside its allocation), twice: as two plain
processes (the GPU time-slices their contexts), and as two clients of one MPS server.  Prints,
per case, what the victim saw; last line `mps_fault victim_ok_plain=… victim_ok_mps=…`.

    python3 bench/mps_fault.py        (on a GPU host with nvidia-cuda-mps-control)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VICTIM = r"""
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
n, end = 0, time.time() + float(sys.argv[1])
try:
    while time.time() < end:
        y = x @ x
        torch.cuda.synchronize()
        n += 1
    print(f"victim ok {n} matmuls")
except Exception as e:
    print(f"victim error after {n} matmuls: {str(e).splitlines()[0]}")
"""


def run_case(env: dict) -> str:
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    time.sleep(3)  # the victim is computing
    attacker = subprocess.run([str(ROOT / "build" / "native" / "oob")], env=env, capture_output=True, text=True)
    out = victim.communicate(timeout=120)[0].strip().splitlines()
    return f"attacker: {attacker.stdout.strip()} | {out[-1] if out else 'victim printed nothing'}"


def main() -> int:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    plain = run_case(base)
    print(f"plain processes (time-sliced): {plain}")
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        print("MPS: unavailable (no nvidia-cuda-mps-control)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="vmgpu-mps-"))
    env = dict(base, CUDA_MPS_PIPE_DIRECTORY=str(tmp / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp / "log"))
    for d in ("pipe", "log"):
        (tmp / d).mkdir()
    subprocess.run([ctl, "-d"], env=env, check=True)
    try:
        mps = run_case(env)
    finally:
        subprocess.run([ctl], input="quit\n", text=True, env=env)
        time.sleep(1)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"two clients of one MPS server: {mps}")
    print(f"mps_fault victim_ok_plain={int('victim ok' in plain)} victim_ok_mps={int('victim ok' in mps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
