"""A guest's GPU time read from a GPU's scheduler page without its lock (vmgpu/sched.py
Page.gpu_time) while a forwarder changes it, and the counter vmgpud exports from those looks
(vmgpu/metrics.py GpuTimeCounters).

The page here is a fake one whose forwarder makes the stores of a charge and a hand-over (as
sched_policy.c's sched_charge and sched_give_turn make them, within the slots' time_seq) between
the loads the reader makes, starting anywhere from well before the reader's first look to its
fourth, at several paces (a store every load, to one every 60: a forwarder that lost its CPU in
the middle of a change): whatever it overlaps, a look must give what the page held at some
moment between two changes, never a stretch counted twice.  Before the slots' time_seq (and with the old order of
loads: the charge point first) a look between a charge's two stores had the stretch twice, and
the next look was smaller: vmgpud's counter stepped back, a spike in Prometheus's rate()."""

from __future__ import annotations

import pytest

from vmgpu import metrics, sched
from vmgpu.sched import Seat

NOW = 100_000  # the reader's clock (ns) throughout
A, B = 0, 1  # the two members' slots


class Struct:
    """A page or a slot as ctypes shows it, each load of a field first letting the writer store."""

    def __init__(self, writer, **fields):
        object.__setattr__(self, "_writer", writer)
        object.__setattr__(self, "_v", fields)

    def __getattr__(self, name):
        self._writer.before_load()
        return self._v.get(name, b"" if name == "name" else 0)

    def __setattr__(self, name, value):  # the writer's stores (and Page's controls, unused here)
        self._v[name] = value


class Writer:
    """A forwarder's changes as single stores [(struct, field, value)], the k-th made before the
    reader's load number start + k * pace (those before its first: made when it begins)."""

    def __init__(self, start: int, pace: int):
        self.start, self.pace, self.loads, self.made, self.stores = start, pace, 0, 0, []

    def before_load(self):
        while self.made < len(self.stores) and self.start + self.made * self.pace <= self.loads:
            struct, field, value = self.stores[self.made]
            struct._v[field] = value
            self.made += 1
        self.loads += 1


def page_with(writer: Writer) -> sched.Page:
    pg = Struct(writer, gen=0, owner=A, hold_start=1_000)
    pg._v["slot"] = [
        Struct(writer, pid=11, joined_ns=1, name=b"a", weight=50, used_ns=5_000, time_seq=0),
        Struct(writer, pid=22, joined_ns=2, name=b"b", weight=50, used_ns=3_000, time_seq=0),
    ]
    page = sched.Page.__new__(sched.Page)
    page.page = pg
    return page


def value(pg: Struct) -> dict[str, int]:
    """Each guest's GPU time at NOW as the page holds it now, read whole."""
    owner, start = pg._v["owner"], pg._v["hold_start"]
    return {
        s._v["name"].decode(): s._v["used_ns"] + (max(0, NOW - start) if i == owner else 0)
        for i, s in enumerate(pg._v["slot"])
    }


def seq(s: Struct, step: int):
    return (s, "time_seq", s._v["time_seq"] + step)


def end_turn(pg: Struct, at: int, charge_point_first: bool) -> list[list[tuple]]:
    """a's turn ends at `at`: charged, then the GPU handed to b; each change a list of stores,
    within the time_seq of the slots whose GPU time it changes (sched_policy.c).  The stores
    inside in the forwarders' order (the charge point first) or the other (as they were before)."""
    a, b = pg._v["slot"]
    moved, added = (pg, "hold_start", at), (a, "used_ns", a._v["used_ns"] + at - pg._v["hold_start"])
    charge = [seq(a, 1), *((moved, added) if charge_point_first else (added, moved)), seq(a, 2)]
    start, owner = (pg, "hold_start", at), (pg, "owner", B)
    stores = (start, owner) if charge_point_first else (owner, start)
    hand_over = [seq(a, 3), seq(b, 1), *stores, seq(b, 2), seq(a, 4)]
    return [charge, hand_over]


def whole_values(pg: Struct, changes: list[list[tuple]]) -> list[dict[str, int]]:
    """What the page holds between changes: before, after the first, ..."""
    out = [value(pg)]
    saved = {id(s): dict(s._v) for s in (pg, *pg._v["slot"])}
    for change in changes:
        for struct, field, v in change:
            struct._v[field] = v
        out.append(value(pg))
    for s in (pg, *pg._v["slot"]):  # as it was: the writer makes the changes as the reader looks
        s._v.clear()
        s._v.update(saved[id(s)])
    return out


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    monkeypatch.setattr(sched.time, "monotonic_ns", lambda: NOW)
    monkeypatch.setattr(sched.os, "sched_yield", lambda: None)


@pytest.mark.parametrize("charge_point_first", [True, False], ids=["forwarders-order", "other-order"])
@pytest.mark.parametrize("pace", [1, 2, 5, 13, 60])
def test_a_look_at_gpu_time_is_never_one_that_a_change_in_the_middle_tore(charge_point_first, pace):
    torn = []
    for start in range(-10 * pace, 120):  # (from a change that began well before the reader)
        writer = Writer(start, pace)
        page = page_with(writer)
        changes = end_turn(page.page, 40_000, charge_point_first)
        whole = whole_values(page.page, changes)
        writer.stores = [store for change in changes for store in change]
        now, seen = page.gpu_time()
        assert now == NOW
        if seen not in whole:
            torn.append((start, seen))
    assert not torn, f"looks a change tore (first store before load, GPU time): {torn[:5]}; whole: {whole}"


