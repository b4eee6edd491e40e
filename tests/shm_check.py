"""The rule that tests leave nothing behind in /dev/shm, checked: with VMGPU_TEST_SHM_CHECK=1 (CI
sets it), a test session that ends with entries in /dev/shm that were not there as it began fails,
naming each with the test after which it was first seen (its setup, body or teardown, a module
fixture's teardown included, made it).  Off by default: on a machine where something else (a
running vmgpud, another test run) makes files there meanwhile, the difference is not the
session's."""

from __future__ import annotations

import os

import pytest

SHM = "/dev/shm"
_BEFORE = pytest.StashKey[set]()
_SEEN = pytest.StashKey[dict]()  # entry -> the test after which it was first seen


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
        session.config.stash[_SEEN] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    yield
    stash = item.config.stash
    if _SEEN in stash:
        for name in _entries() - stash[_BEFORE]:
            stash[_SEEN].setdefault(name, item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _on() or _BEFORE not in session.config.stash:
        return
    left = sorted(_entries() - session.config.stash[_BEFORE])
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    seen = session.config.stash[_SEEN]
    named = ", ".join(f"{n} (first seen after {seen[n]})" if n in seen else n for n in left)
    line = f"left behind in {SHM} by this test session: {named}"
    if reporter:
        reporter.write_line(line, red=True)
    else:
        print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
