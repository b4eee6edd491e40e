"""bench/run_sharing.py's measures under the shared policy, on made-up page samples (time, GPU
time, work calls, turns per guest, as its Sampler records them): how long a live weight change
takes to converge, and how long a guest takes to go at its rate alone once the other stops."""

import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("run_sharing", ROOT / "bench" / "run_sharing.py")
run_sharing = sys.modules.setdefault("run_sharing", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(run_sharing)


def _samples(rates, until: float, every: float = 0.001) -> list:
    """Samples every `every` s up to `until` of guests whose calls/s at time t are rates[g](t)."""
    out, calls, t = [], {}, 0.0
    while t <= until + 1e-9:
        out.append((t, {}, dict(calls), {}))
        for g, rate in rates.items():
            calls[g] = calls.get(g, 0) + rate(t) * every
        t += every
    return out


def test_a_weight_change_converges_when_two_half_seconds_in_a_row_hold_the_new_parts():
    # equal rates alone; a's part is 50% until 0.3 s after the change at 5 s, then 20%
    at = 5.0
    samples = _samples(
        {"a": lambda t: 500 if t < at + 0.3 else 200, "b": lambda t: 500 if t < at + 0.3 else 800}, 10, 0.01
    )
    got = run_sharing.converge_parts(samples, at, 9.8, "a", "b", {"a": 1000.0, "b": 1000.0}, 20)
    assert 0.75 <= got <= 0.85, got  # the first whole window after the move ends 0.8 s after the change
    # parts by each guest's rate alone: b twice as fast alone, so the same calls are half its progress
    uneven = run_sharing.converge_parts(samples, at, 9.8, "a", "b", {"a": 1000.0, "b": 2000.0}, 20)
    assert uneven == math.inf, uneven  # a at 200/1000 beside b at 800/2000: 33%, never 20
    never = _samples({"a": lambda t: 500, "b": lambda t: 500}, 10, 0.01)
    assert run_sharing.converge_parts(never, at, 9.8, "a", "b", {"a": 1000.0, "b": 1000.0}, 20) == math.inf


def test_reclaim_is_from_the_leavers_last_call_to_the_stayer_at_its_rate_alone():
    # the leaver stops at 2 s; the stayer, held to half its rate until 30 ms later, then alone
    samples = _samples({"stay": lambda t: 5000 if t < 2.03 else 10000, "go": lambda t: 8000 if t < 2.0 else 0}, 4)
    got = run_sharing.reclaim_rate_ms(samples, "stay", "go")
    assert 20 <= got <= 40, got
    slow = _samples({"stay": lambda t: 5000 if t < 2.5 else 10000, "go": lambda t: 8000 if t < 2.0 else 0}, 4)
    assert 490 <= run_sharing.reclaim_rate_ms(slow, "stay", "go") <= 510
    idle = _samples({"stay": lambda t: 5000, "go": lambda t: 0}, 4)
    assert math.isnan(run_sharing.reclaim_rate_ms(idle, "stay", "go"))  # the leaver never worked
    # the stayer done at 3.5 s and both gone from the page for the last samples (their
    # forwarders stopped): its rate alone is from its own calls, not the samples after them
    ended = _samples(
        {"stay": lambda t: 5000 if t < 2.03 else 10000 if t < 3.5 else 0, "go": lambda t: 8000 if t < 2.0 else 0}, 4
    )
    ended += [(4.001 + i / 1000, {}, {}, {}) for i in range(200)]
    assert 20 <= run_sharing.reclaim_rate_ms(ended, "stay", "go") <= 40


def test_the_tracer_keeps_the_holds_and_writes_what_the_controller_saw_every_half_second_and_in_probes():
    import io

    from vmgpu.sched import Member
    from vmgpu.share_control import ShareController, _Guest, _Probe

    members = [Member(0, "a", 1, 30, 0, 0, 0, 1, hold=300, sm_part=0 << 16 | 48), Member(1, "b", 2, 70, 0, 0, 0, 1)]
    ctl, out, holds = ShareController(lever="sms"), io.StringIO(), {"a": [], "b": []}
    seen = run_sharing.tracer(out, holds)
    for _ in range(10):
        seen(members, ctl)
    assert holds == {"a": [300] * 10, "b": [0] * 10}
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "spans [(0, 48), (0, 0)]" in lines[0], lines  # every fifth look
    ctl.probe = _Probe((0, "a"), 0.0)
    seen(members, ctl)
    assert len(out.getvalue().splitlines()) == 3  # and at each look in a probe
    a, b = ctl.guests.setdefault((0, "a"), _Guest()), ctl.guests.setdefault((1, "b"), _Guest())
    a.probes.extend([30450.4, 30550.0])
    b.short = 21000.0
    seen(members, ctl)
    assert out.getvalue().splitlines()[-1].endswith("reads {'a': [30450, 30550], 'b': ['short 21000']}")
    run_sharing.tracer(None)(members, ctl)  # (no trace, no holds: nothing kept, nothing fails)


def test_converge_weighs_progress_by_the_rates_alone_known_at_the_windows_end_not_after():
    # the light guest's rate alone read anew after the heavy one stopped (its run winding down):
    # a's part by that rate would be 23%, by the one known during the window 20%
    seen = [(4.0, {"a": 1000.0, "b": 0}), (6.0, {"a": 1000.0, "b": 1000.0}), (9.9, {"a": 830.0, "b": 1000.0})]
    assert run_sharing.alone_at(seen, 9.8) == {"a": 1000.0, "b": 1000.0}
    assert run_sharing.alone_at(seen, 5.0) == {}  # (b's not yet measured)
    samples = _samples({"a": lambda t: 200, "b": lambda t: 800}, 10, 0.01)
    assert run_sharing.converge_parts(samples, 5.0, 9.8, "a", "b", run_sharing.alone_at(seen, 9.8), 20) < 1
    assert run_sharing.converge_parts(samples, 5.0, 9.8, "a", "b", seen[-1][1], 20) == math.inf


def test_the_shared_rows_are_compared_with_each_native_mps_split_named_by_its_light_part(monkeypatch):
    """--mps-refs 30/70,22/78: each split's native pair is a row, and the shared totals are
    compared with each (the weights' split under the summary's old name, another under _atLIGHT)."""
    rates = {(30, 70): (500.0, 900.0), (22, 78): (400.0, 1000.0)}  # img/s, light and heavy
    monkeypatch.setattr(run_sharing, "MPS_REFS", [(30, 70), (22, 78)])
    monkeypatch.setattr(run_sharing, "SKIP", {"mpssame"})  # (the split at the same shares: the tests below)
    monkeypatch.setattr(run_sharing, "nosched_pair", lambda g, run: 1200.0)
    monkeypatch.setattr(run_sharing, "mps_start", lambda tmp: {"CUDA_MPS_PIPE_DIRECTORY": "/x"})
    monkeypatch.setattr(run_sharing, "mps_stop", lambda env: None)
    seen = []
    monkeypatch.setattr(
        run_sharing,
        "native_mps_pair",
        lambda run, env, split: seen.append(split) or [{"img_per_s": r} for r in rates[split]],
    )
    rows, summary = [], {"shared_total": 1.26}
    text = run_sharing.shared_references(None, None, rows, summary, 1000.0, 1000.0, Path("/tmp"), True)
    assert seen == [(30, 70), (22, 78)]
    assert [r[0] for r in rows] == [
        "MPS 30/70 (native): shares (normalised)",
        "MPS 22/78 (native): shares (normalised)",
    ]
    assert text == ", no-sched 1.20, MPS 30/70 (native) 1.40, MPS 22/78 (native) 1.40"
    assert math.isclose(summary["aggregate_shared_vs_mps"], 1.26 / 1.4)
    assert math.isclose(summary["aggregate_shared_vs_mps_at22"], 1.26 / 1.4)
    assert math.isclose(summary["aggregate_shared_vs_nosched"], 1.26 / 1.2)


def test_the_next_mps_split_is_where_the_power_model_puts_the_weights_parts():
    """One point (30/70 gave the light trainer 34.8% of the pair, as on an H100): the line through
    equal limits and equal parts puts 30% at 24/76; two points: the line through them; a split
    already measured, or a line that does not rise, gives none."""
    assert run_sharing.next_mps_light([(30, 34.8)], 30.0) == 24
    assert run_sharing.next_mps_light([(30, 34.8), (24, 28.9)], 30.0) == 25
    assert run_sharing.next_mps_light([(30, 34.8), (25, 29.8)], 30.0) is None  # (25 again)
    assert run_sharing.next_mps_light([(30, 34.8), (24, 36.0)], 30.0) is None  # (fewer threads, more part)
    assert run_sharing.next_mps_light([(50, 50.0)], 30.0) is None  # (no line through the origin)
    assert run_sharing.next_mps_light([], 30.0) is None


def _mps_by_power(curve: float, seen: list):
    """A native MPS pair whose trainers go at (limit/100)^curve of 1000 img/s alone."""

    def pair(run, env, split):
        seen.append(split)
        return [{"img_per_s": 1000.0 * (pct / 100) ** curve} for pct in split]

    return pair


def _mps_refs_at_the_weights(monkeypatch):
    """shared_references with its one MPS reference at 30/70, the split at the same shares looked
    for, and nothing started."""
    monkeypatch.setattr(run_sharing, "MPS_REFS", [(30, 70)])
    monkeypatch.setattr(run_sharing, "SKIP", set())
    monkeypatch.setattr(run_sharing, "nosched_pair", lambda g, run: 1000.0)
    monkeypatch.setattr(run_sharing, "mps_start", lambda tmp: {"CUDA_MPS_PIPE_DIRECTORY": "/x"})
    monkeypatch.setattr(run_sharing, "mps_stop", lambda env: None)


def test_the_shared_rows_are_compared_with_mps_at_the_split_that_delivers_the_weights_shares(monkeypatch):
    """Trainers whose speed goes as limit^0.66: 30/70 gives parts 36/64; the bench tries the split
    the model gives until the light part is within 1 pp of 30, and compares the shared total with
    that pair's (aggregate_shared_vs_mps_same_shares), beside the comparison at 30/70."""
    seen = []
    _mps_refs_at_the_weights(monkeypatch)
    monkeypatch.setattr(run_sharing, "native_mps_pair", _mps_by_power(0.66, seen))
    rows, summary = [], {"shared_total_sms": 1.20}
    text = run_sharing.shared_references(None, None, rows, summary, 1000.0, 1000.0, Path("/tmp"), True)
    assert seen[0] == (30, 70) and 2 <= len(seen) <= 1 + run_sharing.SAME_SHARES_RUNS
    lo, hi = seen[-1]
    light = 100 * lo**0.66 / (lo**0.66 + hi**0.66)
    assert abs(light - 30) <= 1.0
    total = (lo**0.66 + hi**0.66) / 100**0.66
    assert math.isclose(summary["aggregate_shared_vs_mps_same_shares_sms"], 1.20 / total)
    assert math.isclose(summary["aggregate_shared_vs_mps_sms"], 1.20 / ((30**0.66 + 70**0.66) / 100**0.66))
    assert summary["mps_same_shares_light"] == lo
    assert rows[-1][0] == "MPS at the weights' shares (native)" and rows[-1][1].startswith(f"{lo}/{hi}: parts ")
    assert f"MPS at the weights' shares ({lo}/{hi}, native) {total:.2f}" in text


def test_each_shared_row_is_compared_with_mps_at_its_own_parts_between_the_splits_measured(monkeypatch):
    """The pair's total follows the light guest's part (on an H100 MPS gave 1.05 at 28.3 and 1.09
    at 32.9): each shared row is compared with MPS's total at its own light part, on the line
    between the nearest split measured below it and the nearest above; a row whose part lies
    outside the splits measured has no such reference (nan, said in its row), not a guess."""
    seen = []
    _mps_refs_at_the_weights(monkeypatch)
    monkeypatch.setattr(run_sharing, "native_mps_pair", _mps_by_power(0.66, seen))
    summary = {"shared_total_sms": 1.05, "shared_light_sms": 31.0, "shared_total_smsover": 1.2}
    summary["shared_light_smsover"] = 45.0
    rows = []
    run_sharing.shared_references(None, None, rows, summary, 1000.0, 1000.0, Path("/tmp"), True)
    pts = sorted((100 * lo**0.66 / (lo**0.66 + hi**0.66), (lo**0.66 + hi**0.66) / 100**0.66) for lo, hi in seen)
    (x0, y0) = max(p for p in pts if p[0] <= 31.0)
    (x1, y1) = min(p for p in pts if p[0] >= 31.0)
    assert x0 < 31.0 < x1  # (30/70 gives 36%, the split found about 30%)
    at = y0 + (y1 - y0) * (31.0 - x0) / (x1 - x0)
    assert math.isclose(summary["aggregate_shared_vs_mps_equal_parts_sms"], 1.05 / at)
    assert math.isnan(summary["aggregate_shared_vs_mps_equal_parts_smsover"])  # (45%: past 30/70's 36%)
    said = dict(rows)
    assert (
        f"light part 31.0: together {at:.3f}"
        in said["MPS at the parts of the shared row (sms; native, between the splits measured)"]
    )
    assert (
        "outside the parts measured"
        in said["MPS at the parts of the shared row (smsover; native, between the splits measured)"]
    )
    assert math.isclose(run_sharing.mps_total_at([(28.0, 1.0), (33.0, 1.1)], 30.0), 1.04)
    assert run_sharing.mps_total_at([(28.0, 1.0), (33.0, 1.1)], 27.0) is None
    # (two splits whose parts came out the same count as their mean, whichever side is looked at)
    assert math.isclose(run_sharing.mps_total_at([(28.0, 1.0), (28.0, 1.2), (33.0, 1.1)], 30.0), 1.1)


def test_a_shared_row_just_below_the_lowest_split_gets_one_more_split_below_it(monkeypatch):
    """The split found for the weights' shares comes within 1 pp of 30 from either side; a shared
    row that came out under it (and under 30/70's) would have no MPS reference at its own parts.
    The bench measures one more split, aimed 1.5 pp under the row's part, and compares the row on
    the line between it and the split above; a row far from the weights (45%) is not chased."""
    seen = []
    _mps_refs_at_the_weights(monkeypatch)

    def part(lo, hi):
        return 100 * lo**0.66 / (lo**0.66 + hi**0.66)

    probe = []  # (where mps_same_shares stops on this model, with nothing to bracket)
    monkeypatch.setattr(run_sharing, "native_mps_pair", _mps_by_power(0.66, probe))
    run_sharing.shared_references(None, None, [], {"shared_total_sms": 1.0}, 1000.0, 1000.0, Path("/tmp"), True)
    light = min(part(*s) for s in probe) - 0.7
    monkeypatch.setattr(run_sharing, "native_mps_pair", _mps_by_power(0.66, seen))
    summary = {"shared_total_sms": 1.05, "shared_light_sms": light, "shared_total_smsover": 1.2}
    summary["shared_light_smsover"] = 45.0
    rows = []
    run_sharing.shared_references(None, None, rows, summary, 1000.0, 1000.0, Path("/tmp"), True)
    assert seen[: len(probe)] == probe and len(seen) == len(probe) + 1
    assert part(*seen[-1]) < light  # (the one more split, below the row)
    pts = sorted((part(lo, hi), (lo**0.66 + hi**0.66) / 100**0.66) for lo, hi in seen)
    (x0, y0) = max(p for p in pts if p[0] <= light)
    (x1, y1) = min(p for p in pts if p[0] >= light)
    at = y0 + (y1 - y0) * (light - x0) / (x1 - x0)
    assert math.isclose(summary["aggregate_shared_vs_mps_equal_parts_sms"], 1.05 / at)
    assert math.isnan(summary["aggregate_shared_vs_mps_equal_parts_smsover"])
    assert any("so that each shared row's part has a split either side" in r[0] for r in rows)


def test_where_mps_parts_came_out_out_of_order_the_split_past_a_row_is_a_step_past_the_last_one(monkeypatch):
    """As on an H100: 23/77 gave the light trainer 28.6% and 24/76 28.4% (fewer threads, more
    part: no rising line through them), and the sms row came out at 27.1%.  One more split, two
    threads under the fewest measured, brings a part below the row; the row is then compared at
    its own part."""
    seen = []

    def rates(light_part):
        return [10 * light_part, 10 * (100 - light_part)]

    monkeypatch.setattr(
        run_sharing,
        "native_mps_pair",
        lambda run, env, split: seen.append(split) or [{"img_per_s": r} for r in rates({21: 26.0}[split[0]])],
    )

    measured = {(30, 70): rates(35.3), (23, 77): rates(28.6), (24, 76): rates(28.4)}
    assert run_sharing.next_mps_light([(30, 35.3), (23, 28.6), (24, 28.4)], 27.1 - 1.5) is None
    rows = []
    run_sharing.mps_bracket(None, {}, rows, 1000.0, measured, [27.1, 45.0])
    assert seen == [(21, 79)], seen
    parts = [(100 * r[0] / sum(r), sum(r) / 1000.0) for r in measured.values()]
    assert min(p for p, _ in parts) < 27.1 and run_sharing.mps_total_at(parts, 27.1) is not None
    assert len(rows) == 1 and "a split either side" in rows[0][0]

    # and on the other side: parts out of order above the splits (24/76 30.5, 25/75 30.3), a row
    # at 31.5: a step two threads past the most; with rows both sides, one split a side, each
    # past the row furthest out there; a side whose step would leave 1..99 is given up, not the
    # other's
    def pair(run, env, split):
        seen.append(split)
        return [{"img_per_s": r} for r in rates(30.4 + (split[0] - 24.5) * 1.2)]

    monkeypatch.setattr(run_sharing, "native_mps_pair", pair)
    seen.clear()
    run_sharing.mps_bracket(None, {}, [], 1000.0, {(24, 76): rates(30.5), (25, 75): rates(30.3)}, [31.5])
    assert seen == [(27, 73)], seen  # (33.4)
    seen.clear()
    measured = {(24, 76): rates(30.5), (25, 75): rates(30.3)}
    run_sharing.mps_bracket(None, {}, [], 1000.0, measured, [29.0, 31.5, 32.0])
    assert seen == [(22, 78), (27, 73)], seen  # (27.4 under 29.0, then 33.4 over both)
    assert all(run_sharing.mps_total_at([(100 * r[0] / sum(r), 1.0) for r in measured.values()], x) for x in (29, 32))
    seen.clear()
    monkeypatch.setattr(
        run_sharing,
        "native_mps_pair",
        lambda run, env, split: seen.append(split) or [{"img_per_s": r} for r in rates(33.0)],
    )
    run_sharing.mps_bracket(None, {}, [], 1000.0, {(2, 98): rates(30.5), (3, 97): rates(30.3)}, [28.0, 31.5])
    assert seen == [(5, 95)], seen  # (none at 0 threads for 28.0; 31.5 still served)


def test_without_a_split_within_2_pp_of_the_weights_there_is_no_reference_at_the_same_shares(monkeypatch):
    """Where MPS's parts do not follow its limits (here they stay at 40/60 whatever the split), the
    bench stops after its two more windows and the comparison at the same shares is nan, its row
    saying why, not a comparison with the nearest split."""
    seen = []
    _mps_refs_at_the_weights(monkeypatch)
    monkeypatch.setattr(
        run_sharing,
        "native_mps_pair",
        lambda run, env, split: seen.append(split) or [{"img_per_s": 400.0}, {"img_per_s": 600.0}],
    )
    rows, summary = [], {"shared_total": 1.0}
    run_sharing.shared_references(None, None, rows, summary, 1000.0, 1000.0, Path("/tmp"), True)
    assert len(seen) <= 1 + run_sharing.SAME_SHARES_RUNS
    assert math.isnan(summary["aggregate_shared_vs_mps_same_shares"])
    assert "no reference at the same shares" in rows[-1][1]


def test_the_work_a_stayer_lost_is_the_time_it_was_held_back_whatever_its_bins_do():
    """reclaim_lost_ms: a stayer held to half its rate for 30 ms after the leaver stops lost 15 ms
    of work; one at its rate alone at once, but in bursts (10 ms bins alternating 40% and 160% of its
    rate, which five bins in a row at 80% never see), lost none."""
    samples = _samples({"stay": lambda t: 5000 if t < 2.03 else 10000, "go": lambda t: 8000 if t < 2.0 else 0}, 4)
    assert 13 <= run_sharing.reclaim_lost_ms(samples, "stay", "go") <= 17
    bursty = _samples(
        {
            "stay": lambda t: 5000 if t < 2.0 else (4000 if int(t * 100) % 2 else 16000),
            "go": lambda t: 8000 if t < 2.0 else 0,
        },
        4,
    )
    assert abs(run_sharing.reclaim_lost_ms(bursty, "stay", "go")) <= 5
    assert run_sharing.reclaim_rate_ms(bursty, "stay", "go") == float("inf")
    idle = _samples({"stay": lambda t: 5000, "go": lambda t: 0}, 4)
    assert math.isnan(run_sharing.reclaim_lost_ms(idle, "stay", "go"))


def test_the_reserve_looks_are_counted_within_the_measured_seconds_only():
    """Looks before the go (the guests starting, the reserve not yet in force) and after the end
    do not count."""
    looks = [(0.5, False), (0.9, False), (1.0, True), (1.5, True), (2.0, False), (3.0, True), (3.5, False)]
    assert math.isclose(run_sharing.span_looks(looks, 1.0, 3.0), 3 / 4)
    assert math.isnan(run_sharing.span_looks(looks, 5.0, 6.0))


def test_calls_per_bin_spread_a_sample_past_several_bins_over_them():
    """The trace's calls per 10 ms (a probe's) and per 0.5 s: a sample the sampler took late (the
    controller's look in between) is spread over the bins it spans, not counted in the first."""
    even = [(i * 0.002, 10 * i) for i in range(60)]
    assert run_sharing.per_bin(even, 0.01) == [50] * 11
    late = [(0.0, 0), (0.001, 5), (0.035, 345), (0.04, 400)]  # (34 ms between two samples)
    assert run_sharing.per_bin(late, 0.01) == [95, 100, 100, 105]
    assert run_sharing.per_bin([], 0.5) == [] and run_sharing.per_bin([(1.0, 3)], 0.5) == []


def test_reserve_runs_alternate_with_alone_windows_and_pool_every_request_for_the_p99(monkeypatch, tmp_path):
    """--prio-runs 3 --prio-reserve 30: the reserve row three times, an inference-alone window
    before the second and the third; the pooled ratio is the p99 of all three runs' requests over
    that of all three alone windows' (not a mean of ratios), and each window's requests and the
    controller's looks are kept."""
    import contextlib

    order = []
    # each window's latencies: alone windows 10 ms but one 50 ms request each; reserve runs 11 ms
    # with one slow run (two hundred at 30 ms)
    lat = {"alone": [10.0] * 299 + [50.0], "reserve": [[11.0] * 300, [11.0] * 100 + [30.0] * 200, [11.0] * 300]}

    class FakeRun:
        seconds, tmp = 30.0, tmp_path

        def together(self, guests, during=None):
            args = guests[0][0]
            f = Path(args[args.index("--latencies") + 1])
            kind = "alone" if len(guests) == 1 else "reserve"
            times = lat[kind] if kind == "alone" else lat[kind][sum(k == "reserve" for k in order)]
            order.append(kind)
            f.write_text("".join(f"{100 + i:.6f} {x:.3f}\n" for i, x in enumerate(times)))
            if during:
                during(0.0)
            hp = {"p50_ms": sorted(times)[len(times) // 2], "p99_ms": max(times)}
            return [hp] if kind == "alone" else [hp, {"img_per_s": 700.0}]

    class FakeGuests:
        names = ["infer", "train"]

        def env(self, *flags):
            return {}

        def stop(self):
            pass

    from types import SimpleNamespace

    from vmgpu.sched import Member

    def member(slot, guest, calls, used, whole):
        return Member(slot, guest, 1, 50, used, 0, 0, 1, work_calls=calls, whole_ms=whole)

    @contextlib.contextmanager
    def controlled(g, lever, after):
        # (one look of the controller: the trainer on groups 5-15 of 15, no probe)
        members = [member(0, "infer", 40, 5_000_000, 0), member(1, "train", 900, 70_000_000, 1234)]
        after(members, SimpleNamespace(spans={1: (80, 240)}, probe=None))
        yield None

    monkeypatch.setattr(run_sharing, "controlled", controlled)
    monkeypatch.setattr(run_sharing, "PRIO_RUNS", [3])
    monkeypatch.setattr(run_sharing, "PRIO_RESERVE", [30])
    first = tmp_path / "alone-1.txt"
    first.write_text("".join(f"{i:.6f} {x:.3f}\n" for i, x in enumerate(lat["alone"])))
    order.append("alone")
    keep = tmp_path / "keep"
    keep.mkdir()
    rows, summary = [], {}
    infer_alone = {"p50_ms": 10.0, "p99_ms": 50.0, "busy": 0.25, "file": first}
    run_sharing.reserve_priority(
        FakeGuests(), FakeRun(), rows, summary, ["torch_infer.py"], infer_alone, 1000.0, "/p", keep
    )
    assert order == ["alone", "reserve", "alone", "reserve", "alone", "reserve"]
    assert ("inference alone, run 3: p50 / p99", "10.00 / 50.00 ms") in rows
    pooled_alone = run_sharing.pooled_p99([tmp_path / f"alone-{n}.txt" for n in (1, 2, 3)])
    pooled = run_sharing.pooled_p99([tmp_path / f"reserve30-{n}.txt" for n in (1, 2, 3)])
    assert pooled == 30.0 and pooled_alone < 50.0  # (the three 50 ms requests are under 1% of 900)
    assert math.isclose(summary["hp_p99_ratio_reserve30_pooled"], pooled / pooled_alone)
    assert math.isclose(summary["hp_trainer_vs_target_reserve30_pooled"], 0.7 / (0.8 * 0.75))
    assert {"hp_p99_ratio_reserve30", "hp_p99_ratio_reserve30_2", "hp_p99_ratio_reserve30_3"} <= set(summary)
    look = (keep / "looks-reserve30-2.txt").read_text().split()
    assert look[1:] == ["1", "80", "240", "-", "900", "70000000", "40", "5000000", "1234"]
    assert sorted(p.name for p in keep.iterdir()) == sorted(
        [f"alone-{n}.txt" for n in (1, 2, 3)]
        + [f"reserve30-{n}.txt" for n in (1, 2, 3)]
        + [f"looks-reserve30-{n}.txt" for n in (1, 2, 3)]
    )


def test_the_native_reference_runs_the_pair_on_mps_with_the_trainer_on_the_rest_of_the_threads(monkeypatch, tmp_path):
    """--prio-native: the same inference guest and trainer natively, clients of the bench's MPS
    daemon, the trainer on 100 - w of the active threads at the client priority below normal, the
    inference guest on all at normal; each run after the first after a native alone window (no MPS
    client); pooled as the reserve's rows, against the trainer's speed alone natively."""
    calls = []
    monkeypatch.setenv("VMGPU_REGION", "/dev/shm/vmgpu-region-of-this-shell")  # (as a guest's shell has)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/vmgpu/guest")

    class FakeRun:
        seconds, tmp = 30.0, tmp_path

        def together(self, guests, during=None):
            calls.append([(args[0], env) for args, env in guests])
            args = guests[0][0]
            f = Path(args[args.index("--latencies") + 1])
            slow = len(guests) == 2 and len(calls) == 3  # (the second pair: a slow run)
            times = [10.0] * 100 + ([40.0] * 5 if slow else [])
            f.write_text("".join(f"{i:.6f} {x:.3f}\n" for i, x in enumerate(times)))
            hp = {"p50_ms": 10.0, "p99_ms": max(times)}
            return [hp] if len(guests) == 1 else [hp, {"img_per_s": 600.0}]

    monkeypatch.setattr(run_sharing, "PRIO_RUNS", [2])
    monkeypatch.setattr(run_sharing, "PRIO_RESERVE", [30])
    first = tmp_path / "native-alone-1.txt"
    first.write_text("".join(f"{i:.6f} 10.000\n" for i in range(100)))
    rows, summary = [], {}
    infer_native = {"p50_ms": 10.0, "p99_ms": 10.0, "busy": 0.25, "file": first}
    run_sharing.native_reserve_priority(FakeRun(), rows, summary, ["torch_infer.py"], infer_native, 1000.0, "/pipe")
    assert [len(c) for c in calls] == [2, 1, 2]  # pair, alone natively, pair
    (infer, ienv), (train, tenv) = calls[0]
    assert infer == "torch_infer.py" and train == "torch_train.py"
    assert ienv["CUDA_MPS_PIPE_DIRECTORY"] == tenv["CUDA_MPS_PIPE_DIRECTORY"] == "/pipe"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in ienv and "CUDA_MPS_CLIENT_PRIORITY" not in ienv
    assert tenv["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70" and tenv["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in calls[1][0][1]  # (alone: no MPS client)
    assert ("inference alone natively, run 2: p50 / p99", "10.00 / 10.00 ms") in rows
    assert (tmp_path / "native-alone-2.txt").exists()
    # (native: no vmgpu, whatever the bench's own environment says)
    assert all("VMGPU_REGION" not in env and "LD_LIBRARY_PATH" not in env for c in calls for _, env in c)
    assert math.isclose(summary["hp_p99_ratio_native30"], 1.0)
    assert math.isclose(summary["hp_p99_ratio_native30_2"], 4.0)
    assert summary["hp_p99_ratio_native30_pooled"] > 1.0  # (5 slow of 205: above the 1% tail)
    assert math.isclose(summary["hp_trainer_vs_target_native30_pooled"], 0.6 / (0.8 * 0.75))


def test_prio_native_without_the_reserve_rows_or_with_their_scenarios_skipped_is_refused(monkeypatch, capsys):
    """--prio-native runs beside the --prio-reserve rows on the bench's MPS daemon: without them,
    or with priority, sharedprio or mps skipped, it would do nothing; the bench says so at once."""
    import pytest

    for args in (["--prio-native"], ["--prio-native", "--prio-reserve", "30", "--skip", "cap,mps"]):
        monkeypatch.setattr(sys, "argv", ["run_sharing.py", *args])
        monkeypatch.setattr(run_sharing, "PRIO_RESERVE", [])
        with pytest.raises(SystemExit) as e:
            run_sharing.main()
        assert e.value.code == 2
        assert "--prio-native" in capsys.readouterr().err


def test_alone_turns_alternate_the_two_sides_and_count_slow_requests_and_the_hosts_steal(monkeypatch, tmp_path):
    """--alone-turns 2: the inference guest alone through vmgpu, natively, through vmgpu, natively
    (vmgpu's forwarder stopped after each of its windows, the native window with no vmgpu in its
    environment); each row counts the requests over twice the window's own p50 and gives the steal
    Run.together measured; the summary has the pooled p99 ratio, each side's mean steal and its
    requests over 15 and 25 ms."""
    calls, stopped = [], []
    monkeypatch.setenv("VMGPU_REGION", "/dev/shm/vmgpu-region-of-this-shell")

    class FakeRun:
        seconds, tmp = 10.0, tmp_path

        def together(self, guests, during=None):
            ((args, env),) = guests
            side = "vmgpu" if env.get("VMGPU_REGION") == "/dev/shm/r" else "native"
            calls.append(side)
            f = Path(args[args.index("--latencies") + 1])
            # vmgpu's windows: 10 ms, and in its second window 20 requests of 25 ms; natively 10 ms
            slow = 20 if side == "vmgpu" and len(calls) == 3 else 0
            times = [10.0] * (200 - slow) + [25.0] * slow
            f.write_text("".join(f"{i:.6f} {x:.3f} 0 0 0\n" for i, x in enumerate(times)))
            return [{"p50_ms": 10.0, "p99_ms": max(times), "steal_cpus": 0.5 if side == "vmgpu" else 0.25}]

    class FakeGuests:
        def env(self, *flags):
            return {"VMGPU_REGION": "/dev/shm/r"}

        def stop(self):
            stopped.append(len(calls))

    keep = tmp_path / "keep"
    keep.mkdir()
    rows, summary = [], {}
    run_sharing.alone_turns(FakeGuests(), FakeRun(), rows, summary, ["torch_infer.py"], 2, keep)
    assert calls == ["vmgpu", "native", "vmgpu", "native"]
    assert stopped == [1, 3]
    assert (
        "inference alone through vmgpu, turn 2: p50 / p99, over 2x p50, steal",
        "10.00 / 25.00 ms, 20 requests, 0.50 CPUs",
    ) in rows
    assert (
        "inference alone natively, turn 1: p50 / p99, over 2x p50, steal",
        "10.00 / 10.00 ms, 0 requests, 0.25 CPUs",
    ) in rows
    assert summary["alone_p99_vmgpu_vs_native"] > 1.0  # (20 of 400 requests: above the 1% tail)
    assert summary["steal_cpus_vmgpu"] == 0.5 and summary["steal_cpus_native"] == 0.25
    assert (summary["over_15ms_vmgpu"], summary["over_15ms_native"]) == (20, 0)
    assert (summary["over_25ms_vmgpu"], summary["over_25ms_native"]) == (0, 0)  # (25.0 is not over 25)
    assert (
        "inference alone by turns: requests over 15 ms through vmgpu / natively",
        "20 / 0 of 400 / 400",
    ) in rows
    assert sorted(p.name for p in keep.iterdir()) == sorted(
        f"turns-{side}-{n}.txt" for side in ("vmgpu", "native") for n in (1, 2)
    )


def test_a_window_carries_the_steal_the_host_had_while_it_ran(monkeypatch, tmp_path):
    """Run.together reads /proc/stat's steal before the guests go and after they end: each result
    carries how many CPUs the hypervisor held on average meanwhile (here, a made-up host whose
    hypervisor takes 3 CPU-seconds over 2 seconds)."""
    readings = iter([(100.0, 50.0), (103.0, 52.0)])
    monkeypatch.setattr(run_sharing, "host_steal", lambda: next(readings))

    class Proc:
        returncode = 0

        def __init__(self, *a, **k):
            import io

            self.stdout, self.args = io.StringIO("ready\n"), a[0]

        def communicate(self, timeout=None):
            return "p50_ms=1.0 p99_ms=2.0", ""

    monkeypatch.setattr(run_sharing.subprocess, "Popen", Proc)
    (r,) = run_sharing.Run(tmp_path, 1.0).together([(["torch_infer.py"], {})])
    assert r["p99_ms"] == 2.0 and math.isclose(r["steal_cpus"], 1.5)
    assert run_sharing.steal_cpus((5.0, 1.0), (5.0, 1.0)) == 0.0


def test_the_hosts_steal_is_read_from_proc_stat_in_seconds():
    """host_steal: /proc/stat's eighth cpu field in seconds (never less than before) and the time."""
    first = run_sharing.host_steal()
    ticks = int(Path("/proc/stat").read_text().split()[8])
    second = run_sharing.host_steal()
    assert first[0] <= ticks / os.sysconf("SC_CLK_TCK") <= second[0]
    assert first[1] <= second[1] <= time.monotonic()


def test_after_the_shared_window_each_guest_runs_alone_in_turn_and_its_parts_are_by_its_own_rate(monkeypatch, tmp_path):
    """--own-alone: both guests finish the shared window, then the light one runs alone, and the
    heavy one only once the light one is done and a settle has passed; the pair's parts are then
    taken with each guest's own rate alone, by images and by the page's work calls, beside the
    controller's rates alone at the barrier."""
    import contextlib
    import threading
    import types

    monkeypatch.setattr(run_sharing, "SHARED_LEAD", [0.0])
    monkeypatch.setattr(run_sharing, "OWN_ALONE", [0.9])
    monkeypatch.setattr(run_sharing, "OWN_SETTLE_S", 0.2)
    window, beside, alone_calls = 1.4, {"share-1": 9000, "share-2": 22000}, {"share-1": 30000, "share-2": 32000}
    imgs = {"share-1": (300.0, 950.0), "share-2": (700.0, 1000.0)}  # beside, then alone
    turns: dict[str, list[float]] = {}

    class G:
        names: list[str] = []

        def env(self, *flags):
            self.names.append(f"share-{len(self.names) + 1}")
            return {"weight": flags[1]}

    def state(between: str) -> str:  # (what a guest is doing, from its files)
        if not Path(f"{between}.ready").exists():
            return "beside"
        return "alone" if Path(between).exists() and not Path(f"{between}.done").exists() else "idle"

    class FakeSampler:  # (the page's work calls, every 10 ms, as the guests' files say they run)
        def __init__(self, g, every):
            self.samples, self.stop, self.calls = [], threading.Event(), {}

        def start(self, t0):
            def loop():
                last = time.monotonic()
                while not self.stop.wait(0.01):
                    now = time.monotonic()
                    for n, b in self.betweens.items():
                        rate = {"beside": beside[n], "alone": alone_calls[n], "idle": 0}[state(b)]
                        self.calls[n] = self.calls.get(n, 0) + rate * (now - last)
                    last = now
                    self.samples.append((now, dict.fromkeys(self.calls, 0), dict(self.calls), {}))

            self.thread = threading.Thread(target=loop, daemon=True)
            self.thread.start()

        def done(self):
            self.stop.set()
            self.thread.join()
            return self.samples

    @contextlib.contextmanager
    def controlled(g, lever, seen):  # (its looks: once at the start, and on until the run ends)
        done = threading.Event()
        keys = [(0, "share-1"), (1, "share-2")]
        ctl = types.SimpleNamespace(
            guests={k: types.SimpleNamespace(alone=a) for k, a in zip(keys, (30738.0, 34046.0), strict=True)}
        )
        members = [types.SimpleNamespace(guest=n, hold=0) for n in g.names]
        seen(members, ctl)

        def looks():  # (once the turns begin, the controller reads the guests alone anew: not what is kept)
            while not done.wait(0.05):
                if Path(sampler.betweens["share-1"]).exists():
                    for k in keys:
                        ctl.guests[k].alone = 99999.0
                seen(members, ctl)

        t = threading.Thread(target=looks)
        t.start()
        try:
            yield ctl
        finally:
            done.set()
            t.join()

    monkeypatch.setattr(run_sharing, "controlled", controlled)

    class FakeRun:
        tmp, seconds = tmp_path, window

        def together(self, guests, during):
            names = ["share-1", "share-2"]
            betweens = {n: args[args.index("--between") + 1] for n, (args, _) in zip(names, guests, strict=True)}
            assert all(args[args.index("--then-seconds") + 1] == "0.9" for args, _ in guests)
            sampler.betweens = betweens

            def guest(n):
                time.sleep(window)
                Path(f"{betweens[n]}.ready").touch()
                while not Path(betweens[n]).exists():
                    time.sleep(0.002)
                began = time.monotonic()
                time.sleep(0.9)
                turns[n] = [began, time.monotonic()]
                Path(f"{betweens[n]}.done").touch()

            ts = [threading.Thread(target=guest, args=(n,)) for n in names]
            during(time.monotonic())
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return [{"img_per_s": imgs[n][0], "img_per_s_then": imgs[n][1]} for n in names]

    sampler = FakeSampler(None, 0.05)
    monkeypatch.setattr(run_sharing, "Sampler", lambda g, every: sampler)
    rows, summary = [], {}
    run_sharing.shared_pair(G(), FakeRun(), rows, summary, 1000.0, "/pipe", lever="sms")
    # the light guest alone first, the heavy one only after it and the settle
    assert turns["share-2"][0] >= turns["share-1"][1] + 0.2, turns
    own = dict(rows)
    what = "shared 30/70 on MPS (after 0 s), on SM partitions"
    alone_row = own[f"{what}: each alone after the window, in its own process (the other idle)"]
    assert alone_row.startswith("img/s 950 / 1000 (light over heavy 0.950); calls/s "), alone_row
    assert alone_row.endswith("the controller's rates alone at the barrier 30738 / 34046 (0.903)"), alone_row
    # by the common solo 300/700 is 30/70; by each one's own rate alone the light guest did more
    assert math.isclose(summary["shared_light_sms"], 30.0)
    assert math.isclose(summary["own_light_sms"], 100 * (300 / 950) / (300 / 950 + 700 / 1000))
    assert math.isclose(summary["own_share_err_pp_sms"], summary["own_light_sms"] - 30.0)
    assert math.isclose(summary["own_alone_ratio_sms"], 0.95)
    assert math.isclose(summary["books_alone_ratio_sms"], 30738 / 34046)
    # the page's calls: beside 9,000 and 22,000 a second, alone 30,000 and 32,000
    assert abs(summary["own_calls_ratio_sms"] - 30000 / 32000) < 0.03, summary
    parts_row = own[f"{what}: parts by each guest's own rate alone"]
    by_calls = 100 * (9000 / 30000) / (9000 / 30000 + 22000 / 32000)
    assert abs(float(parts_row.split("by calls ")[1].split(" /")[0]) - by_calls) < 1.0, parts_row
    assert abs(summary["own_calls_light_sms"] - by_calls) < 1.0, summary


def test_the_turns_alone_end_when_a_guest_never_finishes_its_shared_window(tmp_path):
    """A guest that failed before its .ready: own_turns starts nobody's window and returns once
    the run is over (stop), leaving no between file made."""
    import threading

    betweens, stop, marks = [tmp_path / "a", tmp_path / "b"], threading.Event(), {}
    (tmp_path / "a.ready").touch()
    t = threading.Thread(target=run_sharing.own_turns, args=(betweens, stop, marks, {"x": 1.0}))
    t.start()
    time.sleep(0.05)
    stop.set()
    t.join(2)
    assert not t.is_alive() and marks == {} and not any(b.exists() for b in betweens)


def test_a_rate_alone_not_measured_gives_nan_not_a_crash():
    """The controller's books hold 0 for a guest it never measured, and the page may show no
    calls in a turn: the rows say nan where a ratio needs them, and the rest is still given."""
    rows, summary = [], {}
    calls = {"a": (9000.0, 0.0), "b": (22000.0, 32000.0)}
    run_sharing.own_alone_rows(rows, summary, "w", "", [300.0, 700.0], [950.0, 1000.0], calls, {"a": 0.0, "b": 1.0})
    assert math.isnan(summary["own_calls_light"]) and math.isnan(summary["own_calls_ratio"])
    assert math.isnan(summary["books_alone_ratio"])
    run_sharing.own_alone_rows(rows, summary, "w", "", [300.0, 700.0], [950.0, 1000.0], calls, {"a": 1.0, "b": 0.0})
    assert math.isnan(summary["books_alone_ratio"])
    assert math.isclose(summary["own_light"], 100 * (300 / 950) / (300 / 950 + 0.7))
    assert "(nan)" in rows[-2][1] and "by calls nan / nan" in rows[-1][1]


def _ends(pid: int, within: float = 2.0) -> bool:
    """Whether process pid is gone (or a zombie: killed, not yet reaped) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True  # reaped between looks: gone
        if state in "ZX":
            return True
        time.sleep(0.02)
    return False


def test_the_guest_that_fails_is_the_one_reported_and_the_others_are_stopped(tmp_path):
    """Run.together with a guest that waits long (as one waits at a barrier for another) and one
    that fails once it goes: the bench ends at once with the failing guest's error, though the
    waiting one was started first, and the waiting one is killed."""
    start = (
        "import os, sys, time\nif sys.argv[-1].endswith('pid'): open(sys.argv[-1], 'w').write(str(os.getpid()))\n"
        "print('ready', flush=True)\ngo = sys.argv[sys.argv.index('--go') + 1]\n"
        "while not os.path.exists(go): time.sleep(0.01)\n"
    )
    waits, fails = tmp_path / "waits.py", tmp_path / "fails.py"
    waits.write_text(start + "time.sleep(60)\n")
    fails.write_text(start + "time.sleep(0.3)\nsys.exit('the real error: out of memory')\n")
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()
    try:
        run_sharing.Run(tmp_path, 1.0).together([([str(waits), str(pid_file)], {}), ([str(fails)], {})])
    except SystemExit as e:
        message = str(e)
    else:
        raise AssertionError("a failed guest was not reported")
    assert time.monotonic() - t0 < 20
    assert "the real error: out of memory" in message, message
    assert _ends(int(pid_file.read_text())), "the waiting guest was left running"


def test_the_trainer_of_every_row_but_the_caps_is_the_one_train_gives(monkeypatch, tmp_path):
    """--train '--batch 64': the denominators (and every row after them) run that trainer; the cap
    rows keep --cap-train's; the table says which trainer it measured."""
    import pytest

    monkeypatch.setattr(run_sharing, "TRAIN", list(run_sharing.TRAIN))
    monkeypatch.setattr(run_sharing, "CAP_TRAIN", list(run_sharing.CAP_TRAIN))
    monkeypatch.setattr(run_sharing.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    monkeypatch.setattr(
        run_sharing, "Guests", lambda *a: type("G", (), {"env": lambda self: {}, "stop": lambda s: 0})()
    )
    seen = []

    def sampled(g, run, guests, seconds):
        seen.append(guests[0][0])
        raise SystemExit("stopped here")

    monkeypatch.setattr(run_sharing, "sampled", sampled)
    monkeypatch.setattr(run_sharing, "PROBE", {})
    argv = ["run_sharing.py", "--train=--batch 64", "--skip", "priority", "--lone-probes", "--young", "12,0.1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="stopped here"):
        run_sharing.main()
    assert seen == [["torch_train.py", "--batch", "64"]]
    # (--lone-probes: the controller's probes one at a time; --young: its youth)
    assert run_sharing.PROBE == {"rounds": False, "young_s": 12.0, "young_part": 0.1}
    run_sharing.share_control.ShareController(**run_sharing.PROBE)  # (what the rows' controllers are given)
    for bad in ("12", "12,1", "-1,0.2", "a,b"):
        monkeypatch.setattr(sys, "argv", ["run_sharing.py", "--young", bad])
        with pytest.raises(SystemExit, match="2"):
            run_sharing.main()
    assert run_sharing.CAP_TRAIN == ["torch_train.py", "--batch", "32", "--no-autotune"]


def test_a_bench_stopped_while_its_guests_run_stops_them_and_sigterm_ends_it_as_an_error(tmp_path):
    """SIGTERM (a `timeout` around the bench) ends it through SystemExit, so that its finally
    blocks stop the forwarders and remove their regions; a stop while guests run kills them."""
    import pytest

    with pytest.raises(SystemExit, match="stopped by signal 15"):
        run_sharing.stopped(15, None)
    guest = tmp_path / "guest.py"
    guest.write_text(
        "import os, sys, time\nopen(sys.argv[-1], 'w').write(str(os.getpid()))\nprint('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    def during(_t0):
        raise SystemExit("stopped")

    with pytest.raises(SystemExit, match="stopped"):
        run_sharing.Run(tmp_path, 1.0).together([([str(guest), str(tmp_path / "pid")], {})], during)
    assert _ends(int((tmp_path / "pid").read_text())), "the guest was left running"


_slow_spec = importlib.util.spec_from_file_location("slow_alone", ROOT / "bench" / "slow_alone.py")
slow_alone = importlib.util.module_from_spec(_slow_spec)
_slow_spec.loader.exec_module(slow_alone)


def test_the_slow_alone_guest_sleeps_only_when_its_work_comes_quicker_than_beside_the_others():
    # (bench/torch_train.py --slow-alone, the hostile guest of the slowalone rows): beside the
    # others its steps take 40 ms; in a probe, the others held, 20 ms: it sleeps 20 * (1/0.25 - 1)
    # ms after each, so that a probe reads it at a quarter of its speed alone
    s = slow_alone.SlowAlone(0.25)
    assert [s.after(0.040) for _ in range(5)] == [0.0] * 5  # (learning how long beside takes)
    assert s.after(0.020) == pytest.approx(0.060) and s.alone == 1
    assert s.after(0.038) == 0.0 and s.after(0.045) == 0.0  # (beside again: not slowed, and learned)
    assert s.beside == pytest.approx(0.040 + 0.1 * (0.038 - 0.040) + 0.1 * (0.045 - 0.0398), abs=1e-6)
    assert s.after(0.0) == 0.0
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="slow-alone"):
            slow_alone.SlowAlone(bad)


def test_the_slowalone_rows_tell_the_hostile_guests_gain_and_what_the_others_lost():
    honest, slow = [0.30, 0.70, 0.10], [0.24, 0.56, 0.40]
    text, gain, others = run_sharing.slow_alone_summary(honest, slow)
    assert gain == pytest.approx(100 * 0.40 / 1.20 - 100 * 0.10 / 1.10)  # 33.3% against 9.1%
    assert others == pytest.approx(0.8)
    assert "9.1%" in text[0] and "33.3%" in text[1] and "0.800 and 0.800 of honest" in text[1]
    _, gain, others = run_sharing.slow_alone_summary(honest, [0.0, 0.0, 0.0])
    assert math.isnan(gain) and others == 0.0


def test_the_trainer_runs_alone_again_at_the_end_and_its_drift_from_the_start_is_told(monkeypatch):
    # every share and aggregate is over the rates alone at the run's start, which moved 5-10% within
    # one H100 lease (session 57): the run ends with both again, through vmgpu first, then natively
    ran = []

    class Run:
        def together(self, guests):
            ((args, env),) = guests
            ran.append("vmgpu" if env.get("VMGPU_REGION") else "native")
            return [{"img_per_s": 1400.0 if env.get("VMGPU_REGION") else 1560.0}]

    class G:
        stopped = 0

        def env(self, *flags):
            return {"VMGPU_REGION": "/dev/shm/x"}

        def stop(self):
            G.stopped += 1

    monkeypatch.delenv("VMGPU_REGION", raising=False)
    rows, summary = [], {}
    run_sharing.alone_again(G(), Run(), rows, summary, 1550.0, 1500.0)
    assert ran == ["vmgpu", "native"] and G.stopped == 1
    assert summary["alone_end_ratio"] == pytest.approx(1400 / 1550)
    assert summary["native_alone_end_ratio"] == pytest.approx(1560 / 1500)
    assert rows == [
        ("trainer alone at the end (vmgpu / native)", "1400.0 / 1560.0 img/s: 0.903 / 1.040 of the start's")
    ]
    summary.clear()
    run_sharing.alone_again(G(), Run(), rows, summary, 0.0, 1500.0)  # (a start that was not measured)
    assert math.isnan(summary["alone_end_ratio"])


def test_the_open_capture_guest_begins_a_relaxed_capture_on_a_non_blocking_stream_of_its_own():
    import ctypes

    sys.path.insert(0, str(ROOT / "bench"))
    from open_capture import end_capture, open_capture

    calls = []

    class Driver:  # (libcuda.so.1's two calls, as ctypes hands them their arguments)
        def __init__(self, fail=None):
            self.fail = fail

        def cuStreamCreate(self, out, flags):
            calls.append(("create", flags))
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x5000
            return 1 if self.fail == "create" else 0

        def cuStreamBeginCapture_v2(self, stream, mode):
            calls.append(("begin", stream.value, mode))
            return 201 if self.fail == "begin" else 0

        def cuStreamEndCapture(self, stream, graph):
            calls.append(("end", stream.value))
            ctypes.cast(graph, ctypes.POINTER(ctypes.c_void_p))[0] = 0x6000
            return 0

        def cuGraphDestroy(self, graph):
            calls.append(("graph destroyed", graph.value))

        def cuStreamDestroy_v2(self, stream):
            calls.append(("stream destroyed", stream.value))

    assert open_capture(Driver()) == 0x5000
    assert calls == [("create", 1), ("begin", 0x5000, 2)]  # non-blocking; relaxed
    calls.clear()
    end_capture(Driver(), 0x5000)  # (before the guest exits)
    assert calls == [("end", 0x5000), ("graph destroyed", 0x6000), ("stream destroyed", 0x5000)]
    calls.clear()
    for fail, name in (("create", "cuStreamCreate"), ("begin", "cuStreamBeginCapture_v2")):
        with pytest.raises(RuntimeError, match=name):  # (a run that got no capture measures an honest guest)
            open_capture(Driver(fail))


def test_the_offspan_rows_run_the_10_honest_then_with_a_capture_open_and_tell_what_the_others_lost(monkeypatch):
    import contextlib

    monkeypatch.setattr(run_sharing, "controlled", lambda g, lever, after: contextlib.nullcontext())
    monkeypatch.setattr(run_sharing, "LEVERS", ["sms"])
    seen = []

    class Run:
        def together(self, guests):
            seen.append([args for args, _ in guests])
            hostile = "--open-capture" in guests[2][0]
            rates = [300.0, 700.0, 500.0] if hostile else [330.0, 760.0, 100.0]  # (img/s, solo 1000)
            return [{"img_per_s": r} for r in rates]

    class G:
        names = ["share-1", "share-2", "share-3"]

        def env(self, *flags):
            return {"flags": flags}

    rows, summary = [], {}
    run_sharing.off_span_rows(G(), Run(), rows, summary, 1000.0, "/pipe", None, "sms")
    assert [("--open-capture" in args) for args in seen[0]] == [False] * 3
    assert [("--open-capture" in args) for args in seen[1]] == [False, False, True]
    assert summary["off_span_gain_pp_sms"] == pytest.approx(100 * 0.5 / 1.5 - 100 * 0.1 / 1.19)
    assert summary["off_span_others_sms"] == pytest.approx(300 / 330)  # (the least of the two)
    assert summary["off_span_total_sms"] == pytest.approx(1.5 / 1.19)
    assert rows[1][0] == "shared 30/70/10 on MPS, lever sms, the 10 off its span", rows