def test_a_look_is_taken_again_while_a_change_is_half_made_and_the_last_is_taken_at_the_end(monkeypatch):
    """A slot's time_seq odd (a forwarder in the middle of a charge, the charge added, its point
    not moved): the reader looks again until it is even, GPU_TIME_TRIES times at most, giving the
    CPU up between looks (the forwarder may need it to finish)."""
    yields = []
    monkeypatch.setattr(sched.os, "sched_yield", lambda: yields.append(1))
    page = page_with(Writer(10**9, 1))  # (a writer that stores nothing itself)
    a = page.page._v["slot"][A]
    a._v.update(time_seq=1, used_ns=44_000)  # charged to 40_000; hold_start still 1_000
    _, seen = page.gpu_time()
    assert len(yields) == sched.GPU_TIME_TRIES - 1  # every look taken, the last one kept
    assert seen == {"a": 44_000 + NOW - 1_000, "b": 3_000}  # (torn: all there is to take)

    # the change completes after the third look: the look after it is whole, and the last
    def finish():
        yields.append(1)
        if len(yields) == 3:
            page.page._v["hold_start"] = 40_000
            a._v["time_seq"] = 2

    yields.clear()
    page = page_with(Writer(10**9, 1))
    a = page.page._v["slot"][A]
    a._v.update(time_seq=1, used_ns=44_000)
    monkeypatch.setattr(sched.os, "sched_yield", finish)
    _, seen = page.gpu_time()
    assert seen == {"a": 44_000 + NOW - 40_000, "b": 3_000}
    assert len(yields) == 3


def test_gpu_time_by_seat_names_each_membership():
    page = page_with(Writer(10**9, 1))
    now, seats = page.gpu_time_by_seat()
    assert seats == {Seat(A, "a", 11, 1): 5_000 + NOW - 1_000, Seat(B, "b", 22, 2): 3_000}


def test_the_exported_counter_never_steps_back_while_its_seats_stay():
    c, uuid = metrics.GpuTimeCounters(), "GPU-0"
    a, b = Seat(0, "a", 11, 1), Seat(1, "b", 22, 2)
    assert c.take(uuid, {a: 100, b: 50}) == {"a": 100, "b": 50}
    # a look that counted more than the forwarder charged after (the idle end of a turn passed
    # over, a change's time stamp): held where it was until the time catches up
    assert c.take(uuid, {a: 90, b: 60}) == {"a": 100, "b": 60}
    assert c.take(uuid, {a: 95, b: 60}) == {"a": 100, "b": 60}
    assert c.take(uuid, {a: 130, b: 60}) == {"a": 130, "b": 60}
    # another GPU's counters are its own
    assert c.take("GPU-1", {a: 7}) == {"a": 7}
    assert c.take(uuid, {a: 131, b: 61}) == {"a": 131, "b": 61}


def test_the_exported_counter_starts_again_from_zero_only_for_a_new_seat():
    c, uuid = metrics.GpuTimeCounters(), "GPU-0"
    a, b = Seat(0, "a", 11, 1), Seat(1, "b", 22, 2)
    assert c.take(uuid, {a: 100, b: 50}) == {"a": 100, "b": 50}
    # a's forwarder started again (another pid, seated anew, its time from 0): a reset
    a2 = Seat(0, "a", 33, 9)
    assert c.take(uuid, {a2: 5, b: 50}) == {"a": 5, "b": 50}
    assert c.take(uuid, {a2: 4, b: 50}) == {"a": 5, "b": 50}
    # b gone from the page, then back in the same slot by the same pid (seated again): from 0
    assert c.take(uuid, {a2: 6}) == {"a": 6}
    assert c.take(uuid, {a2: 6, b: 1}) == {"a": 6, "b": 1}
    # a guest with two memberships on the GPU: their sum, held while both stay
    a3 = Seat(2, "a", 44, 10)
    assert c.take(uuid, {a2: 6, a3: 10, b: 1}) == {"a": 16, "b": 1}
    assert c.take(uuid, {a2: 6, a3: 9, b: 1}) == {"a": 16, "b": 1}


def test_vmgpud_exports_gpu_time_that_never_steps_back_across_scrapes(monkeypatch):
    """UsageCollector: the looks at the page (here scripted: one counted 30 us more than the next)
    become a counter that holds still rather than step back."""
    from types import SimpleNamespace

    a = Seat(0, "a", 11, 1)
    looks = iter([{a: 1_000_000}, {a: 1_030_000}, {a: 1_000_000}, {a: 1_040_000}])
    monkeypatch.setattr(metrics, "_gpu_time", lambda uuid: next(looks))
    ledger = SimpleNamespace(
        usage=lambda: [SimpleNamespace(index=0, uuid="GPU-0")], forwarders=lambda: [], reservations=lambda g=None: []
    )
    collector = metrics.UsageCollector(ledger, metrics.threading.Lock(), SimpleNamespace(restarted={}))

    def scrape() -> float:
        family = next(f for f in collector.collect() if f.name == "vmgpu_guest_gpu_time_seconds")
        (sample,) = [s for s in family.samples if s.name.endswith("_total")]
        return sample.value

    seen = [scrape() for _ in range(4)]
    assert seen == sorted(seen) and seen == [0.001, 0.00103, 0.00103, 0.00104]
