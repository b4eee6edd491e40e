"""How far ahead of the GPU a guest may run beside a guest of a higher priority
(host_forwarder/native/sched_depth.c), against a hostile guest process on the ASan/UBSan
forwarder: markers on streams it destroys at once, the legacy and per-thread streams, stream
handles that name nothing or something else, captures (ended, and left open on a stream it
destroys), markers that never finish in time, and the guest process or its worker killed while
the worker waits for its markers.  The worker serves on, or ends cleanly, and the GPU's other
guest is not held up.  The simulated GPU reaches each event VMGPU_SIM_EVENT_LAG_US after its
record."""

import os
import signal
import subprocess
import time

import pytest

from tests.forwarder import NATIVE, forwarder, guest_env, wait_for, worker_pids
from tests.native.guest_process import PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_HANDLE = 0, 400
LEGACY, PER_THREAD = 1, 2

GUEST = (
    PRELUDE
    + r"""
buf = u64()
assert cuda.cuMemAlloc_v2(ctypes.byref(buf), sz(4096)) == 0
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    op, a = w[0], [int(x, 0) for x in w[1:]]
    out = ""
    if op == "stream":
        s = P()
        r = cuda.cuStreamCreate(ctypes.byref(s), 1)
        out = s.value
    elif op == "event":
        e = P()
        r = cuda.cuEventCreate(ctypes.byref(e), 2)
        out = e.value
    elif op == "destroy":
        r = cuda.cuStreamDestroy_v2(P(a[0]))
    elif op == "memset":  # stream n: n async memsets on it (work the GPU is given)
        r = 0
        for _ in range(a[1]):
            r = r or cuda.cuMemsetD8Async(buf, 7, sz(4096), P(a[0]))
    elif op == "sync":
        r = cuda.cuCtxSynchronize()
    elif op == "ssync":  # one stream (a context's synchronisation would break a capture open)
        r = cuda.cuStreamSynchronize(P(a[0]))
    elif op == "capture":
        r = cuda.cuStreamBeginCapture_v2(P(a[0]), 0)  # global mode
    elif op == "endcapture":
        g = P()
        r = cuda.cuStreamEndCapture(P(a[0]), ctypes.byref(g))
        if g.value:
            cuda.cuGraphDestroy(g)
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)


def _beside_a_higher_guest(tmp_path, lag_ms: int):
    """Forwarder a (ASan, --sched-depth 2, events lagging lag_ms) beside b of a higher priority."""
    a, b = tmp_path / "a", tmp_path / "b"
    lag = {"VMGPU_SIM_EVENT_LAG_US": str(lag_ms * 1000)}
    fa = forwarder(a, asan=True, env=lag, extra=("--sched-depth", "2"))
    fb = forwarder(b, extra=("--priority", "high"))
    return a, b, fa, fb


def _b_runs(b) -> None:
    """The higher guest gets its work done (nobody holds the GPU from it)."""
    p = subprocess.run([str(NATIVE / "spin"), "0.3"], env=guest_env(b), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and int(p.stdout.split()[1]) > 0, p.stdout + p.stderr


def test_markers_on_streams_gone_default_streams_and_foreign_handles_leave_the_worker_serving(
    sched_dir, tmp_path, guests
):
    a, b, fa, fb = _beside_a_higher_guest(tmp_path, 100)
    with fa as fwd, fb:
        g = guests(a, 0, GUEST)
        s1, s2 = int(g.ok("stream")), int(g.ok("stream"))
        # markers on two streams, destroyed while the markers are still to come
        assert g("memset", s1, 2) == (SUCCESS, "") and g("memset", s2, 2) == (SUCCESS, "")
        assert g("destroy", s1)[0] == SUCCESS and g("destroy", s2)[0] == SUCCESS
        # the legacy, per-thread and NULL streams: markers go there too, and pass
        for s in (LEGACY, PER_THREAD, 0):
            assert g("memset", s, 3) == (SUCCESS, "")
        assert g("sync") == (SUCCESS, "")
        # a stream that is gone, an event, and values no stream has: refused, no marker, serving on
        ev = int(g.ok("event"))
        for bad in (s1, ev, 3, 0xDEAD00000000BEEF, (1 << 64) - 1):
            assert g("memset", bad, 1) == (SUCCESS, "")  # async: the error comes at the next sync
            assert g("sync")[0] == INVALID_HANDLE, bad
        assert g("sync") == (SUCCESS, "")
        s3 = int(g.ok("stream"))
        t = time.monotonic()
        assert g("memset", s3, 6) == (SUCCESS, "") and g("sync") == (SUCCESS, "")
        assert time.monotonic() - t >= 0.15  # held: 2 deep, each marker 100 ms behind its record
        g.exit()
        _b_runs(b)
        assert fwd.proc.poll() is None, fwd.log()


def test_a_capture_is_neither_broken_nor_a_way_round_the_depth(sched_dir, tmp_path, guests):
    a, b, fa, fb = _beside_a_higher_guest(tmp_path, 100)
    with fa as fwd, fb:
        g = guests(a, 0, GUEST)
        cap, work, gone = int(g.ok("stream")), int(g.ok("stream")), int(g.ok("stream"))
        assert g("capture", cap) == (SUCCESS, "")
        assert g("memset", cap, 3) == (SUCCESS, "")  # captured: no marker goes there
        t = time.monotonic()
        assert g("memset", work, 6) == (SUCCESS, "") and g("ssync", work)[0] == SUCCESS
        held = time.monotonic() - t
        assert g("endcapture", cap) == (SUCCESS, "")  # whole: the markers' queries were relaxed
        assert held >= 0.15, held  # the open capture did not lift the depth
        # a capture left open on a stream destroyed under it: the depth holds all the same
        assert g("capture", gone) == (SUCCESS, "") and g("destroy", gone)[0] == SUCCESS
        t = time.monotonic()
        assert g("memset", work, 6) == (SUCCESS, "") and g("sync") == (SUCCESS, "")
        assert time.monotonic() - t >= 0.15
        g.exit()
        _b_runs(b)
        assert fwd.proc.poll() is None, fwd.log()


def test_markers_that_never_finish_in_time_are_let_go_and_a_worker_killed_waiting_for_them_ends_clean(
    sched_dir, tmp_path, guests
):
    """Each marker 1.5 s behind its record: a call that finds 2 outstanding waits 1 s, lets them go
    and passes.  Then the guest process, and a worker, killed while it waits for them."""
    a, b, fa, fb = _beside_a_higher_guest(tmp_path, 1500)
    with fa as fwd, fb:
        g = guests(a, 0, GUEST)
        s = int(g.ok("stream"))
        t = time.monotonic()
        assert g("memset", s, 6) == (SUCCESS, "") and g("sync") == (SUCCESS, "")
        took = time.monotonic() - t
        assert 2 <= took < 10, took  # two waits of a second each, then let go
        # the guest process killed while its worker waits
        assert g("memset", s, 40) == (SUCCESS, "")
        time.sleep(0.5)
        g.kill()
        assert wait_for(lambda: not worker_pids(fwd), timeout=15), fwd.log()
        _b_runs(b)
        # a worker killed while it waits
        g = guests(a, 0, GUEST)
        s = int(g.ok("stream"))
        assert g("memset", s, 40) == (SUCCESS, "")
        time.sleep(0.5)
        (w,) = worker_pids(fwd)
        os.kill(w, signal.SIGKILL)
        assert wait_for(lambda: w not in worker_pids(fwd), timeout=15)
        g.kill()
        _b_runs(b)
        # and the guest's next process is served
        g = guests(a, 0, GUEST)
        assert g("memset", 0, 3) == (SUCCESS, "") and g("sync") == (SUCCESS, "")
        g.exit()
        assert fwd.proc.poll() is None, fwd.log()
        assert fwd.stop() == 0, fwd.log()
