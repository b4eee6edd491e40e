"""A hostile guest against the ASan/UBSan forwarder on the simulated backend: random and
adversarial requests, several hostile processes at once, some killed, one scribbling the
region (host_forwarder/tests/fuzz_forwarder.c)."""

import subprocess

import pytest

from tests.forwarder import (
    ASAN,
    forwarder,
)

pytestmark = pytest.mark.native


def test_hostile_guest_cannot_crash_the_forwarder(shm_path):
    """Random and adversarial requests against the ASan/UBSan forwarder; it must stay up and correct."""
    fuzz = ASAN / "tests" / "fuzz_forwarder"
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        for seed in (1, 2, 3):
            r = subprocess.run(
                [str(fuzz), str(shm_path), "60000", str(seed)], capture_output=True, text=True, timeout=300
            )
            assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
            assert "forwarder healthy" in r.stdout
        # several hostile processes at once, some killed mid-way; then the same while another
        # process scribbles the header, channel table, rings, bulk control and heap map
        for extra in (["4"], ["4", "scribble"]):
            r = subprocess.run(
                [str(fuzz), str(shm_path), "24000", "7", *extra], capture_output=True, text=True, timeout=300
            )
            assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
            assert "hostile processes (4 at once)" in r.stdout and "forwarder healthy" in r.stdout
        assert fwd.proc.poll() is None, fwd.log()
        status = fwd.stop()
    text = fwd.log()
    assert status == 0, text
    assert "runtime error" not in text and "AddressSanitizer" not in text
