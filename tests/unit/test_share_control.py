"""The shared policy's controller (vmgpu/share_control.py) against a model of a GPU on a fake
clock: guests whose work runs side by side, each slower the more run at once (two together get
1.2 of one alone, as two trainers did under MPS on an H100), held back by the holds the
controller gives exactly as the forwarders' gate holds them (the first hold per mille of each
100 ms period).  Each test checks what a tenant sees: its calls beside the others over its calls
alone."""

from __future__ import annotations

import functools
import math

import pytest

from vmgpu.share_control import REFUSED_MAX, SMS_LEVERS, Seen, ShareController, _Guest

PERIOD = 0.1
TOGETHER = {1: 1.0, 2: 0.6, 3: 0.45, 4: 0.36}  # each guest's speed with n running


class Gpu:
    """Guests with a rate alone (calls/s) and, for a guest that is not always busy, a demand."""

    def __init__(self, alone: dict[str, float], demand: dict[str, float] | None = None, together=TOGETHER):
        self.alone, self.demand, self.together = alone, demand or {}, together
        self.calls = dict.fromkeys(alone, 0.0)
        self.weight = dict.fromkeys(alone, 100)
        self.cap = dict.fromkeys(alone, 0)
        self.guarantee = dict.fromkeys(alone, 0)
        self.gone: set[str] = set()  # guests whose slots are not on the page
        self.busy = dict.fromkeys(alone, True)
        self.holds = dict.fromkeys(alone, 0)
        self.held_ms = dict.fromkeys(alone, 0)
        self.rank = dict.fromkeys(alone, 1)  # priorities: a lower guest runs only while no higher one does
        self.gamers: set[str] = set()  # guests that make five times the calls in a probe (see run)
        self.short: dict[str, list[float]] = {}  # the part of its rate alone a guest runs at in its probes, by turns
        self.stretches = dict.fromkeys(alone, 0)
        self.alone_since = dict.fromkeys(alone, 0.0)
        self.depths = dict.fromkeys(alone, 32)  # each guest's depth, as the controller last gave it
        # a guest's pull on the GPU beside others at depth d is d / (d + depth_k): a depth tells
        # only once it is small (2: at 19 of 64 a trainer kept 48% of the pair, as on an H100)
        self.depth_k = 2.0
        # SM partitions (the sms lever): the groups of SMs the page offers (0: none), each guest's
        # span as the controller gave it, and a guest's speed on a part x of the SMs, alone there
        # (x ** 0.6: 30% of an H100's SMs ran a trainer at about half its speed)
        self.groups = 0
        self.spans = dict.fromkeys(alone, (0, 0))
        self.sm_speed = lambda x: x**0.6
        self.sm_speeds: dict = {}  # a guest's own curve, where it is not sm_speed
        self.whole: set[str] = set()  # guests whose work does not keep to a span (not partitioned)
        self.waiting: set[str] = set()  # guests with work that did not run at the last millisecond
        self.slow_until: dict[str, float] = {}  # a guest warming up: at 3% of its speed until then
        # a guest whose speed grows over its first seconds: (from, to, f), at f of it at `from`
        # rising evenly to all of it at `to`
        self.ramp: dict[str, tuple[float, float, float]] = {}
        self.now = 1000.0

    def seen(self) -> list[Seen]:
        return [
            Seen(
                i,
                n,
                int(self.calls[n]),
                self.weight[n],
                self.guarantee[n],
                self.cap[n],
                self.rank[n],
                n in self.whole,
                n in self.waiting,
            )
            for i, n in enumerate(self.alone)
            if n not in self.gone
        ]

    def _hold(self, n: str) -> int:
        """n's hold as the gate applies it: while no other guest of its priority or above is busy,
        only as far as its cap holds it (sched_held_ns, alone)."""
        if any(self.busy[m] and m != n and self.rank[m] >= self.rank[n] for m in self.alone):
            return self.holds[n]
        return min(self.holds[n], 1000 - 10 * self.cap[n] if 0 < self.cap[n] < 100 else 0)

    def run(self, ctl: ShareController, seconds: float, dt: float = 0.001) -> dict[str, float]:
        """Run; each guest's calls in this stretch over what it would make alone."""
        start = dict(self.calls)
        names = list(self.alone)
        for i in range(int(round(seconds / dt))):
            t = self.now + i * dt
            if i % int(round(0.1 / dt)) == 0:
                holds = ctl.step(t, self.seen(), self.groups)
                self.holds = {n: holds.get(j, 0) for j, n in enumerate(names)}
                self.depths = {n: ctl.depths.get(j, 0) or ctl.depth for j, n in enumerate(names)}
                self.spans = {n: ctl.spans.get(j, (0, 0)) for j, n in enumerate(names)}
            into = t % PERIOD
            running = [n for n in names if self.busy[n] and into >= self._hold(n) / 1000 * PERIOD]
            top = max((self.rank[n] for n in running), default=0)
            # (the gate's yield to a higher guest, but for a lower one on a span of its own: the
            # priority reserve, where it runs beside the higher one, left on the whole GPU)
            running = [n for n in running if self.rank[n] == top or (self.groups and self.spans[n] != (0, 0))]
            self.waiting = {n for n in names if self.busy[n] and n not in running}
            for n in names:
                self.held_ms[n] += self.busy[n] and n not in running
                if len(running) != 1 or n not in running:
                    self.alone_since[n] = t
                elif t - self.alone_since[n] > PERIOD / 2 >= t - dt - self.alone_since[n]:
                    self.stretches[n] += 1  # alone longer than half a period: a probe (holds are shorter)
            pull = {n: self.depths[n] / (self.depths[n] + self.depth_k) for n in running}
            # on spans of their own (each with one: the forwarders partition only while another is
            # at work), each runs at its speed on its part of the SMs, whatever the others do
            spans = len(running) > 1 and all(self.spans[n] != (0, 0) for n in running)
            # one left on the whole GPU beside others on spans (smsfree): it takes half of their
            # SMs' room as well as the rest, and theirs run at 0.8 of their speed there
            parted = [n for n in running if self.spans[n] != (0, 0)]
            free = len(running) > 1 and len(parted) == len(running) - 1
            taken = sum((self.spans[n][1] - self.spans[n][0]) / (16 * max(self.groups, 1)) for n in parted)
            for n in running:
                # side by side, each gets of what they get together the part its pull is of theirs
                # (equal depths: together[n] each), never more than alone
                share = self.together[len(running)] * len(running) * pull[n] / sum(pull.values())
                if spans:
                    lo, hi = self.spans[n]
                    share = self.sm_speeds.get(n, self.sm_speed)((hi - lo) / (16 * self.groups))
                elif free and self.groups:
                    lo, hi = self.spans[n]
                    share = (
                        0.8 * self.sm_speed((hi - lo) / (16 * self.groups))
                        if n in parted
                        else self.sm_speed(1 - taken / 2)
                    )
                rate = self.alone[n] * min(1.0, share) * (0.03 if t < self.slow_until.get(n, 0) else 1)
                if n in self.ramp:
                    t0, t1, f = self.ramp[n]
                    rate *= f + (1 - f) * min(1.0, max(0.0, (t - t0) / (t1 - t0)))
                if n in self.demand:
                    rate = min(rate, self.demand[n])
                if n in self.gamers and t - self.alone_since[n] > PERIOD:
                    rate *= 5  # alone longer than any hold lasts (a probe): cheap calls, the same work
                if n in self.short and t - self.alone_since[n] > PERIOD / 2:
                    # (probes read trainers short now and then on an H100)
                    rate *= self.short[n][(self.stretches[n] - 1) % len(self.short[n])]
                self.calls[n] += rate * dt
        self.now += seconds
        alone = {n: min(self.alone[n], self.demand.get(n, self.alone[n])) for n in names}
        return {n: (self.calls[n] - start[n]) / (alone[n] * seconds) for n in names}


def settled(gpu: Gpu, warm: float = 20, measure: float = 20, **kw) -> dict[str, float]:
    """A controller of its own run on gpu for `warm` seconds, then what `measure` more give."""
    ctl = ShareController(**kw)
    gpu.run(ctl, warm)
    return gpu.run(ctl, measure)


def parts(shares: dict[str, float]) -> dict[str, float]:
    total = sum(shares.values())
    return {n: 100 * v / total for n, v in shares.items()}


def test_two_guests_at_30_70_get_their_parts_and_keep_most_of_the_overlap():
    gpu = Gpu({"a": 5000.0, "b": 8000.0})  # different workloads: rates alone differ
    gpu.weight.update(a=30, b=70)
    got = settled(gpu, 20, 20)
    p = parts(got)
    assert abs(p["a"] - 30) <= 2 and abs(p["b"] - 70) <= 2, (p, got)
    # time slicing gives at most 1.0 together; side by side with holds, more
    assert sum(got.values()) > 1.05, got


def test_under_the_depth_lever_the_parts_hold_and_the_overlap_is_kept():
    # held back by its depth (how much of its work the GPU has at once) instead of by time, the
    # light guest keeps running beside the other: where a small depth is enough (depth one pulls
    # a third as hard as a full one) the parts hold with no time held, and the pair keeps its overlap
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=30, b=70)
    got = settled(gpu, 20, 20, lever="depth", depth=64)
    p = parts(got)
    assert abs(p["a"] - 30) <= 2, (p, got)
    by_time = settled(_pair(30, 70), 20, 20)
    assert sum(got.values()) > sum(by_time.values()) + 0.05, (got, by_time)
    assert max(gpu.depths.values()) == 64 and 1 <= min(gpu.depths.values()) < 8, gpu.depths
    assert gpu.holds == {"a": 0, "b": 0}, gpu.holds


def test_where_depth_one_is_not_enough_the_depth_lever_holds_by_time_too():
    # a guest at depth one that still pulls nearly as hard as a full one (on an H100 a trainer at
    # 19 of 64 kept half): the depth lever goes down to one and holds by time for the rest, and
    # the parts hold; the light guest still runs the rest of each period beside the other
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=30, b=70)
    gpu.depth_k = 0.3  # (depth one pulls 0.77 of a full depth)
    got = settled(gpu, 20, 20, lever="depth", depth=64)
    p = parts(got)
    assert abs(p["a"] - 30) <= 2 and abs(p["b"] - 70) <= 2, (p, got)
    assert gpu.depths["a"] == 1 and gpu.depths["b"] == 64, gpu.depths
    assert 0 < gpu.holds["a"] < 700 and gpu.holds["b"] == 0, gpu.holds
    by_time = _pair(30, 70)
    by_time.depth_k = 0.3
    assert sum(got.values()) >= sum(settled(by_time, 20, 20).values()) - 0.02, got


def _pair(wa: int, wb: int) -> Gpu:
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=wa, b=wb)
    return gpu


