#!/usr/bin/env python3
"""PyTorch through vmgpu against native, in the same run, on this host's GPU.

Runs unchanged PyTorch workloads natively and through vmgpu (guest libcuda.so.1 -> shared
memory -> vmgpu-forwarder), alternating, and prints medians and ratios (vmgpu / native
throughput: 1.00 is equal):

  resnet50_fp32   torchvision ResNet-50 training, synthetic data, batch 64 (img/s)
  resnet50_bf16   the same under bf16 autocast (img/s)
  gpt_train       a GPT-style transformer training step, 6 layers, d 768, seq 512, batch 8 (tokens/s)
  gpt_graph_infer the same transformer's inference replayed as a CUDA graph (tokens/s)
  resnet50_bs32   ResNet-50 training at batch 32 without cuDNN autotuning: launch-bound (img/s),
                  through a forwarder with the compute scheduler (`_sched`) and with --no-sched
  infer_bs1       batch-1 ResNet-50 inference, one synchronised request at a time: p50 and p99
                  latency (ratios vmgpu / native: 1.00 is equal, lower is better), with and
                  without the scheduler
  poll_*          resnet50_fp32 again through a region in poll wait mode, the mode of a VM's guest
                  (here a local process stands in for the VM)

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

# The forwarders a workload can run through (besides natively): the default one (futex waits, the
# compute scheduler on), one with --no-sched, and one whose region waits by polling, as a VM's does.
FORWARDERS = {"vmgpu": (), "nosched": ("--no-sched",), "poll": ("--wait", "poll")}
# name -> (script args, {metric printed by the script: reported name}, {forwarder: label prefix/suffix})
WORKLOADS = {
    "resnet50": (["torch_train.py"], {"img_per_s": "resnet50_fp32"}, {"vmgpu": "{}", "poll": "poll_{}"}),
    "resnet50_bf16": (["torch_train.py", "--bf16"], {"img_per_s": "resnet50_bf16"}, {"vmgpu": "{}"}),
    "gpt": (
        ["torch_gpt.py"],
        {"train_tokens_per_s": "gpt_train", "graph_infer_tokens_per_s": "gpt_graph_infer"},
        {"vmgpu": "{}"},
    ),
    "resnet50_bs32": (
        ["torch_train.py", "--batch", "32", "--no-autotune"],
        {"img_per_s": "resnet50_bs32"},
        {"vmgpu": "{}_sched", "nosched": "{}"},
    ),
    "infer_bs1": (
        ["torch_infer.py"],
        {"p50_ms": "infer_bs1_p50", "p99_ms": "infer_bs1_p99"},
        {"vmgpu": "{}", "nosched": "{}_nosched"},
    ),
}
ORDER = [
    "resnet50_fp32",
    "resnet50_bf16",
    "gpt_train",
    "gpt_graph_infer",
    "resnet50_bs32",
    "resnet50_bs32_sched",
    "infer_bs1_p50",
    "infer_bs1_p99",
    "infer_bs1_p50_nosched",
    "infer_bs1_p99_nosched",
    "poll_resnet50_fp32",
]
LATENCIES = ("_p50", "_p99")  # a label with one of these is a latency: its ratio is vmgpu / native


def is_latency(label: str) -> bool:
    return any(m in label for m in LATENCIES)


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
    ap.add_argument("--requests", type=int, default=1500, help="batch-1 inference requests per run")
    ap.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="run only these workloads")
    ap.add_argument("--stats", help="directory for the forwarder's statistics page (vmgpu breakdown)")
    a = ap.parse_args()
    region = f"/dev/shm/vmgpu-bench-torch-{os.getpid()}"
    if a.stats:
        os.makedirs(a.stats, exist_ok=True)
    fwds: dict[str, tuple[Forwarder, str]] = {}
    native: dict[str, list[float]] = {}  # by reported label (the native run of that workload)
    vm: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    try:
        for side, extra in FORWARDERS.items():
            path = f"{region}-{side}"
            stats = ("--stats", os.path.join(a.stats, "forwarder.stats")) if a.stats and side == "vmgpu" else ()
            fwd = Forwarder(Path(path), backend="cuda", size="1G", guest=f"bench-{side}", extra=(*extra, *stats))
            fwds[side] = (fwd.start(), path)
            print(fwd.log().strip(), file=sys.stderr)
        for name, (args, metrics, sides) in WORKLOADS.items():
            if a.only and name not in a.only:
                continue
            # requests, not training steps; short steps of batch 32 need more of them
            steps = a.requests if name == "infer_bs1" else a.steps * 4 if name == "resnet50_bs32" else a.steps
            for _ in range(a.reps):
                for side in ("native", *sides):
                    got = run(args, side != "native", fwds[side][1] if side != "native" else "", steps)
                    for metric, base in metrics.items():
                        # a native run is what each forwarder's run of this rep is compared with
                        fmts = sides.values() if side == "native" else [sides[side]]
                        labels = [fmt.format(base) for fmt in fmts]
                        for label in labels:
                            rows = native if side == "native" else vm
                            if isinstance(got, str) or metric not in got:
                                failed[f"{label} ({side})"] = str(got)
                            else:
                                rows.setdefault(label, []).append(got[metric])
                    print(f"  {name} {side}: {got}", file=sys.stderr, flush=True)
    finally:
        for fwd, path in fwds.values():
            fwd.stop()
            Path(path).unlink(missing_ok=True)
    print(f"{'workload':<24}{'native':>12}{'vmgpu':>12}{'ratio':>8}")
    ratios = {}
    for label in ORDER:
        if label in native and label in vm and len(vm[label]) == len(native[label]):
            n, v = statistics.median(native[label]), statistics.median(vm[label])
            r = v / n  # a throughput's speed ratio, a latency's slowdown
            ratios[label] = f"{r:.3f}"
            note = "  (latency, ms: lower is better)" if is_latency(label) else ""
            print(f"{label:<24}{n:>12.3f}{v:>12.3f}{r:>8.3f}{note}")
        elif a.only and label not in native and label not in vm:
            continue  # not asked for
        else:
            ratios[label] = "FAILED"
            print(f"{label:<24}{'':>12}{'':>12}{'FAILED':>8}")
    for what, why in failed.items():
        print(f"FAILED {what}: {why}")
    print("pytorch " + " ".join(f"{k}_ratio={v}" for k, v in ratios.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
