"""The share controller of a GPU under the `shared` policy.

Under `shared` no guest takes turns: every guest's work goes to the GPU as it comes (with the
forwarders' workers clients of one MPS server, their kernels run on the SMs side by side), and
the only control is a hold per guest on the scheduler page: the first `hold` per mille of every
period (100 ms) the guest's work waits in its ring (host_forwarder/native/sched_policy.c,
sched_held_ns).  This controller sets the holds so that what each guest gets is its share of
what the guests get together, measured as tenants measure it: a guest's progress is its rate
beside the others over its rate alone, its rate is the calls that put work on the GPU per second
(the page's `work_calls`), and its rate alone is measured now and then by holding the others for
a moment (a probe: every 4 s, and 16 s apart once the rates alone hold steady, since a probe
moves the shares of the second it falls in), or whenever it is the only busy guest.  A probe can
read a guest short (on an H100, one trainer alone read 21,000 calls/s and 29,000 a few seconds
later), never long: a guest's rate alone is the more of its last two probes, or what it was seen
to do beside the others if that is more; a read well short of it is believed once the guest's
next probe (the next of all, or the first of the next round) agrees.  A newcomer is probed
within a second, and again within a second after that (its first probe may fall in its warming
up), as is a guest seen beside the others at more than 1.1 times what its probes read; an
unmeasured guest whose probes are refused REFUSED_MAX times in a row (it stops in them) is
probed again only after the others, ever further apart, once sooner where it then works on
(_retry), nor does its work break a round of its rank (probed first and every second, a guest at
work a moment every second had the others held a fifth of the time and their own probes never
came); a probe its guest stops in ends at once; and a guest whose rate alone is not measured is
held beside a measured one to its target part of each period.  While a guest is young (for
young_s from the first look it had worked a whole window through, until two probes in a row, the
first GROWN_S into that, read it alike) rounds come every PROBE_EVERY_S, at most young_part of
the time: a trainer's rate alone grows over its first seconds, and two reads from then that
agreed were kept 16 s; a probe that moves a guest's rate alone up by more than a quarter has the
spans set anew rather than followed step by step (at once from the curves under sms; after half a
window of fresh rates under smsover and smsfree; one that moves it down is followed).  Once every
busy guest's rate alone is sure, probes come in rounds: each busy guest in turn, alone for its
target part of the round, or what its cap leaves it if less (the least for PROBE_S, none past
ROUND_MAX_S), as often for each guest as lone probes would be.  A lone probe gives its guest the GPU
and holds the others, so over the window a tenant measures it is a gift to one of them (on the
model, a 10 s window at 30/70 with one of the light guest's probes gave it 31.5-32%, with one of
the heavy guest's 29.3%; on an H100 two of the light guest's in one window gave it some 2.5 pp); a
round gives each its part, where the parts are within 1 : ROUND_MAX_S/PROBE_S of each other (at 5/95 the
light guest gets 13% of its round).  A round ends at the next look once it no longer fits (one
of its guests gone, or stopped in its turn; a target changed; another guest of its priority or
above at work: a newcomer is not held for a round), and a guest whose work no longer waits at
its gate when its turn comes is passed over.  Rates are read over the looks no probe took, half
a window of them at least (_recent), so that after a round they are what they were before it.

Each step (every 0.1 s): the busy guests' progress over the last second, p_i = rate_i / alone_i,
as parts of the whole, p_i / sum(p), against their targets, the weighted policy's: a guarantee
first, the rest by weight among the busy guests.  A guest ahead of its part is held more, one
behind held less (a multiplicative step, a tenth of the error's log each look), and the holds are then
lowered together until the guest held least is not held at all: nobody is held for nothing, and
an idle guest's share goes to the busy ones (at once at the gate, which lets a held guest go
while no other of its priority or above is at work: sched_held_ns; here at the next look).  A
change of targets among the same guests (a weight changed live) moves each guest's open part at
once by its new target over its old, and those holds stand for half a window while rates at them
are measured (the window's older rates would push past the new targets); then each open part so
moved is moved once more, by its target over its part to the power one over how far its part moved
for the move of its open part (as logs: a secant), and stands again; no probe comes for two windows
after it where every guest's rate alone is measured and none's last probe read it well short
unconfirmed (one then would run a guest alone just as the parts reach the new targets).  A guest
at 90% of its rate alone is not held (on spans it is, where a hold is no wait); at 97% it is left
out altogether (holding others could not speed it; by time, a guest that shares again within a
window is held where it was; on spans never), but for one seen
beside the others at more than LIFTED times every read of it alone (its rate alone is then the
rate seen: one that went slow whenever it ran alone, in each of its probes, looked as fast as
alone and was left out unheld, with 35% of the GPU at a weight of 10).  A guest ahead of its part
that can be held no more (at its least open part, or on spans at one group) takes what it takes
from the others alike: their parts are reckoned among themselves, nor do its reads set how often
the rounds come.  No guest is held for more than the rest of its target part of each period (a
guest at 30% runs at least 30 ms of every 100): progress is measured in calls, which a guest
chooses, so a guest can make itself look short of its part and have the others held; this bounds
what it can take.  A guest can make itself look content too, and needs no trick for it: one that
makes its calls at a steady rate whatever it gets (each call as much work as that takes) goes
beside the others as fast as alone by its calls; by time and depth it is not held, and took 38% at
a weight of 10 beside 30 and 70 on the model (a and b kept 0.72-0.74 of what they got beside an
honest guest); on spans, where a content guest is held too, it gains nothing.  Calls cannot tell
it from a guest whose work is light; what each uses of the GPU could, and the page does not carry
that.  A guest's own cap holds its work back all
but cap% of each period (or the part vmgpud's cap controller sets: vmgpu/cap_control.py),
however the others go: a bound on its time, as under the policies with
turns, which alone on the GPU is about cap% of its progress; a capped guest is weighted like the
others while its weight asks less than its cap, and held by its cap alone once it would ask
more (nobody else is held for what its cap keeps it from taking).  Priority is the gate's: while
a guest of a higher priority puts work on the GPU, a lower one's work waits in its ring
(sched_page.c), so only the busy guests of the highest priority share here; the lower ones are
neither held (but by their caps) nor probed.  On SM spans, while one guest of a higher priority is
busy, the lower ones are given spans that leave it its weight's part of the SMs free (the priority
reserve, _reserve), where their work goes on beside it instead of waiting.

The lever is time (the hold) by default.  With `lever="depth"` a guest is held back first by how
much of its work the GPU may have at once (the slot's `depth` word), so that it keeps running
beside the others rather than taking turns with them, and by time only where that is not enough:
its open part from 1 down to DEPTH_PART narrows its depth from the forwarders' down to one
unfinished piece of work, on a log scale (a depth matters only once it is small: on an H100 a
trainer at 19 of 64 still took half the GPU beside another); below DEPTH_PART it runs at depth
one and is held the first part of each period as under time, open/DEPTH_PART of it left open.
A cap holds by time under every lever.

With `lever="sms"` guests are not held by time at all (but for caps): each sharing guest is given
a span of the GPU's SMs, its part of them its open part over the sum of the sharing guests'
(whole groups of the page's `sm_groups`, each guest at least one; the ends in sixteenths of a
group, which the forwarders round per period: host_forwarder/native/partition.h), and its work
runs there while another is at work, side by side on SMs of its own (its forwarder's workers MPS
clients), and on the whole GPU alone.  The same feedback moves the spans as moves the holds.  Each
guest's speed on a part x of the SMs is taken as x ** its curve, learned from its progress on its
span (0.6 until seen; a trainer went as about x ** 0.66 on an H200): a change of targets puts the
spans where the curves say the new parts are, and once those spans have stood half a window,
where the curves each guest then showed say (a curve is no exact power: the second solve starts
from the nearest point), before the feedback goes on.  Where the forwarders cannot partition the
GPU (no groups on the page) it holds by time.  Under
`lever="smsfree"` the guest given the most is left on the whole GPU and the others have spans as
under sms: its work may use their SMs too wherever theirs leaves room (as MPS clients' active-thread
percentages let them), the others' only theirs.  Under `lever="smsover"` each span reaches OVERLAP of
the SMs into each neighbour's: there two guests' work shares SMs as it comes (the room one leaves
is the other's), and the feedback sizes the spans as ever (no curves: a guest's speed there is not
its span's alone).  Both are experiments (make bench-sharing --lever) for the throughput that MPS's
thread limits get beside each other.

Pure arithmetic on what it is given (`step`), so that tests drive it with a model of a GPU on a
fake clock; `run` is the loop vmgpud (and the sharing benchmark) run on a live page.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from vmgpu.sched import DEPTH_MAX, cap_percent

PERIOD_STEP_S = 0.1  # how often the controller looks
WINDOW_S = 1.0  # a guest's rate: its calls over this long
PROBE_EVERY_S = 4.0  # a probe begins this long after the last one ended (with two or more busy guests)
STEADY_MAX = 2  # probes come at most 2**STEADY_MAX times further apart once rates alone hold steady
PROBE_S = 0.3  # how long the others are held while one guest's rate alone is measured
PROBES_KEPT = 2  # a guest's rate alone is the more of its last two probes
QUIET_WINDOWS = 2.0  # after a change of weight, no probe for this many windows (it stands, is
# corrected, stands again, and then has its new parts)
PROBE_SETTLE_S = 0.08  # the first part of a probe is not measured: the others' queued work still runs
ROUND_MAX_S = 2.0  # in a round of probes, no guest's probe is longer than this
# a young guest (first at work through a window less than YOUNG_S ago, its rate alone not yet
# read alike twice in a row past its first GROWN_S) has rounds of probes every PROBE_EVERY_S, or
# as often as leaves them YOUNG_PART of the time, whatever the others' steadiness: its rate alone
# may still be growing
YOUNG_S = 20.0
GROWN_S = 5.0
YOUNG_PART = 0.2
REFUSED_MAX = 3  # an unmeasured guest whose probes this many in a row were refused is probed after the others,
RETRY_MAX = 8  # ever further apart: up to this many times PROBE_EVERY_S
LEAST_OPEN = 0.05  # no busy guest is held more than 95% of the time for another's share
GAIN = 0.1  # the step: a tenth of log(target / actual) each look (the window is ten looks long)
SATISFIED = 0.9  # a guest at 90% of its rate alone or more is not held
REBASE = 0.25  # a probe that moves a guest's rate alone up by more than this part sets the spans anew
FULL = 0.97  # one at 97% or more is short of nothing: it is left out of the sharing
LIFTED = 1.1  # (but not one seen beside the others at more than this many times its reads alone)
RANKS = {"low": 0, "normal": 1, "high": 2}
# how a guest is held back: the first part of each period, its depth, its SMs (apart from the others',
# or, under smsfree, with the guest given most left on all of them)
LEVERS = ("time", "depth", "sms", "smsfree", "smsover")
SMS_LEVERS = ("sms", "smsfree", "smsover")
OVERLAP = 0.125  # under smsover: how far each span reaches into its neighbours', as a part of the SMs
DEPTH = 32  # the forwarders' --sched-depth, which the depth lever's parts are of
SPAN_POW = 0.6  # a guest's speed on a part x of the SMs is taken as x ** its curve: this, until measured
CURVE_LIMITS = (0.25, 1.2)  # a curve measured outside these is taken as the nearer
CURVE_LEARN = 0.3  # each look moves a sharing guest's curve this part of the way to what it showed
DEPTH_PART = 0.5  # under the depth lever: an open part above this narrows the depth; below, time holds too
FREE, HELD, PROBED = range(3)  # a stretch between two looks, for one guest: not held, held, in a probe


@dataclass
class Seen:
    """What the controller is told of one member at one look (a scheduler page's slot)."""

    slot: int
    guest: str
    calls: int  # work_calls so far
    weight: int = 100
    guarantee: int = 0
    cap: int = 0  # % of its progress alone, 0: none
    rank: int = 1  # its priority: 2 high, 1 normal, 0 low
    whole: bool = False  # one of its workers worked on the whole GPU in the last second though given a span
    waiting: bool = False  # one of its workers waits at its gate to put work on the GPU
    cap_pm: int = 0  # where capped: the part of each period the cap controller leaves it (0: cap%)

    @property
    def cap_part(self) -> float:
        """The part of each period its cap leaves its work (1.0: not capped): the cap
        controller's (vmgpu/cap_control.py) where it set one and the guest is capped (as the
        forwarders take it: one left in the slot of a guest whose cap was lifted is not), else cap%."""
        pct = cap_percent(self.cap, self.weight, "shared")  # (the share controller's policy)
        return min(self.cap_pm, 1000) / 1000 if self.cap_pm and pct < 100 else pct / 100


@dataclass
class _Guest:
    calls: deque = field(default_factory=deque)  # (t, calls, how the stretch up to t went: FREE, HELD, PROBED)
    hold: int = 0  # the hold it was last given
    alone: float = 0.0  # calls/s alone (0: not measured yet)
    open: float = 1.0  # the part of each period its work may pass
    ceiling: float = 1.0  # what its cap allows of that
    probed_at: float = -math.inf
    steady: int = 0  # probes in a row that agreed with the one before (within 10%): probed less often
    probes: deque = field(default_factory=lambda: deque(maxlen=PROBES_KEPT))  # its last probes' rates
    # (and its rates beside the others, where they were more: _control) and of these, what was read
    # alone: its last probes that were read, or a whole window alone
    reads: deque = field(default_factory=lambda: deque(maxlen=PROBES_KEPT))
    lifted: bool = False  # at the last look it went beside the others past LIFTED times its reads alone
    lift: tuple | None = None  # (the rate seen, its open part then) of a lift no probe has read since
    lift_probed_at: float = -math.inf  # when a lift last had its guest probed soon
    short: float | None = None  # its last probe read well short of what was kept: to be checked
    sure: bool = False  # its rate alone measured alone a whole window, or read by PROBES_KEPT probes
    born: float | None = None  # the first look it had been at work throughout a window at
    grown: bool = False  # two probes in a row read its rate alone alike, past its first GROWN_S at work
    read_at: float = -math.inf  # when a probe last read its rate alone
    refused: int = 0  # its probes in a row that were refused (it stopped in them, or went slower than beside)
    refused_at: float = -math.inf  # when the last of them ended
    quick: bool = True  # given up on, it may be probed again probe_every_s on once it works on (_retry)
    target: float = 0.0  # its target part at the last look it shared at (0: not sharing then)
    rate_from: float = -math.inf  # its rate counts calls from then on (a change of targets: _retarget)
    given: deque = field(default_factory=deque)  # (t, the part of the SMs its span gave it from t: 0 none)
    curve: float = SPAN_POW  # on a span: its speed on a part x of the SMs as x ** curve (_learn)
    left_open: float = 1.0  # its open part when it last stopped sharing,
    left_at: float = -math.inf  # and when


@dataclass
class _Probe:
    whose: tuple[int, str]
    began: float
    before: float = 0.0  # its rate beside the others just before
    settled_at: float | None = None  # when its measuring began
    calls: int = 0  # the probed guest's calls then
    last: int = 0  # its calls at the last look
    stalled: bool = False  # a look since the measure began found no new call
    length: float = 0.0  # how long it lasts (0: the controller's probe_s)
    retry: bool = False  # of a guest given up on (_retry): the others' probes come as if it had not been


class ShareController:
    """One GPU's controller.  `step(now, seen)` returns each slot's hold (per mille)."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        probe_every_s: float = PROBE_EVERY_S,
        probe_s: float = PROBE_S,
        settle_s: float = PROBE_SETTLE_S,
        lever: str = "time",
        depth: int = DEPTH,
        overlap: float = OVERLAP,
        rounds: bool = True,
        young_s: float = YOUNG_S,
        young_part: float = YOUNG_PART,
    ):
        if lever not in LEVERS:
            raise ValueError(f"lever '{lever}' is not one of {', '.join(LEVERS)}")
        self.window_s, self.probe_every_s, self.probe_s, self.settle_s = window_s, probe_every_s, probe_s, settle_s
        self.lever, self.depth = lever, min(max(1, depth), DEPTH_MAX)  # (a depth it gives is at most this)
        if not 0 <= overlap <= 1:
            raise ValueError(f"overlap {overlap} is not a part of the SMs (0 to 1)")
        if young_s < 0 or not 0 < young_part < 1:
            raise ValueError(f"youth {young_s} s, {young_part} of the time: seconds >= 0 and a part in (0, 1)")
        self.young_s, self.young_part = young_s, young_part  # (YOUNG_S, YOUNG_PART)
        self.overlap = overlap  # under smsover: how far each span reaches into its neighbours'
        self.depths: dict[int, int] = {}  # under the depth lever: each slot's depth (0: its forwarder's)
        self.spans: dict[int, tuple[int, int]] = {}  # under the sms lever: each slot's span (0, 0: the whole GPU)
        self.groups = 0  # the groups of SMs the GPU's page says its spans count in (0: none)
        self.guests: dict[tuple[int, str], _Guest] = {}
        self.probe: _Probe | None = None
        self.probe_ended = 0.0
        # probes in rounds (once every busy guest's rate alone is sure): each in turn, for a time
        # its target part of the round; the round's guests still to be probed, with their lengths
        self.rounds = rounds
        self.round_next: list[tuple[tuple[int, str], float]] = []
        # the round under way: its guests, their rank and targets, and every guest's calls as it
        # began (a round ends early once these change: _round_broken)
        self.round_of: tuple[frozenset, int, dict, dict] | None = None
        self.last: dict[str, float] = {}  # each guest's last progress as parts (for traces and tests)
        self.settle_until = -math.inf  # after a change of targets: the holds it made stand until then,
        self.settling: set = set()  # while these guests are all busy
        self.sharing: set = set()  # the guests that shared at the last look
        self.pinned: set = set()  # of these, those ahead of their parts that could be held no more
        self.free_one = None  # under smsfree: the guest its spans last left on the whole GPU
        self.resolving: set = set()  # after a change of targets: corrected once these guests settle
        self.rebase: set = set()  # guests whose rate alone a probe moved by more than REBASE
        self.rebase_after: set = set()  # (smsover, smsfree) a rebase to make once fresh rates are in
        self.quiet_until = -math.inf  # after a change of weight: no probe until then (QUIET_WINDOWS)
        self.before: dict = {}  # (open part, part) of each guest before a change of targets by time
        self.reserved_at = -math.inf  # when lower guests last had spans beside a higher one (_reserve)
        # under an sms lever, why its guests were held by time at the last look (None: on spans,
        # or fewer than two at work): (why, the guests that made it so), for the host's log
        self.by_time: tuple[str, tuple[str, ...]] | None = None
        self.page_groups = 0  # the groups of SMs on the page at the last look

    def forget(self) -> None:
        """Everything measured dropped, and any probe or round under way (the policy left shared:
        the guests are new to it when it comes back)."""
        self.guests.clear()
        self.probe, self.round_next, self.round_of = None, [], None
        self.pinned = set()
        self.by_time = None

    # -- rates ------------------------------------------------------------------------------

    def _recent(self, g: _Guest, span: float) -> list[tuple[float, int, int]]:
        """Its looks over the last `span` seconds, and further back where probes took more than
        half of them, until half of `span` no probe took is in (after a round of probes, a second
        or more, its rate and whether it is busy are what they were before it, as after a lone
        probe of 0.3 s)."""
        pts, free = list(g.calls), 0.0
        i = len(pts) - 1
        while i > 0:
            if pts[-1][0] - pts[i - 1][0] > span + 1e-9 and free >= span / 2 - 1e-9:
                break
            if pts[i][2] != PROBED:
                free += pts[i][0] - pts[i - 1][0]
            i -= 1
        return pts[max(i, 0) :]

    def _stretches(self, g: _Guest, now: float) -> list[tuple[float, float, float]]:
        """The stretches between looks its rate counts, (start, length, calls): over the window
        (since rate_from; _recent), without those a probe took (a probe speeds the probed guest
        and stops the others)."""
        pts = [p for p in self._recent(g, self.window_s) if p[0] >= g.rate_from - 1e-9]
        return [(t0, t1 - t0, c1 - c0) for (t0, c0, _), (t1, c1, how) in pairwise(pts) if how != PROBED]

    def _kept_s(self, guests: int) -> float:
        """How far back its looks are kept: two windows, and a round of probes of every guest."""
        return 2 * self.window_s + (ROUND_MAX_S * guests if self.rounds else self.probe_s)

    def _rate(self, g: _Guest, now: float) -> float | None:
        """Calls per second over its stretches (_stretches), if they make half a window."""
        stretches = self._stretches(g, now)
        calls, spent = sum(c for _, _, c in stretches), sum(dt for _, dt, _ in stretches)
        return calls / spent if spent >= self.window_s / 2 - 1e-9 else None

    def _span_seen(self, g: _Guest, now: float) -> float | None:
        """The part of the SMs its span gave it over the stretches its rate counts, on average;
        None if it had no span in one of them, or spans more than a quarter apart."""
        given = dict(g.given)
        xs = [(given.get(t0, 0.0), dt) for t0, dt, _ in self._stretches(g, now)]
        if not xs or min(x for x, _ in xs) <= 0 or max(x for x, _ in xs) > 1.25 * min(x for x, _ in xs):
            return None
        return sum(x * dt for x, dt in xs) / sum(dt for _, dt in xs)

    def _learn(self, k, progress: float, now: float, rate: float = CURVE_LEARN) -> None:
        """Its curve moved `rate` of the way to what its progress on its span showed: a speed p on
        a part x of the SMs is x ** (log p / log x)."""
        g = self.guests[k]
        x = self._span_seen(g, now)
        if x is not None and 0.02 < x < 0.95 and 0.02 < progress < 0.98:
            seen = min(max(math.log(progress) / math.log(x), CURVE_LIMITS[0]), CURVE_LIMITS[1])
            g.curve += rate * (seen - g.curve)

    def _solve(self, shared: list, targets: dict) -> dict:
        """The parts of the SMs at which the sharing guests' curves put their progress in their
        target proportions: x_k = (c t_k) ** (1 / curve_k), c such that they add up to all of them."""

        def parts(log_c: float) -> dict:  # (a target of 0, where guarantees take all: the least)
            return {k: math.exp((log_c + math.log(max(targets[k], 1e-3))) / self.guests[k].curve) for k in shared}

        lo, hi = -60.0, 60.0
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(parts(mid).values()) < 1 else (lo, mid)
        return parts((lo + hi) / 2)

    def _short_window(self, g: _Guest, now: float) -> bool:
        """Whether its rate is over less than a whole window (rates since a change of targets)."""
        return now - g.rate_from < self.window_s - 1e-9

    def _at_work_throughout(self, g: _Guest, now: float) -> bool:
        """Whether it made calls between every two looks over the last window (from a look at
        most half a look after the window began: however often the looks come)."""
        pts = [(t, c) for t, c, _ in g.calls if now - t <= self.window_s + PERIOD_STEP_S + 1e-9]
        return (
            len(pts) >= 2
            and pts[0][0] <= now - self.window_s + PERIOD_STEP_S / 2
            and all(b > a for (_, a), (_, b) in pairwise(pts))
        )

    def _busy(self, g: _Guest, now: float) -> bool:
        recent = [c for _, c, _ in self._recent(g, self.window_s / 2)]
        return len(recent) >= 2 and recent[-1] > recent[0]

    # -- one look -----------------------------------------------------------------------------

    def step(self, now: float, seen: list[Seen], groups: int = 0) -> dict[int, int]:
        """The holds (per mille) for each slot at this look; under the sms lever, `groups` is the
        page's sm_groups and the spans are left in self.spans."""
        # a guest whose work does not keep to its span (a process that is not partitioned: a
        # blocking stream, a partition over its quota, a forwarder that does not partition; or one
        # a capture keeps where it was) would be held by nobody: then all are held by time
        self.groups = groups if self.lever in SMS_LEVERS and not any(s.whole for s in seen) else 0
        self.page_groups = groups
        keys = {(s.slot, s.guest): s for s in seen}
        for k in list(self.guests):
            if k not in keys:
                del self.guests[k]  # gone (a slot reused by another guest is a new guest)
        for k, s in keys.items():
            g = self.guests.setdefault(k, _Guest())
            how = PROBED if self.probe is not None else HELD if g.hold else FREE
            g.calls.append((now, s.calls, how))
            while g.calls and now - g.calls[0][0] > self._kept_s(len(keys)):
                g.calls.popleft()
        holds = self._probe_step(now, keys) if self.probe is not None else None
        self.depths = dict.fromkeys((k[0] for k in keys), 0)  # (a probe measures guests at their own depth)
        if holds is None:
            self.spans = dict.fromkeys((k[0] for k in keys), (0, 0))
            holds = self._plan(now, keys)
        for k in keys:
            g = self.guests[k]
            g.hold = holds[k[0]]
            lo, hi = self.spans.get(k[0], (0, 0))
            g.given.append((now, (hi - lo) / (16 * self.groups) if self.groups else 0.0))
            while g.given and now - g.given[0][0] > self._kept_s(len(keys)):
                g.given.popleft()
        return holds

    def _why_by_time(self, keys: dict, busy: list) -> tuple[str, tuple[str, ...]] | None:
        """Under an sms lever, with two or more busy guests sharing: why they are held by time at
        this look, if they are (for the host's log), with the guests that make it so: no groups of
        SMs on the page (the forwarders do not partition the GPU: each of them then says its
        work is off its span), a guest's work off its span (which a guest can bring about itself:
        an open stream capture), or more guests at work than groups.  (Set where the holds are
        planned: through a probe or a round it stands as the look before said.)"""
        if self.lever not in SMS_LEVERS or len(busy) < 2:
            return None
        if not self.page_groups:
            return ("the forwarders do not partition this GPU", ())
        off = tuple(sorted({s.guest for s in keys.values() if s.whole}))
        if off:
            return ("its work off its span", off)
        if len(busy) > self.page_groups:
            return ("more guests at work than groups of SMs", tuple(sorted(k[1] for k in busy)))
        return None

    def _plan(self, now: float, keys: dict) -> dict[int, int]:
        busy = [k for k in keys if self._busy(self.guests[k], now)]
        for k in busy:
            g = self.guests[k]
            if g.born is None and self._at_work_throughout(g, now):
                # (its youth counts from the first window it worked through: a trainer's first
                # seconds, loading and setting up, put work on the GPU by moments, 5 to 45 s on an
                # H100)
                g.born = now
        # only the busy guests of the highest priority share here: a lower one's work waits at the
        # gate while a higher one's goes (sched_page.c, higher_at_work), so it is neither held
        # nor probed, and nobody is held for it
        top = max((keys[k].rank for k in busy), default=0)
        # (a lower guest at work, or waiting at its gate while the higher one's work goes)
        lower = [k for k in keys if keys[k].rank < top and (k in busy or keys[k].waiting)]
        busy = [k for k in busy if keys[k].rank == top]
        self.by_time = self._why_by_time(keys, busy)
        if len(busy) > self.groups:
            self.groups = 0  # (more to share than groups of SMs: by time)
        # alone and not held all the window: its rate is its rate alone (not while lower guests
        # worked beside it in the window, on the spans of a priority reserve)
        if len(busy) == 1 and now - self.reserved_at > self.window_s + 1e-9:
            g = self.guests[busy[0]]
            r = self._rate(g, now)
            recent = [how for t, _, how in g.calls if now - t <= self.window_s + 1e-9][1:]
            if r and recent and all(how == FREE for how in recent):
                g.alone = r if not g.alone else 0.8 * g.alone + 0.2 * r
                g.probes.clear()  # (measured alone for a whole window: what probes read before is old)
                g.probes.append(g.alone)
                g.reads.clear()
                g.reads.append(g.alone)
                g.short, g.sure = None, True
        # a probe, with others beside it: each guest's rate alone, now and then
        # (no probe while a change of targets settles, nor while one of weight is corrected and its
        # parts are first had: a probe then runs one guest alone for a third of a second, just as
        # the parts reach the new targets; on an H200 it put 50/50 turned 20/80 off for a second.
        # Unless a guest's rate alone is unmeasured, or its last probe read it well short and is not
        # yet confirmed: the parts are only as right as it is, and on an H200 one read 38% short made
        # 20/80 settle at 14/86 until its next probe.  A guest whose last probe read it higher than
        # before is not steady but is quiet too: it is taken at the more of its reads, and on an
        # H200 a probe 0.1 s after a change, one read 12% higher having made its guest unsteady,
        # put 20/80 off by 0.3 s)
        if self._weights_changed(keys, busy) and all(
            self.guests[k].alone and self.guests[k].short is None for k in busy
        ):
            self.quiet_until = now + QUIET_WINDOWS * self.window_s  # (seen before _retarget sees it)
        # (not a guest whose probes are refused time after time, as they are where it stops in
        # them: one at work for a moment every second, probed every second and first, had the
        # others held a fifth of the time for it and their own probes never came; it is probed
        # again after the others, ever further apart: _retry)
        measuring = [k for k in busy if not self._given_up(self.guests[k])]
        # (and one measuring guest beside one given up on is probed as ever: the other, its rate
        # alone unmeasured, is held to its target part meanwhile: _unmeasured_open)
        if measuring and len(busy) >= 2 and now >= max(self.settle_until, self.quiet_until):
            # a newcomer is measured soon, and again: its first probe may fall in its warming up
            # (two trainers started together on an H100 read 4% and 1% of their rates alone)
            unmeasured = any(not self.guests[k].alone or not self.guests[k].sure for k in measuring)
            # probes cost the shares (a probed guest runs alone): once every busy guest's rate
            # alone has held steady, they come less often, down to one in four times as many
            # (but not for one ahead of its part that can be held no more: how it reads alone moves
            # nothing, and one that read ever differently had the rounds come every 4 s a guest)
            paced = [k for k in measuring if k not in self.pinned] or measuring
            steady = min(self.guests[k].steady for k in paced)
            every = min(1.0, self.probe_every_s) if unmeasured else self.probe_every_s * 2 ** min(steady, STEADY_MAX)
            # (a round probes every busy guest: as often for each as one probe at a time, but a
            # read short awaiting its check is checked as soon as a lone probe would be; and while
            # one of them is young, every probe_every_s, or further apart where a round is long,
            # so that rounds take at most YOUNG_PART of the time: its rate alone may still grow,
            # and on an H100 a trainer's two reads in its first seconds, 18% under its rate alone
            # at 20 s, agreed and were kept 8 s of a 10 s window, which put 30/70 at 32.8/67.2)
            in_rounds = self.rounds and not unmeasured and len(measuring) >= 2
            young = any(
                self.guests[k].born is not None
                and not self.guests[k].grown
                and now - self.guests[k].born < self.young_s
                for k in measuring
            )
            if in_rounds and all(self.guests[k].short is None for k in paced):
                every *= len(measuring)
            if in_rounds and young:  # (never further apart than they would come anyway)
                turns = sum(length for _, length in self._round(keys, measuring))
                every = min(every, max(self.probe_every_s, turns / self.young_part - turns))
            if now - self.probe_ended >= every:
                if in_rounds:
                    (whose, length), *self.round_next = self._round(keys, measuring)
                    calls = {k: s.calls for k, s in keys.items()}
                    self.round_of = (frozenset(measuring), top, self._round_targets(keys, measuring), calls)
                    return self._begin_probe(whose, length, now, keys)
                # (a guest not yet sure of first: its confirming probe before the others' next)
                whose = min(
                    measuring,
                    key=lambda k: (bool(self.guests[k].alone and self.guests[k].sure), self.guests[k].probed_at),
                )
                return self._begin_probe(whose, self.probe_s, now, keys)
        retry = self._retry(now, busy)
        if (
            retry is not None
            and len(busy) >= 2
            and now >= max(self.settle_until, self.quiet_until, self.probe_ended + min(1.0, self.probe_every_s))
        ):
            return self._begin_probe(retry, self.probe_s, now, keys, retry=True)
        self._control(now, keys, busy)
        if self.lever == "depth":
            self.depths.update({k[0]: self._depth(self.guests[k]) for k in busy})
        if self.groups and len(self.sharing) >= 2:
            self.spans.update(self._spans(sorted(self.sharing)))
        elif self.groups and len(busy) == 1 and lower:
            reserve = self._reserve(keys, busy[0], lower)
            self.spans.update(reserve)
            self.reserved_at = now if reserve else self.reserved_at
        holds = {k[0]: self._hold(self.guests[k]) if k in busy else 0 for k in keys}
        # a guest whose rate alone is not measured (a newcomer before its first probe, or one
        # whose probes failed) shares in nothing, and beside a measured guest is held to its
        # target part of each period (_unmeasured_open), as weighted turns would hold it: a guest
        # that stopped in its every probe would otherwise run unheld beside the others (on the
        # model, at a weight of 10 beside 30 and 70, it took 42% of the GPU).  (Where none beside
        # it is measured, nobody is held so: two so held would leave the GPU idle together)
        for k, open_part in self._unmeasured_open(keys, busy).items():
            holds[k[0]] = max(holds[k[0]], int(round(1000 * (1 - open_part))))
        # (a lower guest is held by nobody's share, but its cap holds it still)
        holds.update({k[0]: int(round(1000 * (1 - keys[k].cap_part))) for k in lower if keys[k].cap_part < 1})
        return holds

    @staticmethod
    def _given_up(g: _Guest) -> bool:
        """Whether its rate alone is unmeasured and its last REFUSED_MAX probes were refused."""
        return not (g.alone and g.sure) and g.refused >= REFUSED_MAX

    def _unmeasured_open(self, keys: dict, busy: list) -> dict:
        """The open part of each busy guest whose rate alone is not measured, where a measured
        guest is busy beside it: its target part of each period (or what its cap leaves it, if
        less), the least that weighted turns would give it."""
        unmeasured = [k for k in busy if not self.guests[k].alone]
        if not unmeasured or len(unmeasured) == len(busy):
            return {}
        targets = self._targets(keys, busy)
        return {k: min(targets[k], keys[k].cap_part) for k in unmeasured}

    def _retry(self, now: float, busy: list):
        """The busy guest given up on (_given_up) whose next probe is due, if any (the one refused
        longest ago): probe_every_s after its last refused probe, twice as long after each refused
        probe more, up to RETRY_MAX times as long; and once, probe_every_s after its last refused
        probe, where it has since been at work a whole window through (a trainer that set up by
        moments and now works on).  One that stops in its every probe holds the others for two
        looks of each; each guest given up on is probed at most once in probe_every_s."""
        due = []
        for k in busy:
            g = self.guests[k]
            if self._given_up(g):
                late = now - g.refused_at >= self.probe_every_s * min(2 ** (g.refused - REFUSED_MAX), RETRY_MAX)
                quick = g.quick and now - g.refused_at >= self.probe_every_s and self._at_work_throughout(g, now)
                if late or quick:
                    due.append((g.refused_at, k, not late))
        if not due:
            return None
        _, k, quick = min(due)
        self.guests[k].quick = self.guests[k].quick and not quick  # (its one quick retry taken)
        return k

    def _reserve(self, keys: dict, higher, lower: list) -> dict[int, tuple[int, int]]:
        """The priority reserve, on SM spans: while one guest of a higher priority is busy, the
        lower busy (or waiting) guests run side by side on spans at the far end of the SMs, leaving
        the higher one the part its weight (or guarantee) gives it among them all, in whole groups
        (rounded up: an end between two groups would give the next one to the lower guests part of
        each period), where no other guest's work is; it runs on the whole GPU, and its work finds
        those SMs free at once (a lower guest's work, unlike under time, then goes on beside it:
        sched_page.c).  The lower guests' spans are their parts of the rest by their weights, each
        at least one group; none where the rest cannot give each one (then they wait in their rings
        while it works, as by time)."""
        total = 16 * self.groups
        start = 16 * max(1, math.ceil(self.groups * self._targets(keys, [higher, *lower])[higher] - 1e-9))
        if total - start < 16 * len(lower):
            return {}
        lower = sorted(lower)
        parts = self._targets(keys, lower)
        spans = side_by_side([parts[k] for k in lower], start, total)
        return {k[0]: span for k, span in zip(lower, spans, strict=True)}

    def _spans(self, shared: list) -> dict[int, tuple[int, int]]:
        """Under the sms lever: the sharing guests' spans side by side in slot order, each its
        open part over theirs of the GPU's groups (at least one; in sixteenths of a group)."""
        total, n = 16 * self.groups, len(shared)
        if n > self.groups:
            return {}  # (fewer groups than guests: they share by time)
        opens = [self.guests[k].open for k in shared]
        # (smsfree: the guest given most on the whole GPU; of two given as much, the one whose
        # target is larger; and the one on it stays there until another is given a tenth more:
        # on the model, with 3 groups, a guest that made five times the calls alone had the whole
        # GPU go back and forth to it, and took 30% at a weight of 10, an honest one 25%)
        free = None
        if self.lever == "smsfree":
            free = max(shared, key=lambda k: (self.guests[k].open, self.guests[k].target))
            was = self.free_one
            if was in shared and self.guests[free].open <= 1.1 * self.guests[was].open:
                free = was
            self.free_one = free
        spans = side_by_side([x / sum(opens) for x in opens], 0, total)
        out = {k[0]: span if k != free else (0, 0) for k, span in zip(shared, spans, strict=True)}
        if self.lever == "smsover":  # each reaching into its neighbours'
            m = int(round(self.overlap * total))
            out = {slot: (max(0, a - m), min(total, b + m)) for slot, (a, b) in out.items()}
        return out

    def _begin_probe(self, k, length: float, now: float, keys: dict, retry: bool = False) -> dict[int, int]:
        """Guest k probed from now for `length` seconds: the holds that run it alone."""
        self.probe = _Probe(k, now, before=self._rate(self.guests[k], now) or 0.0, length=length, retry=retry)
        return self._probe_holds(keys)

    def _ended(self, p: _Probe, now: float) -> float:
        """When the last probe that sets when the next comes ended, probe p ending now."""
        return self.probe_ended if p.retry else now

    def _round(self, keys: dict, busy: list) -> list[tuple[tuple[int, str], float]]:
        """A round of probes: every busy guest in turn (the one probed longest ago first), each
        alone for its part of the round (_round_targets), the least of them probe_s (none more
        than ROUND_MAX_S): over a round each guest has its part, as over a lone probe it has not."""
        targets = self._round_targets(keys, busy)
        least = max(min(targets.values()), 1e-3)
        order = sorted(busy, key=lambda k: self.guests[k].probed_at)
        return [(k, min(ROUND_MAX_S, max(self.probe_s, self.probe_s * targets[k] / least))) for k in order]

    def _round_targets(self, keys: dict, busy: list) -> dict:
        """The parts a round gives its guests: their targets, each at most what its cap leaves
        it (a capped guest probed for its target's part would run uncapped past its cap)."""
        return {k: min(t, keys[k].cap_part) for k, t in self._targets(keys, busy).items()}

    def _round_broken(self, keys: dict) -> bool:
        """Whether the round under way no longer fits the guests: one of its own gone, its
        targets (weights, guarantees, caps) changed, or another guest of its rank or above put
        work on the GPU or waits to (a newcomer, or one of a higher priority: each is to be seen
        to at once, not after a round of up to ROUND_MAX_S a guest)."""
        if self.round_of is None:
            return False
        members, rank, targets, calls = self.round_of
        if not members <= set(keys) or self._round_targets(keys, list(members)) != targets:
            return True
        return any(
            k not in members
            and s.rank >= rank
            and (s.waiting or s.calls > calls.get(k, s.calls))
            # (one at work for moments, its probes failed: it waits for a round of its own rank)
            and not (self._given_up(self.guests[k]) and s.rank == rank)
            for k, s in keys.items()
        )

    def _next_in_round(self, now: float, keys: dict) -> dict[int, int] | None:
        """Once a probe is over: the next guest of its round probed at once (its holds), or None
        (the round is over, or broken: _round_broken).  A guest of the round still held has its
        work waiting at its gate; one that has none is idle and passed over."""
        while self.round_next and not self._round_broken(keys):
            k, length = self.round_next.pop(0)
            if k in keys and keys[k].waiting:
                return self._begin_probe(k, length, now, keys)
        self.round_next, self.round_of = [], None
        return None

    def _probe_step(self, now: float, keys: dict) -> dict[int, int] | None:
        """A probe under way: the holds it needs, or None once it is over (its guest gone, or
        measured) and no other guest of its round is left to probe."""
        p = self.probe
        if p.whose not in keys:
            self.probe, self.probe_ended = None, self._ended(p, now)
            return self._next_in_round(now, keys)
        calls = keys[p.whose].calls
        if p.settled_at is not None and calls <= p.last:
            p.stalled = True  # a look at which it had made no call since the last: not busy throughout
        p.last = calls
        if p.stalled or (self.round_of is not None and self._round_broken(keys)):
            # (not read, and ended at once, where its guest stopped or its round no longer fits:
            # the others are held no longer for it, nor for the rest of a round)
            g = self.guests[p.whose]
            g.probed_at, g.refused = now - self.probe_every_s / 2, g.refused + p.stalled
            g.refused_at = now if p.stalled else g.refused_at
            self.probe, self.probe_ended, self.round_next, self.round_of = None, self._ended(p, now), [], None
            return None
        if p.settled_at is None and now - p.began >= self.settle_s:
            p.settled_at, p.calls = now, calls
        elif p.settled_at is not None and now - p.began >= (p.length or self.probe_s) - 1e-6:
            g = self.guests[p.whose]
            r = (calls - p.calls) / max(now - p.settled_at, 1e-6)
            # kept only if it was busy throughout (calls at every look) and went at least as fast as
            # beside the others: otherwise it was between phases of its work, not alone at work
            if r > 0 and r >= 0.9 * p.before:
                # the more of its last two whole measures: a probe reads a guest's rate alone
                # short, never long (on an H100 the same trainer read 21,000 calls/s in one probe
                # and 29,000 in another, beside a steady 21,000 with the other guest), and an
                # average with older ones kept a stale phase.  A read well short of the kept
                # rate is checked by the next probe, its guest's again: if that one agrees (within
                # 10%), the guest has slowed and the two reads are its rate alone from then on
                kept = max(g.probes, default=0.0)
                confirmed = g.short is not None and abs(r - g.short) <= 0.1 * g.short
                g.short = r if kept and r < 0.9 * kept and not confirmed else None
                if confirmed:
                    g.probes.clear()
                    g.reads.clear()
                g.steady = g.steady + 1 if g.alone and abs(r - g.alone) <= 0.1 * g.alone else 0
                g.grown = g.grown or (g.steady > 0 and g.born is not None and g.read_at - g.born >= GROWN_S)
                g.read_at = now
                g.probes.append(r)
                g.reads.append(r)
                g.sure = g.sure or confirmed or len(g.probes) >= PROBES_KEPT
                was, g.alone = g.alone, max(g.probes)
                if was and g.alone - was > REBASE * was:
                    self.rebase.add(p.whose)
                g.probed_at = -math.inf if g.short is not None else now
                g.refused, g.quick = 0, True
                if g.lift is not None:  # (a lift a read caught up with: back where it was before it)
                    if r * LIFTED >= g.lift[0]:
                        g.open = max(g.open, g.lift[1])
                    g.lift = None
            else:
                g.probed_at = now - self.probe_every_s / 2  # measured again soon, after the others
                # (refused: it went faster beside the others than this probe read, and its kept
                # rate alone is at least what it was seen to do there: no sign of a warm-up read,
                # so no probe within a second, or one refused every time would come every second)
                g.sure, g.refused, g.refused_at = g.sure or bool(g.alone), g.refused + 1, now
            self.probe, self.probe_ended = None, self._ended(p, now)
            return self._next_in_round(now, keys)
        return self._probe_holds(keys)

    def _probe_holds(self, keys: dict) -> dict[int, int]:
        """While a probe measures one guest: every other guest held throughout."""
        whose = self.probe.whose
        return {k[0]: (1000 if k != whose and keys[k].rank >= keys[whose].rank else 0) for k in keys}

    def _targets(self, keys: dict, busy: list) -> dict:
        """The weighted policy's parts among the busy guests: guarantees first, the rest by weight."""
        gsum = sum(min(keys[k].guarantee, 100) for k in busy)
        wsum = sum(max(1, min(keys[k].weight, 100)) for k in busy)
        rest = max(0, 100 - gsum)
        raw = {k: min(keys[k].guarantee, 100) + rest * max(1, min(keys[k].weight, 100)) / wsum for k in busy}
        total = sum(raw.values()) or 1.0
        return {k: v / total for k, v in raw.items()}

    def _control(self, now: float, keys: dict, busy: list) -> None:
        if now < self.settle_until:
            if self.settling <= set(busy):
                return  # (the holds a change of targets made, while their rates are measured: _retarget)
            self.settle_until, self.resolving = -math.inf, set()  # one of them stopped: control as ever,
            for g in self.guests.values():  # on rates over whole windows (the others have had
                g.rate_from = -math.inf  # less than half a window since: they would share no more)
        rebased, self.rebase = set(self.rebase), set()  # (taken at every look: none left for later)
        progress = {}
        for k in busy:
            g = self.guests[k]
            r, g.lifted = self._rate(g, now), False
            if r is not None and g.alone > 0:
                if r > g.alone:  # no guest goes faster beside others than alone: a stale measure,
                    # (well past it: a probe read it short, as one in its warming up does; it is
                    # probed again soon)
                    g.sure = g.sure and r <= 1.1 * g.alone
                    g.alone = r  # and a read the next probe is weighed with (one short then must
                    g.probes.append(r)  # not bring it below what the guest was seen to do)
                # (a guest seen well past every read of it alone: a read in its warming up, or one
                # that goes slow whenever the others are held; see below)
                g.lifted = r > LIFTED * max(g.reads, default=0.0)
                if g.lifted and g.lift is None:
                    # read again within a second (not sure of it), but at most once in four
                    # probe_every_s: a light guest asking more, its rate alone raised a little at
                    # each look and so still sure, waited for the next round, held meanwhile (0.69
                    # of what it asked on the model); and one left out as short of nothing is back
                    # there once a read catches up with it (one sharing is followed as ever)
                    g.lift = (r, g.open if k not in self.sharing else 0.0)
                    if now - g.lift_probed_at >= 4 * self.probe_every_s:
                        g.sure, g.lift_probed_at = False, now
                progress[k] = r / g.alone
        for k in busy:  # a cap: its work passes at most cap% of each period (as under the policies with turns)
            self.guests[k].ceiling = keys[k].cap_part
        # a guest that goes as fast as alone is short of nothing: it is left out (not held, and
        # the others share by weight what it leaves: holding them could not speed it); one that
        # goes nearly as fast is not held either, but still counts among those sharing, so that
        # a guest held for it stays held (its speed may be the holds' doing: were they lifted
        # because it looks content, it would fall back, and the holds come and go)
        # (and with fewer than two to share, nobody is held for anyone).  On SM spans no guest is
        # left out however fast it goes: its speed is its span's doing (a trainer on 79% of an
        # H200's SMs ran at its speed alone), and were it left out the spans would be lifted and
        # the others take its SMs back; nor is one that goes nearly as fast spared there: a
        # smaller span is no wait.  A guest that made its calls at a steady rate, whatever it got,
        # looked content, was given as wide a span as the widest, and took 32% at a weight of 10
        # beside 30 and 70 (their split went to 48/52); one that did so with its work off its
        # span for its first 2 s (all held by time meanwhile) was left out as short of nothing,
        # never came back in once the spans did, and took 37.7% on the whole GPU
        spans = self.lever in SMS_LEVERS and self.groups
        # (nor is a guest sharing left out on rates over less than a window, after a change of
        # targets: half a window's rates are too few to tell 97% from 95%, and left out on them
        # it would have the others' holds lifted and come back a look later)
        shared = [
            k
            for k in busy
            if k in progress
            and 0 < progress[k]
            and (
                progress[k] < FULL
                or self.guests[k].lifted
                or spans
                or (k in self.sharing and self._short_window(self.guests[k], now))
            )
        ]
        if len(shared) < 2:
            shared = []
        for k in busy:
            g = self.guests[k]
            if k not in shared:
                if k in self.sharing:  # (what it had, should it share again soon)
                    g.left_open, g.left_at = g.open, now
                g.open = 1.0
            elif k not in self.sharing and self._by_time() and now - g.left_at <= self.window_s:
                # back within a window (the guest at full speed that left it took the others' holds
                # with it, and came back once it was not): where it was, not held for nothing and
                # then step by step back to where it was
                g.open = g.left_open
        if not shared:
            self._retarget(now, [], {}, {})  # (nobody shares: no targets to change from)
            self.resolving, self.before = set(), {}  # (nor a change to correct when they share again)
            self.pinned = set()
            return
        targets = self._targets(keys, shared)
        if spans and any(k not in self.sharing for k in shared):
            if self._solved(shared):  # a guest begins to share: every span where the curves put the targets
                self._set_spans(now, shared, targets)
                self._retarget(now, shared, targets, progress)  # (who shares, and their targets: no change)
                return  # (stands while half a window of rates at the new spans is measured)
            # (smsfree, smsover: a guest that begins to share starts on a span of its target's
            # size, which stands while half a window of rates on it is measured: its rates over the
            # window before are from before it shared, at its speed alone, and would put it back on
            # as much of the GPU as the guest given most at once; on an H100 two trainers at 30/70
            # began on equal spans so, and took 13 s to come to their parts)
            # (not while one is capped: its cap holds it, off its weight's span; nor under sms,
            # whose curves place a newcomer)
            newcomers = [k for k in shared if k not in self.sharing]
            capped = any(self.guests[k].ceiling < 1 for k in shared)
            if newcomers and self.lever in ("smsfree", "smsover") and not capped:
                # (against the guest given most of those already sharing, whose open part the
                # feedback learned; where none shares yet, against the largest target)
                stayers = [k for k in shared if k not in newcomers]
                ref = max(stayers, key=lambda k: self.guests[k].open) if stayers else max(shared, key=targets.get)
                scale = (self.guests[ref].open if stayers else 1.0) / max(targets[ref], 1e-9)
                for k in newcomers:
                    self.guests[k].open = targets[k] * scale
                self._stand(now, shared, targets)
                self._retarget(now, shared, targets, progress)  # (who shares, and their targets: no change)
                return
        if self._retarget(now, shared, targets, progress):
            return  # (stands while half a window of rates at the new holds is measured)
        rebased &= set(shared)
        if rebased and spans and all(self.guests[k].ceiling >= 1 for k in shared):
            # a probe moved a guest's rate alone by more than a quarter (an earlier one read it in
            # its warming up): the parts seen were off by as much, and the feedback's steps take
            # seconds to follow (on an H100 eight, from 0.8 of the light guest's span to 0.22):
            # the spans set at once where the curves put the targets; under smsover and smsfree,
            # whose spans have no curves, the window's rates may be from before what the probe
            # found changed (a warm-up's end): stand, and after half a window of rates from now
            # move each open part by its target over its part, as a change of targets moves it
            if self._solved(shared):
                self._set_spans(now, shared, targets)
            else:
                self._stand(now, shared, targets)
                self.rebase_after = set(shared)
            return
        if self.rebase_after and self.rebase_after == set(shared):
            total = sum(progress[k] for k in shared)
            for k in shared:
                g = self.guests[k]
                part = max(progress[k] / total, 1e-9)
                g.open = max(LEAST_OPEN, g.open * (targets[k] / part) ** self._retarget_pow())
            self.rebase_after = set()
            self._stand(now, shared, targets)
            return
        self.rebase_after = set()
        again, self.resolving = self.resolving == set(shared), set()  # (a change of targets has settled)
        if self._solved(shared):  # each guest's curve from what its span shows
            for k in shared:  # (after a change of targets, from the new spans alone: the nearest)
                self._learn(k, progress[k], now, 1.0 if again else CURVE_LEARN)
            if again:  # the spans a change of targets gave have settled: solved again, once
                self._set_spans(now, shared, targets)
                return
        elif again and self._by_time() and all(self.guests[k].ceiling >= 1 for k in shared):
            # by time (and none capped: a cap's hold is not its weight's): each open part corrected
            # once by how its part moved
            self._secant(now, shared, targets, progress)
            return
        total = sum(progress[k] for k in shared)
        # a guest ahead of its part that can be held no more (at the least open part, or on spans
        # at one group) takes what it takes from the others alike: their parts are then reckoned
        # among themselves (on the model, a guest of weight 10 on one group of 8 ahead of its part
        # had both others opened wide, and 30/70 went to 42/58 between them)
        pinned = [k for k in shared if progress[k] / total > targets[k] and self._held_most(k, shared, targets)]
        self.pinned = set(pinned)
        rest = [k for k in shared if k not in pinned]
        among = {k: (progress[k] / total, targets[k]) for k in pinned}
        if rest:
            rest_total, rest_targets = sum(progress[k] for k in rest), sum(targets[k] for k in rest)
            among.update({k: (progress[k] / rest_total, targets[k] / max(rest_targets, 1e-9)) for k in rest})
        for k in shared:
            g, (part, target) = self.guests[k], among[k]
            self.last[keys[k].guest] = progress[k] / total
            g.open = (
                1.0
                if progress[k] >= SATISFIED and not g.lifted and not spans
                else min(1.0, max(LEAST_OPEN, g.open * (target / max(part, 1e-9)) ** GAIN))
            )
        # a capped guest its weight would open past its cap is held by its cap alone, and nobody
        # else is held for a part it cannot take (its cap, not its weight, is then its share)
        bound = [
            k for k in shared if self.guests[k].ceiling < 1 and self._open(self.guests[k]) >= self.guests[k].ceiling
        ]
        for k in bound:  # (under the depth lever at its full depth: its cap's hold is all that holds it)
            self.guests[k].open = self.guests[k].ceiling if self._by_time() else 1.0
        free = [k for k in shared if k not in bound]
        if not free:
            return
        top = max(self.guests[k].open for k in free)
        for k in free:  # the least held is not held: nobody waits for nothing
            g = self.guests[k]
            # and none is held for more than the rest of its part of each period, however its
            # progress or another's is measured: a guest can choose its calls (many cheap ones
            # while alone, few large ones beside the others) and so look short of its part, but
            # what it can take from another that way is bounded: the other still runs at least
            # its part of every period, the time weighted turns would give it (under the depth
            # lever at depth one for the rest)
            g.open = min(1.0, max(LEAST_OPEN, targets[k] * self._floor_part(), g.open / top))

    def _held_most(self, k, shared: list, targets: dict) -> bool:
        """Whether guest k's open part is as low as it goes: LEAST_OPEN or the rest of its target
        part of each period (_control), or on spans a part of the SMs under one group."""
        g = self.guests[k]
        if self.lever in SMS_LEVERS and self.groups:
            return g.open / sum(self.guests[m].open for m in shared) * self.groups <= 1 + 1e-9
        return g.open <= max(LEAST_OPEN, targets[k] * self._floor_part()) + 1e-9

    def _open(self, g: _Guest) -> float:
        """The part of each period its weight leaves its work (before its cap): its open part under
        time; under the depth lever all of it down to DEPTH_PART, less below; under the sms lever
        (its open part is its span's) all of it."""
        if self.lever in SMS_LEVERS and self.groups:
            return 1.0
        return g.open if self.lever in ("time", *SMS_LEVERS) else min(1.0, g.open / DEPTH_PART)

    def _weights_changed(self, keys: dict, busy: list) -> bool:
        """Whether the targets of the guests that shared at the last look, all busy still, moved
        since (a weight or guarantee changed live: what _retarget then acts on)."""
        shared = [k for k in busy if k in self.sharing]
        return len(shared) >= 2 and self._moved(shared, self._targets(keys, shared))

    def _moved(self, shared: list, targets: dict) -> bool:
        """Whether `targets` are a change of weight: the same guests as at the last look (one come
        or gone changes the targets too, and is not a change of weight), each with a target then,
        and one of them moved."""
        gs = {k: self.guests[k] for k in shared}
        same = set(shared) == self.sharing and all(g.target for g in gs.values())
        return same and any(abs(targets[k] - g.target) > 0.005 for k, g in gs.items())

    def _retarget(self, now: float, shared: list, targets: dict, progress: dict) -> bool:
        """A weight (or guarantee) changed among the same guests sharing: each guest's open part
        moves at once by its new target over its old (on spans: where the curves put the new
        targets, _solve; the least held then not held), and stands while half a window of rates
        at the new holds is measured (the rates over the window before are the old holds' and would
        push past the new targets: _control), then is corrected once (_secant; on spans, solved
        again from the curves the new spans showed); True if so."""
        gs = {k: self.guests[k] for k in shared}
        for k, g in self.guests.items():
            if k not in gs:
                g.target = 0.0  # (not sharing: its target when it comes back is no change of weight)
        changed = self._moved(shared, targets)
        self.sharing = set(shared)
        if changed:
            if self._solved(shared):  # on spans: where the guests' curves say the new targets are
                self._set_spans(now, shared, targets)
                self.resolving = set(shared)  # (and again from what the spans show once they settle)
            else:
                total = sum(progress[k] for k in gs)  # (its part at its open part: for _secant)
                self.before = {k: (g.open, progress[k] / total) for k, g in gs.items()}
                self._scale(now, shared, targets)
                self.resolving = set(shared)  # (corrected once they settle: _secant)
        for k, g in gs.items():
            g.target = targets[k]
        return changed

    def _secant(self, now: float, shared: list, targets: dict, progress: dict) -> None:
        """A change of targets has settled (by time): each guest whose open part it moved is moved
        again, by its target over its part now to the power one over how far its part moved for
        the move of its open part (both as logs, from before the change to now), standing half a
        window again.  Left to the feedback: a move that took its part the other way, and one too small
        to tell from the noise of half a window's rates (its open part moved less than 5%, or its
        part less than 10%); and no correction is more than twice or half."""
        total = sum(progress[k] for k in shared)
        for k in shared:
            g, (o0, p0) = self.guests[k], self.before.get(k, (0.0, 0.0))
            p1 = progress[k] / total
            if o0 <= 0 or p0 <= 0 or p1 <= 0 or abs(math.log(g.open / o0)) < 0.05 or abs(math.log(p1 / p0)) < 0.1:
                continue
            e = math.log(p1 / p0) / math.log(g.open / o0)
            if e > 0:
                g.open *= min(2.0, max(0.5, (targets[k] / p1) ** (1 / min(max(e, 0.5), 3.0))))
        self._stand(now, shared, targets)

    def _scale(self, now: float, shared: list, targets: dict) -> None:
        """Each sharing guest's open part moved by its new target over its old (on spans without
        curves, by that to the power 1 / 0.6), standing half a window."""
        # (on SM spans not bounded by 1 before the least held is made 1, below: a span is its open
        # part over the others', and one bounded first would keep the old proportion)
        bound = math.inf if self._retarget_pow() != 1.0 else 1.0
        for k in shared:
            g = self.guests[k]
            g.open = min(bound, max(LEAST_OPEN, g.open * (targets[k] / g.target) ** self._retarget_pow()))
        self._stand(now, shared, targets)

    def _set_spans(self, now: float, shared: list, targets: dict) -> None:
        """Each sharing guest's open part where _solve puts it, standing half a window."""
        for k, x in self._solve(shared, targets).items():
            self.guests[k].open = x
        self._stand(now, shared, targets)

    def _stand(self, now: float, shared: list, targets: dict) -> None:
        """The open parts as they are, the least held made 1 (none below its floor), standing
        while half a window of rates at them is measured."""
        top = max(self.guests[k].open for k in shared)
        for k in shared:
            g = self.guests[k]
            g.open = min(1.0, max(LEAST_OPEN, targets[k] * self._floor_part(), g.open / top))
            g.rate_from = now  # (rates from here on: the holds made now)
        self.settle_until, self.settling = now + self.window_s / 2, set(shared)

    def _solved(self, shared: list) -> bool:
        """Whether spans are set from the sharing guests' curves (the sms lever with groups; under
        smsfree one guest has the whole GPU, whose curve no span shows), and their curves learned:
        not while one is capped (its cap holds it by time, off its span's doing, and the others run
        on more than their spans meanwhile; and its span is all its weight gives, not its curve's)."""
        return self.lever == "sms" and bool(self.groups) and all(self.guests[k].ceiling >= 1 for k in shared)

    def _retarget_pow(self) -> float:
        """How far a change of targets moves an open part at once: by new over old, and on SM spans
        by that to the power 1 / 0.6 (a trainer ran at about x ** 0.6 of its speed alone on a part
        x of an H200's SMs: 36.6% on 21.7%, 84.9% on 78.3%), so its part moves as its target did."""
        return 1 / 0.6 if self.lever in SMS_LEVERS and self.groups else 1.0

    def _by_time(self) -> bool:
        """Whether the open part is a part of each period (the time lever, or sms with no groups)."""
        return self.lever == "time" or (self.lever in SMS_LEVERS and not self.groups)

    def _floor_part(self) -> float:
        """What part of its target each period a held guest keeps open at least (see _control);
        under the sms lever, half of it (a guest runs faster on a part of the SMs than that part of
        its speed alone: its target may need a span smaller than the target)."""
        return DEPTH_PART if self.lever == "depth" else 0.5 if self.lever in SMS_LEVERS and self.groups else 1.0

    def _hold(self, g: _Guest) -> int:
        """The part of each period its work waits (per mille): what it may not have of it, by its
        weight and by its cap."""
        return int(round(1000 * (1 - min(self._open(g), g.ceiling))))

    def _depth(self, g: _Guest) -> int:
        """Under the depth lever: how much of its work the GPU may have at once (0: the
        forwarders' depth, not held), from theirs at an open part of 1 down to one at DEPTH_PART,
        evenly on a log scale."""
        if g.open >= 1.0:
            return 0
        x = max(0.0, (g.open - DEPTH_PART) / (1 - DEPTH_PART))
        return max(1, int(round(self.depth**x)))


def side_by_side(parts: list[float], start: int, end: int) -> list[tuple[int, int]]:
    """Spans [lo, hi) in sixteenths of a group, one after another from start to end, each the
    given part (parts add up to 1) of that stretch: each end where its part says, but leaving each
    at least one whole group."""
    out, lo, cum, n = [], start, 0.0, len(parts)
    for i, part in enumerate(parts):
        cum += part
        hi = end if i == n - 1 else start + int(round(cum * (end - start)))
        hi = max(lo + 16, min(hi, end - 16 * (n - 1 - i)))
        out.append((lo, hi))
        lo = hi
    return out


def seen_on(page, now: float | None = None) -> list[Seen]:
    """What a live scheduler page (vmgpu.sched.Page) shows the controller at `now` (time.monotonic,
    the forwarders' CLOCK_MONOTONIC)."""
    now_ms = int(1000 * (time.monotonic() if now is None else now)) & 0xFFFFFFFF
    return [
        Seen(
            m.slot,
            m.guest,
            m.work_calls,
            m.weight,
            m.guarantee,
            m.cap,
            RANKS.get(m.priority, 1),
            m.off_span(now_ms),
            m.waiting > 0,
            m.cap_pm,
        )
        for m in page.members()
    ]


def run(
    page,
    stop: threading.Event,
    every: float = PERIOD_STEP_S,
    controller: ShareController | None = None,
    after: Callable[[list, ShareController], None] | None = None,
) -> None:
    """Control one GPU's page while its policy is shared, until stop is set; holds are lifted
    whenever the policy is another (they mean nothing there, and would be stale when it returns).
    after(members, controller), if given, sees the page's members after each look."""
    ctl = controller or ShareController()
    while not stop.wait(every):
        apply_step(page, ctl, time.monotonic())
        if after:
            after(page.members(), ctl)


def apply_step(page, ctl: ShareController, now: float) -> None:
    """One look at a live page: the holds the controller gives, stored (or lifted off the policy)."""
    members = page.members()
    if page.policy != "shared":
        for m in members:
            if m.hold:
                page.set_hold(m.slot, 0)
            if m.depth:
                page.set_depth(m.slot, 0)
            if m.sm_part:
                page.set_part(m.slot, 0, 0)
        ctl.forget()
        return
    for slot, hold in ctl.step(now, seen_on(page, now), page.sm_groups).items():
        page.set_hold(slot, hold)
        page.set_depth(slot, ctl.depths.get(slot, 0))
        page.set_part(slot, *ctl.spans.get(slot, (0, 0)))
