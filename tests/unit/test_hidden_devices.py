"""The GPU tests' guest processes run with the driver's files hidden (tests/forwarder.py,
HIDE_DEVICES): here on a stand-in /dev of its own (a tmpfs in a private mount namespace) holding
a device file and a directory of them, as the GPU host's /dev/nvidia0 and /dev/nvidia-caps/."""

import os
import shutil
import subprocess

import pytest

from tests.forwarder import HIDE_DEVICES


def _private_mounts() -> bool:
    """Whether a private mount namespace can be made here (root, unshare, and a root that is a
    mount point: inside a chroot it is not, and unshare refuses to make its mounts private)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


pytestmark = pytest.mark.skipif(
    not _private_mounts(), reason="needs root and a private mount namespace (not in a chroot): unshare -m"
)

FAKE_DEV = """set -e
mount -t tmpfs none /dev
mknod -m 666 /dev/null c 1 3
echo driver > /dev/nvidia0
mkdir /dev/nvidia-caps
echo capability > /dev/nvidia-caps/nvidia-cap1
exec sh -c "$1" sh sh -c 'cat /dev/nvidia0; ls -A /dev/nvidia-caps; cat /dev/nvidia-caps/* 2>/dev/null; echo ran'
"""


def test_device_files_and_directories_of_them_are_hidden_and_the_program_still_runs():
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", FAKE_DEV, "sh", HIDE_DEVICES],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n", r.stdout  # nothing of the device file nor of the directory
