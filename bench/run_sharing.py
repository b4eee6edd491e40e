#!/usr/bin/env python3
"""Sharing as tenants see it, on this host's GPU: unchanged PyTorch guests, each through its own
forwarder, started together; each guest's throughput share is its rate beside the others divided
by its rate alone (through vmgpu), and the aggregate is compared with two references measured in
the same run: the same guests through vmgpu with --no-sched, and natively under MPS with the same
shares as active-thread percentages (what users would pick instead).

Scenarios (trainer: ResNet-50 training at batch 32 without autotuning; inference: batch-1
ResNet-50, one synchronised request at a time):
  weights   two trainers at weights 30/70 (the weighted policy)
  nosched   the same two through vmgpu with --no-sched
  mps       the same two natively under MPS, 30/70 active-thread percentages, and through vmgpu
            with their forwarders' workers clients of the same MPS server (--mps, --mps-threads)
  priority  inference (priority high, weight 50) beside a trainer (normal, weight 50): the
            inference guest's p99 beside the trainer over its p99 alone
  cap       one trainer capped at 10%, then at 50%, alone on the card: its rate over its solo rate

Not measured here (yet): convergence after a weight change and an idle guest's reclaim time.

    python3 bench/run_sharing.py [--seconds 10]
Last line: `sharing share_max_err_pp=… aggregate_vs_nosched=… aggregate_vs_mps=… hp_p99_ratio=…
hp_trainer_share=… cap_err_pp=…`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from vmgpu.forwarder import Forwarder, guest_env  # noqa: E402

TRAIN = ["torch_train.py", "--batch", "32", "--no-autotune"]
INFER = ["torch_infer.py"]


class Run:
    """Guests started together: each warms up, says ready, and runs `seconds` from the go file."""

    def __init__(self, tmp: Path, seconds: float):
        self.tmp, self.seconds, self.n = tmp, seconds, 0

    def together(self, guests: list[tuple[list[str], dict]]) -> list[dict]:
        self.n += 1
        go = self.tmp / f"go-{self.n}"
        procs = []
        for args, env in guests:
            cmd = [sys.executable, str(HERE / args[0]), *args[1:], "--seconds", str(self.seconds), "--go", str(go)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                for q in procs:
                    q.kill()
                sys.exit(f"a guest did not start: {line}{p.stderr.read()[-2000:]}")
        go.touch()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=self.seconds + 120)
            if p.returncode != 0:
                sys.exit(f"a guest failed: {stderr[-2000:]}")
            out.append({k: float(v) for k, v in (w.split("=", 1) for w in stdout.split() if "=" in w)})
        return out


def native_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    env.update(extra or {})
    return env


class Guests:
    """Forwarders, one per guest, made as asked and stopped at the end."""

    def __init__(self, tmp: Path):
        self.tmp, self.fwds, self.n = tmp, [], 0

    def env(self, *flags: str) -> dict:
        self.n += 1
        region = Path(f"/dev/shm/vmgpu-bench-share-{os.getpid()}-{self.n}")
        fwd = Forwarder(region, backend="cuda", size="1G", guest=f"share-{self.n}", extra=flags).start()
        self.fwds.append((fwd, region))
        return guest_env(region, native_env())

    def stop(self) -> None:
        for fwd, region in self.fwds:
            fwd.stop()
            region.unlink(missing_ok=True)
        self.fwds = []


def mps_start(tmp: Path) -> dict | None:
    """An MPS control daemon of our own; the environment its clients need, or None."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        return None
    env = native_env({"CUDA_MPS_PIPE_DIRECTORY": str(tmp / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp / "mps-log")})
    for d in ("mps-pipe", "mps-log"):
        (tmp / d).mkdir(exist_ok=True)
    if subprocess.run([ctl, "-d"], env=env).returncode != 0:
        return None
    return env


