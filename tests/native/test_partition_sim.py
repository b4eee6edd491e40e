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


def _slots(pg: Page) -> dict[str, int]:
    return {m.guest: m.slot for m in pg.members()}


def test_beside_another_at_work_a_guests_work_runs_on_its_span_and_alone_on_the_whole_gpu(sched_dir, tmp_path):
    """a at [0, 5) (40 SMs), b at [5, 16) (92: its last group takes the 4 left over).  Beside each
    other, a's memsets on its own stream (a twin in the green context) and b's on the legacy
    stream (the green context current) run on their spans; once b is done, a's go back to the
    whole GPU, and each move of a's stream comes after a wait on an event."""
    a, b = tmp_path / "a", tmp_path / "b"
    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    with (
        forwarder(a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la)}),
        forwarder(b, extra=PART, env={"VMGPU_SIM_SM_LOG": str(lb)}),
    ):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa = _spin(a, 4, "async")
            pb = _spin(b, 1.5, "sync")
            assert wait_for(lambda: pg.sm_groups == 16, timeout=10)  # (published as their contexts were made)
            slot = _slots(pg)
            pg.set_part(slot["a"], 0, 5 * 16)
            pg.set_part(slot["b"], 5 * 16, 16 * 16)
            assert _done(pb) > 0
            assert _done(pa) > 0
    sa, sb = _sms(_log(la)), _sms(_log(lb))
    assert 40 in sa and 92 in sb, (set(sa), set(sb))
    assert set(sa) <= {0, 40} and set(sb) <= {0, 92}, (set(sa), set(sb))
    assert sa[-1] == 0, "alone at the end: a's work is back on the whole GPU"
    # each move of a's stream (0 -> 40, 40 -> 0) comes after a wait on an event
    prev, waited, moves = None, False, 0
    for line in _log(la):
        if line == "wait":
            waited = True
        elif line.startswith("memset"):
            (sms,) = _sms([line])
            if prev is not None and sms != prev:
                assert waited, f"a's work moved from {prev} to {sms} SMs with no wait before it"
                moves += 1
            prev, waited = sms, False
    assert moves >= 2, moves


def test_a_fractional_span_end_takes_the_next_group_that_part_of_each_period(sched_dir, tmp_path):
    """a at [0, 4.5) beside b: 5 groups (40 SMs) the first half of each period, 4 (32) the second."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with forwarder(a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la)}), forwarder(b, extra=PART):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 3, "async"), _spin(b, 3, "async")
            assert wait_for(lambda: pg.sm_groups == 16, timeout=10)
            slot = _slots(pg)
            pg.set_part(slot["a"], 0, 72)
            pg.set_part(slot["b"], 72, 256)
            _done(pa), _done(pb)
    sa = _sms(_log(la))
    n32, n40 = sa.count(32), sa.count(40)
    assert n32 and n40, set(sa)
    assert 0.25 < n40 / (n32 + n40) < 0.75, (n32, n40)


def test_a_process_with_a_blocking_stream_stays_on_the_whole_gpu(sched_dir, tmp_path):
    """A stream made without CU_STREAM_NON_BLOCKING keeps an implicit order with the default
    stream that holds only within one context: such a process is not partitioned (said once in
    the log), and its work still runs."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    with forwarder(a, extra=PART, env={"VMGPU_SIM_SM_LOG": str(la)}) as fa, forwarder(b, extra=PART):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 2, "blocking"), _spin(b, 2, "async")
            assert wait_for(lambda: pg.sm_groups == 16, timeout=10)
            slot = _slots(pg)
            pg.set_part(slot["a"], 0, 80)
            pg.set_part(slot["b"], 80, 256)
            assert _done(pa) > 0
            _done(pb)
        assert "without CU_STREAM_NON_BLOCKING" in fa.log()
    assert set(_sms(_log(la))) == {0}


def test_a_span_whose_green_context_does_not_fit_the_quota_is_refused_and_the_work_goes_on(sched_dir, tmp_path):
    """A green context is charged before it is made (what the driver says it takes, measured):
    at 200 MiB in a 64 MiB quota it does not fit, nothing is left of it, and the guest's work
    stays on the whole GPU."""
    a, b = tmp_path / "a", tmp_path / "b"
    la = tmp_path / "a.log"
    big = {"VMGPU_SIM_SM_LOG": str(la), "VMGPU_SIM_GREEN_MIB": "200"}
    with forwarder(a, mem="64M", extra=PART, env=big) as fa, forwarder(b, extra=PART):
        with _page(sched_dir) as pg:
            pg.policy = "shared"
            pa, pb = _spin(a, 2, "async"), _spin(b, 2, "async")
            assert wait_for(lambda: pg.sm_groups == 16, timeout=10)
            slot = _slots(pg)
            pg.set_part(slot["a"], 0, 80)
            pg.set_part(slot["b"], 80, 256)
            assert _done(pa) > 0
            _done(pb)
        assert "does not fit its memory quota" in fa.log()
    assert set(_sms(_log(la))) == {0}


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