def test_a_guest_near_its_rate_alone_because_another_is_held_keeps_it_held():
    # two that overlap well (0.8 each side by side, as on MPS): holding the light one for 30/70
    # brings the heavy one to 90% of its rate alone; it must not then look content and have the
    # holds lifted (they came and went every few looks on an H200, parts 43/57)
    gpu = Gpu({"a": 5000.0, "b": 5000.0}, together={1: 1.0, 2: 0.8})
    gpu.weight.update(a=30, b=70)
    got = settled(gpu, 20, 20)
    p = parts(got)
    assert abs(p["a"] - 30) <= 2, (p, got)
    assert sum(got.values()) > 1.2, got  # (1.6 with no control at all; time slicing gives 1.0)


def test_a_probe_that_reads_a_guest_short_does_not_move_the_parts():
    # on an H100 probes of one trainer alone read 21,000 calls/s and 29,000 at other times beside
    # a steady 21,000 with the other guest: a short read makes a guest look nearer its rate alone
    # than it is, and the other is held for nothing (39.5 / 60.5 here, keeping only the last read);
    # the more of its last two reads is kept, and a short one is believed only once the next
    # probe of its guest agrees
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=30, b=70)
    gpu.short["b"] = [1.0, 0.7]  # every other probe of it reads it short, from its second
    got = settled(gpu, 30, 30)
    p = parts(got)
    assert abs(p["a"] - 30) <= 2, (p, got)


def test_a_rate_seen_beside_others_counts_against_the_short_probe_it_brings():
    # a guest first probed while it warms up (its probe reads its warm-up rate) and then seen
    # faster beside the other: that rate is its rate alone until probes find more, and the probe
    # that brings soon after (seen well past its probe, it is not sure of it) reads short of it
    # and must not bring its rate alone below what it was seen to do (an H100 trace: 24,110
    # calls/s seen, then 18,820 read, and the holds lifted: the guest looked content)
    gpu = Gpu({"a": 5000.0, "b": 8000.0}, demand={"b": 1500.0})
    gpu.weight.update(a=30, b=70)
    ctl = ShareController()
    gpu.run(ctl, 3)
    b = next(g for k, g in ctl.guests.items() if k[1] == "b")
    assert b.probes and max(b.probes) < 2000, b  # probed while it warmed up
    del gpu.demand["b"]
    for _ in range(15):  # until its rate beside the other (0.6 of 8,000) is seen
        gpu.run(ctl, 0.1)
        if b.alone > 4700:
            break
    assert b.alone > 4700 and not b.sure and ctl.probe is None, b  # (well past its probe: probed soon)
    probed, seen = False, 0.0
    for _ in range(30):
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe.whose[1] == "b":
            if not probed:  # its work slows a little: the probe it brings reads 93% of what was seen
                seen = b.alone
                gpu.short["b"] = [0.93 * seen / gpu.alone["b"]]
            probed = True
        elif probed:
            break
    assert probed and min(b.probes) < seen, b  # read short of what it was seen to do, and kept
    assert b.alone >= seen, b


def _probes(gpu: Gpu, ctl: ShareController, seconds: float) -> list[str]:
    """Run seconds in steps of 0.1 s; whose probe each that began was, in order."""
    who, was = [], None
    for _ in range(int(round(seconds / 0.1))):
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe is not was:
            who.append(ctl.probe.whose[1])
        was = ctl.probe
    return who


@pytest.mark.parametrize("lever", ["sms", "smsover", "smsfree"])
def test_a_guest_whose_probes_read_it_short_beside_a_fast_rate_is_not_probed_every_second(lever):
    # b (the 70) runs beside a at most of its speed alone and its probes read it 30% short every
    # time, so each is refused (slower than 0.9 of its rate beside the other just before); it was
    # seen beside a well past its first probe.  A refused probe is no sign of a warm-up read:
    # probes come every 4 s at most, not every second for as long as it lasts (which held the
    # others 0.3 s of every 1.35 s and cost the pair 7-9% on the model)
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=30, b=70)
    gpu.groups = 15
    gpu.short = {"b": [0.7]}
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 20)
    assert len(_probes(gpu, ctl, 60)) <= 16


@pytest.mark.parametrize("lever", ["time", "sms", "smsover"])
def test_a_newcomers_confirming_probe_comes_before_the_others_are_probed_again(lever):
    # three guests share, their rates alone sure; a fourth begins: its first probe and the one
    # that confirms it come one after the other, not after each of the others' next
    gpu = Gpu({"a": 5000.0, "b": 8000.0, "d": 7000.0, "c": 6000.0})
    gpu.groups = 0 if lever == "time" else 15
    gpu.busy["c"] = False
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 30)
    gpu.busy["c"] = True
    assert _probes(gpu, ctl, 4)[:2] == ["c", "c"]


def test_a_rate_measured_alone_for_a_whole_window_replaces_what_probes_read_before():
    # a guest busy alone has its rate alone measured directly; what probes read before (when it
    # went twice as fast) must not come back as its rate alone once another guest is busy again
    # (found by a review: it stayed over-estimated 25 s, 36/64 for 30/70)
    gpu = _pair(30, 70)
    ctl = ShareController()
    gpu.run(ctl, 20)
    gpu.busy["b"] = False
    gpu.alone["a"] = 2500.0
    gpu.run(ctl, 10)
    gpu.busy["b"] = True
    gpu.run(ctl, 0.5)
    a = ctl.guests[next(k for k in ctl.guests if k[1] == "a")]
    assert abs(a.alone - 2500) < 250 and max(a.probes) < 2750, a
    got = gpu.run(ctl, 20)
    assert abs(parts(got)["a"] - 30) <= 2, parts(got)


def test_steady_rates_alone_are_probed_less_often_and_the_shares_hold_second_by_second():
    # a probe lets one guest run alone for 0.3 s, which moves the parts of the second it falls in
    # by 10-20 pp: once every guest's rate alone has held steady, probes come 16 s apart, not 4
    gpu = Gpu({"a": 5000.0, "b": 8000.0})
    gpu.weight.update(a=30, b=70)
    ctl = ShareController()
    gpu.run(ctl, 20)
    within, probes, was = 0, 0, None
    for _ in range(60):
        before = dict(gpu.calls)
        for _ in range(10):
            gpu.run(ctl, 0.1)
            probes += ctl.probe is not None and ctl.probe is not was
            was = ctl.probe
        second = {n: (gpu.calls[n] - before[n]) / gpu.alone[n] for n in before}
        within += abs(parts(second)["a"] - 30) <= 2
    assert probes <= 6 and within >= 50, (probes, within)  # (every 4 s: 15 probes, 42 seconds within)
    # a guest whose rate alone changes is probed often again until it holds steady once more; a
    # read well short of the last is believed once the next probe, at once its guest's, agrees
    gpu.alone["a"] = 2500.0
    a = ctl.guests[next(k for k in ctl.guests if k[1] == "a")]
    short_at = known_at = None
    for _ in range(400):
        gpu.run(ctl, 0.1)
        if short_at is None and a.short is not None:
            short_at = gpu.now  # its first read of the new rate: well short of what was kept
        if abs(a.alone - 2500) < 250:
            known_at = gpu.now
            break
    # believed once its next probe, at once its own (first of the next round, which comes 4 s after
    # the round it was read short in: not a whole round's interval, 8 s) agrees: about 5 s
    assert short_at is not None and known_at is not None and known_at - short_at <= 6, (short_at, known_at)


def test_equal_weights_are_not_held_when_equal_already():
    gpu = Gpu({"a": 4000.0, "b": 4000.0})
    got = settled(gpu, 10, 20)
    assert abs(parts(got)["a"] - 50) <= 2
    assert sum(got.values()) > 1.12, got  # only the probes cost (1.2 with no control at all)


def test_a_weight_changed_live_is_reached_within_seconds():
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=20, b=80)
    gpu.run(ctl, 5)
    p = parts(gpu.run(ctl, 10))
    assert abs(p["a"] - 20) <= 2, p


def test_a_weight_changed_live_moves_the_holds_at_once_and_holds_within_a_second():
    # the holds move by the new targets over the old at the look that sees the change, and stand
    # while rates at them are measured: the first half second after a change of 50/50 to 20/80 is
    # within 3 pp of it and the second within 2 (moved step by step, 40/60 and then 28/72)
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=20, b=80)
    first, second = parts(gpu.run(ctl, 0.5)), parts(gpu.run(ctl, 0.5))
    assert abs(first["a"] - 20) <= 3 and abs(second["a"] - 20) <= 2, (first, second)


def test_by_time_a_weight_change_is_corrected_once_from_how_far_the_parts_moved():
    # two guests that each go at 0.7 of their speed beside the other: the holds moved by new
    # target over old put the light one 4 pp over 20/80 (a held guest gains from the other's
    # holds too); once they have stood half a second, its open part is moved again by how far its
    # part moved for the move of its open part, and from the second half second on the parts are
    # within 1 pp (moved by the feedback alone, 3.3 pp over then, and 1.6 a second later)
    gpu = Gpu({"a": 5000.0, "b": 5000.0}, together={1: 1.0, 2: 0.7, 3: 0.5, 4: 0.4})
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=20, b=80)
    got = [parts(gpu.run(ctl, 0.5))["a"] for _ in range(4)]
    assert all(abs(p - 20) <= 1 for p in got[1:]), got


def _wandering_20_80(seed: int, halves: int, together=TOGETHER) -> list[float]:
    """Two equal guests by time whose rates alone wander (each by about 8% every tenth of a
    second, seeded), 50/50 turned 20/80: the light one's parts of each half second after."""
    import math
    import random

    rng = random.Random(seed)
    gpu = Gpu({"a": 5000.0, "b": 5000.0}, together=together)
    ctl = ShareController()

    def wander(seconds):
        calls = dict(gpu.calls)
        for _ in range(int(round(seconds / 0.1))):
            for n in ("a", "b"):
                gpu.alone[n] = 5000.0 * math.exp(rng.gauss(0, 0.08))
            gpu.run(ctl, 0.1)
        return {n: (gpu.calls[n] - calls[n]) / 5000.0 for n in ("a", "b")}

    wander(15)
    gpu.weight.update(a=20, b=80)
    return [parts(wander(0.5))["a"] for _ in range(halves)]


def test_by_time_a_guest_read_at_full_speed_on_half_a_windows_rates_is_not_left_out():
    # after the correction the heavy guest's rate over the half second since read 97.7% of its
    # rate alone; left out of the sharing on that, the light one's holds were lifted and its part
    # was 29 pp over 20 the half second after.  A guest sharing is left out only on whole windows
    got = _wandering_20_80(15, 4)
    assert all(abs(p - 20) <= 4 for p in got), got


def test_by_time_a_guest_back_to_sharing_within_a_window_is_held_where_it_was():
    # the heavy guest reads at full speed (its rate alone wandered low) and is left out: the
    # light one's holds go with it, and both share again a look later; the light one is then held
    # where it was, not from nothing up (which left it 28, 23 and 12 pp over 20 for a second and
    # a half); one half second off, then within 4 pp
    got = _wandering_20_80(15, 6, together={1: 1.0, 2: 0.7, 3: 0.5, 4: 0.4})
    assert all(abs(p - 20) <= 4 for p in got[4:]), got


