"""The compute scheduler's shared page of one GPU, from Python: who takes part, with what
weight, how much GPU time each was given; and the live controls (policy, weights).

The page is native/shm_transport/include/vmgpu/sched_abi.h's `struct vmgpu_sched_page`, mirrored
once in vmgpu/abi.py (SchedPage, checked against the header by a test), one per physical GPU at
`<dir>/vmgpu-sched-<GPU UUID>` (dir: $VMGPU_SCHED_DIR or /dev/shm/vmgpu).  Forwarders create it and
take turns through it; vmgpud and `vmgpu weight` / `cap` / `priority` / `policy` write its controls.  Whoever
writes a page sets every guest's share, so the directory must be root's and writable by no one
else, and a page is used only if root made it (host_forwarder/native/region_file.c makes both).
Standard library only (and vmgpu's own): the GPU host's benchmarks use it too.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

from vmgpu import abi, errors, files
from vmgpu.errors import UnsafePath

PAGE_SIZE = ctypes.sizeof(abi.SchedPage)
POLICIES = {
    "native": abi.POLICY_NATIVE,
    "equal": abi.POLICY_EQUAL,
    "preemptive": abi.POLICY_PREEMPTIVE,
    "weighted": abi.POLICY_WEIGHTED,
    "fixed": abi.POLICY_FIXED,
    "shared": abi.POLICY_SHARED,
}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}
POLICY_HELP = {
    "native": "no compute control",
    "equal": "1/N of the time each, even when the others are idle",
    "preemptive": "equal shares; an idle guest's time goes to busy ones",
    "weighted": "shares by weight; an idle guest's time goes to busy ones",
    "fixed": "a hard cap of weight% of the time, even on an otherwise idle card",
    "shared": "side by side (MPS), each guest held back as far as its share of progress needs",
}


DEFAULT_DIR = abi.SCHED_DIR


SchedError = errors.SchedulerError  # in the error tree: its exit status and gRPC status are the code table's


def sched_dir() -> Path:
    return Path(os.environ.get("VMGPU_SCHED_DIR") or DEFAULT_DIR)


def page_path(uuid: str, directory: str | Path | None = None) -> Path:
    return Path(directory or sched_dir()) / f"vmgpu-sched-{uuid}"


DEPTH_MAX = 1024  # a forwarder's deepest --sched-depth (host_forwarder/native/process.h: VH_DEPTH_MAX)
PRIORITIES = {"normal": abi.PRIO_NORMAL, "high": abi.PRIO_HIGH, "low": abi.PRIO_LOW}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}


def cap_percent(cap: int, weight: int, policy: str) -> int:
    """The % a member's cap holds it to (100: none): its cap, and under fixed its weight, whichever
    is less.  The one rule of "capped" for vmgpud, as the forwarders take it
    (host_forwarder/native/sched_policy.c cap_part_pm): below 100 the cap controller's part
    (cap_pm) stands in place of it; at 100 there is no budget to hold (sched_policy.c counted_budget)."""
    pct = min(cap, 100) if cap else 100
    return min(pct, max(weight, 0)) if policy == "fixed" else pct


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
    cap: int = 0  # % of each period, 0: none
    priority: str = "normal"
    guarantee: int = 0
    work_calls: int = 0  # calls that put work on the GPU, as the workers publish them
    hold: int = 0  # under shared: per mille of each period its work is held back
    depth: int = 0  # under shared: its workers' calls unfinished on the GPU at most (0: the forwarder's)
    sm_part: int = 0  # under shared: the SMs its work runs on beside others (lo << 16 | hi; 0: all)
    whole_ms: int = 0  # when one of its workers last worked on the whole GPU though its span said otherwise
    cap_pm: int = 0  # where capped: the part of each period (per mille) the cap controller leaves it (0: cap%)
    active_ms: int = 0  # under shared: when one of its workers was last seen at work (ms, low 32 bits; 0: never)

    def off_span(self, now_ms: int) -> bool:
        """Whether one of its workers worked off its SM span within the last second (whole_ms; now_ms:
        CLOCK_MONOTONIC in ms, its low 32 bits as the forwarders write them, compared across a wrap)."""
        return bool(self.whole_ms) and ((now_ms - self.whole_ms + 2**31) & 0xFFFFFFFF) - 2**31 < 1000

    def capped(self, policy: str) -> bool:
        """Whether a cap holds it below its whole rate: its cap, or under fixed its weight, below 100%
        (where the forwarders take the cap controller's cap_pm: sched_policy.c cap_part_pm)."""
        return cap_percent(self.cap, self.weight, policy) < 100


@dataclass(frozen=True)
class Seat:
    """One membership of a guest on a GPU's page: its slot, as its forwarder (pid) took it at
    joined_ns.  Its GPU time counts from 0 at that seat."""

    slot: int
    guest: str
    pid: int
    joined_ns: int


GPU_TIME_TRIES = 256  # looks at GPU time taken again at most while a forwarder changes it (Page.gpu_time)


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
        self.page = abi.SchedPage.from_buffer(self.m)  # a live view: every read is the page's now
        if self.page.magic != abi.SCHED_MAGIC or self.page.version != abi.SCHED_VERSION:
            self.close()
            raise SchedError(f"{self.path}: not a version-{abi.SCHED_VERSION} scheduler page")

    def close(self) -> None:
        self.page = None  # the view goes before the mapping it holds open
        self.m.close()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def policy(self) -> str:
        return POLICY_NAMES.get(self.page.policy, "unknown")

    @policy.setter
    def policy(self, name: str) -> None:
        if name not in POLICIES:
            raise SchedError(f"unknown policy '{name}' (one of {', '.join(POLICIES)})")
        self.page.policy = POLICIES[name]  # one aligned 4-byte store (abi.SchedPage)

    @property
    def slice_us(self) -> int:
        return self.page.slice_us

    @property
    def period_us(self) -> int:
        return self.page.period_us

    @property
    def owner(self) -> int:
        return self.page.owner

    def members(self) -> list[Member]:
        out = []
        for i, s in enumerate(self.page.slot):
            if s.pid:
                name = s.name.decode(errors="replace")
                prio = PRIORITY_NAMES.get(s.priority, "normal")
                m = Member(
                    i,
                    name,
                    s.pid,
                    s.weight,
                    s.used_ns,
                    s.turns,
                    s.waiters,
                    s.nworkers,
                    s.cap,
                    prio,
                    s.guarantee,
                    s.work_calls,
                    s.hold,
                    s.depth,
                    s.sm_part,
                    s.whole_ms,
                    s.cap_pm,
                    s.active_ms,
                )
                out.append(m)
        return out

    def work_calls(self, slot: int) -> int:
        """A slot's work calls now (what the cap controller samples in a probe)."""
        return self.page.slot[slot].work_calls

    def gpu_time(self) -> tuple[int, dict[str, int]]:
        """(now, each member's GPU time so far, ns), counting the turn the owner holds now: a
        turn is charged to used_ns only as it ends (or a slice of it, as it goes), and a guest
        alone on the GPU keeps its turn as long as it stays busy.  A guest with several
        memberships (forwarders) on the GPU: their sum (gpu_time_by_seat has each)."""
        now, seats = self.gpu_time_by_seat()
        out: dict[str, int] = {}
        for seat, ns in seats.items():
            out[seat.guest] = out.get(seat.guest, 0) + ns
        return now, out

    def gpu_time_by_seat(self) -> tuple[int, dict[Seat, int]]:
        """(now, each membership's GPU time so far, ns), as gpu_time, by the seat it is counted
        in: a forwarder started again (or a guest that left and came back) is a new seat, its
        used_ns from 0.

        The forwarders charge a turn and hand the GPU over under the page's lock, which this
        reader does not take; a look that saw a change half made would count a stretch twice
        (or to two guests), and the next one would be smaller.  So a look is taken again while
        a slot's time_seq is odd or moved across it, or anything it read moved under it (the
        older forwarders' guard: they keep no time_seq), GPU_TIME_TRIES times at most, the last
        taken as it is (sched_abi.h, "Reading a guest's GPU time", has the protocol; a counter
        made of these is kept from stepping back by its reader: vmgpu/metrics.py).  Python has
        no fences: the loads are in the order the protocol says, which x86-64 keeps; elsewhere
        the interpreter's thousands of instructions between them stand in for the fences."""
        pg, slots = self.page, self.page.slot
        for tries in range(GPU_TIME_TRIES, 0, -1):
            # CLOCK_MONOTONIC, the forwarders' clock, before the look: read after it, the owner's
            # turn would be carried past where a change the look missed ends it
            now = time.monotonic_ns()
            seqs = [s.time_seq for s in slots]
            gen, owner = pg.gen, pg.owner  # the owner, then the charges, then the charge point
            seats = self._seats()
            start = pg.hold_start
            whole = (
                not any(q & 1 for q in seqs)
                and (pg.gen, pg.owner, pg.hold_start) == (gen, owner, start)
                and self._seats() == seats
                and [s.time_seq for s in slots] == seqs
            )
            if whole or tries == 1:
                break
            os.sched_yield()  # (a forwarder in the middle of a change may want this CPU to finish it)
        return now, {
            Seat(i, name.decode(errors="replace"), pid, joined): ns + (max(0, now - start) if i == owner else 0)
            for i, pid, joined, name, ns in seats
        }

    def _seats(self) -> list[tuple[int, int, int, bytes, int]]:
        """(slot, pid, joined_ns, name, used_ns) of each member, as read now."""
        return [(i, s.pid, s.joined_ns, s.name, s.used_ns) for i, s in enumerate(self.page.slot) if s.pid]

    def set_weight(self, guest: str, weight: int) -> int:
        """Set a guest's weight (1..100); how many of its memberships changed."""
        if not 1 <= weight <= 100:
            raise SchedError(f"weight {weight} is not in 1..100")
        return self._store(guest, "weight", weight)

    def set_cap(self, guest: str, cap: int) -> int:
        """Set a guest's cap (0..100 % of each period, 0: none); how many of its memberships changed."""
        if not 0 <= cap <= 100:
            raise SchedError(f"cap {cap}% is not in 0..100 (0: none)")
        return self._store(guest, "cap", cap)

    def set_priority(self, guest: str, priority: str) -> int:
        """Set a guest's priority (high, normal, low); how many of its memberships changed."""
        if priority not in PRIORITIES:
            raise SchedError(f"priority '{priority}' is not one of high, normal, low")
        return self._store(guest, "priority", PRIORITIES[priority])

    def set_hold(self, slot: int, hold: int) -> None:
        """Under shared: hold the member in `slot` back `hold` per mille of each period (0..1000)."""
        if not 0 <= hold <= 1000:
            raise SchedError(f"hold {hold} is not in 0..1000 per mille")
        self.page.slot[slot].hold = hold  # one aligned 4-byte store

    def set_depth(self, slot: int, depth: int) -> None:
        """Under shared: hold each of the member's workers to `depth` of its work calls unfinished on
        the GPU, where that is fewer than its forwarder's --sched-depth (1..1024; 0: the forwarder's)."""
        if not 0 <= depth <= DEPTH_MAX:
            raise SchedError(f"depth {depth} is not in 0..{DEPTH_MAX} (0: the forwarder's)")
        self.page.slot[slot].depth = depth  # one aligned 4-byte store

    def set_cap_pm(self, slot: int, pm: int, pid: int | None = None) -> bool:
        """Where the member in `slot` is capped: let its work have `pm` per mille of each period in
        place of its cap% (1..1000; 0: its cap% again), as the cap controller sets it.  pid: only
        while the slot is still that forwarder's (False where it is not: a part meant for a guest
        that left is not left to the one seated after it; the forwarders take a part only where
        a guest is capped, and the next look puts a stray one right: one seated between the check
        and the store, microseconds, keeps it until then)."""
        if not 0 <= pm <= 1000:
            raise SchedError(f"cap part {pm} is not in 0..1000 per mille")
        s = self.page.slot[slot]
        if pid is not None and s.pid != pid:
            return False
        s.cap_pm = pm  # one aligned 4-byte store
        return True

    def mark_caps_look(self, now: float) -> None:
        """The cap controller looks at `now` (time.monotonic, the forwarders' CLOCK_MONOTONIC): the
        slots' cap_pm hold for VMGPU_SCHED_CAPS_FRESH_MS from it (a vmgpud that stops looking, in a
        probe or not, leaves its guests to their caps' own parts)."""
        self.page.caps_ms = (int(now * 1000) & 0xFFFFFFFF) or 1  # one aligned 4-byte store; 0 is never

    def caps_fresh(self, now: float | None = None, probe: bool = False) -> bool:
        """Whether the cap controller's parts hold now: it looked within VMGPU_SCHED_CAPS_FRESH_MS,
        or for a probe's part (1000) VMGPU_SCHED_PROBE_FRESH_MS (as the forwarders judge it:
        host_forwarder/native/sched_policy.c, cap_part_pm)."""
        looked = self.page.caps_ms
        now_ms = int(1000 * (time.monotonic() if now is None else now)) & 0xFFFFFFFF
        age = ((now_ms - looked + 2**31) & 0xFFFFFFFF) - 2**31
        fresh = abi.SCHED_PROBE_FRESH_MS if probe else abi.SCHED_CAPS_FRESH_MS
        return bool(looked) and -fresh < age <= fresh

    @property
    def sm_groups(self) -> int:
        """The groups of SMs an SM span counts in (0: the forwarders cannot partition this GPU)."""
        return self.page.sm_groups

    def set_part(self, slot: int, lo: int, hi: int) -> None:
        """Under shared, while another guest of its priority or above is at work: run the member's
        work on the SMs of groups [lo/16, hi/16) of the page's sm_groups (sixteenths of a group: a
        fractional end takes the next group that part of each period); lo == hi == 0: the whole GPU."""
        groups = self.sm_groups
        if (lo, hi) != (0, 0) and not (0 <= lo and lo + 16 <= hi <= 16 * groups):
            raise SchedError(f"SM span [{lo / 16:g}, {hi / 16:g}) is not at least one group inside 0..{groups}")
        self.page.slot[slot].sm_part = lo << 16 | hi  # one aligned 4-byte store

    def _store(self, guest: str, field: str, value: int) -> int:
        n = 0
        for m in self.members():
            if m.guest == guest:
                setattr(self.page.slot[m.slot], field, value)  # one aligned 4-byte store
                n += 1
        return n


def apply(
    uuid: str,
    weights: dict[str, int] | None = None,
    policy: str | None = None,
    caps: dict[str, int] | None = None,
    priorities: dict[str, str] | None = None,
) -> bool:
    """Put weights, caps and priorities (by guest) and a policy on the GPU's page now, if a
    forwarder has made it; whether anything running took them (vmgpud keeps them for
    forwarders started later)."""
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
        for guest, c in (caps or {}).items():
            live |= page.set_cap(guest, c) > 0
        for guest, p in (priorities or {}).items():
            live |= page.set_priority(guest, p) > 0
        return live
