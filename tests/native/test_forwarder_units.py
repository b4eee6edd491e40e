"""Runs the forwarder's unit test programs (host_forwarder/tests/t_*.c), each linked with the
files it tests and needing no GPU: the memory quota on a fake clock and a fake meter, the handle
table's generations.  Plain and ASan/UBSan builds; exit status 0 passes."""

import pytest

from tests.native.test_shm_programs import run_program

PROGRAMS = [
    # reserve/settle, the wait for a closed process's memory (bounded by the clock), refusals
    "t_quota",
    # the meter and the host's NVML: opened once per worker, a second thread waiting for the answer
    "t_meter",
    # a stale handle of a freed slot is refused after reuse; forged values; a module's children
    "t_handles",
]

CASES = [
    pytest.param(
        build,
        prog,
        id=f"{build}-{prog}",
        marks=[pytest.mark.native] + ([pytest.mark.sanitizer] if build != "native" else []),
    )
    for prog in PROGRAMS
    for build in ("native", "asan")
]


@pytest.mark.parametrize("build,prog", CASES)
def test_forwarder_unit_program_passes(build, prog):
    res = run_program(build, prog, [])
    assert res.returncode == 0, f"{prog} ({build}) exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert res.stdout.strip() == "ok"