def mps_stop(env: dict) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env)
    time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vmgpu-sharing-"))
    run, g = Run(tmp, a.seconds), Guests(tmp)
    rows, summary = [], {}
    try:
        # alone: the denominators
        (train_alone,) = run.together([(TRAIN, g.env())])
        g.stop()
        (infer_alone,) = run.together([(INFER, g.env())])
        g.stop()
        (train_native,) = run.together([(TRAIN, native_env())])
        solo = train_alone["img_per_s"]
        rows.append(("trainer alone (vmgpu / native)", f"{solo:.1f} / {train_native['img_per_s']:.1f} img/s"))
        rows.append(("inference alone p50 / p99", f"{infer_alone['p50_ms']:.2f} / {infer_alone['p99_ms']:.2f} ms"))

        # two trainers at 30/70
        w30, w70 = run.together([(TRAIN, g.env("--weight", "30")), (TRAIN, g.env("--weight", "70"))])
        g.stop()
        shares = [w30["img_per_s"] / solo, w70["img_per_s"] / solo]
        weighted_total = w30["img_per_s"] + w70["img_per_s"]
        rows.append(("weights 30/70: shares", f"{100 * shares[0]:.1f}% / {100 * shares[1]:.1f}%"))
        summary["share_max_err_pp"] = max(abs(100 * shares[0] - 30), abs(100 * shares[1] - 70))

        n1, n2 = run.together([(TRAIN, g.env("--no-sched")), (TRAIN, g.env("--no-sched"))])
        g.stop()
        nosched_total = n1["img_per_s"] + n2["img_per_s"]
        ns = [100 * n1["img_per_s"] / solo, 100 * n2["img_per_s"] / solo]
        rows.append(("--no-sched: shares", f"{ns[0]:.1f}% / {ns[1]:.1f}%"))
        summary["aggregate_vs_nosched"] = weighted_total / nosched_total

        mps = mps_start(tmp)
        if mps:
            try:
                m30, m70 = run.together(
                    [
                        (TRAIN, {**mps, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}),
                        (TRAIN, {**mps, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}),
                    ]
                )
                # the same two through vmgpu, their forwarders' workers clients of the same MPS server
                pipe = mps["CUDA_MPS_PIPE_DIRECTORY"]
                v30, v70 = run.together(
                    [
                        (TRAIN, g.env("--mps", pipe, "--mps-threads", "30")),
                        (TRAIN, g.env("--mps", pipe, "--mps-threads", "70")),
                    ]
                )
                g.stop()
            finally:
                mps_stop(mps)
            mps_total = m30["img_per_s"] + m70["img_per_s"]
            vm_mps_total = v30["img_per_s"] + v70["img_per_s"]
            rows.append(
                (
                    "vmgpu on MPS 30/70: shares",
                    f"{100 * v30['img_per_s'] / solo:.1f}% / {100 * v70['img_per_s'] / solo:.1f}%",
                )
            )
            summary["mps_share_max_err_pp"] = max(
                abs(100 * v30["img_per_s"] / solo - 30), abs(100 * v70["img_per_s"] / solo - 70)
            )
            summary["aggregate_vmgpu_mps_vs_mps"] = (vm_mps_total / solo) / (mps_total / train_native["img_per_s"])
            native_solo = train_native["img_per_s"]
            rows.append(
                (
                    "MPS 30/70 (native): shares",
                    f"{100 * m30['img_per_s'] / native_solo:.1f}% / {100 * m70['img_per_s'] / native_solo:.1f}%",
                )
            )
            summary["aggregate_vs_mps"] = (weighted_total / solo) / (mps_total / native_solo)
        else:
            rows.append(("MPS 30/70 (native)", "unavailable (no nvidia-cuda-mps-control, or it did not start)"))
            summary["aggregate_vs_mps"] = float("nan")
        agg = f"weights {weighted_total / solo:.2f}, no-sched {nosched_total / solo:.2f}"
        if mps:
            agg += f", vmgpu on MPS {vm_mps_total / solo:.2f}, MPS (native) {mps_total / train_native['img_per_s']:.2f}"
        rows.append(("aggregate, of one guest alone", agg))

        hp, tr = run.together(
            [(INFER, g.env("--weight", "50", "--priority", "high")), (TRAIN, g.env("--weight", "50"))]
        )
        g.stop()
        summary["hp_p99_ratio"] = hp["p99_ms"] / infer_alone["p99_ms"]
        summary["hp_trainer_share"] = tr["img_per_s"] / solo
        rows.append(("priority: inference p50 / p99 beside", f"{hp['p50_ms']:.2f} / {hp['p99_ms']:.2f} ms"))
        rows.append(("priority: the trainer's share", f"{100 * tr['img_per_s'] / solo:.1f}%"))

        errs = []
        for cap in (10, 50):
            (c,) = run.together([(TRAIN, g.env("--cap", str(cap)))])
            g.stop()
            errs.append(abs(100 * c["img_per_s"] / solo - cap))
            rows.append((f"cap {cap}% alone: share", f"{100 * c['img_per_s'] / solo:.1f}%"))
        summary["cap_err_pp"] = max(errs)
    finally:
        g.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print("sharing " + " ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
