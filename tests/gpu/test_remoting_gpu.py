"""Differential GPU tests: one test body, the same unchanged program natively and through
vmgpu on a real GPU, outputs compared.

Run on the GPU host: `make native cuda-programs && python3 -m pytest -m gpu tests/gpu`.
"""

import operator
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, hidden_devices, hold, log_text, memquota, run_guest, wait_for
from tests.gpu.programs import PROGRAMS, SAME_OUTPUT, native_env, run_native
from vmgpu import gpu, stats
from vmgpu.errors import GpuError
from vmgpu.forwarder import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and driver here")]


def _both(shm_path, program, mem=None):
    # natively on the one GPU the guest's slice is on (GPU 0): on a host with more, a program that
    # counts its devices sees as many as the guest does
    native = run_native(program, CUDA_VISIBLE_DEVICES="0")
    assert native.returncode == 0, native.stdout + native.stderr
    with forwarder(shm_path, backend="cuda", size="1G", mem=mem) as fwd:
        vm = run_guest(program, shm_path, timeout=300)
        assert vm.returncode == 0, vm.stdout + vm.stderr + log_text(fwd)
    assert "SIMULATED" not in log_text(fwd)
    return native.stdout, vm.stdout


@pytest.mark.parametrize("program", [pytest.param(p, id=k) for k, p in SAME_OUTPUT.items()])
def test_same_output_natively_and_through_vmgpu(shm_path, program):
    native, vm = _both(shm_path, program)
    assert vm == native


def _gpu_count() -> int:
    """The GPUs NVML sees here (0 without a driver or NVML)."""
    if not gpu_present():
        return 0
    try:
        return len(gpu.nvml())
    except GpuError:
        return 0


TWO_GPUS = pytest.mark.skipif(_gpu_count() < 2, reason="needs two NVIDIA GPUs (a guest with slices on GPUs 0 and 1)")


def _both_on_two_gpus(shm_path, program) -> tuple[str, str]:
    """program natively, then through a forwarder whose guest has slices on GPUs 0 and 1."""
    native = run_native(program)
    assert native.returncode == 0, native.stdout + native.stderr
    with forwarder(shm_path, backend="cuda", size="2G", extra=["--gpus", "0,1"]) as fwd:
        vm = run_guest(program, shm_path, timeout=300)
        assert vm.returncode == 0, vm.stdout + vm.stderr + log_text(fwd)
    assert "SIMULATED" not in log_text(fwd)
    return native.stdout, vm.stdout


@TWO_GPUS
def test_pytorch_tensors_move_between_a_guests_two_gpus_as_natively(shm_path):
    """A guest with slices on GPUs 0 and 1: tensors copied from cuda:0 to cuda:1 and back (peer
    access and peer copies where the GPUs have a path, staged through the host where not), computed
    on there: the same output natively and through vmgpu."""
    native, vm = _both_on_two_gpus(shm_path, PROGRAMS["torch-peer"])
    assert vm == native


@TWO_GPUS
@pytest.mark.parametrize("name", ["ipc-pair", "vmm-fd-pair"])
def test_two_processes_of_a_guest_share_memory_on_two_gpus_as_natively(shm_path, name):
    """NCCL's two ways of sharing memory between processes, by a guest with slices on GPUs 0 and 1:
    CUDA IPC handles (tests/cuda/ipc_pair.c) and VMM handles passed as file descriptors over a Unix
    socket (tests/cuda/vmm_fd_pair.c); each process reads the other's bytes, every step succeeds
    natively and through vmgpu with the same output."""
    native, vm = _both_on_two_gpus(shm_path, PROGRAMS[name])
    assert sorted(vm.splitlines()) == sorted(native.splitlines())  # (the two processes' lines interleave)
    assert vm.rstrip().endswith(" ok")


@pytest.mark.parametrize("name", ["ipc-pair", "vmm-fd-pair"])
def test_two_processes_of_a_guest_share_memory_on_one_gpu_as_natively(shm_path, name):
    """The same two programs with both processes on GPU 0 (a guest with one slice): each reads the
    other's bytes, every step succeeds natively and through vmgpu with the same output."""
    native, vm = _both(shm_path, PROGRAMS[f"{name}-one-gpu"])
    assert sorted(vm.splitlines()) == sorted(native.splitlines())
    assert vm.rstrip().endswith(" ok")


@TWO_GPUS
def test_nccl_between_two_processes_of_a_guest_each_on_its_own_gpu_as_natively(shm_path):
    """torch.distributed over NCCL: two processes of one guest (slices on GPUs 0 and 1), one GPU
    each: all_reduce, all_gather, broadcast and reduce_scatter give the native, correct results."""
    native, vm = _both_on_two_gpus(shm_path, PROGRAMS["nccl-all-reduce"])
    assert sorted(vm.splitlines()) == sorted(native.splitlines())
    assert "rank 0 all_reduce correct=True" in vm and "rank 1 all_reduce correct=True" in vm


