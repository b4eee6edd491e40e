import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


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