def test_by_time_a_weight_changed_twice_in_a_second_is_corrected_from_the_parts_at_the_second():
    # 30/100 turned 70/10 and back half a second later: the correction after the second change
    # measures how far the parts moved from those at the second change (had it taken them from
    # before the first, the light guest's part went to 60 where 23 was asked); within 2 pp from
    # the second half second after it
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.weight.update(a=30, b=100)
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=70, b=10)
    gpu.run(ctl, 0.5)
    gpu.weight.update(a=30, b=100)
    got = [parts(gpu.run(ctl, 0.5))["a"] for _ in range(4)]
    assert all(abs(p - 100 * 30 / 130) <= 2 for p in got[1:]), got


def test_by_time_no_correction_while_a_guest_is_capped():
    # a guest capped at 30% turned from weight 30 beside 50 to 100 beside 10: its cap, not its
    # weight, then holds it, and nobody else is held for it; the correction (which knows no caps)
    # is not made, and from the first look after the change has stood the other is not held
    gpu = _pair(30, 50)
    gpu.cap["a"] = 30
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=100, b=10)
    gpu.run(ctl, 0.6)
    holds = []
    for _ in range(5):
        gpu.run(ctl, 0.1)
        holds.append(gpu.holds["b"])
    assert holds == [0] * 5, holds


def test_a_change_of_weight_a_higher_guest_interrupts_is_not_corrected_when_it_leaves():
    # 50/50 turned 20/80, and a high-priority guest at work from 0.4 s, before the holds have stood
    # half a second: while it works nobody of the two shares, and the correction due is dropped
    # (made seconds later, when the two share again, it would move holds by parts long gone)
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.busy["c"], gpu.rank["c"] = False, 2
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.weight.update(a=20, b=80)
    gpu.run(ctl, 0.4)
    assert ctl.resolving, "the change was not seen"
    gpu.busy["c"] = True
    gpu.run(ctl, 1.0)
    assert not ctl.resolving and not ctl.before, (ctl.resolving, ctl.before)


def test_a_guest_going_idle_or_coming_back_is_no_change_of_weight():
    # the targets of the others change when one stops or comes back, but no weight did: the holds
    # are not moved at once nor left standing (only a change among the same guests is)
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.weight.update(a=20, b=30, c=50)
    ctl = ShareController()
    gpu.run(ctl, 20)
    for busy in (False, True):
        gpu.busy["c"] = busy
        for _ in range(30):
            gpu.run(ctl, 0.1)
            assert ctl.settle_until == float("-inf"), (busy, ctl.settle_until)


def test_a_weight_change_beside_a_guest_short_of_nothing_keeps_the_holds_while_it_settles():
    # c makes few calls (it is short of nothing, left out of the sharing) while a and b share;
    # a change of a's and b's weights moves their holds, which stand while rates are measured
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0}, demand={"c": 300.0})
    gpu.weight.update(a=50, b=50)
    ctl = ShareController()
    gpu.run(ctl, 20)
    gpu.weight.update(a=20, b=80)
    for _ in range(5):
        gpu.run(ctl, 0.1)
        assert gpu.holds["a"] > 0 and gpu.holds["b"] == 0, gpu.holds
    assert abs(parts({n: v for n, v in gpu.run(ctl, 1).items() if n != "c"})["a"] - 20) <= 3


def test_an_idle_guests_share_goes_to_the_busy_one():
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.weight.update(a=10, b=90)
    ctl = ShareController()
    gpu.run(ctl, 15)
    gpu.busy["b"] = False
    gpu.run(ctl, 2)
    got = gpu.run(ctl, 5)
    assert got["a"] > 0.97, got  # alone and not held
    assert gpu.holds["a"] == 0 and gpu.holds["b"] == 0


@pytest.mark.parametrize("cap", [10, 50])
def test_a_cap_holds_a_guest_alone_to_its_part_of_each_period(cap):
    gpu = Gpu({"a": 6000.0})
    gpu.cap["a"] = cap
    got = settled(gpu, 2, 10)
    assert abs(100 * got["a"] - cap) <= 1, got
    assert gpu.holds["a"] == 1000 - 10 * cap


def test_a_cap_beside_a_weighted_guest_holds_only_the_capped():
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.cap["a"] = 20
    got = settled(gpu, 10, 20)
    assert 100 * got["a"] <= 21, got
    assert got["b"] > 0.85, got  # the rest is the other's: alone 80% of the time, beside a for 20%
    assert gpu.holds["b"] == 0


def test_a_capped_guest_whose_cap_does_not_bind_is_held_to_its_weight():
    # weights 20/80 with a cap of 60% on the light guest: the weights ask less of it than its
    # cap allows, so they hold it, not the cap
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.weight.update(a=20, b=80)
    gpu.cap["a"] = 60
    p = parts(settled(gpu, 20, 20))
    assert abs(p["a"] - 20) <= 2, p
    assert gpu.holds["b"] == 0


def test_a_capped_guest_whose_cap_binds_holds_nobody_else():
    # equal weights, a cap of 30% on one: its weight would open it past its cap, so the cap holds
    # it and the other is not held for a part the capped one cannot take
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.cap["a"] = 30
    got = settled(gpu, 20, 20)
    assert 100 * got["a"] <= 31, got
    assert gpu.holds["a"] == 700 and gpu.holds["b"] == 0, gpu.holds


def test_a_guest_gaming_its_calls_cannot_hold_another_below_its_part_of_each_period():
    # the attacker makes five times the calls for the same work whenever it runs alone (as in a
    # probe), so its rate alone reads five times its real one and it looks far short of its part:
    # the controller holds its victim, but never for more than the rest of the victim's part
    gpu = Gpu({"mal": 5000.0, "victim": 5000.0})
    gpu.gamers.add("mal")
    got = settled(gpu, 20, 20)
    assert max(gpu.holds.values()) <= 500, gpu.holds  # the victim runs at least 50% of each period
    assert got["victim"] >= 0.5 * TOGETHER[2] * 0.95, got  # beside the attacker all of that time


def test_on_spans_a_guest_gaming_its_calls_cannot_take_its_victim_below_half_its_part_of_the_sms():
    # the attacker's rate alone reads five times its real one, so it looks far short of its part
    # and its curve is learned steep; it also goes idle and comes back, so that the spans are
    # solved from the curves again and again.  Its victim's span is never below half its target
    # (a quarter beside the attacker's whole: a fifth of the SMs, less the sixteenths they round to)
    gpu = Gpu({"mal": 5000.0, "victim": 5000.0})
    gpu.groups = 16
    gpu.gamers.add("mal")
    ctl = ShareController(lever="sms")
    spans = []

    def run(seconds):
        for _ in range(int(round(seconds / 0.1))):
            gpu.run(ctl, 0.1)
            lo, hi = gpu.spans["victim"]
            if hi > lo:
                spans.append((hi - lo) / 256)

    run(20)
    for _ in range(10):
        gpu.busy["mal"] = False
        run(0.7)
        gpu.busy["mal"] = True
        run(1.5)
    assert spans and min(spans) >= 0.25 / 1.25 - 1 / 256, min(spans)


def test_only_the_highest_priority_shares_and_a_lower_guest_is_neither_held_nor_probed():
    # two normal guests and a low one, all making calls (the low one in the gaps the gate leaves
    # it): the low one's work waits at the gate while theirs goes, so the controller leaves it
    # alone; holding it, or holding them to probe it, would be for nothing or against their
    # priority.  The normal ones are probed among themselves.
    ctl = ShareController()
    calls = {"a": 0, "b": 0, "low": 0}
    rank = {"a": 1, "b": 1, "low": 0}
    weight = {"a": 30, "b": 70, "low": 100}
    holds, probed = [], set()
    for i in range(400):
        for n in calls:
            calls[n] += 500
        got = ctl.step(1000 + 0.1 * i, [Seen(j, n, calls[n], weight[n], 0, 0, rank[n]) for j, n in enumerate(calls)])
        holds.append(got)
        if ctl.probe:
            probed.add(ctl.probe.whose[1])
            assert got[2] == 0 and sorted(got[j] for j in (0, 1)) == [0, 1000], got  # only the other normal one
    assert all(h[2] == 0 for h in holds), holds
    assert probed == {"a", "b"}, probed


def test_a_guest_that_asks_little_is_not_made_to_wait_for_nothing():
    # an inference guest that asks a tenth of what it could do, beside a trainer at equal weights:
    # it goes at the rate it asks for, so it is short of nothing and neither is held (but for
    # the probes)
    gpu = Gpu({"inf": 3000.0, "train": 6000.0}, demand={"inf": 300.0})
    got = settled(gpu, 20, 20)
    assert got["inf"] > 0.95, got
    assert got["train"] > 0.57, got  # 0.6 beside it in this model, less the probes
    assert sum(gpu.held_ms.values()) < 0.1 * 40 * 1000 * 2


@pytest.mark.parametrize("lever", ["time", "depth", "sms"])
def test_a_guest_that_asks_little_and_then_more_is_read_again_soon_and_not_held_for_it(lever):
    # (found by a review of the mend for a guest slow alone) the guest above asks 450 calls/s
    # instead of 300: it is seen beside the trainer well past its reads alone (lifted), so no
    # longer content, and was held; its rate alone rose a little at each look, so it stayed sure
    # and was not probed until the next round, 25 s on, and it got 0.69 of what it asked for.  A
    # guest lifted is probed within a second (at most once in 16 s), and once a read catches up
    # one that was left out as short of nothing is back where it was
    gpu = Gpu({"inf": 3000.0, "train": 6000.0}, demand={"inf": 300.0})
    gpu.groups = 15 if lever == "sms" else 0
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 20)
    gpu.demand["inf"] = 450.0
    calls = gpu.calls["inf"]
    gpu.run(ctl, 30)
    assert (gpu.calls["inf"] - calls) / (30 * 450) > 0.95, gpu.holds


def test_guests_that_come_and_go_are_forgotten_and_measured_afresh():
    ctl = ShareController()
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.run(ctl, 10)
    assert set(k[1] for k in ctl.guests) == {"a", "b"}
    holds = ctl.step(gpu.now + 0.1, [Seen(0, "a", int(gpu.calls["a"]))])
    assert set(holds) == {0} and set(k[1] for k in ctl.guests) == {"a"}
    # another guest in b's old slot is someone else: nothing of b's is kept for it
    ctl.step(gpu.now + 0.2, [Seen(0, "a", int(gpu.calls["a"])), Seen(1, "c", 0)])
    assert ctl.guests[(1, "c")].alone == 0


def test_a_guest_held_during_a_probe_is_let_go_when_the_probed_one_leaves():
    ctl = ShareController()
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.run(ctl, 0.2)  # the first probe has begun
    assert ctl.probe is not None
    whose = ctl.probe.whose
    other = [k for k in ctl.guests if k != whose][0]
    holds = ctl.step(gpu.now + 0.1, [Seen(other[0], other[1], int(gpu.calls[other[1]]))])
    assert holds == {other[0]: 0} and ctl.probe is None


