"""SM partitions on the simulated backend (host_forwarder/native/partition.h): under shared, while
another guest of its priority or above is at work, a guest's work runs on the span of SMs its slot
names (green contexts: the simulated GPU is an H200's 132 SMs in 16 groups of 8, plus 4); alone it
has the whole GPU again; a stream's work moves only after an event on where it went before.  The
simulated driver logs where each memset would have run (VMGPU_SIM_SM_LOG: "memset sms=N", 0 the
whole GPU; "wait" for each wait on an event).  The GPU numbers come from `make bench-sharing`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.forwarder import NATIVE, forwarder, guest_env, wait_for
from vmgpu.sched import Page, SchedError

PART = ("--sm-partitions", "on")
NO_MPS = "/proc/vmgpu-no-mps"  # a forwarder's MPS pipe directory where it must reach no MPS daemon


def _page(d: Path) -> Page:
    assert wait_for(lambda: list(d.glob("vmgpu-sched-*")), timeout=10)
    return Page(next(d.glob("vmgpu-sched-*")))


def _spin(region: Path, secs: float, how: str = "sync", idle: float = 0.0) -> subprocess.Popen:
    args = [str(NATIVE / "spin"), str(secs), "1", how] + ([str(idle)] if idle else [])
    return subprocess.Popen(args, env=guest_env(region), stdout=subprocess.PIPE, text=True)


def _done(p: subprocess.Popen) -> int:
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    return int(out.split()[1])


def _log(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def _sms(lines: list[str]) -> list[int]:
    return [int(x.split("=")[1]) for x in lines if x.startswith("memset")]


def _spans_40_92(pg: Page) -> None:
    """Once the page has its groups (published as the guests' contexts are made): a at [0, 5)
    (40 SMs), b at [5, 16) (92: its last group takes the 4 left over)."""
    assert wait_for(lambda: pg.sm_groups == 16, timeout=10)
    slot = _slots(pg)
    pg.set_part(slot["a"], 0, 80)
    pg.set_part(slot["b"], 80, 256)


def _mps(path: Path) -> list[str]:
    """Each cuInit's MPS pipe directory, as the simulated driver logged them (VMGPU_SIM_INIT_LOG)."""
    return [line.split()[1] for line in _log(path)]


def _slots(pg: Page) -> dict[str, int]:
    return {m.guest: m.slot for m in pg.members()}


def _side_by_side(sched_dir, tmp_path, spans, how=("async", "async"), secs=(2.0, 2.0), env_a=None, mem_a=None):
    """Guests a and b (spin, `how` each, for `secs`) under shared with --sm-partitions on, given
    `spans` (a's and b's, in sixteenths of a group) once the page has its groups: the lines each
    one's simulated driver logged, a's forwarder's log, and a's slot's whole_ms at the end."""
    a, b = tmp_path / "a", tmp_path / "b"
    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    with (
        forwarder(a, mem=mem_a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la), **(env_a or {})}) as fa,
        forwarder(b, extra=PART, env={"VMGPU_SIM_SM_LOG": str(lb)}),
    ):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, secs[0], how[0]), _spin(b, secs[1], how[1])
            assert wait_for(lambda: pg.sm_groups == 16, timeout=10)  # (published as their contexts were made)
            slot = _slots(pg)
            pg.set_part(slot["a"], *spans[0])
            pg.set_part(slot["b"], *spans[1])
            assert _done(pb) > 0
            assert _done(pa) > 0
            whole = next(m.whole_ms for m in pg.members() if m.guest == "a")
        return _log(la), _log(lb), fa.log(), whole


def test_beside_another_at_work_a_guests_work_runs_on_its_span_and_alone_on_the_whole_gpu(sched_dir, tmp_path):
    """a at [0, 5) (40 SMs), b at [5, 16) (92: its last group takes the 4 left over).  Beside each
    other, a's memsets on its own stream (a twin in the green context) and b's on the legacy
    stream (the green context current) run on their spans; once b is done, a's go back to the
    whole GPU, and each move of a's stream comes after a wait on an event."""
    la, lb, _, whole = _side_by_side(sched_dir, tmp_path, [(0, 80), (80, 256)], ("async", "sync"), (4.0, 1.5))
    sa, sb = _sms(la), _sms(lb)
    assert 40 in sa and 92 in sb, (set(sa), set(sb))
    assert set(sa) <= {0, 40} and set(sb) <= {0, 92}, (set(sa), set(sb))
    assert sa[-1] == 0, "alone at the end: a's work is back on the whole GPU"
    assert not whole, "a kept to its span: its slot must not say otherwise"
    # each move of a's stream (0 -> 40, 40 -> 0) comes after a wait on an event
    prev, waited, moves = None, False, 0
    for line in la:
        if line == "wait":
            waited = True
        elif line.startswith("memset"):
            (sms,) = _sms([line])
            if prev is not None and sms != prev:
                assert waited, f"a's work moved from {prev} to {sms} SMs with no wait before it"
                moves += 1
            prev, waited = sms, False
    assert moves >= 2, moves


