"""Fixtures of the native tests."""

import pytest

from tests.native.guest_process import Guest


@pytest.fixture
def two_gpus(monkeypatch):
    """The simulated backend with two GPUs."""
    monkeypatch.setenv("VMGPU_SIM_DEVICES", "2")


@pytest.fixture
def guests():
    """Guest processes a test starts (region, GPU, the file's script), killed at its end whatever happened."""
    started: list[Guest] = []

    def start(region, gpu: int, script: str) -> Guest:
        g = Guest(region, gpu, script)
        started.append(g)
        return g

    yield start
    for g in started:
        g.kill()
