"""The rule that tests leave nothing behind in /dev/shm, checked: with VMGPU_TEST_SHM_CHECK=1 (CI
sets it), a test session that ends with entries in /dev/shm that were not there as it began fails,
naming them.  Off by default: on a machine where something else (a running vmgpud, another test
run) makes files there meanwhile, the difference is not the session's."""

from __future__ import annotations

import os

import pytest

SHM = "/dev/shm"
_BEFORE = pytest.StashKey[set]()


def _entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _on() -> bool:
    return os.environ.get("VMGPU_TEST_SHM_CHECK") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    if _on():
        session.config.stash[_BEFORE] = _entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _on() or _BEFORE not in session.config.stash:
        return
    left = sorted(_entries() - session.config.stash[_BEFORE])
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    line = f"left behind in {SHM} by this test session: {', '.join(left)}"
    if reporter:
        reporter.write_line(line, red=True)
    else:
        print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