def test_a_guest_process_cannot_reach_the_driver_itself():
    """The differential tests run guests with /dev/nvidia* hidden: the same native program that
    works outside fails inside (so a guest's success is vmgpu's, not the driver's)."""
    program = [NATIVE / "devquery"]
    assert run_native(program).returncode == 0
    hidden = subprocess.run(
        hidden_devices([str(a) for a in program]), env=native_env(), capture_output=True, text=True, timeout=60
    )
    assert hidden.returncode != 0, hidden.stdout


def test_device_query_shows_the_quota_and_nothing_else_changes(shm_path):
    native, vm = _both(shm_path, [NATIVE / "devquery"], mem="20G")
    quota = str(20 << 30)
    want = [ln for ln in native.splitlines() if not ln.startswith(("total_mem", "meminfo_total"))]
    assert [ln for ln in vm.splitlines() if not ln.startswith(("total_mem", "meminfo_total"))] == want
    assert f"total_mem {quota}" in vm.splitlines() and f"meminfo_total {quota}" in vm.splitlines()


# The errors the driver gives a kernel's write far outside its allocation.  Which one is not fixed:
# natively on the H100 the same program got 700 in one run and 717 in another (and a single
# thread's write 1 GiB out got 700, 700, 717 in three runs), so the guest is held to the set.
WILD_WRITE_ERRORS = {700: "cudaErrorIllegalAddress", 717: "cudaErrorInvalidAddressSpace"}


def _wild_write_error(stdout: str) -> int:
    """The oob program's sticky error: launched fine, then the same fault error at the sync and after."""
    m = re.fullmatch(r"launch=0 sync=(\d+) \((\w+)\) after=(\d+)\n", stdout)
    assert m, stdout
    sync, name, after = int(m[1]), m[2], int(m[3])
    assert WILD_WRITE_ERRORS.get(sync) == name and after == sync, stdout
    return sync


def test_kernel_fault_is_the_guests_alone(shm_path):
    """An out-of-bounds kernel gets a native fault error, sticky as natively; the forwarder
    survives; the next process runs."""
    native = run_native(PROGRAMS["oob"])
    with forwarder(shm_path, backend="cuda", size="1G") as fwd:
        vm = run_guest(PROGRAMS["oob"], shm_path)
        after = run_guest([NATIVE / "vecadd", 1 << 20], shm_path)
        assert fwd.proc.poll() is None, log_text(fwd)
    assert native.returncode == 0, native.stdout
    _wild_write_error(native.stdout)
    assert vm.returncode == 0, vm.stdout + vm.stderr
    _wild_write_error(vm.stdout)
    assert after.returncode == 0 and after.stdout.strip() == "vecadd ok n=1048576", after.stdout + after.stderr


