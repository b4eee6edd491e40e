#!/usr/bin/env python3
"""PyTorch through vmgpu against native, in the same run, on this host's GPU.

Runs unchanged PyTorch workloads natively and through vmgpu (guest libcuda.so.1 -> shared
memory -> vmgpu-forwarder), alternating, and prints medians and ratios (vmgpu / native
throughput: 1.00 is equal):

  resnet50_fp32   torchvision ResNet-50 training, synthetic data, batch 64 (img/s)
  resnet50_bf16   the same under bf16 autocast (img/s)
  gpt_train       a GPT-style transformer training step, 6 layers, d 768, seq 512, batch 8 (tokens/s)
  gpt_graph_infer the same transformer's inference replayed as a CUDA graph (tokens/s)

A workload that fails through vmgpu is reported as FAILED with its last error line, and the
others still run.  With --stats DIR the forwarder writes its statistics page there, for
`vmgpu breakdown`.

    python3 bench/run_torch.py [--reps 2] [--steps 30] [--stats DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from vmgpu.forwarder import Forwarder, guest_env  # noqa: E402

# name -> (script args, {metric printed by the script: reported name})
WORKLOADS = {
    "resnet50": (["torch_train.py"], {"img_per_s": "resnet50_fp32"}),
    "resnet50_bf16": (["torch_train.py", "--bf16"], {"img_per_s": "resnet50_bf16"}),
    "gpt": (["torch_gpt.py"], {"train_tokens_per_s": "gpt_train", "graph_infer_tokens_per_s": "gpt_graph_infer"}),
}
ORDER = ["resnet50_fp32", "resnet50_bf16", "gpt_train", "gpt_graph_infer"]


def run(args: list[str], vmgpu: bool, region: str, steps: int) -> dict | str:
    """The workload's metrics, or the reason it failed."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    if vmgpu:
        env = guest_env(Path(region), env)
    cmd = [sys.executable, os.path.join(HERE, args[0]), *args[1:], "--steps", str(steps)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return "timed out"
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        return lines[-1] if lines else f"exit {p.returncode}"
    return {k: float(v) for k, v in (w.split("=", 1) for w in p.stdout.split() if "=" in w)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="run only these workloads")
    ap.add_argument("--stats", help="directory for the forwarder's statistics page (vmgpu breakdown)")
    a = ap.parse_args()
    region = f"/dev/shm/vmgpu-bench-torch-{os.getpid()}"
    if a.stats:
        os.makedirs(a.stats, exist_ok=True)
    stats = ("--stats", os.path.join(a.stats, "forwarder.stats")) if a.stats else ()
    fwd = Forwarder(Path(region), backend="cuda", size="1G", guest="bench-torch", extra=stats).start()
    print(fwd.log().strip(), file=sys.stderr)
    native: dict[str, list[float]] = {}
    vm: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    try:
        for name, (args, metrics) in WORKLOADS.items():
            if a.only and name not in a.only:
                continue
            for _ in range(a.reps):
                for side, rows in ((False, native), (True, vm)):
                    got = run(args, side, region, a.steps)
                    for metric, label in metrics.items():
                        if isinstance(got, str) or metric not in got:
                            failed[f"{label} ({'vmgpu' if side else 'native'})"] = str(got)
                        else:
                            rows.setdefault(label, []).append(got[metric])
                    print(f"  {name} {'vmgpu' if side else 'native'}: {got}", file=sys.stderr, flush=True)
    finally:
        fwd.stop()
        Path(region).unlink(missing_ok=True)
    print(f"{'workload':<18}{'native':>12}{'vmgpu':>12}{'ratio':>8}")
    ratios = {}
    for label in ORDER:
        if label in native and label in vm and len(vm[label]) == len(native[label]):
            n, v = statistics.median(native[label]), statistics.median(vm[label])
            ratios[label] = f"{v / n:.3f}"
            print(f"{label:<18}{n:>12.1f}{v:>12.1f}{v / n:>8.3f}")
        else:
            ratios[label] = "FAILED"
            print(f"{label:<18}{'':>12}{'':>12}{'FAILED':>8}")
    for what, why in failed.items():
        print(f"FAILED {what}: {why}")
    print("pytorch " + " ".join(f"{k}_ratio={ratios[k]}" for k in ORDER))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
