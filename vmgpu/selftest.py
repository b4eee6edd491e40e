"""`vmgpu region selftest`: exercise the transport end to end on this host."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
import uuid

from vmgpu import shm

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


def run_selftest(exchanges: int = 20000) -> dict:
    path = shm.Region.resolve(f"vmgpu-selftest-{uuid.uuid4().hex[:8]}")
    params = shm.Params(nchannels=2, bulk_size=1 << 20)
    region = shm.Region.create(path, params.min_size(4 << 20), params, "selftest")
    host = shm.Host(region, params)
    checks = {}
    try:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        proc = ctx.Process(target=_guest, args=(str(path), exchanges, q))
        proc.start()
        t0 = time.monotonic()
        served = 0
        heap_ok = False
        idx = None
        deadline = t0 + 60
        while proc.is_alive() or served <= exchanges:
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
            if not proc.is_alive() and RECLAIMED in checks:
                break
        seconds = time.monotonic() - t0
        proc.join(10)
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
        host.close()
        region.close()
        os.unlink(path)
