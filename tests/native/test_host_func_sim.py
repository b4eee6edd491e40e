"""Host functions on streams (cuLaunchHostFunc, cuStreamAddCallback) on the simulated backend: the
guest library runs them on its callback thread while the stream waits on two words of the
region's heap (guest_agent/libcuda/host_func.c); the host queues the write and the wait only on
the guest's own stream and words of its heap, refuses a capturing stream, and gives up on a
function that never returns (host_forwarder/native/host_func.c)."""

import struct
import subprocess
import time

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, run_guest
from tests.native.test_generator import raw
from vmgpu import shm

pytestmark = pytest.mark.native

OP_LAUNCH_HOST_FUNC = 140


def test_host_functions_run_in_order_after_the_work_queued_before_them(shm_path):
    """600 functions on two streams, more than the library's 256 slots at once: each sees the value
    the copy before it brought back and runs in its stream's order; a NULL function and callback
    flags are refused as the driver refuses them."""
    with forwarder(shm_path, asan=True) as fwd:
        r = run_guest([NATIVE / "hostfn"], shm_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
    assert r.stdout.splitlines() == ["hostfn ok=1 ran=600 errors=0 sync=0,0", "null_fn 1 bad_flags 1"], r.stdout


def test_a_host_function_that_never_returns_is_given_up_on_and_the_guest_told(shm_path):
    """A function that does not return within the timeout (1 s here): the forwarder releases the
    stream, logs it, and the guest's synchronisation answers CUDA_ERROR_LAUNCH_TIMEOUT (702)."""
    with forwarder(shm_path, asan=True, env={"VMGPU_HOST_FUNC_TIMEOUT_S": "1"}) as fwd:
        r = run_guest([NATIVE / "hostfn", "stuck"], shm_path, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert r.stdout.split() == ["queued", "0", "stuck", "702"], r.stdout + fwd.log()
        assert "a host function has not returned 1 s after its stream reached it" in fwd.log()


def test_a_host_function_on_a_capturing_stream_is_refused(shm_path):
    """A graph would replay the same sequence number, which the wait has already seen: refused with
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) rather than captured wrong."""
    with forwarder(shm_path) as fwd:
        r = run_guest([NATIVE / "hostfn", "capture"], shm_path, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["capture", "900"], r.stdout + r.stderr + fwd.log()


def test_raw_host_function_requests_naming_words_outside_the_heap_or_a_stream_not_the_guests_are_refused(
    shm_path,
):
    """Past the guest library: words before or straddling the heap's ends, misaligned, a sequence
    number of 0 or past 32 bits, a stream the guest never made, a request cut short: each refused
    without the driver being asked; a good request on words of the guest's heap is queued and the
    stream waits for the guest's own "done" word (written here by hand)."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            params = region.check()
            lay = params.layout(region.size)
            heap_off, heap_end = lay["heap_off"], lay["heap_off"] + lay["heap_size"]
            words = chan.heap_alloc(64)

            def req(stream, off, seq):
                return struct.pack("<QQQ", stream, off, seq)

            bad = [
                (req(0, heap_off - 8, 1), 1),
                (req(0, heap_end - 4, 1), 1),
                (req(0, heap_end, 1), 1),
                (req(0, 1 << 62, 1), 1),
                (req(0, words + 2, 1), 1),
                (req(0, words, 0), 1),
                (req(0, words, 1 << 32), 1),
                (req(0x1234, words, 1), 400),
                (req(0, words, 1)[:16], 1),
            ]
            got = [raw(chan, OP_LAUNCH_HOST_FUNC, body, seq=1 + i)[0] for i, (body, _) in enumerate(bad)]
            assert got == [want for _, want in bad], (got, fwd.log())
            region.mm[words + 4 : words + 8] = struct.pack("<I", 7)  # "done" before the host asks
            assert raw(chan, OP_LAUNCH_HOST_FUNC, req(0, words, 7), seq=50)[0] == 0, fwd.log()
            assert struct.unpack_from("<I", region.mm, words)[0] == 7  # the stream wrote "reached"
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()
        assert "has not returned" not in fwd.log()  # the wait saw the guest's word, not the timeout


def test_a_child_forked_after_its_parent_ran_host_functions_runs_its_own(shm_path):
    """A forked child connects afresh: its host functions run on a callback thread of its own and
    on words of its own channel's heap, not on the parent's (whose thread is not in the child),
    so the function runs and the stream's synchronisation succeeds without the watchdog."""
    with forwarder(shm_path, asan=True, env={"VMGPU_HOST_FUNC_TIMEOUT_S": "1"}) as fwd:
        r = run_guest([NATIVE / "hostfn", "fork"], shm_path, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert r.stdout.split() == ["child", "0", "0", "1"], r.stdout + fwd.log()
        assert "has not returned" not in fwd.log()


def test_a_host_function_that_never_returns_is_given_up_on_while_another_guest_waits_for_the_gpu(
    shm_path, tmp_path, sched_dir
):
    """Another guest's work waits for the GPU, so the scheduler hands the turn over and drains the
    holder's work, which waits for the function: the watch must still give up on it after the
    timeout (1 s here, the function takes 3 s), not wait with the drain for the function."""
    other = tmp_path / "other"
    with (
        forwarder(shm_path, asan=True, extra=("--compute", "50"), env={"VMGPU_HOST_FUNC_TIMEOUT_S": "1"}) as fwd,
        forwarder(other, extra=("--compute", "50")),
    ):
        spin = subprocess.Popen([str(NATIVE / "spin"), "8"], env=guest_env(other), stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(0.5)  # the other guest is at work, and waits for the GPU at every turn
            r = run_guest([NATIVE / "hostfn", "stuck"], shm_path, timeout=60)
        finally:
            spin.kill()
            spin.wait()
        assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
        assert r.stdout.split() == ["queued", "0", "stuck", "702"], r.stdout + fwd.log()
        assert "a host function has not returned 1 s after its stream reached it" in fwd.log()
