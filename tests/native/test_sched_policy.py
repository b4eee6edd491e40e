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
