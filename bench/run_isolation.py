#!/usr/bin/env python3
"""Compute isolation on this host's GPU: guests through vmgpu sharing one GPU under the
weighted and fixed policies, set share against achieved share.

Each guest is bench/isolation.cu (an unchanged CUDA program) in one of four modes that
saturate the GPU differently: gemm (long kernels), tiny (empty kernels), graph (CUDA graph
replays), sync (a synchronise after every launch).  A guest's achieved share is its
throughput beside the others divided by its throughput alone through vmgpu; its GPU-time
share is what the scheduler gave it (the page's held time).  Printed:

  - per run (N guests, policy, mode): per guest set %, achieved %, GPU-time %, iterations/s;
  - max and p95 of |GPU-time share - set| in percentage points over all guests and runs
    (and of the throughput share, which launch-bound modes can exceed: a guest's ring fills
    while it waits, and its turn then runs without the guest's own latency);
  - converge_s: after a weight change 50/50 -> 20/80, the time until the shares stay within
    2 pp of the new setting;
  - reclaim_ms: after one of two equal guests stops, the time until the other runs at 90%
    of its solo rate;
  - cap10/cap50/cap100: one guest under the fixed policy capped at 10/50/100 %, its
    throughput as a fraction of its solo throughput;
  - overhead_pct: one guest with the scheduler on (weight 100, never binding) against the
    same guest with the forwarder's scheduler off (--no-sched): the mean over the modes of the
    medians of --reps alternated runs each.

Last line: `isolation max_err_pp=X p95_err_pp=X converge_s=X reclaim_ms=X cap10=X cap50=X overhead_pct=X
tput_max_err_pp=X tput_p95_err_pp=X`.

    python3 bench/run_isolation.py [--seconds 3] [--reps 3] [--modes gemm tiny graph sync]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vmgpu.forwarder import Forwarder, guest_env  # noqa: E402
from vmgpu.sched import Page  # noqa: E402

PROG = ROOT / "build" / "native" / "isolation"
MODES = ["gemm", "tiny", "graph", "sync"]
SETS = {2: [30, 70], 4: [10, 20, 30, 40]}


class Host:
    """Forwarders on GPU 0 sharing one scheduler page in a private directory."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.fwds: list[Forwarder] = []
        os.environ["VMGPU_SCHED_DIR"] = str(tmp)

    def start(self, weights: list[int], sched: bool = True) -> list[Path]:
        self.stop()
        regions = []
        for i, w in enumerate(weights):
            r = Path(f"/dev/shm/vmgpu-iso-{os.getpid()}-{i}")
            extra = ("--compute", str(w)) if sched else ("--no-sched",)
            f = Forwarder(r, backend="cuda", size="256M", guest=f"g{i}", extra=extra)
            f.start()
            self.fwds.append(f)
            regions.append(r)
        if sched:
            with self.page() as pg:
                pg.policy = "weighted"  # each step starts from the default
        return regions

    def page(self) -> Page:
        pages = list(self.tmp.glob("vmgpu-sched-*"))
        return Page(pages[0])

    def stop(self):
        for f in self.fwds:
            f.stop()
            f.region.unlink(missing_ok=True)
        self.fwds = []


def run(regions: list[Path], modes: list[str], secs: list[float], window_ms: int = 100) -> list[dict]:
    """The guests, started together: each warms up, then all run from the same instant."""
    start = time.monotonic_ns() + 3_000_000_000
    procs = [
        subprocess.Popen(
            [str(PROG), m, str(s), str(window_ms), str(start)],
            env=guest_env(r),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r, m, s in zip(regions, modes, secs, strict=True)
    ]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"isolation guest failed: {se.strip()[-500:]}")
        d = {}
        for ln in so.splitlines():
            k, _, v = ln.partition(" ")
            d[k] = [int(x) for x in v.split()] if k == "windows" else int(v)
        d["window_ns"] = window_ms * 1_000_000
        out.append(d)
    return out


def steady_rate(d: dict, skip: int = 2) -> float:
    """Iterations per second over the windows of the steady state (first `skip` and the last dropped)."""
    w = d["windows"][skip:-1]
    return sum(w) / (len(w) * d["window_ns"] / 1e9) if w else 0.0


