"""`vmgpu region selftest` when its guest process goes wrong: it fails at once, or at its
--timeout, with one line naming the process and what became of it, and leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.native  # libvmgpushm.so (make native)


def _start(*args: str) -> tuple[subprocess.Popen, int]:
    """The self-test as an operator runs it, and the pid of its guest process once it is there."""
    p = subprocess.Popen(
        [sys.executable, "-m", "vmgpu.cli.main", "region", "selftest", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children = Path(f"/proc/{p.pid}/task/{p.pid}/children")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in children.read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return p, int(pid)
            except FileNotFoundError:
                continue
        time.sleep(0.01)
    p.kill()
    raise AssertionError("the self-test started no guest process: " + p.communicate()[1])


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _region(stderr: str) -> Path:
    m = re.search(r"region selftest \((/dev/shm/vmgpu-selftest-[0-9a-f]+)\)", stderr)
    assert m, stderr
    return Path(m.group(1))


def test_selftest_fails_at_once_naming_the_guest_process_when_it_is_killed():
    p, child = _start("--exchanges", "100000000", "--timeout", "300")
    os.kill(child, signal.SIGKILL)
    # without the fix it served on until its deadline (60 s then, 300 s here)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4, err  # REGION's exit status
    line = f"the guest process (pid {child}) was killed by SIGKILL after "
    assert line in err and "[REGION]" in err, err
    assert [ln for ln in err.splitlines() if ln.startswith("vmgpu: error:")] == [err.splitlines()[-1]]
    assert not _region(err).exists()  # its region removed


def test_selftest_kills_a_guest_process_that_outlasts_its_timeout_and_says_so():
    p, child = _start("--exchanges", "100000000", "--timeout", "3")
    os.kill(child, signal.SIGSTOP)  # alive, never finishing
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
    assert p.returncode == 4, err
    assert f"the guest process (pid {child}) did not finish within 3 s" in err and "--timeout" in err, err
    assert _gone(child)  # killed, not left stopped behind
    assert not _region(err).exists()
