"""`vmgpu demo` on the simulated backend (the README's main command on a machine without a GPU):
its programs run through a forwarder, and it leaves nothing behind, neither its region nor a
scheduler page (before, the page of the simulated GPU stayed in the scheduler directory)."""

from __future__ import annotations

import glob
import os
import tempfile

from vmgpu.demo import run_demo


def test_the_demo_runs_its_programs_and_leaves_no_region_and_no_scheduler_page(sched_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (where its own scheduler directory is made)
    made = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    before = set(glob.glob("/dev/shm/vmgpu-demo-*"))
    out = run_demo("sim")
    assert out["simulated"]
    assert out["programs"] and all(p["ok"] for p in out["programs"]), out["programs"]
    assert any("SIMULATED" in line for line in out["forwarder_log"])
    assert os.listdir(sched_dir) == []  # (the forwarders' shared directory: nothing of the demo's)
    assert len(made) == 1 and made[0].startswith(str(tmp_path)) and not os.path.exists(made[0])
    assert set(glob.glob("/dev/shm/vmgpu-demo-*")) == before
