"""The programs the GPU tests run natively (and through vmgpu), by test id: one list, read by the
differential tests and by `make census` (bench/census.py).  Standard library only, so the census
can import it without the test dependencies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NATIVE = HERE.parent.parent / "build" / "native"
PTX = HERE.parent / "cuda" / "vadd.ptx"

# the differential tests' programs: the same output natively and through vmgpu
SAME_OUTPUT: dict[str, list] = {
    "drv_api-ptx-and-cubin": [NATIVE / "drv_api", PTX, 256, NATIVE / "vadd.cubin"],
    "vecadd": [NATIVE / "vecadd", 1 << 24],
    "matmul": [NATIVE / "matmul", 768],
    "streams-events-memset-pinned": [NATIVE / "streams"],
    "devquery": [NATIVE / "devquery"],
    "freed-block-reused-after-its-work": [NATIVE / "free_reuse"],
    "host-functions": [NATIVE / "hostfn"],
    "copy2d-3d-memset2d-arrays": [NATIVE / "copy2d"],
    "link-ptx-file-and-cubin": [NATIVE / "link", PTX, NATIVE / "vadd_rdc.cubin"],
    "jit-options-module-and-library-loads": [NATIVE / "jit_load", PTX],
    "pytorch": [sys.executable, HERE / "torch_ops.py"],
    "pytorch-cuda-graphs": [sys.executable, HERE / "torch_graphs.py"],
    "torch-compile": [sys.executable, HERE / "torch_compile.py"],
    "cupy": [sys.executable, HERE / "cupy_ops.py"],
    "cupy-sparse-solver": [sys.executable, HERE / "cupy_sparse.py"],
    "jax": [sys.executable, HERE / "jax_ops.py"],
    "triton": [sys.executable, HERE / "triton_ops.py"],
    "cuda-python-nvrtc": [sys.executable, HERE / "cuda_nvrtc.py"],
    "hf-transformer": [sys.executable, HERE / "hf_transformer.py"],
}

# and every other program a GPU test runs natively
PROGRAMS: dict[str, list] = {
    **SAME_OUTPUT,
    "oob": [NATIVE / "oob"],
    "torch-mem": [sys.executable, HERE / "torch_mem.py"],
    "torch-train-fp32": [sys.executable, HERE / "torch_train_diff.py"],
    "torch-train-bf16": [sys.executable, HERE / "torch_train_diff.py", "--bf16"],
    "zero-copy": [sys.executable, HERE / "zero_copy.py", PTX],
    "ipc-pair-one-gpu": [NATIVE / "ipc_pair", 0, 0],
    "vmm-fd-pair-one-gpu": [NATIVE / "vmm_fd_pair", 0, 0],
    "torch-peer": [sys.executable, HERE / "torch_peer.py"],
    "nccl-all-reduce": [sys.executable, HERE / "torch_nccl.py"],
    "ipc-pair": [NATIVE / "ipc_pair", 0, 1],
    "vmm-fd-pair": [NATIVE / "vmm_fd_pair", 0, 1],
}

# the programs that need two GPUs (on a host with one they fail, or wait on a peer that failed)
TWO_GPUS = frozenset({"torch-peer", "nccl-all-reduce", "ipc-pair", "vmm-fd-pair"})


def gpu_count() -> int:
    """The GPUs this host's driver exposes (its /dev/nvidiaN files): 0 without a driver."""
    return sum(1 for p in Path("/dev").glob("nvidia*") if p.name[len("nvidia") :].isdigit())


def native_env(**extra: str) -> dict[str, str]:
    """This process's environment for a native run: no guest library, no region."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    env.update(extra)
    return env


SHM = Path("/dev/shm")


def driver_files() -> set[str]:
    """The driver's shared-memory files in /dev/shm (`cuda.shm.<n>.<pid in hex>.<n>`)."""
    try:
        return {p.name for p in SHM.glob("cuda.shm.*")}
    except OSError:
        return set()


def driver_files_of(pid: int) -> set[str]:
    """The driver's files in /dev/shm named for process pid, spelled as the driver spells it."""
    return {n for n in driver_files() if n.split(".")[3:4] == [f"{pid:x}"]}


def maker_gone(name: str) -> bool:
    """Whether the process that made this driver file (the pid its name gives) has ended."""
    parts = name.split(".")
    try:
        pid = int(parts[3], 16)
    except (IndexError, ValueError):
        return False
    return pid > 0 and not Path(f"/proc/{pid}").exists()


def run_native(args, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    """A program run natively.  The driver leaves an interprocess event's file in /dev/shm after
    the processes that made and opened it have ended (ipc_pair natively: one each run; through
    vmgpu none): what a native run's processes left there is removed after it, so that a test
    leaves /dev/shm as it found it and what vmgpu leaves is still seen (tests/shm_check.py)."""
    before = driver_files()
    try:
        return subprocess.run(
            [str(a) for a in args], env=native_env(**extra), capture_output=True, text=True, timeout=timeout
        )
    finally:
        for name in driver_files() - before:
            if maker_gone(name):
                (SHM / name).unlink(missing_ok=True)
