"""Reading a forwarder's statistics page (host_forwarder/native/vh_stats.h) and explaining
where a guest's time goes: `vmgpu breakdown`."""

from __future__ import annotations

import ctypes
import mmap
import time
from pathlib import Path

from vmgpu.cuda_ops import OPS, PROTOCOL
from vmgpu.errors import InvalidArgument

MAGIC = 0x5354415447504D56
NOPS = 256


class _Op(ctypes.Structure):
    _fields_ = [("count", ctypes.c_uint64), ("ns", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("ndev", ctypes.c_uint32),
        ("quota", ctypes.c_uint64 * 16),
        ("used", ctypes.c_uint64 * 16),
        ("sync_calls", ctypes.c_uint64),
        ("async_calls", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("htod_bytes", ctypes.c_uint64),
        ("dtoh_bytes", ctypes.c_uint64),
        ("processes", ctypes.c_uint64),
        ("op", _Op * NOPS),
    ]


def read(path: str | Path) -> dict:
    """A snapshot of the page: totals, memory per GPU, and per-function counts and times."""
    try:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), ctypes.sizeof(_Stats), access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"statistics page {path}: {e}") from None
    s = _Stats.from_buffer_copy(mm)
    mm.close()
    if s.magic != MAGIC or s.version != 1:
        raise InvalidArgument(f"{path} is not a vmgpu forwarder statistics page (version 1)")
    names = {**PROTOCOL, **OPS}
    return {
        "time": time.monotonic(),
        "processes": s.processes,
        "sync_calls": s.sync_calls,
        "async_calls": s.async_calls,
        "busy_ns": s.busy_ns,
        "htod_bytes": s.htod_bytes,
        "dtoh_bytes": s.dtoh_bytes,
        "memory": [{"gpu": i, "quota": s.quota[i], "used": s.used[i]} for i in range(s.ndev)],
        "ops": {
            names.get(i, f"op {i}"): {"count": s.op[i].count, "ns": s.op[i].ns} for i in range(NOPS) if s.op[i].count
        },
    }


def delta(a: dict, b: dict) -> dict:
    """What happened between two snapshots (b later)."""
    out = {k: b[k] - a[k] for k in ("processes", "sync_calls", "async_calls", "busy_ns", "htod_bytes", "dtoh_bytes")}
    out["seconds"] = b["time"] - a["time"]
    out["memory"] = b["memory"]
    ops = {}
    for name, v in b["ops"].items():
        was = a["ops"].get(name, {"count": 0, "ns": 0})
        if v["count"] - was["count"]:
            ops[name] = {"count": v["count"] - was["count"], "ns": v["ns"] - was["ns"]}
    out["ops"] = ops
    return out