def test_a_probe_of_a_guest_that_stopped_in_it_is_not_taken_for_its_rate_alone():
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    ctl = ShareController()
    gpu.run(ctl, 10)
    good = {k[1]: g.alone for k, g in ctl.guests.items()}
    assert all(abs(v - 5000) < 300 for v in good.values()), good
    while ctl.probe is None:  # the next probe: its guest goes quiet for it
        gpu.run(ctl, 0.1)
    whose = ctl.probe.whose[1]
    gpu.run(ctl, 0.15)  # its measure begins (the probe has settled), then it stops for a while
    gpu.busy[whose] = False
    gpu.run(ctl, 0.3)
    # (its probe over: the next of its round, the other's, may be under way)
    assert (ctl.probe is None or ctl.probe.whose[1] != whose) and ctl.guests[ctl_key(ctl, whose)].alone == good[whose]


def _flickering(
    flicker: bool, rounds: bool, ctl: ShareController | None = None
) -> tuple[dict[str, float], dict[str, int], dict[str, int], Gpu]:
    """a and b share at 30/70, sure of their rates alone; then for 90 s c, never measured, is at
    work 0.1 s of every second (or not at all): a's and b's rates over their rates alone, each
    guest's probes, the milliseconds each was held, and the model."""
    gpu = Gpu({"a": 5000.0, "b": 8000.0, "c": 6000.0})
    gpu.weight.update(a=30, b=70)
    gpu.busy["c"] = False
    ctl = ShareController(rounds=rounds) if ctl is None else ctl
    gpu.run(ctl, 20)
    calls, held, who, was = dict(gpu.calls), dict(gpu.held_ms), [], None
    for i in range(900):
        gpu.busy["c"] = flicker and i % 10 == 0
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe is not was:
            who.append(ctl.probe.whose[1])
        was = ctl.probe
    got = {n: (gpu.calls[n] - calls[n]) / (90 * gpu.alone[n]) for n in "ab"}
    return got, {n: who.count(n) for n in "abc"}, {n: gpu.held_ms[n] - held[n] for n in "abc"}, gpu


@pytest.mark.parametrize("rounds", [True, False])
def test_a_guest_at_work_a_moment_every_second_neither_has_the_others_held_nor_stops_their_probes(rounds):
    # hostile: c never works long enough for a probe to read it, so each of its probes is
    # refused and it stays unmeasured; an unmeasured guest is probed first and every second, and
    # a probe held the others its whole 0.3 s though c had stopped in it.  On the model c was
    # probed 40 times in 60 s, a and b never, and b was held 12 s of the 60 (a and b lost 23% of
    # their rates).  A probe its guest stops in ends at once, and after REFUSED_MAX refused in a
    # row the guest is probed only after the others, ever further apart (_retry)
    quiet, quiet_probes, _, _ = _flickering(False, rounds)
    got, probes, held, _ = _flickering(True, rounds)
    # (nor does c break a's and b's rounds: held for them, as they are for each other)
    assert probes["c"] <= 8 and all(probes[n] >= max(2, quiet_probes[n] - 1) for n in "ab"), (probes, quiet_probes)
    assert held["b"] <= 4500, held
    # (c's own moments of work beside them cost them a little)
    assert all(got[n] >= 0.93 * quiet[n] for n in "ab"), (got, quiet)


def test_a_guest_whose_probes_failed_while_it_worked_by_moments_is_measured_once_it_works_on():
    # (as a trainer setting up by moments, then at work: probed again within probe_every_s of its
    # last refused probe once it has worked a window through, not RETRY_MAX times that)
    ctl = ShareController()
    *_, gpu = _flickering(True, True, ctl)
    c = ctl.guests[ctl_key(ctl, "c")]
    assert not c.alone and c.refused >= 6, c
    gpu.busy["c"] = True
    who = _probes(gpu, ctl, 6)
    assert who[:2] == ["c", "c"] and abs(c.alone - 6000) <= 600, (who, c)


def _against(mode: str, phase: int = 0) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """a and b share at 30/70, sure of their rates alone; c (weight 10) comes and for 60 s works
    as `mode` says: on throughout ("honest"), on but stopped in each of its probes ("dodge"), on
    0.N s of every second ("dutyN", from `phase` tenths into it), or both: each guest's rate over
    its rate alone, its probes and the milliseconds it was held."""
    gpu = Gpu({"a": 5000.0, "b": 8000.0, "c": 6000.0})
    gpu.weight.update(a=30, b=70, c=10)
    gpu.busy["c"] = False
    ctl = ShareController()
    gpu.run(ctl, 20)
    calls, held, who, was = dict(gpu.calls), dict(gpu.held_ms), [], None
    for i in range(600):
        probed = ctl.probe is not None and ctl.probe.whose[1] == "c"
        on = (i + phase) % 10 < int(mode[-1]) if mode[-1].isdigit() else True
        gpu.busy["c"] = on and not (probed and mode.startswith("dodge"))
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe is not was:
            who.append(ctl.probe.whose[1])
        was = ctl.probe
    got = {n: (gpu.calls[n] - calls[n]) / (60 * gpu.alone[n]) for n in "abc"}
    return got, {n: who.count(n) for n in "abc"}, {n: gpu.held_ms[n] - held[n] for n in "abc"}


@pytest.mark.parametrize(("mode", "phase"), [("dodge", 0), ("duty5", 3), ("duty5", 0), ("duty8", 0), ("dodge8", 0)])
def test_a_guest_that_stops_in_its_probes_gains_nothing_by_it(mode, phase):
    # hostile (found by a review): unmeasured, a guest shared in nothing and was not held, so one
    # that stopped in its every probe (and worked on otherwise) or at work 0.5-0.9 s of every
    # second took 22-42% of the GPU at a weight of 10 beside 30 and 70, and had its probes every
    # second.  An unmeasured guest is held to its target part of each period, and one given up on
    # is probed again at most every probe_every_s (each of its probes holds the others two looks)
    honest, _, honest_held = _against("honest")
    got, probes, held = _against(mode, phase)
    assert parts(got)["c"] <= parts(honest)["c"] + 1, (parts(got), parts(honest))
    assert all(got[n] >= 0.97 * honest[n] for n in "ab"), (got, honest)
    assert probes["c"] <= 16 and held["b"] <= honest_held["b"] + 2000, (probes, held, honest_held)


@functools.cache
def _slow_alone(lever: str, slow: float | str | None) -> tuple[dict[str, float], int]:
    """a and b share at 30/70 (on 8 groups of SMs under the sms levers); c (weight 10) comes and
    works on, at `slow` of its speed whenever it runs alone (None: at its speed; "mirror": at what
    it did beside the others the second before; "steady": at its speed, but its calls 600 a second
    whatever it gets, each as much work as that takes; "offspan": steady, its work off its span for
    its first 2 s, as an open stream capture keeps it): each guest's rate over its rate alone (c's
    by its work) over 30 s, 10 s after c came, and c's probes then."""
    gpu = Gpu({"a": 5000.0, "b": 8000.0, "c": 6000.0})
    gpu.weight.update(a=30, b=70, c=10)
    gpu.groups = 8 if lever in SMS_LEVERS else 0
    gpu.busy["c"] = False
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 20)
    gpu.busy["c"] = True
    if isinstance(slow, float):
        gpu.short["c"] = [slow]
    was: list[float] = []
    probes, probe, empty = 0, None, 0.0
    for i in range(400):
        if i == 100:
            calls, probes, empty = dict(gpu.calls), 0, 0.0
        was = [*was[-10:], gpu.calls["c"]]
        if slow == "mirror" and len(was) > 1 and not (ctl.probe and ctl.probe.whose[1] == "c"):
            # (alone as fast as it went beside the others over the second before, no faster)
            gpu.short["c"] = [max(0.01, (was[-1] - was[0]) / (0.1 * (len(was) - 1)) / gpu.alone["c"])]
        if slow == "offspan":
            (gpu.whole.add if i < 20 else gpu.whole.discard)("c")
        made = gpu.calls["c"]
        gpu.run(ctl, 0.1)
        if slow in ("steady", "offspan"):
            # (calls the page counts: 60 every 0.1 s, each of them as much work as it takes)
            made = gpu.calls["c"] - made
            gpu.calls["c"] += 60 - made
            empty += 60 - made
        probes += ctl.probe is not None and ctl.probe is not probe and ctl.probe.whose[1] == "c"
        probe = ctl.probe
    got = {n: (gpu.calls[n] - calls[n]) / (30 * gpu.alone[n]) for n in "abc"}
    got["c"] -= empty / (30 * gpu.alone["c"])
    return got, probes


@pytest.mark.parametrize("lever", ["time", "depth", "sms", "smsfree", "smsover"])
@pytest.mark.parametrize("slow", [0.2, "mirror"])
def test_a_guest_that_goes_slow_whenever_it_runs_alone_gains_nothing_by_it(lever, slow):
    # hostile (found in session 55): c's probes read it at a fifth of its speed, so its rate alone
    # was taken from what it was seen to do beside the others, which made it look as fast as alone:
    # short of nothing, it was left out of the sharing, held by nobody, and took 35% of the GPU at
    # a weight of 10 under time.  A guest seen beside the others well past every read of it alone
    # (LIFTED) is neither left out nor spared as content; the feedback holds it on the rates it
    # was read at.  Held, one that goes alone as fast as it went beside the others ("mirror") reads
    # ever lower: a probe that moved its rate alone down set the spans anew from wrong curves, and
    # its reads, never steady, had the rounds come every 4 s a guest (b lost 12-16% on spans).
    # (Not mended: one that knew beforehand how fast it goes unheld beside the others, and went
    # alone at 0.9-1.0 of that, still looks content: at a slow of 0.4 under time it took 29.5%)
    honest, _ = _slow_alone(lever, None)
    got, probes = _slow_alone(lever, slow)
    assert parts(got)["c"] <= parts(honest)["c"] + 1, (parts(got), parts(honest))
    assert all(got[n] >= 0.9 * honest[n] for n in "ab"), (got, honest)
    assert probes <= 6, probes  # (nor are the others held for its probes time after time)


@pytest.mark.parametrize("how", ["steady", "offspan"])
@pytest.mark.parametrize("lever", ["sms", "smsfree", "smsover"])
def test_on_spans_a_guest_whose_calls_come_steadily_whatever_it_gets_gains_nothing_by_it(lever, how):
    # hostile (found by a review): c makes its calls at 600 a second whatever the GPU gives it
    # (each as much work as that takes), so its calls beside the others are its calls alone: at
    # 90% of its rate alone it was content, not held, and on spans given as wide a span as the
    # widest: 32% of the GPU at a weight of 10, a and b split 48/52.  On spans a content guest is
    # held as any other (a smaller span is no wait).  (Under the time and depth levers it still
    # takes 38%: a guest whose calls say it goes as fast as alone is not held while it waits, and
    # calls cannot tell it from a light guest; on the sms levers a guest off its span, which it
    # can be at will, has every guest held by time: see the test below).  Nor left out as short of
    # nothing, there: one whose work ran off its span for its first 2 s (all held by time
    # meanwhile) was left out so, was never brought back in once the spans came back, and took
    # 37.7% on the whole GPU (found by a second review)
    honest, _ = _slow_alone(lever, None)
    got, _ = _slow_alone(lever, how)
    assert parts(got)["c"] <= parts(honest)["c"] + 1, (parts(got), parts(honest))
    assert all(got[n] >= 0.9 * honest[n] for n in "ab"), (got, honest)


