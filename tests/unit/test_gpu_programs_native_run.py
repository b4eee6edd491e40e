"""tests/gpu/programs.run_native: what the driver leaves in /dev/shm after a native run's processes
have ended (an interprocess event's `cuda.shm.<n>.<pid in hex>.<n>`, as ipc_pair leaves natively)
is removed; a file made before the run, or whose maker still lives, is not."""

from __future__ import annotations

import os
import sys

from tests.gpu import programs

# a program that leaves two driver-named files: one of its own pid (it ends), one of this test's
# (alive), and a name that is not the driver's
MAKER = """
import os, sys
mine, live = sys.argv[1], sys.argv[2]
open(f"/dev/shm/cuda.shm.0.{os.getpid():x}.{mine}", "w").close()
open(f"/dev/shm/cuda.shm.0.{int(live):x}.{mine}", "w").close()
open(f"/dev/shm/not-the-drivers-{mine}", "w").close()
"""


def test_a_native_runs_leftover_driver_files_of_ended_processes_are_removed_and_no_others():
    tag = f"t{os.getpid()}"
    before = f"/dev/shm/cuda.shm.0.{0x7FFFFFF0:x}.{tag}b"  # (made before the run: not its to remove)
    live = f"/dev/shm/cuda.shm.0.{os.getpid():x}.{tag}"
    other = f"/dev/shm/not-the-drivers-{tag}"
    open(before, "w").close()
    try:
        r = programs.run_native([sys.executable, "-c", MAKER, tag, str(os.getpid())])
        assert r.returncode == 0, r.stderr
        left = {n for n in os.listdir("/dev/shm") if tag in n}
        assert left == {os.path.basename(p) for p in (before, live, other)}, left
    finally:
        for p in (before, live, other):
            if os.path.exists(p):
                os.unlink(p)


def test_only_a_driver_files_name_with_a_pid_of_no_process_counts_as_its_makers_gone():
    assert programs.maker_gone(f"cuda.shm.0.{0x7FFFFFF0:x}.1")
    assert not programs.maker_gone(f"cuda.shm.0.{os.getpid():x}.1")
    assert not programs.maker_gone("cuda.shm.0.zz.1")
    assert not programs.maker_gone("cuda.shm")
    assert not programs.maker_gone("cuda.shm.0.0.1")