def test_spans_that_reach_into_each_other_are_each_used_as_given(sched_dir, tmp_path):
    """The smsover lever's spans: a at [0, 7) (56 SMs) and b at [5, 16) (92), groups 5 and 6 in
    both: each guest's work runs on its own span, nothing assuming the spans are apart."""
    la, lb, _, _ = _side_by_side(sched_dir, tmp_path, [(0, 112), (80, 256)], secs=(2.0, 2.0))
    sa, sb = _sms(la), _sms(lb)
    assert 56 in sa and 92 in sb, (set(sa), set(sb))
    assert set(sa) <= {0, 56} and set(sb) <= {0, 92}, (set(sa), set(sb))


def test_a_fractional_span_end_takes_the_next_group_that_part_of_each_period(sched_dir, tmp_path):
    """a at [0, 4.5) beside b: 5 groups (40 SMs) the first half of each period, 4 (32) the second."""
    la, _, _, _ = _side_by_side(sched_dir, tmp_path, [(0, 72), (72, 256)], secs=(3.0, 3.0))
    sa = _sms(la)
    n32, n40 = sa.count(32), sa.count(40)
    assert n32 and n40, set(sa)
    assert 0.25 < n40 / (n32 + n40) < 0.75, (n32, n40)


def test_a_blocking_stream_keeps_its_order_with_the_legacy_stream_on_a_span(sched_dir, tmp_path):
    """A stream made without CU_STREAM_NON_BLOCKING waits for the legacy stream's work before it,
    and the legacy stream for its, which the driver keeps only within one context.  a puts its
    memsets by turns on such a stream and on the legacy stream: beside b, both run on a's span
    (the stream's twin, and the green context's own legacy stream), and each memset that follows
    one on the other stream comes after a wait on an event (tests/cuda/blocking_order.c checks
    the values on a GPU)."""
    la, _, log, whole = _side_by_side(sched_dir, tmp_path, [(0, 80), (80, 256)], ("blocking", "async"))
    assert "stays on the whole GPU" not in log, log
    assert not whole, "a kept to its span: its slot must not say otherwise"
    memsets = [x for x in la if x.startswith("memset")]
    assert sum(1 for x in memsets if x.endswith("sms=40")) > 20, set(memsets)
    # (apart: either of the two on a span)
    assert _switches_waited(la, lambda before, now: before != "sms=0" or now != "sms=0") > 20


def _switches_waited(lines: list[str], apart) -> int:
    """How many times a memset on one stream followed one on the other (a blocking stream's and
    the legacy stream's) where apart(sms before, sms now); each must come after a wait."""
    prev, waited, checked = None, False, 0
    for line in lines:
        if line == "wait":
            waited = True
            continue
        on, sms = line.rsplit(" ", 1)
        if prev is not None and on != prev[0] and apart(prev[1], sms):
            assert waited, f"{line} followed {' '.join(prev)} (apart) with no wait before it"
            checked += 1
        prev, waited = (on, sms), False
    return checked


