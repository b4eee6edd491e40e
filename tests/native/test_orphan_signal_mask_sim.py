"""A worker must not outlive its supervisor whatever signal mask the forwarder was started with.

A blocked signal mask survives fork and execve.  Since ebab165 a worker's death signal is SIGUSR2
with a handler (worker.c: on_orphaned), not SIGKILL.  If the forwarder starts with SIGUSR2 blocked,
its workers inherit the block, and they never get the signal: a worker whose supervisor is killed
stays, adopted by init, and keeps serving its guest process.  It also keeps the driver's file in
/dev/shm.  With SIGKILL no mask mattered."""

import signal

import pytest

from tests.forwarder import wait_for, worker_pids
from tests.gpu.programs import driver_files_of
from tests.native.test_ipc_sim import GUEST, ended, leave_nothing_of
from vmgpu.forwarder import Forwarder

pytestmark = pytest.mark.native


def test_a_worker_of_a_forwarder_started_with_sigusr2_blocked_ends_with_its_supervisor(shm_path, two_gpus, guests):
    """The forwarder started with its workers' death signal blocked (as whatever starts it may
    leave it): a worker whose forwarder is killed still ends, and removes the driver's file of its
    interprocess event.  (Written by a reviewer; it failed before vh_worker unblocked the signal.)"""
    fwd = Forwarder(
        shm_path,
        backend="sim",
        size="256M",
        extra=("--gpus", "0,1"),
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2}),
    )
    fwd.start()
    worker = 0
    try:
        g = guests(shm_path, 0, GUEST)
        assert wait_for(lambda: worker_pids(fwd)), fwd.log()
        (worker,) = worker_pids(fwd)
        g.ok("event", 6)
        fwd.proc.kill()
        fwd.proc.wait()
        assert wait_for(lambda: ended(worker), timeout=5), "the worker outlived its supervisor: " + fwd.log()
        assert not driver_files_of(worker), fwd.log()
    finally:
        fwd.stop()
        if worker:
            leave_nothing_of(worker, fwd.proc.pid)
