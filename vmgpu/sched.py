"""The compute scheduler's shared page of one GPU, from Python: who takes part, with what
weight, how much GPU time each was given; and the live controls (policy, weights).

The page is host_forwarder/native/vh_sched.h's `struct vs_page`, one per physical GPU at
`<dir>/vmgpu-sched-<GPU UUID>` (dir: $VMGPU_SCHED_DIR or /dev/shm/vmgpu).  Forwarders create it and
take turns through it; vmgpud and `vmgpu weight` / `vmgpu policy` write its controls.  Whoever
writes a page sets every guest's share, so the directory must be root's and writable by no one
else, and a page is used only if root made it (host_forwarder/native/region_file.c makes both).
Standard library only (and vmgpu's own): the GPU host's benchmarks use it too.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from vmgpu import files
from vmgpu.errors import UnsafePath

MAGIC = 0x3144454843534756
VERSION = 1
SLOTS = 64
SLOT_SIZE = 256
SLOT0 = 128
PAGE_SIZE = SLOT0 + SLOTS * SLOT_SIZE
POLICIES = {"native": 0, "equal": 1, "preemptive": 2, "weighted": 3, "fixed": 4}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}
POLICY_HELP = {
    "native": "no compute control",
    "equal": "1/N of the time each, even when the others are idle",
    "preemptive": "equal shares; an idle guest's time goes to busy ones",
    "weighted": "shares by weight; an idle guest's time goes to busy ones",
    "fixed": "a hard cap of weight% of the time, even on an otherwise idle card",
}


DEFAULT_DIR = "/dev/shm/vmgpu"  # host_forwarder/native/vh_sched.h VS_DIR


class SchedError(Exception):
    pass


def sched_dir() -> Path:
    return Path(os.environ.get("VMGPU_SCHED_DIR") or DEFAULT_DIR)


def page_path(uuid: str, directory: str | Path | None = None) -> Path:
    return Path(directory or sched_dir()) / f"vmgpu-sched-{uuid}"


@dataclass
class Member:
    slot: int
    guest: str
    pid: int
    weight: int
    used_ns: int
    turns: int
    waiting: int
    workers: int


class Page:
    """An open scheduler page (a context manager)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            files.private_dir(self.path.parent, create=False)
            fd = files.open_ours(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise SchedError(f"{self.path}: no scheduler page (no forwarder has run on this GPU)") from None
        except UnsafePath as e:
            raise SchedError(f"{e.message}: not touching this scheduler page") from None
        try:
            if os.fstat(fd).st_size < PAGE_SIZE:
                raise SchedError(f"{self.path}: not a scheduler page (too small)")
            self.m = mmap.mmap(fd, PAGE_SIZE)
        finally:
            os.close(fd)
        magic, version = struct.unpack_from("<QI", self.m, 0)
        if magic != MAGIC or version != VERSION:
            self.m.close()
            raise SchedError(f"{self.path}: not a version-{VERSION} scheduler page")

    def close(self) -> None:
        self.m.close()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _u32(self, off: int, value: int | None = None) -> int:
        if value is not None:
            self.m[off : off + 4] = struct.pack("<I", value)  # one aligned 4-byte store
        return struct.unpack_from("<I", self.m, off)[0]

    @property
    def policy(self) -> str:
        return POLICY_NAMES.get(self._u32(16), "unknown")

    @policy.setter
    def policy(self, name: str) -> None:
        if name not in POLICIES:
            raise SchedError(f"unknown policy '{name}' (one of {', '.join(POLICIES)})")
        self._u32(16, POLICIES[name])

    @property
    def slice_us(self) -> int:
        return self._u32(20)

    @property
    def period_us(self) -> int:
        return self._u32(24)

    @property
    def owner(self) -> int:
        return struct.unpack_from("<i", self.m, 28)[0]

    def members(self) -> list[Member]:
        out = []
        for i in range(SLOTS):
            base = SLOT0 + i * SLOT_SIZE
            pid, weight, waiters = struct.unpack_from("<III", self.m, base)
            if not pid:
                continue
            name = bytes(self.m[base + 16 : base + 80]).split(b"\0", 1)[0].decode(errors="replace")
            (used,) = struct.unpack_from("<Q", self.m, base + 88)
            (turns,) = struct.unpack_from("<Q", self.m, base + 120)
            (workers,) = struct.unpack_from("<I", self.m, base + 152)
            out.append(Member(i, name, pid, weight, used, turns, waiters, workers))
        return out

    def set_weight(self, guest: str, weight: int) -> int:
        """Set a guest's weight (1..100); how many of its memberships changed."""
        if not 1 <= weight <= 100:
            raise SchedError(f"weight {weight} is not in 1..100")
        n = 0
        for m in self.members():
            if m.guest == guest:
                self._u32(SLOT0 + m.slot * SLOT_SIZE + 4, weight)
                n += 1
        return n


def apply(uuid: str, weights: dict[str, int] | None = None, policy: str | None = None) -> bool:
    """Put weights (by guest) and a policy on the GPU's page now, if a forwarder has made it;
    whether anything running took them (vmgpud keeps them for forwarders started later)."""
    try:
        page = Page(page_path(uuid))
    except SchedError:
        return False
    with page:
        live = False
        if policy is not None:
            page.policy = policy
            live = bool(page.members())
        for guest, w in (weights or {}).items():
            live |= page.set_weight(guest, w) > 0
        return live
