#!/usr/bin/env python3
"""A guest whose GPU is on another host, against native, in the same run, on this host's GPU.

The "other host" is this one over loopback TCP: a forwarder on the real driver, vmgpu-netbridge
serve beside it, and vmgpu-netbridge attach making the guest's region; the guest's calls cross
TLS 1.3 on 127.0.0.1 both ways (two processes and the kernel's TCP stack, no physical wire: a
real network adds its own latency and bandwidth limits on top).  Runs bench_remoting and
ResNet-50 training (bench/torch_train.py, batch 64, fp32) natively and through the bridge,
alternating, and prints medians and ratios (1.00 is equal; for times, native / remote).

    python3 bench/run_remote.py [--reps 3] [--steps 30] [--scale 1.0]

Last line: remote launch_overhead_us=... rtt_overhead_us=... pageable_h2d_ratio=...
pageable_d2h_ratio=... pinned_h2d_ratio=... pinned_d2h_ratio=... alloc_free_ratio=...
resnet50_fp32_ratio=...
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
NATIVE = ROOT / "build" / "native"
sys.path.insert(0, str(ROOT))
from vmgpu.forwarder import Forwarder, guest_env  # noqa: E402

TIMES = ["launch_async_us", "launch_sync_us", "memcpy4_htod_us", "memcpy4_dtoh_us", "alloc_free_1m_us"]
RATES = ["htod_pageable_gbs", "dtoh_pageable_gbs", "htod_pinned_gbs", "dtoh_pinned_gbs"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Remote:
    """A forwarder, serve and attach on this host: the guest's region at self.region."""

    def __init__(self, tmp: Path, backend: str = "cuda", bulk: str | None = None):
        bridge = NATIVE / "vmgpu-netbridge"
        if not bridge.exists():
            sys.exit(f"{bridge} is not built (needs libssl-dev when building: make native)")
        self.tmp = tmp
        fp = subprocess.run([str(bridge), "cert", str(tmp)], capture_output=True, text=True, check=True).stdout.strip()
        token = secrets.token_hex(32)
        tok = tmp / "token"
        tok.write_text(token + "\n")
        tok.chmod(0o600)
        self.fwd_region = Path(f"/dev/shm/vmgpu-bench-remote-{os.getpid()}")
        self.region = Path(f"{self.fwd_region}-guest")
        extra = ("--bulk", bulk) if bulk else ()
        self.fwd = Forwarder(self.fwd_region, backend=backend, size="1G", guest="remote-bench", extra=extra)
        self.fwd.start()
        guests = tmp / "guests"
        guests.mkdir(mode=0o700)
        (guests / "remote-bench").write_text(f"{self.fwd_region} {hashlib.sha256(token.encode()).hexdigest()}\n")
        (guests / "remote-bench").chmod(0o600)
        port = _port()
        self.serve = subprocess.Popen(
            [str(bridge), "serve", "--listen", f"127.0.0.1:{port}", "--guests", str(guests), "--cert", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "serve.log", "ab"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while "listening on" not in (tmp / "serve.log").read_text():
            if self.serve.poll() is not None or time.monotonic() > deadline:
                self.close()
                sys.exit("serve did not start: " + (tmp / "serve.log").read_text())
            time.sleep(0.05)
        self.attach = subprocess.Popen(
            [str(bridge), "attach", "--connect", f"127.0.0.1:{port}", "--guest", "remote-bench"]
            + ["--region", str(self.region), "--size", "1G", "--fingerprint", fp, "--token-file", str(tok)],
            stdout=subprocess.PIPE,
            stderr=open(tmp / "attach.log", "ab"),
            text=True,
        )
        deadline = time.monotonic() + 30
        while not self.region.exists() or "the GPU is at" not in (tmp / "attach.log").read_text():
            if self.attach.poll() is not None or time.monotonic() > deadline:
                self.close()
                sys.exit("attach did not start: " + (tmp / "attach.log").read_text() + (tmp / "serve.log").read_text())
            time.sleep(0.1)

    def close(self) -> None:
        for p in (getattr(self, "attach", None), self.serve):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=20)
        self.fwd.stop()
        for r in (self.fwd_region, self.region):
            r.unlink(missing_ok=True)


def remoting(region: Path | None, scale: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    if region:
        env = guest_env(region, env)
    cmd = [str(NATIVE / "bench_remoting"), str(scale)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"bench_remoting ({'remote' if region else 'native'}) failed: {p.stdout}{p.stderr}")
    return {k: float(v) for k, v in (ln.split("=") for ln in p.stdout.split())}


def resnet(region: Path | None, steps: int) -> float | str:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    if region:
        env = guest_env(region, env)
    cmd = [sys.executable, str(HERE / "torch_train.py"), "--steps", str(steps)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        return lines[-1] if lines else f"exit {p.returncode}"
    return float(next(w.split("=", 1)[1] for w in p.stdout.split() if w.startswith("img_per_s=")))


def progress(what: str, native: dict, remote: dict) -> None:
    """Each repetition's numbers on stderr as they come, so a run cut short still tells something."""
    row = " ".join(f"{k}={native[k]}/{remote[k]}" for k in native)
    print(f"{what} (native/remote): {row}", file=sys.stderr, flush=True)


def bridge_only(remote: Remote, tmp: Path, reps: int, scale: float) -> int:
    """The bridge's own ceiling: bench_remoting through it on the simulated backend (copies are
    host memcpy there, so what limits them is the bridge and the machine's TLS and TCP)."""
    try:
        far = [remoting(remote.region, scale) for _ in range(reps)]
    finally:
        remote.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("SIMULATED backend: no GPU; the remote rows measure the bridge alone")
    print(f"{'measure':<22}{'remote':>12}")
    for k in TIMES + RATES:
        print(f"{k:<22}{statistics.median(r[k] for r in far):>12.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument(
        "--backend",
        choices=["cuda", "sim"],
        default="cuda",
        help="sim: the bridge alone on a machine without a GPU (remote rows only; no native run, no ResNet-50)",
    )
    ap.add_argument(
        "--bulk",
        help="each channel's bulk area (the forwarder's --bulk, e.g. 32M; default its own, 4 MiB): "
        "how many bytes of a pageable copy are on their way at once",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vmgpu-bench-remote-"))
    remote = Remote(tmp, a.backend, a.bulk)
    if a.backend == "sim":
        return bridge_only(remote, tmp, a.reps, a.scale)
    try:
        native, far, rn_native, rn_far = [], [], [], []
        for i in range(a.reps):
            native.append(remoting(None, a.scale))
            far.append(remoting(remote.region, a.scale))
            progress(f"rep {i + 1}/{a.reps} bench_remoting", native[-1], far[-1])
        for i in range(a.reps):
            rn_native.append(resnet(None, a.steps))
            rn_far.append(resnet(remote.region, a.steps))
            progress(f"rep {i + 1}/{a.reps} resnet50_fp32", {"img_per_s": rn_native[-1]}, {"img_per_s": rn_far[-1]})
    finally:
        remote.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    ratio = {}
    print(f"{'measure':<22}{'native':>12}{'remote':>12}{'ratio':>8}")
    for k in TIMES + RATES:
        n, v = med(native, k), med(far, k)
        ratio[k] = n / v if k in TIMES else v / n
        print(f"{k:<22}{n:>12.3f}{v:>12.3f}{ratio[k]:>8.2f}")
    failed = next((x for x in rn_far + rn_native if isinstance(x, str)), None)
    if failed:
        print(f"resnet50_fp32 FAILED: {failed}")
        rn = "FAILED"
    else:
        n, v = statistics.median(rn_native), statistics.median(rn_far)
        print(f"{'resnet50_fp32 img/s':<22}{n:>12.1f}{v:>12.1f}{v / n:>8.3f}")
        rn = f"{v / n:.3f}"
    over = lambda k: med(far, k) - med(native, k)  # noqa: E731
    print(
        f"remote launch_overhead_us={over('launch_async_us'):.3f} rtt_overhead_us={over('launch_sync_us'):.3f}"
        f" pageable_h2d_ratio={ratio['htod_pageable_gbs']:.3f} pageable_d2h_ratio={ratio['dtoh_pageable_gbs']:.3f}"
        f" pinned_h2d_ratio={ratio['htod_pinned_gbs']:.3f} pinned_d2h_ratio={ratio['dtoh_pinned_gbs']:.3f}"
        f" alloc_free_ratio={ratio['alloc_free_1m_us']:.3f} resnet50_fp32_ratio={rn}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
