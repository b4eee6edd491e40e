"""Runs the transport's C test programs (native/shm_transport/tests), each one a
behaviour, in the plain, ASan/UBSan and TSan builds that `make test` produces.
Exit status 0 passes, 77 skips (with the program's reason), anything else fails."""

import os
import subprocess

import pytest

from tests.conftest import BUILD

# program, args, builds it runs in.  TSan sees races between threads only, so it
# gets the programs whose two sides are threads of one process.
PROGRAMS = [
    ("t_layout", [], ("native", "asan")),
    ("t_ring", [], ("native", "asan", "tsan")),
    ("t_channels", [], ("native", "asan", "tsan")),
    ("t_heap", [], ("native", "asan", "tsan")),
    ("t_bulk", [], ("native", "asan", "tsan")),
    ("t_liveness", [], ("native", "asan", "tsan")),
    ("t_addr", [], ("native", "asan")),
    ("t_wakeup", ["100000"], ("native",)),
    ("t_wakeup", ["20000"], ("asan", "tsan")),
    ("t_stress", ["proc", "4", "500000"], ("native",)),
    ("t_stress", ["proc", "4", "100000"], ("asan",)),
    ("t_stress", ["thread", "3", "30000"], ("tsan",)),
    ("t_kill", [], ("native", "asan")),
    ("t_owner_death", [], ("native", "asan")),
    ("t_forged_close", [], ("native", "asan", "tsan")),
    ("t_owner_limit", [], ("native", "asan")),
    ("t_republish", [], ("native", "asan", "tsan")),
]

CASES = [
    pytest.param(
        build,
        prog,
        args,
        id=f"{build}-{prog}-{'-'.join(args) or 'default'}",
        marks=[pytest.mark.native] + ([pytest.mark.sanitizer] if build != "native" else []),
    )
    for prog, args, builds in PROGRAMS
    for build in builds
]

SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=66",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=66",
    "TSAN_OPTIONS": "halt_on_error=1:exitcode=66",
}


def run_program(build: str, prog: str, args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    exe = BUILD / build / "tests" / prog
    if not exe.exists():
        pytest.fail(f"{exe} is missing: run `make test` (it builds native, native-asan, native-tsan)")
    env = dict(os.environ, **SAN_ENV)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("build,prog,args", CASES)
def test_program(build, prog, args):
    res = run_program(build, prog, args)
    if res.returncode == 77:
        pytest.skip(res.stdout.strip() or "program asked to be skipped")
    assert res.returncode == 0, f"{prog} {args} ({build}) exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "ok" in res.stdout


@pytest.mark.native
@pytest.mark.sanitizer
def test_fuzz_host_bounded():
    """Hostile region contents against the host side, ASan/UBSan build, bounded time."""
    secs = os.environ.get("VMGPU_FUZZ_SECONDS", "60")
    res = run_program("asan", "fuzz_host", [secs], timeout=int(float(secs)) + 120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no crash" in res.stdout
    print(res.stdout)


@pytest.mark.native
@pytest.mark.sanitizer
def test_host_survives_guests_dying_and_scribbling_while_it_serves():
    """Several guest processes claim, close, abandon and are killed while another scribbles the
    header, descriptors, ring and bulk control and the heap map; the ASan/UBSan host never
    crashes nor touches memory outside the region, and serves an honest guest afterwards."""
    secs = os.environ.get("VMGPU_FUZZ_LIVE_SECONDS", "30")
    res = run_program("asan", "fuzz_host", ["live", secs], timeout=int(float(secs)) + 120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "an honest guest is served after it" in res.stdout
    print(res.stdout)
