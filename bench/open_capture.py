"""A guest's way off its SM span, for bench/torch_train.py --open-capture: a stream capture begun
on a stream of its own and never ended.

While a capture is open in a forwarder's process, the forwarder moves none of that guest's work
between spans (a capture keeps work where it began: host_forwarder/native/partition.c, may_move),
the guest's slot says so (whole_ms), and the share controller then holds every guest on the GPU by
time (vmgpu/share_control.py): one guest can take the others off their spans at will.  The capture
is on a new non-blocking stream (no implicit order with the legacy stream the trainer's work goes
on) in the relaxed mode (no call of any thread is refused for it), so the guest's own training goes
on as ever, but for a context-wide synchronisation, which the driver refuses while a capture is
open in the context whatever its mode: the guest then waits for its own stream instead
(torch_train.py), and ends the capture before it exits (end_capture).  No torch here: the calls
alone, which the tests drive with a fake driver."""

from __future__ import annotations

import ctypes

CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2


def open_capture(lib) -> int:
    """Begin a capture on a new non-blocking stream of the calling thread's current context, in
    the relaxed mode, and leave it open; the stream's handle.  lib: the driver (libcuda.so.1, in a
    guest vmgpu's).  A driver error raises, naming the call: a run that asked for the capture and
    got none would measure an honest guest."""
    s = ctypes.c_void_p()
    r = lib.cuStreamCreate(ctypes.byref(s), CU_STREAM_NON_BLOCKING)
    if r:
        raise RuntimeError(f"--open-capture: cuStreamCreate failed: CUresult {r}")
    r = lib.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED)
    if r:
        raise RuntimeError(f"--open-capture: cuStreamBeginCapture_v2 failed: CUresult {r}")
    return s.value or 0


def end_capture(lib, stream: int) -> None:
    """End the capture open_capture began (the graph it made destroyed) and destroy its stream,
    before the guest exits (a context torn down with a capture open may fail its exit).  Errors
    are left: the guest's result is already out."""
    s = ctypes.c_void_p(stream)
    graph = ctypes.c_void_p()
    lib.cuStreamEndCapture(s, ctypes.byref(graph))
    if graph.value:
        lib.cuGraphDestroy(graph)
    lib.cuStreamDestroy_v2(s)
