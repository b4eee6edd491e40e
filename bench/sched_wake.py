#!/usr/bin/env python3
"""How long a high-priority guest waits for a GPU that a lower guest holds idle, on each GPU of a
guest with two (simulated backend, on this host's CPU; no GPU).

A guest on GPUs 0 and 1 makes a memset on one of them every 50 ms, and holds that GPU between
them; a high-priority guest on that GPU alone makes a memset every 37 ms and times it (its wait
for the holder's hand-over).  Each scheduler thread of the holder's worker sleeps on its GPU's
page, whose wake reaches it at once: the waits are the same on both GPUs.  (With one thread
asleep on GPU 0's page for every GPU, the waits on GPU 1 were longer by up to a look, 1 ms.)

    python3 bench/sched_wake.py [--samples 60]

Last line: sched_wake gpu0_median_ms=... gpu1_median_ms=... gpu0_mean_ms=... gpu1_mean_ms=...
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.forwarder import forwarder, guest_env  # noqa: E402
from tests.native.guest_process import GUEST_LIB  # noqa: E402

HOLDER = r"""
import ctypes, sys, time
cuda = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p
dev, c, buf = int(sys.argv[2]), [P(), P()], ctypes.c_uint64()
assert cuda.cuInit(0) == 0
for d in (0, 1):
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c[d]), d) == 0
assert cuda.cuCtxSetCurrent(c[dev]) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)) == 0
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    assert cuda.cuMemsetD8_v2(buf, 1, ctypes.c_size_t(4096)) == 0
    time.sleep(0.05)
"""

HIGH = r"""
import ctypes, sys, time
cuda = ctypes.CDLL(sys.argv[1])
c, buf = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c), 0) == 0
assert cuda.cuCtxSetCurrent(c) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)) == 0
waits = []
for _ in range(int(sys.argv[2])):
    time.sleep(0.037)
    t = time.monotonic()
    assert cuda.cuMemsetD8_v2(buf, 1, ctypes.c_size_t(4096)) == 0
    waits.append(time.monotonic() - t)
print(" ".join(f"{w:.6f}" for w in waits))
"""


def waits(work: Path, gpu: int, samples: int) -> list[float]:
    a, b = work / f"holder{gpu}", work / f"high{gpu}"
    with forwarder(a, extra=("--gpus", "0,1")), forwarder(b, extra=("--gpus", str(gpu), "--priority", "high")):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(GUEST_LIB), str(gpu), str(0.5 + samples * 0.045)], env=guest_env(a)
        )
        try:
            time.sleep(0.5)
            p = subprocess.run(
                [sys.executable, "-c", HIGH, str(GUEST_LIB), str(samples)],
                env=guest_env(b),
                capture_output=True,
                text=True,
                check=True,
            )
        finally:
            holder.wait()
    return [float(x) * 1e3 for x in p.stdout.split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=60)
    args = ap.parse_args()
    os.environ["VMGPU_SIM_DEVICES"] = "2"
    with tempfile.TemporaryDirectory(prefix="vmgpu-sched-wake-") as tmp:
        os.environ["VMGPU_SCHED_DIR"] = tmp
        work = Path(tmp)
        got = {g: waits(work, g, args.samples) for g in (0, 1)}
    for g, w in got.items():
        print(f"GPU {g}: high-priority wait median {statistics.median(w):.3f} ms, mean {statistics.mean(w):.3f} ms")
    print(
        "sched_wake "
        + " ".join(f"gpu{g}_median_ms={statistics.median(w):.3f}" for g, w in got.items())
        + " "
        + " ".join(f"gpu{g}_mean_ms={statistics.mean(w):.3f}" for g, w in got.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