def test_a_faulting_guest_does_not_harm_its_neighbour(shm_path, tmp_path, monkeypatch):
    """Two guests share the GPU under the weighted scheduler (50/50): one launches an
    out-of-bounds kernel again and again, the other multiplies matrices; the second's results
    are correct and it is not slowed below its share."""
    monkeypatch.setenv("VMGPU_SCHED_DIR", str(tmp_path))
    other = Path(str(shm_path) + "-b")
    solo_t = None
    with forwarder(shm_path, backend="cuda", size="1G", extra=("--compute", "50")) as fa:
        with forwarder(other, backend="cuda", size="1G", extra=("--compute", "50")):
            t = time.monotonic()
            solo = run_guest([NATIVE / "matmul", 1024], other, timeout=300)
            solo_t = time.monotonic() - t
            faulting = subprocess.Popen(
                ["sh", "-c", f"for i in $(seq 40); do {NATIVE / 'oob'}; done"],
                env=guest_env(shm_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            t = time.monotonic()
            beside = run_guest([NATIVE / "matmul", 1024], other, timeout=300)
            beside_t = time.monotonic() - t
            faulting.communicate(timeout=300)
            assert fa.proc.poll() is None, log_text(fa)
    assert solo.returncode == 0 and beside.returncode == 0, beside.stdout + beside.stderr
    assert solo.stdout == beside.stdout and " ok" in beside.stdout, (solo.stdout, beside.stdout)
    assert beside_t < 2.5 * solo_t + 1, (solo_t, beside_t)  # at worst its half of the GPU, with slack


@pytest.mark.parametrize("quota,fits", [("3200M", False), ("8G", True)])
def test_pytorch_training_fits_its_quota_or_gets_a_cuda_oom(shm_path, quota, fits):
    """Training that needs about 7.6 GB: a CUDA out-of-memory error under 3.2 GiB, trained under 8 GiB."""
    native = run_native(PROGRAMS["torch-mem"])
    assert native.stdout.startswith("trained"), native.stdout + native.stderr
    with forwarder(shm_path, backend="cuda", size="1G", mem=quota) as fwd:
        vm = run_guest(PROGRAMS["torch-mem"], shm_path, timeout=300)
        assert vm.returncode == 0, vm.stdout + vm.stderr + log_text(fwd)
    if fits:
        assert vm.stdout.startswith("trained"), vm.stdout + vm.stderr
        assert int(vm.stdout.split()[1]) <= 8 << 30
    else:
        assert vm.stdout.startswith("oom"), vm.stdout + vm.stderr


def test_quota_is_what_the_guest_sees_and_enforced(shm_path):
    """The guest sees its quota as the card's size, less what its context measurably takes;
    1 MiB allocations succeed until exactly that is spent, then OUT_OF_MEMORY (2)."""
    with forwarder(shm_path, backend="cuda", mem="2G"):
        p = hold(shm_path, 1024)
        held = p.stdout.readline().split()
        assert held[0] == "held" and int(held[2]) == 2 << 30, held
        ctx = (2 << 30) - (1024 << 20) - int(held[1])
        assert (256 << 20) < ctx < (1 << 30), ctx  # the context's own memory (518 MiB on the H100)
        for _ in range(1100):
            p.stdin.write("x\n")
        p.stdin.close()
        results = p.stdout.read().split("\n")
        p.wait()
    fit = int(held[1]) >> 20
    print(f"context charge {ctx} bytes; {fit} MiB left for 1 MiB allocations")
    assert abs(results.count("alloc 0") - fit) <= 1 and results.count("alloc 2") == 1100 - results.count("alloc 0")


@pytest.mark.parametrize("precision,rel", [("fp32", 1e-4), ("bf16", 2e-2)])
def test_pytorch_training_gives_the_native_losses(shm_path, precision, rel):
    """A small CNN and a small transformer train a few steps: the same losses natively and through vmgpu."""
    import json

    program = PROGRAMS[f"torch-train-{precision}"]
    native, vm = _both(shm_path, program)
    native, vm = json.loads(native.splitlines()[-1]), json.loads(vm.splitlines()[-1])
    for model in ("cnn", "transformer"):
        assert len(vm[model]) == len(native[model]) == 6
        for step, (n, v) in enumerate(zip(native[model], vm[model], strict=True)):
            assert v == pytest.approx(n, rel=rel), f"{model} step {step}: native {n}, vmgpu {v}"


def test_every_allocation_path_is_held_to_the_quota_by_nvml(shm_path, tmp_path):
    """Random sizes through cuMemAlloc, pitched, 3D arrays, stream-ordered, an own pool, VMM,
    graph memory nodes and module globals until refused, three rounds: NVML's per-process
    usage of the forwarder's workers never passes the quota, and the charges agree with it."""
    import pynvml

    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    quota = 3 << 30
    page = tmp_path / "stats"
    seen = []

    def measure(workers):
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)
        return sum(p.usedGpuMemory or 0 for p in procs if p.pid in workers), stats.read(page)["memory"][0]["used"]

    def check(what, fields, workers):
        # frees the guest did not wait for (stream-ordered, module unloads) reach the charges
        # at the worker's next look, at most 50 ms on
        wait_for(lambda: abs(operator.sub(*measure(workers))) <= 4 << 20, timeout=2)
        real, charges = measure(workers)
        seen.append((what, int(fields.get("held", 0)), charges, real))
        print(
            f"memquota {what} held={fields.get('held', 0)} charged={charges} nvml={real} ooms={fields.get('ooms', '')}"
        )
        assert workers and real <= quota and charges <= quota
        assert abs(charges - real) <= 4 << 20  # the charges are the measurement
        if what == "FULL":
            # full: the round ended on refusals, and none of them refused memory the guest had
            # (what was left is less than the largest take, 256 MiB)
            assert int(fields["held"]) <= quota and fields["ended"] == "refused" and real > quota - (256 << 20)

    with forwarder(shm_path, backend="cuda", size="1G", mem="3G", extra=["--stats", str(page)]) as fwd:
        refused = memquota(fwd, shm_path, 11, 3, NATIVE / "bigglobal.cubin", "aprsovgm", check)
    assert [w for w, *_ in seen] == ["FULL", "FULL", "FULL", "EMPTY"]
    assert all(refused.get(k, 0) > 0 for k in "aprsovgm"), refused
