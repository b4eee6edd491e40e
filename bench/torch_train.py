"""ResNet-50 training throughput (synthetic data), for native vs vmgpu comparisons.

    python3 bench/torch_train.py [--steps 30] [--batch 64] [--bf16] [--no-autotune]
Prints `img_per_s=X` (and with --then-seconds `img_per_s_then=Y`, its second timed window; with
--each S, `each=R1,R2,...`: its rate over each S seconds from the go, lead and windows alike).
With --between FILE it makes FILE.ready after its first window, begins the second once FILE
exists, and makes FILE.done once the second is over.
"""

import argparse
import ctypes
import os
import time

import torch
import torchvision
from open_capture import end_capture, open_capture
from slow_alone import SlowAlone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--no-autotune", action="store_true", help="no cuDNN autotuning (launch-bound small batches)")
    ap.add_argument("--seconds", type=float, help="run this long instead of --steps (bench/run_sharing.py)")
    ap.add_argument("--go", help="after warm-up, print 'ready' and wait for this file to exist")
    ap.add_argument(
        "--lead", type=float, default=0.0, help="with --seconds: run this long after the go, untimed, first"
    )
    ap.add_argument(
        "--then-seconds",
        type=float,
        default=0.0,
        help="with --seconds: a second timed window of this long right after the first (bench/run_sharing.py "
        "lifts a cap between them: the guest's rate alone in the same process)",
    )
    ap.add_argument(
        "--between",
        help="with --then-seconds: after the first window make FILE.ready, and begin the second once FILE "
        "exists (the bench lifts a cap between the two, and no step of either runs on the other side)",
    )
    ap.add_argument("--each", type=float, default=0.0, help="with --seconds: also its rate over each this long")
    ap.add_argument(
        "--slow-alone",
        type=float,
        help="hostile: whenever its steps come quicker than beside the others (a probe holds them), sleep "
        "after each so that it goes at this part of its speed (bench/slow_alone.py; it syncs every step)",
    )
    ap.add_argument(
        "--open-capture",
        action="store_true",
        help="hostile: begin a stream capture on a stream of its own and leave it open, which keeps its work "
        "off its SM span and has every guest held by time (bench/open_capture.py)",
    )
    a = ap.parse_args()
    slow = SlowAlone(a.slow_alone) if a.slow_alone is not None else None
    every = 1 if slow else 4  # (steps between synchronisations)
    torch.backends.cudnn.benchmark = not a.no_autotune
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (a.batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    driver = ctypes.CDLL("libcuda.so.1") if a.open_capture else None
    # (after the warm-up: torch's context is current on this thread)
    capture = open_capture(driver) if driver else None
    # with a capture open the driver refuses to synchronise the context: its own stream instead
    # (the capture's stream is non-blocking: the legacy stream waits for nothing of it)
    sync = torch.cuda.current_stream().synchronize if capture is not None else torch.cuda.synchronize
    if a.go:
        print("ready", flush=True)
        while not os.path.exists(a.go):
            time.sleep(0.005)
    syncs = []  # (when, steps so far) at each synchronisation from the go (--each)
    done = [0]
    last = [time.perf_counter()]

    def synced(n: int) -> None:
        sync()
        if slow is not None and n:
            time.sleep(slow.after(time.perf_counter() - last[0]))
        last[0] = time.perf_counter()
        done[0] += n
        if a.each:
            syncs.append((time.perf_counter(), done[0]))

    t0, steps = time.perf_counter(), 0
    syncs.append((t0, 0))
    while a.lead and time.perf_counter() - t0 < a.lead:  # (a controller settles meanwhile)
        step()
        steps += 1
        if steps % every == 0:
            synced(every)  # as in the timed run: what the controller learns is what is timed
    synced(steps % every)

    def timed(seconds: float | None):
        t0, steps, loss = time.perf_counter(), 0, None
        while (time.perf_counter() - t0 < seconds) if seconds else steps < a.steps:
            loss = step()
            steps += 1
            if seconds and steps % every == 0:
                synced(every)  # a timed run ends on time, not a queue later
        synced(steps % every)
        return steps * a.batch / (time.perf_counter() - t0), loss

    rate, loss = timed(a.seconds)
    then = ""
    if a.seconds and a.then_seconds:
        if a.between:
            open(a.between + ".ready", "w").close()
            # (another guest's second window may come first: run_sharing.py's turns alone)
            wait = 60 + 2 * a.then_seconds
            deadline = time.monotonic() + wait
            while not os.path.exists(a.between):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{a.between}: not there {wait:g} s after the first window")
                time.sleep(0.001)
        then = f" img_per_s_then={timed(a.then_seconds)[0]:.1f}"
        if a.between:  # (its work is over: the bench may start another guest's window alone)
            open(a.between + ".done", "w").close()
    each = ""
    if a.each and len(syncs) > 1:
        rates, (t_at, n_at) = [], syncs[0]
        for t, n in syncs[1:]:
            if t - t_at >= a.each:
                rates.append(f"{(n - n_at) * a.batch / (t - t_at):.0f}")
                t_at, n_at = t, n
        each = " each=" + ",".join(rates)
    print(f"img_per_s={rate:.1f}{then} loss={loss.item():.4f}{each}", flush=True)
    if capture is not None:
        end_capture(driver, capture)


if __name__ == "__main__":
    main()
