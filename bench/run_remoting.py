#!/usr/bin/env python3
"""vmgpu against native, in the same run, on this host's GPU.

Runs bench_remoting (an unchanged CUDA runtime program) natively and through
vmgpu (guest libcuda.so.1 -> shared memory -> vmgpu-forwarder on the real
driver), alternating, and prints medians and ratios.  A ratio is vmgpu's speed
relative to native: 1.00 is equal, 0.50 is half as fast.

    python3 bench/run_remoting.py [--reps 3] [--scale 1.0]
"""

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "build", "native")
TIMES = [
    "launch_async_us",
    "launch_sync_us",
    "memcpy4_htod_us",
    "memcpy4_dtoh_us",
    "alloc_free_1m_us",
    "local_query_us",
]
RATES = ["htod_pageable_gbs", "dtoh_pageable_gbs", "htod_pinned_gbs", "dtoh_pinned_gbs"]


def start_forwarder(region: str) -> subprocess.Popen:
    if os.path.exists(region):
        os.unlink(region)
    fwd = subprocess.Popen(
        [os.path.join(NATIVE, "vmgpu-forwarder"), "--region", region, "--create", "1G", "--guest", "bench"],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = fwd.stderr.readline()
    if "serving" not in line:
        fwd.kill()
        sys.exit(f"forwarder did not start: {line.strip()}")
    print(line.strip(), file=sys.stderr)
    return fwd


def run(vmgpu: bool, region: str, scale: float) -> dict:
    env = dict(os.environ)
    if vmgpu:
        env["LD_LIBRARY_PATH"] = os.path.join(NATIVE, "guest")
        env["VMGPU_REGION"] = region
    p = subprocess.run(
        [os.path.join(NATIVE, "bench_remoting"), str(scale)], env=env, capture_output=True, text=True, timeout=600
    )
    if p.returncode != 0:
        sys.exit(f"bench_remoting ({'vmgpu' if vmgpu else 'native'}) failed: {p.stdout}{p.stderr}")
    out = p.stdout
    return {k: float(v) for k, v in (ln.split("=") for ln in out.split())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    region = f"/dev/shm/vmgpu-bench-{os.getpid()}"
    fwd = start_forwarder(region)
    try:
        native, vm = [], []
        for _ in range(a.reps):
            native.append(run(False, region, a.scale))
            vm.append(run(True, region, a.scale))
    finally:
        fwd.terminate()
        fwd.wait(timeout=10)
        os.unlink(region)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    print(f"{'measure':<22}{'native':>12}{'vmgpu':>12}{'ratio':>8}")
    ratios = {}
    for k in TIMES + RATES:
        n, v = med(native, k), med(vm, k)
        ratios[k] = (n / v) if k in TIMES else (v / n)
        print(f"{k:<22}{n:>12.3f}{v:>12.3f}{ratios[k]:>8.2f}")
    launch = med(vm, "launch_async_us") - med(native, "launch_async_us")
    rtt = med(vm, "launch_sync_us") - med(native, "launch_sync_us")
    print(
        f"remoting launch_overhead_us={launch:.3f} rtt_overhead_us={rtt:.3f}"
        f" pinned_h2d_ratio={ratios['htod_pinned_gbs']:.3f} pinned_d2h_ratio={ratios['dtoh_pinned_gbs']:.3f}"
        f" pageable_h2d_ratio={ratios['htod_pageable_gbs']:.3f} pageable_d2h_ratio={ratios['dtoh_pageable_gbs']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