def test_a_blocking_streams_order_on_a_span_is_kept_while_a_capture_is_open_on_another_stream(sched_dir, tmp_path):
    """As above, with a capture (global mode) open on a third stream from halfway: the legacy
    stream's work is on a green context, which has no blocking stream for the capture to take in,
    and neither stream is captured, so the waits go on; the capture ends whole."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with forwarder(a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la)}), forwarder(b, extra=PART):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 3.0, "blocking-capture"), _spin(b, 3.0, "async")
            _spans_40_92(pg)
            out, _ = pa.communicate(timeout=60)
            assert _done(pb) > 0
    assert pa.returncode == 0 and "capture ok" in out, out
    lines = _log(la)
    # (the second half: the capture open; both on the span)
    assert _switches_waited(lines[len(lines) // 2 :], lambda before, now: before == now == "sms=40") > 20


def test_the_legacy_stream_waits_for_every_blocking_stream_with_work_past_the_eight_kept_by_name(sched_dir, tmp_path):
    """a puts a memset on each of ten blocking streams, then one on the legacy stream, again and
    again: on its span, each legacy memset comes after ten waits, one for each stream (the worker
    keeps eight by name; past that it looks at every stream)."""
    la, _, log, whole = _side_by_side(sched_dir, tmp_path, [(0, 80), (80, 256)], ("blocking-many", "async"))
    assert "stays on the whole GPU" not in log, log
    waits, checked, prev = 0, 0, None
    for line in la:
        if line == "wait":
            waits += 1
            continue
        if line == "memset default sms=40" and prev == "memset sms=40":
            assert waits >= 10, f"the legacy stream's memset came after {waits} waits, not one per stream"
            checked += 1
        prev, waits = line, 0
    assert checked > 10, checked


def _beside_higher(sched_dir, tmp_path, part_a=PART, b_prio="high", how="sync") -> tuple[int, int, list[int], int]:
    """a (priority low) spins a second alone, then a second while b (b_prio) works, with a given the
    span [5, 16) that the share controller's priority reserve gives it: a's memsets (or launches,
    by `how`) alone and beside b, the SMs its memsets (launches) beside b ran on, and its slot's
    whole_ms then (its work off its span)."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with (
        forwarder(a, extra=(*part_a, "--priority", "low"), env={"VMGPU_SIM_SM_LOG": str(la)}),
        forwarder(b, extra=(*PART, "--priority", b_prio)),
    ):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            alone = _done(_spin(a, 1, how))
            hi = _spin(b, 4)
            assert wait_for(lambda: pg.sm_groups == 16 and {m.guest: m.work_calls for m in pg.members()}["b"] > 0)
            pg.set_part(_slots(pg)["a"], 80, 256)
            n0 = len(_log(la))
            beside = _done(_spin(a, 1, how))
            sms = [int(x.split("=")[1]) for x in _log(la)[n0:] if x.startswith(("memset", "launch"))]
            whole = next(m.whole_ms for m in pg.members() if m.guest == "a")
            assert _done(hi) > 0
    return alone, beside, sms, whole


def test_a_lower_guest_on_a_span_beside_a_higher_one_runs_there_and_is_not_held_in_its_ring(sched_dir, tmp_path):
    """The priority reserve: a span given to a lower guest while a higher one works leaves the
    higher one's SMs free, so the lower one's work goes on there beside it (92 SMs) instead of
    waiting in its ring as it does with no span (one memset in the second: the test below, and
    test_sched_sim.py).  (How fast is not compared with a guest of its own priority: two simulated
    guests side by side on this 2-core host ran about 8,900 memsets a second in most runs and
    25,000-39,000 in the others, whatever their priorities, so one run against another failed
    some 3 times in 10; the reserve's rate on a GPU is make bench-sharing's.)"""
    alone, beside, sms, whole = _beside_higher(sched_dir, tmp_path)
    assert beside > 0.05 * alone, (beside, alone)  # (8,600 and more of 80,000: held, it is 1)
    assert sms and sms.count(92) >= 0.9 * len(sms), set(sms)
    assert not whole, "a kept to its span: its slot must not say otherwise"


def test_a_lower_guest_given_a_span_it_cannot_keep_to_still_waits_for_the_higher_one(sched_dir, tmp_path):
    """The same guest whose forwarder does not partition: its work would run on the whole GPU, so
    it waits in its ring while the higher one works, span or no span."""
    alone, beside, sms, _ = _beside_higher(sched_dir, tmp_path, part_a=())
    assert beside < 0.05 * alone, (beside, alone)
    assert set(sms) <= {0}, set(sms)


