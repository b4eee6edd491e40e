"""The compute scheduler's arithmetic on a fake clock (host_forwarder/tests/t_sched_policy.c):
who gets the next turn for weights 30/70, the preemptive, equal and fixed policies, caps and
overruns per period, an idle guest's time going to the busy one, a guest back from idle or
joining late owed nothing, native ending every turn at once, ties, and dead members let go.
Exact and the same every run; tests/native/test_sched_sim.py runs the same policies for real."""

import pytest

from tests.native.test_shm_programs import run_program

pytestmark = pytest.mark.native


@pytest.mark.parametrize("build", ["native", pytest.param("asan", marks=pytest.mark.sanitizer)])
def test_the_scheduler_gives_turns_as_its_policies_say_on_a_fake_clock(build):
    res = run_program(build, "t_sched_policy", [])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout and res.stdout.strip().endswith("t_sched_policy: ok"), res.stdout


@pytest.mark.parametrize("build", ["native", pytest.param("asan", marks=pytest.mark.sanitizer)])
def test_a_worker_dying_while_it_ends_its_guests_turn_does_not_leave_the_gpu_held(build):
    """host_forwarder/tests/t_sched_dead.c: a worker killed holding the page's lock in the middle of
    ending its guest's turn; the supervisor, its guest's last worker gone, gives the GPU up and
    the lock is whole again (before, the turn stayed half ended and every other guest waited: a
    CI run saw another guest's program time out after its neighbour's worker was killed)."""
    res = run_program(build, "t_sched_dead", [])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("t_sched_dead: ok"), res.stdout


@pytest.mark.parametrize("build", ["native", pytest.param("asan", marks=pytest.mark.sanitizer)])
def test_the_page_wakes_whom_it_must_at_once_and_nobody_else(build):
    """host_forwarder/tests/t_sched_wake.c: a higher-priority guest that begins to wait wakes the
    lower holder's sleeping scheduler thread, whose next tick ends the turn, drains and hands the
    GPU over in that one tick; a lower guest that begins to wait wakes nobody; and waiters all held
    back by their caps, with nobody holding the GPU, do not wake one another (before, each handed
    the GPU to nobody and woke the others, thousands of times a second, and every scheduler thread
    on the GPU with them)."""
    res = run_program(build, "t_sched_wake", [])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("t_sched_wake: ok"), res.stdout


def test_vmgpud_takes_a_guest_as_capped_by_the_rule_the_forwarders_follow():
    """vmgpu/sched.py cap_percent (Member.capped, the share and cap controllers) against
    sched_policy.c itself (`t_sched_policy --table`): for a guest alone under every policy with
    turns or holds, each cap and weight, the % of each period its cap leaves it, and whether its
    turns are counted (below 100%: sched_policy.c counted_budget)."""
    from vmgpu.sched import POLICY_NAMES, cap_percent

    res = run_program("native", "t_sched_policy", ["--table"])
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [tuple(int(x) for x in line.split()) for line in res.stdout.splitlines()]
    assert len(rows) == 5 * 6 * 3, res.stdout
    for policy, cap, weight, pct, counted in rows:
        want = cap_percent(cap, weight, POLICY_NAMES[policy])
        assert (pct, counted) == (want, int(want < 100)), (POLICY_NAMES[policy], cap, weight, pct, counted)


@pytest.mark.parametrize("build", ["native", pytest.param("asan", marks=pytest.mark.sanitizer)])
def test_a_guests_gpu_time_read_without_the_lock_never_counts_a_stretch_twice(build):
    """host_forwarder/tests/t_sched_time.c: a writer thread charges a busy guest as it goes and hands
    the GPU to and fro between two, while a reader takes looks as vmgpu/sched.py does (the slots'
    time_seq): their sum is never more than the time since the first turn, and a guest's time never
    less than the last look's but for the change's time stamp (before, a look between a charge's
    two stores counted the stretch twice, and vmgpud's GPU time counter stepped back)."""
    res = run_program(build, "t_sched_time", [])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout and res.stdout.strip().endswith("t_sched_time: ok"), res.stdout
