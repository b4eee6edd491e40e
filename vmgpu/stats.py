"""Reading a forwarder's statistics page and explaining where a guest's time goes: `vmgpu breakdown`.
The page's layout: native/shm_transport/include/vmgpu/stats_abi.h, mirrored in vmgpu/abi.py."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

from vmgpu import abi
from vmgpu.cuda_ops import OPS, PROTOCOL
from vmgpu.errors import InvalidArgument


def read(path: str | Path) -> dict:
    """A snapshot of the page: totals, memory, gate waits and refusals per guest GPU, and
    per-function counts and times."""
    full = ctypes.sizeof(abi.StatsPage)
    try:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), min(os.fstat(f.fileno()).st_size, full), access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"statistics page {path}: {e}") from None
    data = mm[:]
    mm.close()
    s = abi.StatsPage.from_buffer_copy(data.ljust(full, b"\0"))
    # (version 2, of a forwarder started before version 3: the same fields but the workers, which
    # are not read here)
    need = {2: abi.STATS_PAGE_V2_SIZE, abi.STATS_VERSION: full}.get(s.version)
    if s.magic != abi.STATS_MAGIC or need is None or len(data) < need:
        raise InvalidArgument(f"{path} is not a vmgpu forwarder statistics page (version 2 or {abi.STATS_VERSION})")
    names = {**PROTOCOL, **OPS}
    return {
        "time": time.monotonic(),
        "processes": s.processes,
        "sync_calls": s.sync_calls,
        "async_calls": s.async_calls,
        "busy_ns": s.busy_ns,
        "htod_bytes": s.htod_bytes,
        "dtoh_bytes": s.dtoh_bytes,
        "memory": [{"gpu": i, "quota": s.quota[i], "used": s.used[i]} for i in range(min(s.ndev, abi.STATS_GPUS))],
        # per guest GPU: ns its calls waited for their turn at the compute gate; memory refusals
        "throttled_ns": [s.throttled_ns[i] for i in range(min(s.ndev, abi.STATS_GPUS))],
        "oom_refusals": [s.oom_refusals[i] for i in range(min(s.ndev, abi.STATS_GPUS))],
        "ops": {
            names.get(i, f"op {i}"): {"count": s.op[i].count, "ns": s.op[i].ns}
            for i in range(abi.STATS_OPS)
            if s.op[i].count
        },
    }


def delta(a: dict, b: dict) -> dict:
    """What happened between two snapshots (b later)."""
    out = {k: b[k] - a[k] for k in ("processes", "sync_calls", "async_calls", "busy_ns", "htod_bytes", "dtoh_bytes")}
    out["seconds"] = b["time"] - a["time"]
    out["memory"] = b["memory"]
    for k in ("throttled_ns", "oom_refusals"):
        out[k] = [now - was for now, was in zip(b[k], a[k], strict=False)]
    ops = {}
    for name, v in b["ops"].items():
        was = a["ops"].get(name, {"count": 0, "ns": 0})
        if v["count"] - was["count"]:
            ops[name] = {"count": v["count"] - was["count"], "ns": v["ns"] - was["ns"]}
    out["ops"] = ops
    return out