def test_a_lower_guests_cooperative_launch_waits_for_the_higher_one_though_it_has_a_span(sched_dir, tmp_path):
    """A cooperative launch goes to the whole GPU, span or not, where the higher guest's work is:
    it waits in its ring while the higher one works, as a guest with no span does (else a lower
    guest could put its work beside the higher one's on every SM by asking for cooperative grids).
    Each such launch also says its work is off its span (its slot's whole_ms: the controller then
    holds by time), which alone let 6.5% of its launches through here (one each time that lapsed);
    with the gate's own check none but in the gaps of the higher guest's calls (0.5%; 2.8% with
    three busy loops on this machine's two cores, where the higher guest's own calls have gaps:
    the bound is the one a guest with no span is held to, above)."""
    alone, beside, sms, whole = _beside_higher(sched_dir, tmp_path, how="coop")
    assert beside < 0.05 * alone, (beside, alone)
    assert set(sms) <= {0}, set(sms)
    assert whole, "a's cooperative launches went off its span: its slot must say so"


def test_a_span_whose_green_context_does_not_fit_the_quota_is_refused_and_the_work_goes_on(sched_dir, tmp_path):
    """A green context is charged before it is made (what the driver says it takes, measured):
    at 200 MiB in a 64 MiB quota it does not fit, nothing is left of it, and the guest's work
    stays on the whole GPU."""
    big = {"VMGPU_SIM_GREEN_MIB": "200"}
    la, _, log, whole = _side_by_side(sched_dir, tmp_path, [(0, 80), (80, 256)], env_a=big, mem_a="64M")
    assert "does not fit its memory quota" in log
    assert set(_sms(la)) == {0}
    assert whole


def test_a_process_whose_first_call_is_work_gets_its_context_charged_and_goes_on(sched_dir, tmp_path):
    """A guest at work on its span beside another starts a process whose first call to the host is
    work for the GPU (a memset of memory it does not hold: refused): its worker makes its context
    in that call, charged in a call of its own as every change of the charges (the checked
    forwarder ends a worker that changes them outside one), and the process goes on to work of
    its own.  (A green context made for work is charged the same way: vh_quota_call_begin_if_out,
    t_quota.)"""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with (
        forwarder(a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la)}, asan=True),
        forwarder(b, extra=PART),
    ):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 6.0, "async"), _spin(b, 6.0, "async")
            _spans_40_92(pg)
            assert wait_for(lambda: 40 in _sms(_log(la)), timeout=10), "a's work never ran on its span"
            first = subprocess.Popen(
                [str(NATIVE / "spin"), "1.0", "1", "work-first"], env=guest_env(a), stdout=subprocess.PIPE, text=True
            )
            try:
                out, _ = first.communicate(timeout=30)  # (a worker that hung on its own lock: no answer)
            finally:
                if first.poll() is None:
                    first.kill()
                    first.wait()
            assert first.returncode == 0, out
            assert int(out.split()[1]) > 0, out
            _done(pa), _done(pb)


