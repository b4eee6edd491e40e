"""Batch-1 ResNet-50 inference latency (eval, no autotuning), for native vs vmgpu comparisons.

Each request is one image, answered when its result is back on the host (synchronised), as an
inference service answers one.  By default requests come back to back (a closed loop); with
--rate R they arrive every 1/R seconds whether or not the last is answered (an open loop, as a
service's clients send them), and a request's latency counts from its arrival, so time it waits
behind the one before counts too.

    python3 bench/torch_infer.py [--steps 400] [--warmup 50] [--rate R] [--latencies FILE]
Prints `p50_ms=X p99_ms=Y req_per_s=Z busy=B` (B: the share of the time a request was being served);
with --latencies, each request's arrival (time.monotonic(), the host's CLOCK_MONOTONIC: other
processes' clocks too) and latency in ms, one request a line, followed by where its time went (ms):
how long it waited behind the request before, how long the forward pass took to be issued on the
host (the launches), and the GPU's span from its first work to its last (two timing events).
"""

import argparse
import os
import statistics
import time

import torch
import torchvision


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seconds", type=float, help="run this long instead of --steps (bench/run_sharing.py)")
    ap.add_argument("--go", help="after warm-up, print 'ready' and wait for this file to exist")
    ap.add_argument("--rate", type=float, help="requests per second arriving on a fixed schedule (open loop)")
    ap.add_argument("--latencies", help="write each request's arrival (time.monotonic()) and latency (ms) here")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = False
    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    times, arrivals, parts = [], [], []
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.no_grad():
        for _ in range(a.warmup):
            model(x).argmax(1).item()
        if a.go:
            print("ready", flush=True)
            while not os.path.exists(a.go):
                time.sleep(0.005)
        start = time.perf_counter()
        served = 0.0
        while (time.perf_counter() - start < a.seconds) if a.seconds else len(times) < a.steps:
            arrival = start + len(times) / a.rate if a.rate else time.perf_counter()
            while time.perf_counter() < arrival:
                time.sleep(min(0.0005, max(0.0, arrival - time.perf_counter())))
            t0 = time.perf_counter()
            first.record()
            y = model(x).argmax(1)
            issued = time.perf_counter()
            last.record()
            y.item()  # the answer, on the host
            done = time.perf_counter()
            parts.append((t0 - arrival, issued - t0, first.elapsed_time(last)))
            served += done - t0
            times.append(done - arrival)
            arrivals.append(arrival)
        elapsed = time.perf_counter() - start
    if a.latencies:  # (perf_counter and monotonic: one clock here, but say it in monotonic's terms)
        shift = time.monotonic() - time.perf_counter()
        with open(a.latencies, "w") as f:
            f.writelines(
                f"{t + shift:.6f} {1e3 * x:.3f} {1e3 * w:.3f} {1e3 * i:.3f} {g:.3f}\n"
                for t, x, (w, i, g) in zip(arrivals, times, parts, strict=True)
            )
    q = statistics.quantiles(times, n=100)
    print(
        f"p50_ms={q[49] * 1e3:.3f} p99_ms={q[98] * 1e3:.3f} req_per_s={len(times) / elapsed:.1f} "
        f"busy={served / elapsed:.4f}"
    )


if __name__ == "__main__":
    main()
