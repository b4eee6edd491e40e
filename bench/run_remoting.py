#!/usr/bin/env python3
"""vmgpu against native, in the same run, on this host's GPU.

Runs bench_remoting (an unchanged CUDA runtime program) natively and through
vmgpu (guest libcuda.so.1 -> shared memory -> vmgpu-forwarder on the real
driver), alternating, and prints medians and ratios.  A ratio is vmgpu's speed
relative to native: 1.00 is equal, 0.50 is half as fast.

Each measure is taken twice through vmgpu: with the region in futex wait mode (a container's
guest) and in poll wait mode (a VM's guest, which cannot be woken across the VM boundary; here a
local process stands in for the VM).  Last, the host CPU that an idle guest costs in each mode:
the forwarder (supervisor and workers) while no guest process is connected, and while one holds
a context and does nothing, in percent of one core.

    python3 bench/run_remoting.py [--reps 3] [--scale 1.0] [--idle-secs 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "build", "native")
TIMES = [
    "launch_async_us",
    "launch_sync_us",
    "memcpy4_htod_us",
    "memcpy4_dtoh_us",
    "alloc_free_1m_us",
    "alloc_free_mixed_us",
    "local_query_us",
]
RATES = ["htod_pageable_gbs", "dtoh_pageable_gbs", "htod_pinned_gbs", "dtoh_pinned_gbs"]


def start_forwarder(region: str, *extra: str) -> subprocess.Popen:
    if os.path.exists(region):
        os.unlink(region)
    fwd = subprocess.Popen(
        [os.path.join(NATIVE, "vmgpu-forwarder"), "--region", region, "--create", "1G", "--guest", "bench", *extra],
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


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process pid and its children (a forwarder's workers)."""
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(d) == pid or int(fields[1]) == pid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def idle_cpu_pct(fwd: subprocess.Popen, region: str, secs: float) -> tuple[float, float]:
    """Host CPU of the forwarder (% of a core) with no guest process, then with an idle one."""
    t0, c0 = time.monotonic(), cpu_seconds(fwd.pid)
    time.sleep(secs)
    none = 100 * (cpu_seconds(fwd.pid) - c0) / (time.monotonic() - t0)
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(NATIVE, "guest"), VMGPU_REGION=region)
    hold = subprocess.Popen(
        [os.path.join(NATIVE, "hold"), "16"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        if not hold.stdout.readline().startswith("held"):
            sys.exit("hold did not start through vmgpu")
        time.sleep(1)  # past its start-up
        t0, c0 = time.monotonic(), cpu_seconds(fwd.pid)
        time.sleep(secs)
        held = 100 * (cpu_seconds(fwd.pid) - c0) / (time.monotonic() - t0)
    finally:
        hold.stdin.close()
        hold.wait(timeout=30)
    return none, held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--idle-secs", type=float, default=5.0)
    a = ap.parse_args()
    region = f"/dev/shm/vmgpu-bench-{os.getpid()}"
    poll_region = region + "-poll"
    fwd = start_forwarder(region)
    pfwd = start_forwarder(poll_region, "--wait", "poll")
    try:
        native, vm, poll = [], [], []
        for _ in range(a.reps):
            native.append(run(False, region, a.scale))
            vm.append(run(True, region, a.scale))
            poll.append(run(True, poll_region, a.scale))
        idle = {"futex": idle_cpu_pct(fwd, region, a.idle_secs), "poll": idle_cpu_pct(pfwd, poll_region, a.idle_secs)}
    finally:
        for f, r in ((fwd, region), (pfwd, poll_region)):
            f.terminate()
            f.wait(timeout=10)
            os.unlink(r)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    ratio = lambda k, n, v: (n / v) if k in TIMES else (v / n)  # noqa: E731
    print(f"{'measure':<22}{'native':>12}{'vmgpu':>12}{'ratio':>8}{'poll mode':>12}{'ratio':>8}")
    ratios, pratios = {}, {}
    for k in TIMES + RATES:
        n, v, p = med(native, k), med(vm, k), med(poll, k)
        ratios[k], pratios[k] = ratio(k, n, v), ratio(k, n, p)
        print(f"{k:<22}{n:>12.3f}{v:>12.3f}{ratios[k]:>8.2f}{p:>12.3f}{pratios[k]:>8.2f}")
    for mode, (none, held) in idle.items():
        print(f"host CPU of an idle guest, {mode} mode: {none:.2f}% of a core with no process, {held:.2f}% with one")
    over = lambda rows, k: med(rows, k) - med(native, k)  # noqa: E731
    print(
        f"remoting launch_overhead_us={over(vm, 'launch_async_us'):.3f}"
        f" rtt_overhead_us={over(vm, 'launch_sync_us'):.3f}"
        f" pinned_h2d_ratio={ratios['htod_pinned_gbs']:.3f} pinned_d2h_ratio={ratios['dtoh_pinned_gbs']:.3f}"
        f" pageable_h2d_ratio={ratios['htod_pageable_gbs']:.3f} pageable_d2h_ratio={ratios['dtoh_pageable_gbs']:.3f}"
        f" alloc_free_ratio={ratios['alloc_free_1m_us']:.3f}"
        f" alloc_free_mixed_ratio={ratios['alloc_free_mixed_us']:.3f}"
        f" poll_launch_overhead_us={over(poll, 'launch_async_us'):.3f}"
        f" poll_rtt_overhead_us={over(poll, 'launch_sync_us'):.3f}"
        f" poll_pinned_h2d_ratio={pratios['htod_pinned_gbs']:.3f}"
        f" poll_alloc_free_ratio={pratios['alloc_free_1m_us']:.3f}"
        f" poll_idle_cpu_pct={idle['poll'][1]:.2f} poll_idle_noprocess_cpu_pct={idle['poll'][0]:.2f}"
        f" futex_idle_cpu_pct={idle['futex'][1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
