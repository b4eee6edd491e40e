"""The cap controller of a GPU: a capped guest's progress held to its cap.

A cap (`cap=` in a share, `vmgpu cap`; under the fixed policy a guest's weight as well) bounds
what a guest gets of a GPU.  The forwarders hold it by time: its work passes at most its part of
each period (host_forwarder/native/sched_policy.c: sched_budget_ns under turns, sched_held_ns
under shared).  What its tenant sees is its progress, and that is not its time: a guest whose own
CPU leaves the GPU idle part of the time alone (a trainer's Python between steps) packs its work
into its part of the period when capped, and makes more than cap% of its rate alone; at a small
cap, the hand-over at the end of each part costs more than that gains.  On an H100 a trainer held
to 10% and 50% of the time made 7-10% and 42-56% of its rate alone.

This controller makes a cap a cap of progress, as tenants measure it: a capped guest's rate (its
calls that put work on the GPU per second, the page's work_calls) over its rate alone is held to
its cap, by the part of each period its work may have (the slot's cap_pm, which the forwarders
take in place of cap%).

Its rate alone is measured by a probe: its cap lifted (cap_pm 1000) for PROBE_S while it is the
only guest at work on the GPU (no other member's calls, GPU time or activity moving, none holding
the GPU: one long kernel makes no calls), the first PROBE_SETTLE_S not counted (the work its cap
held back goes first); a probe another guest's work comes into, or in which the guest stops, is
spoilt and not read.  A probe is read between whole bursts of its calls: a guest's calls come
in bursts (a trainer issues some steps, then waits for the GPU at its synchronisation), so its
calls between the probe's two ends are some part of a burst off (on an H200 a trainer's reads over
0.5 s were 7% apart); while a probe is under way the controller samples the guest's calls every
FINE_S (wait()), and reads them from the first burst's start to the last's, a whole number of bursts
(where it finds fewer than two bursts over half the probe, as in a guest whose calls never pause,
between the probe's ends).  Its rate alone is the mean of its last PROBES_KEPT reads, less those out of
80% of their median either way (a read as it begins its work); two reads in a row K_SHIFT or more
off the median of the others on the same side are its new rate alone (its work changed).  After
one such read the next probe comes four times as soon as it would (PROBE_EVERY_S at least), and
so it does once what a part of the period makes the guest (its calls per second of its parts,
over about SHIFT_TAU_S of them) is seen K_SHIFT or more off what it made at its last read (then
as soon as it can be paid for ahead): at a cap of 10%, where probes are 108 s apart, a rate alone
that moved by x0.5 to x1.6 is had within 8% in 32-128 s in a model (before, over 3 minutes, and
not at all for x0.8).
Probes come PROBE_FIRST_S apart (twice as far after each spoilt one) until its last PROBES_KEPT
reads agree within STEADY or FIRST_MAX have begun (a guest that warms up reads short or long; it
is not taken up before: held by time,
and its first probes are not paid back: on an H200 a trainer was taken up some 25-32 s after its
first work), then PROBE_EVERY_S apart, and at a small cap further (a probe gives a guest at most
PROBE_COST of its cap more between two).

A guest is held to its cap of its rate alone as its probes read it: where its rate alone moves
between probes, its share of what it would make alone moves with it (on an H200 a ResNet-50
trainer bound by its own Python, natively as much as through vmgpu, moved some 10% over tens of
seconds; held to 48.8-50.8% of its read rate alone, it made 44.8-54.9% of its rate alone in the 12 s
after).  A probe's whole period is a budget the forwarders do not count (sched_policy.c counted_budget):
counted, its turns ended at each idle moment, each a drain of the GPU, and an H200's probes read a
GPU-bound trainer at 91-95% of its rate alone (cap 50: 45.4-48.0%); uncounted, at 100.9% (cap 10:
10.2%).

What it made is kept against what its cap allows as a debt, in seconds at its rate alone: each look
adds its calls since the last over its rate alone, less its cap times the time between (a
probe's stretch too, so a probe is paid back).  What it falls short is owed back only up to
CREDIT_S at its cap: a guest that could not use its part is not owed a burst later.  Its part of
each period is then (cap - debt / PAYBACK_S) / k, where k is the progress a part of the period
has been seen to give it (learned over the looks between probes while it is alone on the GPU: a
second at a time), kept in [1 per mille, OVER x its cap] while it is alone on the GPU and in [1
per mille, its cap] beside others (time past its cap would be theirs): a probe is paid for ahead
and back at up to its whole cap a second.

Under the equal policy caps stay parts of the time: there every member is held to 1/N of it
besides its cap, and no probe could read a rate alone.

A cap binds a guest only where it slows it: the controller takes a guest up once its rate over
the last second (no probe in it) is short of its rate alone by BIND or more, and lets it go when
it is idle.  A guest whose work fits in cap% of the time (one that is seldom at work, or waits on
its own CPU most of the time) goes at its rate alone there, and is left held by time (cap_pm 0:
cap%), which it does not reach; so, as on time alone, is a guest whose cap is near what it uses
of the GPU alone (a trainer busy 90% of the time, capped at 90).  Until its rate alone is
measured a guest is held by time too; a guest whose GPU always has another guest at work is never
probed, and stays held by time.

Hostile guests: progress is counted in calls, which the guest chooses.  One that makes its calls
look slower than they are (many cheap ones in a probe, few heavy ones after) is owed more than its
cap of time, but never more than OVER x its cap of each period alone on the GPU (its cap beside
others), and a probe's PROBE_S uncapped every PROBE_EVERY_S at most besides its first FIRST_MAX
probes, read or spoilt (one that keeps its work looking changed gets its probes four times as
often as its cap's spacing, PROBE_EVERY_S apart at least: a probe lasts up to PROBE_S and a
look, so at a cap of 10% some 2.6% of the time uncapped against 0.65%); one that makes them look
faster is held tighter, which hurts only itself.
A guest is known by its name: one whose forwarder is started again, in its slot or another, within
GRACE_S keeps its debt, its reads and its probes' count (a counter begun again is no progress).

The parts it sets hold only while it looks: each look stores them and then stamps the page
(caps_ms), and the forwarders take a slot's cap_pm only within 2 s of the last stamp
(VMGPU_SCHED_CAPS_FRESH_MS; a probe's 1000 within 1 s, VMGPU_SCHED_PROBE_FRESH_MS), so a
vmgpud that dies, in a probe or not, leaves every guest to its cap% of the time; one that stops,
or stops controlling a GPU, takes its parts back at once (withdraw).

Pure arithmetic on what it is given (`step`), so that tests drive it with a model of a GPU on a
fake clock; `apply_step` is one look at a live page, as vmgpud's share-control thread makes them.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from vmgpu.sched import cap_percent
from vmgpu.share_control import Seen, seen_on

PERIOD_STEP_S = 0.1  # how often the controller looks
PROBE_S = 0.6  # a probe: the cap lifted this long (a trainer's calls come in bursts: read over 0.22 s
# they were 12% apart from one probe to the next on an H200; a longer probe costs more to pay back)
PROBE_SETTLE_S = 0.1  # its first part not counted: the work its cap held back goes first
PROBE_FIRST_S = 2.5  # a guest's first probes this far apart, before it is taken up, until its
STEADY = 0.15  # last PROBES_KEPT reads are within this part of their mean (a guest still warming up
FIRST_MAX = 8  # reads short or long), or it has had this many
PROBE_EVERY_S = 10.0  # then this far apart at least,
PROBE_COST = 0.05  # and so far apart that a probe gives it at most this part of its cap more
PROBES_KEPT = 6
SHORT_READ = 0.8  # a read short of this part of the median kept is left out of the rate alone
PAYBACK_S = 1.0  # a debt is paid back over about this long
PREPAY_PART = 0.25  # a bound guest pays for its next probe ahead, at this part of its cap (in a second at least)
CREDIT_S = 0.2  # what a guest fell short of its cap is owed back up to this long at its cap
OVER = 1.5  # a capped guest's part of each period is at most this many times its cap
FINE_S = 0.002  # a probing guest's calls sampled this often (the forwarders publish them every 250 us)
K_EVERY_S = 1.0  # k (progress per part of the period) is read over this long,
K_LEARN = 0.5  # and moves this part of the way to each read
K_LIMITS = (0.3, 4.0)
K_SHIFT = 0.15  # its work looks changed where a part makes it this much more or less than at its last read,
SHIFT_TAU_S = 4.0  # read over about this long of its parts (at a cap of 10%, 40 s)
IDLE_S = 0.3  # a guest whose calls have not moved for this long, and none of whose work waits, is idle
GRACE_S = 60.0  # a capped guest that left the page is remembered this long (its forwarder started again)
GAP_S = 1.0  # a guest not seen for this long: the stretch is not counted (nor a probe under way read)
BIND = 0.05  # a guest whose rate is short of its rate alone by this part is slowed by its cap
RATE_S = 1.0  # a guest's rate: over this long


@dataclass
class _Capped:
    cap: float  # the part of its rate alone it may make (0..1)
    calls: int = 0  # at the last look
    at: float = 0.0  # the last look
    seen: deque = field(default_factory=deque)  # (t, calls) since its last probe, over RATE_S
    reads: deque = field(default_factory=lambda: deque(maxlen=PROBES_KEPT))  # its probes' rates
    started: int = 0  # its probes begun (read or spoilt)
    spoilt: int = 0  # its probes spoilt in a row since its last read (each doubles the wait for the next)
    alone: float = 0.0  # calls/s alone (0: not measured)
    bound: bool = False  # taken up: its cap slows it, and it has not been idle since
    debt: float = 0.0  # progress past its cap so far, in seconds at its rate alone
    k: float = 1.0  # progress per part of the period
    k_sum: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (progress, part x time, time) since k was last read
    pm: int = 0  # the part it was last given (0: cap%)
    probe_at: float | None = None  # its probe under way began then
    settled: tuple[float, int] | None = None  # (when, its calls) its probe's measure began
    probed_at: float = -math.inf  # its last probe ended then
    slot: int = -1  # its slot on the page at the last look
    fine: list = field(default_factory=list)  # (t, calls) every FINE_S in its probe's measure (wait())
    per_part_now: float = 0.0  # calls a whole period makes it, per second: over about SHIFT_TAU_S of its parts
    parts_seen: float = 0.0  # of its parts, in seconds, per_part_now has been read over (up to SHIFT_TAU_S)
    per_part: float = 0.0  # per_part_now at its last read in band (0: not known yet; shifted())
    changed_at: float | None = None  # shifted() was first seen then, since its last read
    out_of_band: bool = False  # its last read was K_SHIFT or more off the others' median (_add_read)
    last_read: tuple[float, float] = (0.0, 0.0)  # its last probe's read: between its ends, between whole bursts
    left_at: float | None = None  # it left the page then (kept GRACE_S for its forwarder started again)


class CapController:
    """One GPU's cap controller.  `step(now, seen, policy)` returns each member's cap_pm by slot."""

    def __init__(
        self,
        *,
        probe_s: float = PROBE_S,
        settle_s: float = PROBE_SETTLE_S,
        probe_every_s: float = PROBE_EVERY_S,
        probe_cost: float = PROBE_COST,
    ):
        self.probe_s, self.settle_s, self.probe_every_s = probe_s, settle_s, probe_every_s
        self.probe_cost = probe_cost
        self.guests: dict[tuple[int, str], _Capped] = {}
        self.moved: dict[tuple[int, str], tuple[int, float]] = {}  # every member's (calls, when they last moved)
        self.marks: dict[int, tuple] = {}  # each slot's (guest, used_ns, active_ms) at the last look (at_work)

    @staticmethod
    def cap_of(s: Seen, policy: str) -> int:
        """The % of its rate alone a member may make: its cap, under fixed its weight too (100: none).
        Under equal none: there every member is held to 1/N of the time besides its cap (a probe
        could not read its rate alone), and its cap stays cap% of the time."""
        return 100 if policy == "equal" else cap_percent(s.cap, s.weight, policy)

    def step(self, now: float, seen: list[Seen], policy: str, at_work: set[int] | None = None) -> dict[int, int]:
        """One look: each member's cap_pm by slot (0 for the uncapped, and for the capped it holds
        by time).  at_work: the slots the page shows at work besides their calls (at_work()), busy
        as well.  A guest is known by its name, wherever its slot: one whose forwarder is started
        again (in the same slot or another) within GRACE_S keeps what it owes and what was
        measured of it."""
        keys = {s.guest: s for s in seen}
        self.moved = {k: self._moved(k, s, now) for k, s in keys.items()}
        at_work = at_work or set()
        busy = {k for k, s in keys.items() if s.waiting or now - self.moved[k][1] < IDLE_S or s.slot in at_work}
        out = {s.slot: 0 for s in seen}
        capped = {k: self.cap_of(s, policy) for k, s in keys.items()}
        for k, g in list(self.guests.items()):
            if k not in keys and g.left_at is None:
                g.left_at, g.probe_at = now, None
            if policy == "native" or (k in keys and capped[k] >= 100) or now - (g.left_at or now) > GRACE_S:
                del self.guests[k]
        if policy == "native":
            return out
        probing = any(g.probe_at is not None for g in self.guests.values())
        for k, s in keys.items():
            if capped[k] >= 100:
                continue
            g = self.guests.setdefault(k, _Capped(capped[k] / 100, s.calls, now))
            g.cap, g.left_at, g.slot = capped[k] / 100, None, s.slot
            out[s.slot] = self._look(g, now, s, k in busy, alone_on_gpu=busy <= {k}, probing=probing)
            probing |= g.probe_at is not None
        return out

    @property
    def probing(self) -> bool:
        """Whether a probe's measure is under way (its guest's calls are to be sampled every
        FINE_S: watch())."""
        return any(g.probe_at is not None and g.settled is not None for g in self.guests.values())

    def watch(self, now: float, calls_of) -> None:
        """A fine sample of each probing guest's calls (calls_of(slot): its counter now), where its
        probe's measure has begun.  A count below the last is not kept (its slot was taken by
        another forwarder since the last look, which the next look sees: the probe is not read)."""
        for g in self.guests.values():
            if g.probe_at is not None and g.settled is not None and g.left_at is None:
                calls = calls_of(g.slot)
                if not g.fine or calls >= g.fine[-1][1]:
                    g.fine.append((now, calls))

    def at_work(self, owner: int, members, policy: str) -> set[int]:
        """The slots a page shows at work besides their calls: the GPU's holder under turns (under
        shared no turn is handed over: the holder is whoever held it when the policy changed), and
        a member whose GPU time (used_ns) or last activity (active_ms, under shared) moved since the
        last look."""
        marks = {m.slot: (m.guest, m.used_ns, m.active_ms) for m in members}
        out = {slot for slot, mark in marks.items() if slot in self.marks and self.marks[slot] != mark}
        self.marks = marks
        return out | ({owner} if owner in marks and policy not in ("shared", "native") else set())

    def _moved(self, k, s: Seen, now: float) -> tuple[int, float]:
        calls, at = self.moved.get(k, (s.calls, now))
        return s.calls, now if s.calls != calls else at

    def _look(self, g: _Capped, now: float, s: Seen, busy: bool, alone_on_gpu: bool, probing: bool) -> int:
        dt, made = now - g.at, s.calls - g.calls
        g.calls, g.at = s.calls, now
        if made < 0 or dt > GAP_S:
            # its counter began again (its forwarder seated afresh), or it was not seen a while
            # (gone, or the controller not looking): nothing seen of that stretch, nothing forgiven
            made, dt = 0, 0.0
            if g.probe_at is not None:
                g.spoilt += 1
            self._probe_over(g, now)
        elif g.probe_at is not None:
            return self._probing(g, now, s, made, dt, alone_on_gpu)
        else:
            g.seen.append((now, s.calls))
        while len(g.seen) > 2 and g.seen[1][0] <= now - RATE_S:
            g.seen.popleft()
        if not busy:  # idle: its cap is taken up afresh when it works again
            g.bound, g.debt, g.k_sum = False, 0.0, (0.0, 0.0, 0.0)
        elif g.alone > 0 and dt > 0:
            if g.bound:
                progress = made / g.alone
                g.debt = max(g.debt + progress - g.cap * dt, -CREDIT_S * g.cap - self._excess(g))
                if alone_on_gpu:  # (beside others its progress is theirs to share too: not its part's)
                    self._learn(g, progress, dt)
                    self._watch_parts(g, made, (g.pm / 1000 if g.pm else g.cap) * dt, now)
            else:
                g.bound = self._steady(g) and self._rate(g) < (1 - BIND) * g.alone
        # (no probe before it is paid for, nor while the last one is being paid back)
        paid = g.debt + self._prepaid(g, now) <= g.cap * PERIOD_STEP_S + self._excess(g) / 4
        if busy and alone_on_gpu and not probing and paid and now >= self._due(g):
            g.probe_at, g.settled, g.pm = now, None, 1000
            g.started += 1
            return 1000
        return self._part(g, now, alone_on_gpu)

    def _watch_parts(self, g: _Capped, made: int, part_s: float, now: float) -> None:
        """per_part_now moved by a look's calls over the part of the period it had (a mean over
        the first SHIFT_TAU_S of parts, then a moving one over about as long); per_part taken
        once it is known; and the first sight of shifted() kept (changed_at: its early probe comes
        once its excess can be paid ahead, not at once)."""
        if part_s <= 0:
            return
        g.parts_seen = min(SHIFT_TAU_S, g.parts_seen + part_s)
        g.per_part_now += (part_s / g.parts_seen) * (made / part_s - g.per_part_now)
        if not g.per_part and g.parts_seen >= SHIFT_TAU_S:
            g.per_part = g.per_part_now
        if g.changed_at is None and self.shifted(g):
            g.changed_at = now

    def _due(self, g: _Capped) -> float:
        """When its next probe is due: a guest's first probes PROBE_FIRST_S apart; later ones
        PROBE_EVERY_S apart at least, further where a probe would give more than PROBE_COST of
        what its cap gives it between two (at a cap of 10%, 108 s apart); a quarter as far (and
        PROBE_EVERY_S at least) while its work looks changed: shifted(), or its last read out of
        the band of the others (a second such read makes its new rate alone)."""
        if not self._steady(g):
            return g.probed_at + PROBE_FIRST_S * 2 ** min(g.spoilt, 6)
        gap = max(self.probe_every_s, (1 - g.cap) * self.probe_s / (self.probe_cost * g.cap))
        soon = g.probed_at + max(self.probe_every_s, gap / 4)
        if g.out_of_band:  # (known at its read: what it pays ahead is paid from there)
            return soon
        if g.changed_at is not None:  # (seen since: paid ahead from then)
            return min(g.probed_at + gap, max(soon, g.changed_at + self._lead(g)))
        return g.probed_at + gap

    @staticmethod
    def shifted(g: _Capped) -> bool:
        """Whether its work looks changed since its rate alone was last read: the calls a whole
        period makes it now (per_part_now) more than K_SHIFT off what they were at that read (its
        last in band; per_part, or where that came before SHIFT_TAU_S of its parts were seen, once
        they were): a read of its new rate then comes sooner (at a small cap probes are far apart)."""
        return g.per_part > 0 and g.per_part_now > 0 and abs(g.per_part_now / g.per_part - 1) > K_SHIFT

    @staticmethod
    def _steady(g: _Capped) -> bool:
        """Whether its rate alone is known well enough to hold it by: its last PROBES_KEPT reads
        within STEADY of their mean, or FIRST_MAX probes begun, read or spoilt (a guest that keeps
        its reads apart, or spoils its probes, is not probed every PROBE_FIRST_S for ever: its first
        probes are not paid back)."""
        if g.started >= FIRST_MAX:
            return True
        if len(g.reads) < PROBES_KEPT:
            return False
        kept = _kept(g.reads)
        mean = sum(kept) / len(kept)
        return len(kept) >= PROBES_KEPT - 1 and all(abs(r - mean) <= STEADY * mean for r in kept)

    def _excess(self, g: _Capped) -> float:
        """What a probe gives a bound guest past its cap, in seconds at its rate alone."""
        return (1 - g.cap) * self.probe_s if g.bound else 0.0

    def _prepaid(self, g: _Capped, now: float) -> float:
        """The part of its next probe's excess it pays for by now: from none some time before the
        probe is due (long enough to pay it at PREPAY_PART of its cap, a second at least) to all of
        it then, so that a stretch with a probe in it, and the time about it, is the cap's on the
        whole, not only a long one."""
        ahead = (self._due(g) - now) / self._lead(g)
        return self._excess(g) * min(1.0, max(0.0, 1 - ahead))

    def _lead(self, g: _Capped) -> float:
        """How long before a probe it begins to pay for it (at PREPAY_PART of its cap, a second at least)."""
        return max(1.0, self._excess(g) / (PREPAY_PART * g.cap))

    def _rate(self, g: _Capped) -> float:
        """Its calls per second over the last RATE_S since its last probe (inf until it has that long)."""
        (t0, c0), (t1, c1) = g.seen[0], g.seen[-1]
        return (c1 - c0) / (t1 - t0) if t1 - t0 >= RATE_S else math.inf

    def _probing(self, g: _Capped, now: float, s: Seen, made: int, dt: float, alone_on_gpu: bool) -> int:
        """A look during g's probe: its measure begun after the settle, read at the end (and left
        unread if another guest came to work meanwhile, or g stopped)."""
        if g.alone > 0 and g.bound:
            g.debt += made / g.alone - g.cap * dt
        if not alone_on_gpu or (made == 0 and not s.waiting):
            g.spoilt += 1  # (spoilt: tried again at its time, later each time)
            self._probe_over(g, now)
            return self._part(g, now, alone_on_gpu)
        if g.settled is None:
            if now - g.probe_at >= self.settle_s:
                g.settled, g.fine = (now, s.calls), [(now, s.calls)]
            return 1000
        if now - g.probe_at < self.probe_s:
            return 1000
        t0, c0 = g.settled
        if s.calls > c0 and now > t0:
            g.last_read = ((s.calls - c0) / (now - t0), burst_rate([*g.fine, (now, s.calls)]))
            g.out_of_band = _add_read(g.reads, g.last_read[1])  # (a second comes soon: two are its new rate)
            g.spoilt = 0
            kept = _kept(g.reads)
            g.alone = sum(kept) / len(kept)
            g.changed_at = None
            if not g.out_of_band:  # (the read has it at this level; out of band, it stays shifted)
                g.per_part = g.per_part_now if g.parts_seen >= SHIFT_TAU_S else 0.0
        self._probe_over(g, now)
        return self._part(g, now, alone_on_gpu)

    @staticmethod
    def _probe_over(g: _Capped, now: float) -> None:
        """g's probe (if one is under way) ended, or a stretch of it not seen: its rate and k are
        measured afresh from now."""
        if g.probe_at is not None:
            g.probe_at, g.probed_at = None, now
        g.k_sum, g.seen, g.fine = (0.0, 0.0, 0.0), deque([(now, g.calls)]), []

    def _part(self, g: _Capped, now: float, alone_on_gpu: bool) -> int:
        """Its part of each period (per mille): its cap less what it owes (and what it pays ahead
        for its next probe), per the progress a part has been seen to give it; 0 (cap% of the
        time) while its cap is not taken up.  More than cap% only while it is alone on the GPU:
        beside others, time it is given past its cap would be theirs."""
        if g.alone <= 0 or not g.bound:
            g.pm = 0
            return 0
        part = (g.cap - (g.debt + self._prepaid(g, now)) / PAYBACK_S) / g.k
        # (999 at most: 1000 is a probe's, which the forwarders neither count nor keep long)
        most = min(OVER * g.cap, 0.999) if alone_on_gpu else g.cap
        g.pm = int(round(1000 * min(most, max(0.001, part))))
        return g.pm

    def _learn(self, g: _Capped, progress: float, dt: float) -> None:
        """k from the progress g made on the parts it was given, read every K_EVERY_S."""
        p, x, t = g.k_sum
        p, x, t = p + progress, x + (g.pm / 1000 if g.pm else g.cap) * dt, t + dt
        if t >= K_EVERY_S and x > 0:
            lo, hi = K_LIMITS
            g.k = min(hi, max(lo, g.k + K_LEARN * (p / x - g.k)))
            p, x, t = 0.0, 0.0, 0.0
        g.k_sum = (p, x, t)


def burst_rate(samples: list[tuple[float, int]]) -> float:
    """Calls per second over (t, calls) samples in time order: from the start of the first burst
    to the start of the last (a burst starts where the calls move after their longest pauses: a
    pause at least half the longest), where at least two starts span half the samples' time;
    else from the first sample to the last (0 where they span no time).  A start is placed only
    where the samples about it are FINE_S apart or so (3 x at most): one the sampling stalled
    across (vmgpud's loop held up) would be placed up to half the stall off."""
    (t_first, c_first), (t_end, c_end) = samples[0], samples[-1]
    if t_end <= t_first:
        return 0.0
    pauses, still = [], 0  # (the pause's length, the sample its calls moved at)
    for i in range(1, len(samples)):
        if samples[i][1] != samples[i - 1][1]:
            if i - 1 > still:  # (the calls stood still from samples[still] to samples[i - 1])
                pauses.append((samples[i - 1][0] - samples[still][0], i))
            still = i
    longest = max((p for p, _ in pauses), default=0.0)
    starts = [i for p, i in pauses if p >= longest / 2 and samples[i][0] - samples[i - 1][0] <= 3 * FINE_S]
    if len(starts) >= 2:
        # (a start's time: halfway from the pause's last sample to the first that moved)
        (a, b) = starts[0], starts[-1]
        ta = (samples[a - 1][0] + samples[a][0]) / 2
        tb = (samples[b - 1][0] + samples[b][0]) / 2
        if tb - ta >= (t_end - t_first) / 2:
            return (samples[b - 1][1] - samples[a - 1][1]) / (tb - ta)
    return (c_end - c_first) / (t_end - t_first)


def wait(stop, seconds: float, controlled) -> bool:
    """stop.wait(seconds) for a controlling thread (vmgpud's, the bench's): meanwhile, while a
    probe is under way on one of `controlled` ((page, CapController) pairs: vmgpu.sched.Page), its
    guest's calls sampled every FINE_S (CapController.watch).  True where stop was set."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return stop.is_set()
        probing = [(page, ctl) for page, ctl in controlled if ctl.probing]
        if stop.wait(min(left, FINE_S) if probing else left):
            return True
        now = time.monotonic()
        for page, ctl in probing:
            try:
                ctl.watch(now, page.work_calls)
            except Exception:  # noqa: BLE001 - a page that fails is dealt with at the next step
                continue


def _add_read(reads: deque, read: float) -> bool:
    """A probe's read kept; where it and the read before are both off the median of the others
    by K_SHIFT or more (short of it, or past it) on the same side, the guest's rate alone has
    moved (its work changed): the reads before them go.  Whether the read was so off."""
    off = 0
    if len(reads) >= 3:
        *older, last = reads
        median = sorted(older)[len(older) // 2]

        def side(r: float) -> int:
            return -1 if r < (1 - K_SHIFT) * median else 1 if r * (1 - K_SHIFT) > median else 0

        off = side(read)
        if off and off == side(last):
            reads.clear()
            reads.append(last)
    reads.append(read)
    return bool(off)


def _kept(reads) -> list[float]:
    """The reads a rate alone is made of: those within SHORT_READ of their median, either way (a
    read as a guest begins its work, or a probe that read long)."""
    median = sorted(reads)[len(reads) // 2]
    return [r for r in reads if SHORT_READ * median <= r <= median / SHORT_READ]


def apply_step(page, ctl: CapController, now: float) -> None:
    """One look at a live page (vmgpu.sched.Page): each capped member's part of the period, stored
    where it changed, and then the look stamped (the parts hold for VMGPU_SCHED_CAPS_FRESH_MS from
    it: a part a vmgpud that died left is not made fresh again before it is replaced)."""
    members = page.members()
    policy = page.policy
    parts = ctl.step(now, seen_on(page, now), policy, ctl.at_work(page.owner, members, policy))
    for m in members:
        pm = parts.get(m.slot, 0)
        if m.cap_pm != pm:
            page.set_cap_pm(m.slot, pm, m.pid)  # (not where another forwarder took the slot since)
    page.mark_caps_look(now)


def withdraw(page) -> None:
    """Every part the cap controller set on a live page taken back (its caps are cap% of the time
    again at once): when vmgpud stops controlling a GPU."""
    for m in page.members():
        if m.cap_pm:
            page.set_cap_pm(m.slot, 0, m.pid)
