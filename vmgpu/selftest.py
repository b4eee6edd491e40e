"""`vmgpu region selftest`: exercise the transport end to end on this host."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
import uuid

from vmgpu import shm
from vmgpu.errors import RegionError

RECLAIMED = "channel reclaimed after the guest closed it"


def _guest(path: str, exchanges: int, q) -> None:
    region = shm.Region.open(path)
    ch = shm.GuestChannel(region)
    try:
        ok = True
        for i in range(exchanges):
            payload = hashlib.sha256(i.to_bytes(8, "little")).digest() * (1 + i % 8)
            ch.send(1, payload)
            t, back = ch.recv(timeout_s=5)
            ok &= t == 2 and back == hashlib.sha256(payload).digest()
        off = ch.heap_alloc(1 << 20)
        region.mm[off : off + 16] = b"vmgpu-heap-check"
        ch.send(3, off.to_bytes(8, "little"))
        t, back = ch.recv(timeout_s=5)
        ok &= back == b"seen"
        q.put({"ok": ok, "channel": ch.index})
    finally:
        ch.close()
        region.close()


def _ended(exitcode: int) -> str:
    """How a process ended, from multiprocessing's exit code (-N: signal N)."""
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def run_selftest(exchanges: int = 20000, timeout_s: float = 60.0) -> dict:
    """The checks' results; RegionError where the guest process dies (or is still running after
    timeout_s: it is killed then), naming it and how far it got.  Nothing waits unbounded."""
    path = shm.Region.resolve(f"vmgpu-selftest-{uuid.uuid4().hex[:8]}")
    params = shm.Params(nchannels=2, bulk_size=1 << 20)
    region = shm.Region.create(path, params.min_size(4 << 20), params, "selftest")
    host = shm.Host(region, params)
    checks = {}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # daemonic: an interpreter that exits (an error here) kills it rather than waiting on it
    proc = ctx.Process(target=_guest, args=(str(path), exchanges, q), daemon=True)
    try:
        proc.start()
        t0 = time.monotonic()
        served = 0
        heap_ok = False
        idx = None
        deadline = t0 + timeout_s
        while True:
            alive = proc.is_alive()
            # a guest that died stops the run at once; one that ended well, once its channel is reclaimed
            if not alive and (proc.exitcode != 0 or RECLAIMED in checks):
                break
            if time.monotonic() > deadline:
                break
            host.beat()
            for i in range(params.nchannels):
                ev = host.poll(i)
                if ev in ("closed", "lost"):
                    host.reclaim(i)
                    if i == idx:
                        checks[RECLAIMED] = True
                    continue
                if ev not in ("opened", "serving"):
                    continue
                idx = i
                while (m := host.recv(i, timeout_s=0.001)) is not None:
                    t, data = m
                    if t == 1:
                        host.send(i, 2, hashlib.sha256(data).digest())
                        served += 1
                    elif t == 3:
                        off = int.from_bytes(data, "little")
                        addr = host.heap(off, 16)
                        heap_ok = addr is not None and region.mm[off : off + 16] == b"vmgpu-heap-check"
                        host.send(i, 4, b"seen")
        seconds = time.monotonic() - t0
        progress = f"after {served} of {exchanges} round trips"
        if proc.is_alive():
            proc.kill()
            proc.join(5)
            raise RegionError(
                f"region selftest ({path}): the guest process (pid {proc.pid}) did not finish within {timeout_s:g} s "
                f"({progress}) and was killed: give it longer (--timeout) or fewer --exchanges"
            )
        if proc.exitcode != 0:
            raise RegionError(
                f"region selftest ({path}): the guest process (pid {proc.pid}) {_ended(proc.exitcode)} {progress} "
                "(its own error, if it printed one, is above): run it again; if it fails again, the transport "
                "or this host's /dev/shm is at fault"
            )
        res = q.get(timeout=5) if not q.empty() else {"ok": False}
        checks = {
            "guest attached and claimed a channel": idx is not None,
            "checksummed round trips": bool(res["ok"]) and served == exchanges,
            "heap buffer at the same offset on both sides": heap_ok,
            RECLAIMED: checks.get(RECLAIMED, False),
            "guest process exited cleanly": proc.exitcode == 0,
        }
        return {"region": str(path), "exchanges": served, "seconds": seconds, "checks": checks}
    finally:
        if proc.is_alive():  # an error of the host side's own: the guest is not left behind
            proc.kill()
            proc.join(5)
        q.close()
        host.close()
        region.close()
        os.unlink(path)