@pytest.mark.parametrize(("light", "trainer"), [(10, 90), (90, 10)])
def test_a_light_guest_off_its_span_is_served_what_it_asks_and_the_trainer_gets_the_rest(light, trainer):
    # an honest light guest (300 of its 3,000 calls/s) whose work keeps to no span (its partition
    # did not fit, or a capture keeps it where it was) has every guest held by time; it is spared
    # as content there, as on the whole GPU.  Session 57 tried holding a guest off its span as any
    # other (the steady guest of the test above took 38.5% by time and would have taken 4.5%), and
    # a review found the cost: this guest at a weight of 10 got 0.11 of what it asked (0.94
    # before), and at 90 the trainer beside it was held to 0.11 of its speed, the GPU idle.  Calls
    # cannot tell the two apart; what each uses of the GPU could
    gpu = Gpu({"inf": 3000.0, "t1": 6000.0}, demand={"inf": 300.0})
    gpu.weight.update(inf=light, t1=trainer)
    gpu.groups = 8
    gpu.whole = {"inf"}
    got = settled(gpu, 20, 30, lever="sms")
    assert got["inf"] >= 0.9 and got["t1"] >= 0.5, got


def test_a_guest_as_held_as_it_goes_still_ahead_leaves_the_others_their_parts_among_themselves():
    # on spans, one group of 8 is the least a guest has: c (weight 10) on it is ahead of its part
    # whatever the feedback does, and what it takes was taken from a and b as their parts of the
    # whole said: both looked behind, both were opened wide, and their 30/70 went to 34/66 (42/58
    # with c slow in its probes)
    got, _ = _slow_alone("sms", None)
    among = parts({n: got[n] for n in "ab"})
    assert abs(among["a"] - 30) <= 1, (among, got)


def test_a_guest_at_work_is_seen_to_work_a_window_through_however_often_the_looks_come():
    # (vmgpud's loop looks every 0.1 s plus what a look takes: at 0.112 s apart a window holds
    # nine looks, not ten, and the guest was never seen to work it through, nor grew young)
    ctl = ShareController()
    t, calls = 1000.0, 0
    for _ in range(30):
        ctl.step(t, [Seen(0, "a", calls), Seen(1, "b", calls)])
        t, calls = t + 0.112, calls + 100
    assert all(g.born is not None for g in ctl.guests.values()), ctl.guests


def ctl_key(ctl: ShareController, name: str):
    return next(k for k in ctl.guests if k[1] == name)


def test_run_stores_the_holds_on_the_page_and_shows_each_look_to_after():
    import threading

    from vmgpu import share_control
    from vmgpu.sched import Member

    class Page:  # the parts of vmgpu.sched.Page the loop uses
        policy = "shared"

        def __init__(self):
            self.m = [Member(0, "a", 1, 30, 0, 0, 0, 1), Member(1, "b", 2, 70, 0, 0, 0, 1)]
            self.stored = []

        def members(self):
            for m in self.m:
                m.work_calls += 100  # both busy
            return self.m

        def set_hold(self, slot, hold):
            self.stored.append((slot, hold))
            self.m[slot].hold = hold

        def set_depth(self, slot, depth):
            self.m[slot].depth = depth

        sm_groups = 0  # (a GPU the forwarders do not partition)

        def set_part(self, slot, lo, hi):
            self.m[slot].sm_part = lo << 16 | hi

    page, stop, looks = Page(), threading.Event(), []

    def after(members, ctl):
        looks.append(([m.hold for m in members], ctl.probe is not None))
        if len(looks) == 8:
            stop.set()

    share_control.run(page, stop, every=0.001, after=after)
    assert len(looks) == 8 and {s for s, _ in page.stored} == {0, 1}
    # two busy guests, neither measured alone: a probe begins, holding the other throughout
    assert any(probing and sorted(h) == [0, 1000] for h, probing in looks), looks
    assert all(m.depth == 0 for m in page.m)  # (the time lever sets no depth)
    # under the depth lever the depths it gives are stored, and lifted with the holds off shared
    ctl = share_control.ShareController(lever="depth", depth=64)
    ctl.depths = {}
    page.m[0].depth = 0
    ctl.step = lambda now, seen, groups=0: (setattr(ctl, "depths", {0: 20, 1: 0}), {0: 0, 1: 0})[1]
    share_control.apply_step(page, ctl, 0.0)
    assert [m.depth for m in page.m] == [20, 0]
    page.policy = "weighted"
    share_control.apply_step(page, ctl, 0.0)
    assert [m.depth for m in page.m] == [0, 0] and [m.hold for m in page.m] == [0, 0]
    with pytest.raises(ValueError):
        share_control.ShareController(lever="turns")
    for overlap in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="overlap"):
            share_control.ShareController(lever="smsover", overlap=overlap)


def test_under_the_sms_lever_the_parts_hold_on_spans_of_their_own_and_the_pair_gets_more():
    # each guest on SMs of its own (its span's part of the GPU's 16 groups), nobody held by time:
    # the spans move until the parts are 30/70, and the pair gets what partitions give (1.3 on
    # this model at 30/70), more than holding by time beside each other
    gpu = _pair(30, 70)
    gpu.groups = 16
    got = settled(gpu, 20, 20, lever="sms")
    p = parts(got)
    assert abs(p["a"] - 30) <= 2 and abs(p["b"] - 70) <= 2, (p, got)
    assert gpu.holds == {"a": 0, "b": 0}, gpu.holds
    (alo, ahi), (blo, bhi) = gpu.spans["a"], gpu.spans["b"]
    assert alo == 0 and ahi == blo and bhi == 16 * 16 and ahi - alo >= 16, gpu.spans  # side by side, all of it
    assert ahi < bhi - blo, gpu.spans  # the light guest on fewer SMs
    by_time = settled(_pair(30, 70), 20, 20)
    assert sum(got.values()) > sum(by_time.values()) + 0.05, (got, by_time)


def test_under_the_sms_lever_a_gpu_with_no_groups_is_shared_by_time():
    # the forwarders cannot partition the GPU (no MPS, an older driver): the page has no groups,
    # and the same lever holds by time as the time lever does
    gpu = _pair(30, 70)
    got = settled(gpu, 20, 20, lever="sms")
    p = parts(got)
    assert abs(p["a"] - 30) <= 2, (p, got)
    assert gpu.spans == {"a": (0, 0), "b": (0, 0)} and gpu.holds["a"] > 0, (gpu.spans, gpu.holds)


def test_under_the_sms_lever_a_guest_alone_gets_no_span():
    # the other gone idle: nobody shares, so nobody is given a span (the forwarders would give the
    # one at work the whole GPU anyway; the page says so too)
    gpu = _pair(30, 70)
    gpu.groups = 16
    got = _spans_lifted_when_idle(gpu, "a", "b", 10, 3)
    assert got["a"] > 0.95, got


def _spans_lifted_when_idle(gpu: Gpu, stays: str, goes: str, first: float, then: float) -> dict[str, float]:
    """Under the sms lever: `stays` has a span after `first` seconds; `goes` goes idle, and after
    `then` more nobody has one; what `then` gave."""
    ctl = ShareController(lever="sms")
    gpu.run(ctl, first)
    assert gpu.spans[stays] != (0, 0), gpu.spans
    gpu.busy[goes] = False
    got = gpu.run(ctl, then)
    assert set(gpu.spans.values()) == {(0, 0)}, gpu.spans
    return got


def test_under_the_sms_lever_a_cap_still_holds_by_time():
    gpu = _pair(50, 50)
    gpu.groups = 16
    gpu.cap["a"] = 20
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 15)
    while ctl.probe is not None:  # (at a look no probe of the other holds it)
        gpu.run(ctl, 0.1)
    assert gpu.holds["a"] == 800, gpu.holds  # (its cap's hold: 1000 - 10 x 20)


def test_under_the_sms_lever_a_guest_at_full_speed_on_its_span_keeps_sharing():
    # SMs a trainer cannot use: on 80% of them the heavy guest runs as fast as alone.  Left out
    # of the sharing as "short of nothing", its span would be lifted and the light guest take the
    # SMs back, and so on; it stays in, the spans stand, and the parts hold with much overlap
    gpu = _pair(30, 70)
    gpu.groups = 16
    gpu.sm_speed = lambda x: min(1.0, 1.25 * x**0.6)
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 20)
    spans = []
    for _ in range(20):
        got = gpu.run(ctl, 0.5)
        if ctl.probe is None:  # (a probe runs each guest on the whole GPU in turn)
            spans.append(gpu.spans["a"])
    p = parts(gpu.run(ctl, 10))
    assert len(spans) >= 15 and all(s != (0, 0) for s in spans), spans
    assert abs(p["a"] - 30) <= 2, p
    assert got["b"] > 0.95 and sum(got.values()) > 1.3, got


def test_under_the_sms_lever_the_spans_begin_where_the_curves_put_the_targets():
    # two guests that begin to share begin on the spans their curves (0.6 until measured, as this
    # model's) put at 30/70: 19.6% of the SMs for the light one, not half each nor 30%, which
    # would give it 37.6% of the progress; the first look that gives spans does so, and the half
    # second after it is within 2 pp of 30/70
    gpu = _pair(30, 70)
    gpu.groups = 16
    ctl = ShareController(lever="sms")
    for _ in range(100):
        gpu.run(ctl, 0.1)
        if gpu.spans["a"] != (0, 0):
            break
    lo, hi = gpu.spans["a"]
    assert abs((hi - lo) / 256 - 0.196) < 0.01, gpu.spans
    p = parts(gpu.run(ctl, 0.5))
    assert abs(p["a"] - 30) <= 2, p


def test_under_the_smsfree_lever_the_heavy_guest_keeps_the_whole_gpu_and_the_parts_hold():
    gpu = _pair(30, 70)
    gpu.groups = 16
    got = settled(gpu, 20, 20, lever="smsfree")
    p = parts(got)
    assert abs(p["a"] - 30) <= 2, (p, got)
    assert gpu.spans["b"] == (0, 0) and gpu.spans["a"][1] - gpu.spans["a"][0] >= 16, gpu.spans
    assert gpu.holds == {"a": 0, "b": 0}, gpu.holds


def test_under_the_smsfree_lever_the_guest_on_the_whole_gpu_stays_there_until_another_is_given_a_tenth_more():
    # (found by a review: with 3 groups, a guest making five times the calls alone had the whole
    # GPU go back and forth between it and the heavy guest, and took 30.2% at a weight of 10)
    ctl = ShareController(lever="smsfree")
    ctl.groups = 3
    a, b, c = (0, "a"), (1, "b"), (2, "c")
    for k, open_part, target in ((a, 0.3, 0.3), (b, 1.0, 0.6), (c, 0.5, 0.1)):
        ctl.guests[k] = _Guest(open=open_part, target=target)
    assert ctl._spans([a, b, c])[1] == (0, 0)  # b, given most
    ctl.guests[b].open, ctl.guests[c].open = 0.95, 1.0
    assert ctl._spans([a, b, c])[1] == (0, 0)  # c is given more, but not a tenth more
    ctl.guests[b].open = 0.9
    spans = ctl._spans([a, b, c])
    assert spans[2] == (0, 0) and spans[1] != (0, 0), spans  # now it is


