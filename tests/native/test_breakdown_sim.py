"""The forwarder's statistics page, read by `vmgpu breakdown`, explains a run on the simulated
backend: calls by class, bytes each way, the top functions."""

import json
import subprocess
import sys

import pytest

from tests.forwarder import (
    NATIVE,
    PTX,
    ROOT,
    forwarder,
    run_guest,
)

pytestmark = pytest.mark.native


def test_breakdown_explains_a_run(shm_path, tmp_path):
    """The forwarder's statistics page, read by `vmgpu breakdown`: calls by class, bytes, top functions."""
    stats = tmp_path / "fwd.stats"
    with forwarder(shm_path, extra=["--stats", str(stats)]):
        r = run_guest([NATIVE / "drv_api", PTX, 8], shm_path)
        assert r.returncode == 0, r.stdout + r.stderr
        out = subprocess.run(
            [sys.executable, "-m", "vmgpu.cli.main", "breakdown", str(stats), "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    d = json.loads(out.stdout)
    assert d["processes"] == 1 and d["sync_calls"] > 20 and d["async_calls"] > 5
    assert d["htod_bytes"] >= 8 << 20 and d["dtoh_bytes"] >= 8 << 20
    assert d["ops"]["cuLaunchKernel"]["count"] == 5 and d["ops"]["cuGraphLaunch"]["count"] == 1
    assert d["ops"]["module functions"]["count"] == 1
    assert d["ops"]["hello"]["count"] == 1
    # 104 attribute queries: the guest's cache sends one per attribute, and one again after each
    # real set; of three sets, the one that repeats the cached value does not cross
    assert d["ops"]["cuFuncGetAttribute"]["count"] == 4
    assert d["ops"]["cuFuncSetAttribute"]["count"] == 2