def test_without_sm_partitions_the_span_is_not_used(sched_dir, tmp_path):
    """--sm-partitions off (auto without --mps): the page gets no groups and work stays whole."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with forwarder(a, env={"VMGPU_SIM_SM_LOG": str(la)}), forwarder(b):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 1.5, "async"), _spin(b, 1.5, "async")
            time.sleep(0.5)
            assert pg.sm_groups == 0
            try:
                pg.set_part(_slots(pg)["a"], 0, 80)
                raise AssertionError("a span on a page without groups was taken")
            except SchedError:
                pass
            _done(pa), _done(pb)
    assert set(_sms(_log(la))) == {0}


def test_a_capture_begins_on_the_stream_itself_not_its_twin(sched_dir, tmp_path):
    """A graph captured on a twin would be its green context's, which may go before the graph: a
    stream whose work is on its twin goes home (after a wait) when a capture begins on it, and
    back to its span after the capture.  a's memset captured halfway runs (is recorded) on the
    whole GPU between memsets on its 40 SMs, each move after a wait."""
    la, _, _, _ = _side_by_side(sched_dir, tmp_path, [(0, 80), (80, 256)], ("late-capture", "async"), (3.0, 4.0))
    lines = [x for x in la if x.startswith(("memset", "wait"))]
    spans = _sms(lines)
    # the captured memset: one on the whole GPU with memsets on the span before and after it
    at = [i for i in range(1, len(spans) - 1) if spans[i] == 0 and spans[i - 1] == 40 and spans[i + 1] == 40]
    assert len(at) == 1, [(i, spans[i - 2 : i + 3]) for i in at][:5]
    memsets = [i for i, x in enumerate(lines) if x.startswith("memset")]
    k = memsets[at[0]]
    assert lines[k - 1] == "wait" and lines[k + 1] == "wait", lines[k - 3 : k + 4]


def test_a_cooperative_launch_goes_to_the_whole_gpu_though_a_span_is_given(sched_dir, tmp_path):
    """A cooperative grid is sized for the whole GPU (its SM count, which the guest is told): on a
    span the driver would refuse it as too large, so its stream goes home first.  The same launch
    without the attribute runs on the span."""

    def launches(lines: list[str]) -> set[int]:
        return {int(x.split("=")[1]) for x in lines if x.startswith("launch")}

    (tmp_path / "coop").mkdir()
    (tmp_path / "plain").mkdir()
    spans = [(0, 80), (80, 256)]
    (tmp_path / "query").mkdir()
    coop, _, _, _ = _side_by_side(sched_dir, tmp_path / "coop", spans, ("coop", "async"), (2.0, 3.0))
    plain, _, _, _ = _side_by_side(sched_dir, tmp_path / "plain", spans, ("launch", "async"), (2.0, 3.0))
    assert launches(coop) == {0}, launches(coop)
    assert 40 in launches(plain), launches(plain)
    # a query of the cooperative configuration before each plain launch moves nothing, and the
    # launch after it is no cooperative one (the query's mark used to stay for the next call)
    queried, _, _, whole = _side_by_side(sched_dir, tmp_path / "query", spans, ("coop-query", "async"), (2.0, 3.0))
    assert 40 in launches(queried) and launches(queried) <= {0, 40}, launches(queried)
    assert not whole, "a kept to its span: its slot must not say otherwise"


def test_under_mps_when_shared_only_a_process_started_while_its_gpu_is_shared_is_an_mps_client(sched_dir, tmp_path):
    """--mps DIR --mps-when shared (what vmgpud runs its forwarders with): a guest process that
    starts while its GPU's policy is weighted keeps a context of its own (no MPS client, so no
    partitions: its work stays on the whole GPU); one that starts once the GPU is shared is a client
    and its work runs on its span beside the other guest's.  Each cuInit's MPS pipe directory (the
    simulated driver's VMGPU_SIM_INIT_LOG): the forwarder's probe and the first process, none anyone
    can make; the second, the daemon's."""
    mps = tmp_path / "mps"
    mps.mkdir(mode=0o700)
    extra = ("--mps", str(mps), "--mps-when", "shared")  # (partitions: auto, as vmgpud leaves them)
    a, b, la, ma = tmp_path / "a", tmp_path / "b", tmp_path / "a.log", tmp_path / "a.mps"
    with (
        forwarder(a, extra=extra, env={"VMGPU_SIM_SM_LOG": str(la), "VMGPU_SIM_INIT_LOG": str(ma)}) as fa,
        forwarder(b, extra=extra),
        _page(sched_dir) as pg,
    ):
        assert pg.policy == "weighted"
        assert _done(_spin(a, 0.2, "async")) > 0
        assert wait_for(lambda: "not an MPS client" in fa.log(), timeout=10), fa.log()
        before = len(_log(la))
        assert set(_sms(_log(la))) == {0}

        pg.policy = "shared"
        pa, pb = _spin(a, 2.0, "async"), _spin(b, 2.0, "async")
        _spans_40_92(pg)
        assert _done(pb) > 0 and _done(pa) > 0
        assert fa.log().count("not an MPS client") == 1, fa.log()
        assert 40 in _sms(_log(la)[before:]), "the process started under shared runs on its span"
    assert _mps(ma) == [NO_MPS, NO_MPS, str(mps)]


def test_a_forwarder_without_mps_names_an_mps_directory_no_one_can_make_whatever_its_environment_says(tmp_path):
    """The driver looks for an MPS control daemon in CUDA_MPS_PIPE_DIRECTORY, by default
    /tmp/nvidia-mps, which any local user can make (on an H200 a root program then connected to
    nobody's daemon there: tests/gpu/test_mps_gpu.py).  Without --mps, the forwarder's probe and its
    workers name /proc/vmgpu-no-mps, even when its own environment names another directory."""
    region, log = tmp_path / "r", tmp_path / "mps.log"
    env = {"VMGPU_SIM_INIT_LOG": str(log), "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    with forwarder(region, env=env):
        assert _done(_spin(region, 0.1, "async")) > 0
    assert _mps(log) == [NO_MPS, NO_MPS]
