"""tests/shm_check.py: with VMGPU_TEST_SHM_CHECK=1 a test session that leaves an entry in /dev/shm
fails and names it, with the test after which it was first seen; one that leaves nothing
passes; without the variable nothing is checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _session(tmp_path: Path, body: str, check: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from tests.shm_check import pytest_runtest_protocol, pytest_sessionfinish, pytest_sessionstart\n"
    )
    (tmp_path / "test_inner.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VMGPU_TEST_SHM_CHECK", None)
    if check:
        env["VMGPU_TEST_SHM_CHECK"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_session_that_leaves_a_file_in_dev_shm_fails_and_names_it(tmp_path):
    name = f"vmgpu-shm-check-{os.getpid()}"
    body = (
        "def test_clean():\n    pass\n\n"
        f"def test_leaves():\n    open('/dev/shm/{name}', 'w').close()\n\n"
        "def test_after():\n    pass\n"
    )
    try:
        r = _session(tmp_path, body, check=True)
        assert r.returncode == 1, r.stdout + r.stderr
        assert (
            f"left behind in /dev/shm by this test session: {name} (first seen after test_inner.py::test_leaves)"
            in r.stdout
        )
        os.unlink(f"/dev/shm/{name}")
        r = _session(tmp_path, body, check=False)  # (off: not checked)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_a_session_that_removes_what_it_made_passes(tmp_path):
    name = f"vmgpu-shm-check-clean-{os.getpid()}"
    body = (
        f"import os\n\ndef test_cleans():\n    open('/dev/shm/{name}', 'w').close()\n    os.unlink('/dev/shm/{name}')\n"
    )
    r = _session(tmp_path, body, check=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left behind" not in r.stdout
