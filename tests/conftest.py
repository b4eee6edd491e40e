import os
import shutil
from pathlib import Path

import pytest

from tests.shm_check import (  # noqa: F401 (hooks: /dev/shm as found)
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_sessionstart,
)

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SHARED_SCHED = Path("/dev/shm/vmgpu")  # the forwarders' default scheduler directory
SHARED_DIRS = (SHARED_SCHED, Path("/dev/shm/vmgpu-containers"))  # and the container runtime's regions


@pytest.fixture(autouse=True, scope="session")
def _private_sched_dir(tmp_path_factory):
    """Forwarders the tests start keep their GPUs' scheduler pages in the session's own
    directory, not in the host's; a default directory that only the tests made (forwarders
    started by a test libvirtd, which does not pass the environment on; the container runtime
    run by a test dockerd) goes at the end."""
    made_here = [d for d in SHARED_DIRS if not d.exists()]
    old = os.environ.get("VMGPU_SCHED_DIR")
    if old is None:
        d = tmp_path_factory.mktemp("sched")
        d.chmod(0o700)
        os.environ["VMGPU_SCHED_DIR"] = str(d)
    yield
    if old is None:
        os.environ.pop("VMGPU_SCHED_DIR", None)
    for d in made_here:
        if d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.geteuid():
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shm_path(tmp_path_factory, request):
    """A unique /dev/shm path, removed afterwards."""
    name = f"vmgpu-test-{os.getpid()}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
    p = Path("/dev/shm") / name
    if p.exists():
        p.unlink()
    yield p
    if p.exists():
        p.unlink()


@pytest.fixture
def sched_dir(tmp_path, monkeypatch):
    """A scheduler directory of the test's own: forwarders started in the test share it."""
    d = tmp_path / "sched"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("VMGPU_SCHED_DIR", str(d))
    return d