@pytest.mark.parametrize(("overlap", "light"), [(None, 30), (0.25, 40)])
def test_under_the_smsover_lever_each_span_reaches_into_its_neighbours_and_the_parts_hold(overlap, light):
    # the spans side by side as under sms, each then reaching 2 of the 16 groups (an eighth of the
    # SMs, the default) or 4 (overlap 0.25) into its neighbour's, and the feedback holds 30/70 (or
    # 40/60: in this model a span of 4 groups more than its own already gives a guest a third of
    # the pair) on them (what the overlap gives on a GPU is what the experiment is for: this model
    # only makes a wider span faster)
    gpu = _pair(light, 100 - light)
    gpu.groups = 16
    ctl = ShareController(lever="smsover", **({} if overlap is None else {"overlap": overlap}))
    gpu.run(ctl, 20)
    got = gpu.run(ctl, 20)
    p = parts(got)
    assert abs(p["a"] - light) <= 2, (p, got)
    reach = 16 * 16 * (overlap or 0.125)
    (alo, ahi), (blo, bhi) = gpu.spans["a"], gpu.spans["b"]
    assert alo == 0 and bhi == 256 and ahi - blo == 2 * reach, gpu.spans  # (each that far into the other's)
    assert gpu.holds == {"a": 0, "b": 0}, gpu.holds


@pytest.mark.parametrize("lever", ["smsover", "smsfree"])
def test_a_guest_that_begins_to_share_beside_one_that_ran_alone_starts_on_a_span_of_its_target(lever):
    # the light guest runs alone first, and beside the heavy one (both on the whole GPU, before
    # either has a span) at 0.93 of its speed (launch-bound MPS clients), so its progress when
    # they begin to share is over 90%; it begins on a span of its target's size (standing half a
    # window while rates on it are measured), not on as much as the guest given most, or all of
    # the GPU under smsfree (on an H100 under smsover two trainers at 30/70 began on equal spans
    # so, and took 13 s to come to their parts)
    gpu = Gpu({"a": 5000.0, "b": 8000.0}, together={1: 1.0, 2: 0.93})
    gpu.weight.update(a=30, b=70)
    gpu.groups = 16
    gpu.busy["b"] = False
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 5)
    gpu.busy["b"] = True
    first = None
    for _ in range(40):
        gpu.run(ctl, 0.1)
        if gpu.spans["a"] != (0, 0) or gpu.spans["b"] != (0, 0):
            first = dict(gpu.spans)
            break
    assert first, "they never shared"
    for _ in range(4):  # (and stands while half a window of rates on them is measured)
        gpu.run(ctl, 0.1)
        assert gpu.spans == first, (gpu.spans, first)
    width = {n: hi - lo for n, (lo, hi) in first.items()}
    if lever == "smsfree":  # (the heavy one on the whole GPU, the light one on its target's span)
        assert first["b"] == (0, 0) and width["a"] <= 0.5 * 256, first
    else:  # (each its target's part, then reaching 32 sixteenths into the other's)
        assert width["a"] < 0.6 * width["b"], first
    gpu.run(ctl, 15)
    got = gpu.run(ctl, 20)
    assert abs(parts(got)["a"] - 30) <= 2, got


@pytest.mark.parametrize("warm", [(4.2, 1.5), (1.5, 4.2), (3.0, 6.0)])
@pytest.mark.parametrize("lever", ["sms", "smsover"])
def test_two_guests_that_begin_together_warming_up_come_to_their_parts_within_eight_seconds(lever, warm):
    # two trainers started together (as the bench starts them) warm up for their first seconds
    # (their first batches, the library's set-up) at a few per cent of their speed; a guest's
    # first probe falls in that, and on an H100 read the light one's rate alone at 4% and the
    # heavy one's at 1% of what later probes did.  With one read kept as its rate alone until its
    # next probe 8 s on, 30/70 was 35.6/64.4 over the 10 s after an 8 s lead (run 74): a guest's
    # first probe is confirmed by a second one soon after
    gpu = Gpu({"a": 36000.0, "b": 36000.0}, together={1: 1.0, 2: 0.55})
    gpu.weight.update(a=30, b=70)
    gpu.groups = 15
    gpu.slow_until = {"a": gpu.now + warm[0], "b": gpu.now + warm[1]}
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 8)
    got = gpu.run(ctl, 10)
    assert abs(parts(got)["a"] - 30) <= 2, parts(got)


@pytest.mark.parametrize(("steps", "setup"), [((3, 0), 0), ((0, 5), 0), ((2, 6), 0), ((0, 5), 30)])
@pytest.mark.parametrize("lever", ["time", "sms", "smsover"])
def test_a_guest_whose_rate_alone_grows_in_its_first_seconds_is_read_again_soon(lever, steps, setup):
    # on an H100 a trainer's first two probes, in its first seconds, read it 18% under its rate
    # alone at 20 s; they agreed, so were sure and steady, and the next round came 16 s on: 30/70
    # was 32.8/67.2 over the 10 s after an 8 s lead (run 79).  Here each guest runs at 82% of its
    # speed until a moment in its first seconds; rounds come every PROBE_EVERY_S while a guest is
    # young (the old spacing put the light guest at 26-34%).  Its youth counts from when it works
    # on, not from its setting up, where it is at work by moments (`setup` seconds of 0.1 s in
    # every second: a trainer loading and setting up took 5-45 s on an H100)
    gpu = Gpu({"a": 30000.0, "b": 30000.0}, together={1: 1.0, 2: 0.55})
    gpu.weight.update(a=30, b=70)
    gpu.groups = 0 if lever == "time" else 15
    gpu.sm_speed = lambda x: x**0.66
    ctl = ShareController(lever=lever)
    for i in range(10 * setup):
        gpu.busy = dict.fromkeys("ab", i % 10 == 0)
        gpu.run(ctl, 0.1)
    gpu.busy = dict.fromkeys("ab", True)
    gpu.ramp = {n: (gpu.now + at, gpu.now + at + 0.5, 0.82) for n, at in zip("ab", steps, strict=True)}
    gpu.run(ctl, 8)
    got = gpu.run(ctl, 10)  # (both at full speed: the parts by their rates alone now)
    assert abs(parts(got)["a"] - 30) <= 1, parts(got)


def test_without_a_youth_a_read_from_a_guests_first_seconds_is_kept_and_the_parts_are_off():
    # (young_s=0, as the bench's --young 0,PART: what the youth mends)
    gpu = Gpu({"a": 30000.0, "b": 30000.0}, together={1: 1.0, 2: 0.55})
    gpu.weight.update(a=30, b=70)
    gpu.groups = 15
    gpu.sm_speed = lambda x: x**0.66
    gpu.ramp = {"b": (gpu.now + 5, gpu.now + 5.5, 0.82)}
    ctl = ShareController(lever="sms", young_s=0)
    gpu.run(ctl, 8)
    assert parts(gpu.run(ctl, 10))["a"] > 32
    for bad in ({"young_s": -1}, {"young_part": 0}, {"young_part": 1}):
        with pytest.raises(ValueError, match="youth"):
            ShareController(**bad)


@pytest.mark.parametrize("lever", ["sms", "smsover"])
def test_a_guest_that_begins_to_share_beside_a_capped_one_is_not_put_on_its_targets_span(lever):
    # where a sharing guest is capped, its cap holds it (its span is not its weight's), so a guest
    # that begins to share beside it is not put on a span of its target's size (under sms its
    # curves would place it, and do not while one is capped): the spans are even from the first
    # look on, not its target's for half a window and then even
    gpu = Gpu({"a": 5000.0, "b": 8000.0}, together={1: 1.0, 2: 0.93})
    gpu.weight.update(a=30, b=70)
    gpu.cap["b"] = 50
    gpu.groups = 16
    gpu.busy["b"] = False
    ctl = ShareController(lever=lever)
    gpu.run(ctl, 5)
    gpu.busy["b"] = True
    seen = []
    for _ in range(20):
        gpu.run(ctl, 0.1)
        if gpu.spans["a"] != (0, 0):
            seen.append(dict(gpu.spans))
    reach = 32 if lever == "smsover" else 0
    assert seen and all(x == {"a": (0, 128 + reach), "b": (128 - reach, 256)} for x in seen), seen


def test_under_the_sms_lever_a_weight_changed_live_holds_within_a_second():
    # on spans, a guest's speed goes as its part of the SMs to the power 0.6: moving its span by
    # the new target over the old would move its part far less than that; solved on each guest's
    # curve, 50/50 turned 20/80 holds within 2 pp in the second half second
    first, second = _turned_20_80(2)
    assert abs(first - 20) <= 4 and abs(second - 20) <= 2, (first, second)


@pytest.mark.parametrize("rounds", [True, False])
@pytest.mark.parametrize("lever", ["time", "sms"])
@pytest.mark.parametrize("last_read", ["steady", "higher", "short"])
def test_no_probe_comes_within_two_windows_of_a_weight_change_though_one_is_due(lever, last_read, rounds):
    # probes every 0.5 s, so that one falls due while the change stands and is corrected: where
    # both rates alone are steady, or one's last probe read it higher than before (not steady, but
    # taken at the more of its reads; on an H200 a probe 0.1 s after the change cost 0.3 s), none
    # begins until two windows after it (on an H200 one 0.4 s after put 20/80 off for a second), and
    # they begin again after that; where one's last read was well short and is not yet confirmed
    # (its parts are only as right as it is), its probe comes when due.  In rounds (each guest
    # probed in turn), a steady pair's round is due every 4 s, each guest's lone probe every 2 s
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.groups = 16
    ctl = ShareController(lever=lever, probe_every_s=0.5, rounds=rounds)
    gpu.run(ctl, 15)
    assert all(g.steady for g in ctl.guests.values())
    first = next(iter(ctl.guests.values()))
    if last_read != "steady":
        first.steady = 0
    if last_read == "short":
        first.short = 0.8 * first.alone
    gpu.weight.update(a=20, b=80)
    changed, began = gpu.now, set()
    for _ in range(40):
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe.began >= changed:  # (one under way then may end)
            began.add(round(ctl.probe.began - changed, 1))
    if last_read != "short":
        assert began and 2.0 <= min(began) <= (4.5 if rounds and last_read == "steady" else 3.0), sorted(began)
    else:
        assert began and min(began) < 1.0, sorted(began)