def used(page: Page) -> dict[str, int]:
    return {m.guest: m.used_ns for m in page.members()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=3, help="solo runs with the scheduler on and off, alternated")
    ap.add_argument("--modes", nargs="*", default=MODES, choices=MODES)
    a = ap.parse_args()
    if not PROG.exists():
        sys.exit(f"{PROG} is missing: make cuda-programs")
    tmp = Path(tempfile.mkdtemp(prefix="vmgpu-iso-"))
    host = Host(tmp)
    secs = a.seconds
    try:
        # solo rates, the scheduler on (never binding) and off
        # alternated a.reps times and the medians compared, so that a drift of the card's clocks
        # between two runs is not taken for the scheduler's cost
        solo, solo_off = {}, {}
        for m in a.modes:
            on, off = [], []
            for _ in range(a.reps):
                (r,) = host.start([100], sched=False)
                off.append(steady_rate(run([r], [m], [secs])[0]))
                (r,) = host.start([100])
                on.append(steady_rate(run([r], [m], [secs])[0]))
            solo[m], solo_off[m] = statistics.median(on), statistics.median(off)
            print(
                f"solo {m:<6} {solo[m]:>10.1f} it/s   scheduler off {solo_off[m]:>10.1f} it/s"
                f"   (runs on: {' '.join(f'{x:.1f}' for x in on)}; off: {' '.join(f'{x:.1f}' for x in off)})",
                flush=True,
            )
        overhead = statistics.mean(100 * (1 - solo[m] / solo_off[m]) for m in a.modes)

        errs, terrs = [], []  # |GPU-time share - set|, |throughput share - set|
        head = f"{'N':>2} {'policy':<9}{'mode':<6} {'guest':<6}{'set %':>7}{'achieved %':>12}{'GPU time %':>12}"
        print(f"\n{head}{'it/s':>11}")
        for n, weights in SETS.items():
            regions = host.start(weights)
            for policy in ("weighted", "fixed"):
                with host.page() as pg:
                    pg.policy = policy
                for m in a.modes:
                    with host.page() as pg:
                        before = used(pg)
                    res = run(regions, [m] * n, [secs] * n)
                    with host.page() as pg:
                        after = used(pg)
                    spent = {g: after.get(g, 0) - before.get(g, 0) for g in after}
                    total = sum(spent.values()) or 1
                    for i, (w, d) in enumerate(zip(weights, res, strict=True)):
                        rate = steady_rate(d)
                        ach = 100 * rate / solo[m]
                        gt = 100 * spent.get(f"g{i}", 0) / total
                        errs.append(abs(gt - w))
                        terrs.append(abs(ach - w))
                        print(f"{n:>2} {policy:<9}{m:<6} g{i:<5}{w:>7}{ach:>12.1f}{gt:>12.1f}{rate:>11.1f}", flush=True)
        errs.sort()
        terrs.sort()
        max_err, t_max = errs[-1], terrs[-1]
        p95 = errs[min(len(errs) - 1, int(round(0.95 * (len(errs) - 1))))]
        t_p95 = terrs[min(len(terrs) - 1, int(round(0.95 * (len(terrs) - 1))))]
        print(f"\nerror of the GPU-time share: max {max_err:.2f} pp, p95 {p95:.2f} pp")
        print(f"error of the throughput share: max {t_max:.2f} pp, p95 {t_p95:.2f} pp")

        # convergence after a weight change: shares over sliding 250 ms (5 windows of 50 ms)
        regions = host.start([50, 50])
        procs_t = secs * 2
        change = {}

        def later():
            time.sleep(3 + procs_t / 2)  # run() starts the guests 3 s from now
            with host.page() as pg:
                pg.set_weight("g0", 20)
                pg.set_weight("g1", 80)
            change["t"] = time.monotonic_ns()

        th = threading.Thread(target=later)
        th.start()
        res = run(regions, ["gemm", "gemm"], [procs_t, procs_t], window_ms=50)
        th.join()
        wn = res[0]["window_ns"]
        w0, w1 = res[0]["windows"], res[1]["windows"]

        def share(k: int) -> float | None:
            a0, a1 = sum(w0[k : k + 5]), sum(w1[k : k + 5])
            return 100 * a0 / (a0 + a1) if a0 + a1 else None

        k0 = int(max(0, (change["t"] - res[0]["t0"]) // wn))
        converge = None
        for k in range(k0, len(w0) - 10):
            if all((sh := share(j)) is not None and abs(sh - 20) <= 2 for j in range(k, k + 5)):
                converge = (res[0]["t0"] + (k + 5) * wn - change["t"]) / 1e9
                break
        before = share(k0 - 6) if k0 >= 6 else None
        print(
            f"\nweight change 50/50 -> 20/80: g0 had {before if before is None else round(before, 1)} % before;"
            f" within 2 pp of 20 % (250 ms windows) after {converge if converge is not None else 'never'} s"
        )

        # idle reclaim: g1 stops, g0 takes the GPU back (10 ms windows)
        regions = host.start([50, 50])
        res = run(regions, ["gemm", "gemm"], [secs * 2, secs], window_ms=10)
        g0, g1 = res
        stop_ns = g1["t0"] + int(secs * 1e9)  # both started at the same instant
        solo_win = solo["gemm"] * 0.010
        reclaim = None
        for k, c in enumerate(g0["windows"]):
            start = g0["t0"] + k * g0["window_ns"]
            if start >= stop_ns and c >= 0.9 * solo_win:
                reclaim = (start + g0["window_ns"] - stop_ns) / 1e6
                break
        print(f"idle reclaim: {reclaim if reclaim is not None else 'never'} ms")

        # caps under the fixed policy
        caps = {}
        for cap in (10, 50, 100):
            (r,) = host.start([cap])
            with host.page() as pg:
                pg.policy = "fixed"
            caps[cap] = steady_rate(run([r], ["gemm"], [secs])[0]) / solo["gemm"]
            print(f"fixed cap {cap}%: {caps[cap]:.3f} of solo")
        print(f"non-binding scheduler overhead: {overhead:.2f}%")
        conv = "inf" if converge is None else f"{converge:.2f}"
        recl = "inf" if reclaim is None else f"{reclaim:.0f}"
        print(
            f"isolation max_err_pp={max_err:.2f} p95_err_pp={p95:.2f} converge_s={conv} reclaim_ms={recl}"
            f" cap10={caps[10]:.3f} cap50={caps[50]:.3f} overhead_pct={overhead:.2f}"
            f" tput_max_err_pp={t_max:.2f} tput_p95_err_pp={t_p95:.2f}"
        )
    finally:
        host.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
