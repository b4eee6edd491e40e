"""SM partitions on a real GPU (host_forwarder/native/partition.h): what the simulated backend
cannot show (tests/native/test_partition_sim.py shows where the work and the waits go), the
values kernels see.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

import subprocess
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, hidden_devices, wait_for
from vmgpu.forwarder import gpu_present
from vmgpu.sched import Page

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]

ROUNDS = "3000"  # (about a second of work: long enough for its span to be set early on)


def _order(how: str, region: Path | None = None) -> str:
    """blocking_order's verdict, natively or as a guest of region."""
    cmd = [str(NATIVE / "blocking_order"), ROUNDS, how]
    env = guest_env(region) if region else None
    out = subprocess.run(hidden_devices(cmd) if region else cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_blocking_stream_keeps_its_order_with_the_legacy_stream_on_a_span(sched_dir, tmp_path):
    """Natively, kernels on a blocking stream and on the legacy stream see each other's values
    in order, and on a non-blocking stream they do not (the check can fail).  Through vmgpu,
    beside another guest at work under shared with SM partitions, the guest's work runs on its
    span (the stream's twin and the green context's legacy stream, two contexts), and the order
    holds as natively."""
    assert _order("blocking") == f"order ok {ROUNDS}"
    assert _order("nonblocking").startswith("order broken"), "the check saw no disorder without the order"
    a, b = tmp_path / "a", tmp_path / "b"
    part = ("--sm-partitions", "on")
    with forwarder(a, backend="cuda", extra=part) as fa, forwarder(b, backend="cuda", extra=part):
        busy = subprocess.Popen(
            hidden_devices([str(NATIVE / "spin"), "30", "64", "async"]), env=guest_env(b), stdout=subprocess.PIPE
        )
        try:
            assert wait_for(lambda: list(sched_dir.glob("vmgpu-sched-*")), timeout=20)
            with Page(next(sched_dir.glob("vmgpu-sched-*"))) as pg:
                pg.policy = "shared"
                assert wait_for(lambda: pg.sm_groups > 4, timeout=20), "no SM groups published"
                groups = pg.sm_groups
                verdict = None

                def spans_set() -> bool:
                    slots = {m.guest: m.slot for m in pg.members()}
                    if "a" in slots and "b" in slots:
                        pg.set_part(slots["a"], 0, 3 * 16)
                        pg.set_part(slots["b"], 3 * 16, groups * 16)
                        return True
                    return False

                # a's first context joins the page; its spans are set as soon as it is there
                proc = subprocess.Popen(
                    hidden_devices([str(NATIVE / "blocking_order"), ROUNDS, "blocking"]),
                    env=guest_env(a),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                assert wait_for(spans_set, timeout=20)
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
                verdict = out.strip()
                whole = next(m.whole_ms for m in pg.members() if m.guest == "a")
        finally:
            busy.kill()
            busy.wait()
        assert "stays on the whole GPU" not in fa.log()
        # the order was kept by waits of ours (a's work ran apart from its legacy stream's), said
        # once its context goes
        assert wait_for(lambda: "waits kept" in fa.log(), timeout=20), "a's work never ran on its span"
        kept = [ln for ln in fa.log().splitlines() if "waits kept" in ln]
        assert int(kept[0].split("waits kept")[0].split()[-1]) > 0, kept
    assert verdict == f"order ok {ROUNDS}"
    assert not whole, "a's work kept to its span"