def _turned_20_80(halves: int, speeds: dict | None = None, speed=None) -> list[float]:
    """Two equal guests sharing at 50/50 on spans (their speeds on a part of the SMs: speeds by
    guest, or speed for both, or the model's), turned 20/80: the light one's parts of each half
    second after."""
    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.groups = 16
    gpu.sm_speeds = speeds or {}
    gpu.sm_speed = speed or gpu.sm_speed
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 15)
    gpu.weight.update(a=20, b=80)
    return [parts(gpu.run(ctl, 0.5))["a"] for _ in range(halves)]


def test_under_the_sms_lever_a_weight_change_is_reached_at_once_on_each_guests_own_curve():
    # guests whose speeds go as x ** 0.75 and x ** 0.5 on a part x of the SMs (on an H200 a trainer
    # went as about x ** 0.66): each one's curve is learned from its progress on its span at 50/50,
    # and the spans for 20/80 are solved from them; the first half second after the change is
    # already within 2 pp (moved by one power 1 / 0.6 for both, it is 2.4 pp short and takes
    # seconds of feedback)
    got = _turned_20_80(2, speeds={"a": lambda x: x**0.75, "b": lambda x: x**0.5})
    assert all(abs(p - 20) <= 1 for p in got), got


def test_under_the_sms_lever_spans_a_curve_put_wrong_are_solved_again_once_they_settle():
    # speeds that are no power of the part of the SMs (1 - (1 - x) ** 2.2: a trainer that fills
    # half the GPU at 78% of its speed): the spans solved from the curves at 50/50 put the light
    # guest 4 pp short, and the half second they stand shows its curve there; solved again from
    # it, the parts are within 2 pp from the second half second on (by feedback alone, 1.9 pp
    # short after a second and a half)
    got = _turned_20_80(4, speed=lambda x: 1 - (1 - x) ** 2.2)
    assert all(abs(p - 20) <= 2 for p in got[1:]), got


def test_under_the_sms_lever_guarantees_that_take_all_leave_a_guest_of_weight_alone_the_least():
    # guarantees of 60 and 40 leave a third guest, of a weight only, a target of 0: the spans are
    # still solved (no log of 0), it gets the least (one group), and the guaranteed two share the
    # rest in their order; nobody's spans are solved again at every look
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.groups = 16
    gpu.guarantee.update(a=60, b=40)
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 10)
    got, spans = [], []
    for _ in range(20):
        got.append(parts(gpu.run(ctl, 0.5)))
        spans.append(gpu.spans["c"])
    given = [s for s in spans if s != (0, 0)]  # (none during a probe)
    assert len(given) >= 15 and all(s[1] - s[0] == 16 for s in given), spans
    assert all(p["a"] > p["b"] > p["c"] for p in got[-4:]), got[-4:]


def test_under_the_sms_lever_a_guest_gone_while_the_spans_it_joined_stand_leaves_the_others_theirs():
    # a and b share at 30/70; c comes, and the spans are solved for three and stand; c's slot goes
    # within that half second: a and b keep spans (on rates over whole windows), never none
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.groups = 16
    gpu.weight.update(a=30, b=70)
    gpu.gone, gpu.busy["c"] = {"c"}, False
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 10)
    gpu.gone, gpu.busy["c"] = set(), True
    for _ in range(60):
        gpu.run(ctl, 0.1)
        if gpu.spans["c"] != (0, 0):
            break
    assert gpu.spans["c"] != (0, 0), gpu.spans
    gpu.run(ctl, 0.2)
    gpu.gone, gpu.busy["c"] = {"c"}, False
    seen = []
    for _ in range(10):
        gpu.run(ctl, 0.1)
        seen.append((gpu.spans["a"], gpu.spans["b"]))
    assert all((0, 0) not in s for s in seen), seen


def test_under_the_sms_lever_a_capped_guests_curve_and_its_partners_are_not_learned():
    # a cap holds its guest by time, and its partner then runs on more than its span: neither's
    # progress is its span's doing, and no curve is learned from it (the model's curves are 0.6)
    gpu = _pair(20, 80)
    gpu.groups = 16
    gpu.cap["a"] = 60
    ctl = ShareController(lever="sms")
    gpu.sm_speeds = {"a": lambda x: x**0.9, "b": lambda x: x**0.9}
    gpu.run(ctl, 15)
    assert gpu.holds["a"] == 400, gpu.holds
    assert [round(g.curve, 2) for g in ctl.guests.values()] == [0.6, 0.6]


def test_under_the_sms_lever_a_guest_off_its_span_makes_all_held_by_time():
    # a guest whose work keeps to no span (a process with a blocking stream, a forwarder that does
    # not partition: its slot's whole_ms) would run on the whole GPU held by nobody while the other
    # keeps to its span; instead nobody is given a span and both are held by time, and 30/70 holds
    gpu = _pair(30, 70)
    gpu.groups = 16
    gpu.whole = {"a"}
    got = settled(gpu, 20, 20, lever="sms")
    p = parts(got)
    assert gpu.spans == {"a": (0, 0), "b": (0, 0)} and gpu.holds["a"] > 0, (gpu.spans, gpu.holds)
    assert abs(p["a"] - 30) <= 2, (p, got)


def test_the_controller_says_why_its_guests_are_held_by_time_and_who_made_it_so():
    # for the host's log (vmgpud: "guests held by time, not on SM spans"): a guest off its span,
    # which it can bring about itself, costs every guest on the GPU the overlap of spans
    def why(lever="sms", groups=16, whole=(), guests=("a", "b")):
        gpu = Gpu(dict.fromkeys(guests, 5000.0))
        gpu.groups, gpu.whole = groups, set(whole)
        ctl = ShareController(lever=lever)
        gpu.run(ctl, 5)
        return ctl.by_time

    assert why() is None
    assert why(whole=["b"]) == ("its work off its span", ("b",))
    assert why(groups=0) == ("the forwarders do not partition this GPU", ())
    # (forwarders that do not partition say every guest's work is off its span: nobody is blamed)
    assert why(groups=0, whole=["a", "b"]) == ("the forwarders do not partition this GPU", ())
    assert why(groups=2, guests=("a", "b", "c")) == ("more guests at work than groups of SMs", ("a", "b", "c"))
    assert why(lever="time", groups=0) is None  # (by time by choice)
    assert why(whole=["b"], guests=("b",)) is None  # (alone: nobody is held for anybody)


def test_under_the_sms_lever_more_guests_than_groups_are_held_by_time():
    # three to share and two groups of SMs: no spans (each needs a group), held by time instead
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.weight.update(a=10, b=10, c=80)
    gpu.groups = 2
    got = settled(gpu, 20, 20, lever="sms")
    p = parts(got)
    assert all(s == (0, 0) for s in gpu.spans.values()), gpu.spans
    assert abs(p["c"] - 80) <= 3, (p, got)


def _ranked(weights: dict[str, int], ranks: dict[str, int], groups: int = 16) -> Gpu:
    gpu = Gpu(dict.fromkeys(weights, 5000.0))
    gpu.weight.update(weights)
    gpu.rank.update(ranks)
    gpu.groups = groups
    return gpu


def test_under_the_sms_lever_a_higher_guest_has_its_part_of_the_sms_left_free_and_a_lower_one_runs_beside_it():
    # the priority reserve: an inference guest (high, weight 30) always at work beside a trainer
    # (normal, 70).  By time the trainer waits while the higher guest works, here all the time; on
    # spans it runs on the far 70% of the SMs, the higher guest on the whole GPU with its 30% free
    gpu = _ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1})
    got = settled(gpu, 5, 10, lever="sms")
    # (0.3 of 16 groups is 4.8: five whole groups, so that none is the trainer's part of each period)
    assert gpu.spans == {"hp": (0, 0), "tr": (80, 256)}, gpu.spans
    assert gpu.holds == {"hp": 0, "tr": 0}, gpu.holds
    assert got["tr"] > 0.6 and got["hp"] > 0.7, got  # (the model: the higher guest shares the lower one's SMs)
    by_time = settled(_ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1}, groups=0), 5, 10, lever="sms")
    assert by_time["tr"] < 0.05, by_time  # (the reserve is what lets it run)


def test_the_priority_reserve_splits_the_rest_among_the_lower_guests_by_weight_each_at_least_a_group():
    gpu = _ranked({"hp": 20, "a": 30, "b": 50}, {"hp": 2, "a": 1, "b": 0})
    settled(gpu, 3, 1, lever="sms")
    (alo, ahi), (blo, bhi) = gpu.spans["a"], gpu.spans["b"]
    assert gpu.spans["hp"] == (0, 0) and alo == 64 and ahi == blo and bhi == 256, gpu.spans  # (3.2: 4 groups)
    assert abs((ahi - alo) / (bhi - blo) - 30 / 50) < 0.02, gpu.spans
    # a guarantee of 80 gives the higher guest 86.7% (14 groups): the two lower ones a group each;
    # one of 90, 93.3% (15 groups): one group left for two, too few, and none is given a span
    for guarantee, spans in ((80, {"hp": (0, 0), "a": (224, 240), "b": (240, 256)}), (90, None)):
        gpu = _ranked({"hp": 100, "a": 100, "b": 100}, {"hp": 2, "a": 1, "b": 1})
        gpu.guarantee["hp"] = guarantee
        settled(gpu, 3, 1, lever="sms")
        assert gpu.spans == (spans or dict.fromkeys(gpu.spans, (0, 0))), (guarantee, gpu.spans)


@pytest.mark.parametrize("lever", ["time", "depth"])
def test_no_priority_reserve_off_the_sms_levers(lever):
    gpu = _ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1})
    settled(gpu, 3, 1, lever=lever)
    assert all(s == (0, 0) for s in gpu.spans.values()), gpu.spans


def test_no_priority_reserve_where_higher_guests_share_among_themselves():
    # two high guests on spans of their own over the whole GPU: no part of it is free of them, so
    # the lower guest is given none and waits in its ring while they work, as by time
    gpu = _ranked({"h1": 30, "h2": 70, "tr": 100}, {"h1": 2, "h2": 2, "tr": 1})
    settled(gpu, 10, 1, lever="sms")
    assert gpu.spans["tr"] == (0, 0) and gpu.spans["h1"] != (0, 0), gpu.spans


def test_a_higher_guests_rate_beside_lower_guests_on_a_reserve_is_not_taken_for_its_rate_alone():
    # alone among its priority, a guest's rate is its rate alone, but not while lower guests work
    # beside it on the reserve's spans (at 0.77 of alone on the model): taken for it, a second high
    # guest coming would find the first ahead of its share by that much
    gpu = _ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1})
    ctl = ShareController(lever="sms")
    gpu.run(ctl, 5)
    hp = next(g for k, g in ctl.guests.items() if k[1] == "hp")
    assert hp.alone == 0, hp.alone  # (not measured: a probe measures it once another shares)
    gpu.busy["tr"] = False
    gpu.run(ctl, 3)
    assert hp.alone > 0.95 * 5000, hp.alone  # (alone for a whole window: measured)


def test_the_priority_reserve_goes_when_the_higher_guest_does():
    got = _spans_lifted_when_idle(_ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1}), "tr", "hp", 3, 2)
    assert got["tr"] > 0.9, got


