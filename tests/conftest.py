import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SHARED_SCHED = Path("/dev/shm/vmgpu")  # the forwarders' default scheduler directory


@pytest.fixture(autouse=True, scope="session")
def _private_sched_dir(tmp_path_factory):
    """Forwarders the tests start keep their GPUs' scheduler pages in the session's own
    directory, not in the host's; a default directory that only the tests made (forwarders
    started by a test libvirtd, which does not pass the environment on) goes at the end."""
    made_here = not SHARED_SCHED.exists()
    old = os.environ.get("VMGPU_SCHED_DIR")
    if old is None:
        d = tmp_path_factory.mktemp("sched")
        d.chmod(0o700)
        os.environ["VMGPU_SCHED_DIR"] = str(d)
    yield
    if old is None:
        os.environ.pop("VMGPU_SCHED_DIR", None)
    if (
        made_here
        and SHARED_SCHED.is_dir()
        and not SHARED_SCHED.is_symlink()
        and SHARED_SCHED.stat().st_uid == os.geteuid()
    ):
        shutil.rmtree(SHARED_SCHED, ignore_errors=True)


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