@pytest.mark.parametrize("lever", ["time", "sms"])
def test_a_capped_lower_guest_is_held_by_its_cap_beside_a_higher_one(lever):
    # nobody's share holds a lower guest, but its cap does (before, it was given no hold at all,
    # and ran uncapped whenever the higher guest was at work)
    gpu = _ranked({"hp": 30, "tr": 70}, {"hp": 2, "tr": 1})
    gpu.cap["tr"] = 40
    settled(gpu, 3, 1, lever=lever)
    assert gpu.holds["tr"] == 600, gpu.holds


def test_seen_on_a_page_tells_a_guest_off_its_span_for_a_second():
    from vmgpu.sched import Member
    from vmgpu.share_control import seen_on

    class Page:
        def __init__(self, whole_ms):
            self.m = [Member(0, "a", 1, 30, 0, 0, 0, 1, whole_ms=whole_ms)]

        def members(self):
            return self.m

    now = 5000.0  # 5,000,000 ms
    assert seen_on(Page(0), now)[0].whole is False  # never
    assert seen_on(Page(5_000_000 - 400), now)[0].whole is True
    assert seen_on(Page(5_000_000 + 3), now)[0].whole is True  # (a tick that read the clock just after)
    assert seen_on(Page(5_000_000 - 1500), now)[0].whole is False  # over a second ago


def test_seen_on_a_page_tells_a_guest_waiting_at_its_gate():
    from vmgpu.sched import Member
    from vmgpu.share_control import seen_on

    class Page:
        def members(self):
            return [Member(0, "a", 1, 30, 0, 0, 0, 1), Member(1, "b", 2, 70, 0, 0, 2, 1)]

    assert [m.waiting for m in seen_on(Page(), 5000.0)] == [False, True]


def _ten_second_parts(lever: str, rounds: bool, lead: float = 8) -> list[float]:
    """The light guest's part of 30/70 (equal rates alone, speeds on spans as an H100 trainer's)
    over 10 s windows, as the sharing bench measures it, after several warm-ups."""
    out = []
    for seed in range(4):
        gpu = Gpu({"a": 30000.0, "b": 30000.0})
        gpu.weight.update(a=30, b=70)
        gpu.groups = 15 if lever != "time" else 0
        gpu.sm_speed = lambda x: x**0.66
        ctl = ShareController(lever=lever, rounds=rounds)
        gpu.run(ctl, lead + 0.7 * seed)
        out += [parts(gpu.run(ctl, 10))["a"] for _ in range(3)]
    return out


@pytest.mark.parametrize("lever", ["time", "sms", "smsover"])
def test_probes_in_rounds_keep_each_ten_seconds_at_the_parts_where_lone_probes_move_them(lever):
    # a lone probe runs its guest alone and holds the other: a 10 s window with one of the light
    # guest's gets it 31.5-32%, with one of the heavy guest's 29.3%; a round gives each its part.
    # Past the guests' youth (YOUNG_S), every window within 0.5 pp; in it, where rounds come every
    # 4 s, a window that cuts a round between its two turns is off by up to 2 pp
    lone, rounds = _ten_second_parts(lever, False), _ten_second_parts(lever, True)
    assert sum(lone) / len(lone) - 30 >= 0.7 and sum(abs(p - 30) > 0.5 for p in lone) >= 10, lone
    assert abs(sum(rounds) / len(rounds) - 30) <= 0.3 and max(abs(p - 30) for p in rounds) <= 2, rounds
    grown = _ten_second_parts(lever, True, lead=20)
    assert abs(sum(grown) / len(grown) - 30) <= 0.2 and max(abs(p - 30) for p in grown) <= 0.5, grown


@pytest.mark.parametrize(
    ("weights", "lengths"),
    [((30, 70), [0.3, 0.7]), ((10, 20, 30, 40), [0.3, 0.6, 0.9, 1.2]), ((5, 95), [0.3, 2.0])],
)
def test_a_round_probes_each_guest_alone_for_its_target_part_of_the_round(weights, lengths):
    # each guest in turn, the least for a lone probe's 0.3 s, none past ROUND_MAX_S (2 s)
    names = "abcd"[: len(weights)]
    gpu = Gpu(dict.fromkeys(names, 5000.0), together={1: 1.0, 2: 0.6, 3: 0.45, 4: 0.36})
    gpu.weight.update(dict(zip(names, weights, strict=True)))
    ctl = ShareController()
    gpu.run(ctl, 12)  # (every rate alone sure: lone probes only before that)
    seen, was = [], None
    for _ in range(400):
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe is not was:
            seen.append((ctl.probe.whose[1], round(ctl.probe.length, 2), round(gpu.now, 1)))
        was = ctl.probe
        if len(seen) >= len(names) and not ctl.round_next and ctl.probe is None:
            break
    got = dict((n, length) for n, length, _ in seen[: len(names)])
    assert got == dict(zip(names, lengths, strict=True)), seen
    # one after another, each as soon as the one before ended
    starts = [t for *_, t in seen[: len(names)]]
    assert all(abs((b - a) - got[n]) <= 0.15 for (n, _, a), b in zip(seen, starts[1:], strict=False)), seen


def _into_a_round(gpu: Gpu, ctl: ShareController, warm: float = 12) -> None:
    """Run until a round of probes is under way."""
    gpu.run(ctl, warm)
    for _ in range(600):
        if ctl.round_of is not None:
            return
        gpu.run(ctl, 0.1)
    raise AssertionError("no round came")


def test_a_newcomer_or_a_weight_changed_in_a_round_ends_it_at_the_next_look():
    # a round holds every guest but the one it probes, for up to ROUND_MAX_S each: a guest that
    # begins to work meanwhile is seen to at once (as after a lone probe of 0.3 s), and so is a
    # change of weight (its open parts moved at once)
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.weight.update(a=5, b=95)
    gpu.busy["c"] = False
    ctl = ShareController()
    _into_a_round(gpu, ctl)
    before = gpu.calls["c"]
    gpu.busy["c"] = True
    gpu.run(ctl, 0.3)
    assert ctl.round_of is None and gpu.calls["c"] - before > 300, (ctl.probe, gpu.calls["c"] - before)
    gpu.busy["c"] = False
    _into_a_round(gpu, ctl, 2)
    gpu.weight.update(a=50, b=50)
    gpu.run(ctl, 0.2)
    assert ctl.round_of is None and ctl.probe is None


def test_a_guest_idle_when_its_turn_in_a_round_comes_is_passed_over():
    gpu = Gpu({"a": 5000.0, "b": 5000.0, "c": 5000.0})
    gpu.weight.update(a=5, b=5, c=90)
    ctl = ShareController()
    _into_a_round(gpu, ctl)
    first, rest = ctl.probe.whose[1], [k[1] for k, _ in ctl.round_next]
    idle = rest[-1]
    gpu.busy[idle] = False  # (its work waits at its gate no more)
    probed = set()
    while ctl.round_of is not None:
        gpu.run(ctl, 0.1)
        if ctl.probe is not None:
            probed.add(ctl.probe.whose[1])
    assert idle not in probed and first not in rest, (probed, idle)


def test_a_capped_guests_turn_in_a_round_is_its_caps_part_not_its_weights():
    # probed, a guest runs uncapped: its turn is sized by what its cap leaves it
    ctl = ShareController()
    keys = {(0, "a"): Seen(0, "a", 0, 30), (1, "b"): Seen(1, "b", 0, 70, cap=20)}
    ctl.step(1000.0, list(keys.values()))  # (known to it)
    lengths = {k[1]: round(length, 2) for k, length in ctl._round(keys, list(keys))}
    assert lengths == {"a": 0.45, "b": 0.3}, lengths


def test_a_round_left_when_the_policy_leaves_shared_is_not_carried_on_when_it_comes_back():
    from vmgpu.share_control import apply_step

    gpu = Gpu({"a": 5000.0, "b": 5000.0})
    gpu.weight.update(a=30, b=70)
    ctl = ShareController()
    _into_a_round(gpu, ctl)
    assert ctl.round_next

    class Page:
        policy = "weighted"

        def members(self):
            return []

    apply_step(Page(), ctl, gpu.now)
    assert (ctl.probe, ctl.round_next, ctl.round_of, ctl.guests) == (None, [], None, {})


def test_a_guest_given_up_on_breaks_no_round_of_its_rank_but_does_one_below_it():
    # (a review: exempt from every round, a higher guest given up on was held through a lower
    # round, up to ROUND_MAX_S a turn, against its priority)
    ab = [(0, "a"), (1, "b")]
    for rank, broken in ((1, False), (2, True)):
        ctl = ShareController()
        keys = {(0, "a"): Seen(0, "a", 100), (1, "b"): Seen(1, "b", 100), (2, "c"): Seen(2, "c", 50, rank=rank)}
        ctl.step(1000.0, list(keys.values()))
        ctl.guests[(2, "c")].refused = 3  # (its last three probes refused: given up on)
        ctl.round_of = (frozenset(ab), 1, ctl._round_targets(keys, ab), {k: s.calls for k, s in keys.items()})
        keys[(2, "c")] = Seen(2, "c", 60, rank=rank)  # (at work)
        assert ctl._round_broken(keys) is broken, rank


def test_a_guest_given_up_on_that_works_on_between_its_probes_is_probed_again_ever_further_apart():
    # (a review: one that works on but stops in each of its probes was retried every 4 s for as
    # long as it liked, since it had worked each window through: 16 probes in 60 s, the others
    # held for two looks of each; the quick retry is had once, then they double)
    _, honest_probes, honest_held = _against("honest")
    _, probes, held = _against("dodge")
    assert probes["c"] <= REFUSED_MAX + 5, probes
    assert held["b"] <= honest_held["b"] + 1500, (held, honest_held)


def test_a_newcomer_beside_only_a_guest_given_up_on_is_measured_and_neither_is_held_for_the_other():
    # (a review: with its one partner given up on, a newcomer was never probed, so both stayed
    # unmeasured, and were held in the same part of each period, the GPU idle then)
    gpu = Gpu({"a": 5000.0, "b": 8000.0, "c": 6000.0, "d": 7000.0})
    gpu.weight.update(a=30, b=70)
    gpu.gone, gpu.busy["d"], gpu.busy["c"] = {"d"}, False, False
    ctl = ShareController()
    gpu.run(ctl, 20)
    for i in range(300):  # (c at work 0.1 s of every second: given up on)
        gpu.busy["c"] = i % 10 == 0
        gpu.run(ctl, 0.1)
    assert ctl._given_up(ctl.guests[ctl_key(ctl, "c")])
    gpu.gone, gpu.busy["d"] = {"a", "b"}, True
    gpu.busy.update(a=False, b=False)
    who, was = [], None
    for i in range(40):
        gpu.busy["c"] = i % 10 == 0
        gpu.run(ctl, 0.1)
        if ctl.probe is not None and ctl.probe is not was:
            who.append(ctl.probe.whose[1])
        was = ctl.probe
    d = ctl.guests[ctl_key(ctl, "d")]
    assert "d" in who and abs(d.alone - 7000) <= 700, (who, d)
