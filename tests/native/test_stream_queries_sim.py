"""What a guest is told of its streams without a round trip: cuStreamGetGreenCtx (cuBLAS 13.10 asks it
at cublasCreate; before, it was unserved, and cublasCreate failed with CUBLAS_STATUS_INTERNAL_ERROR
through vmgpu).  vmgpu puts no guest stream in a green context (cuGreenCtxCreate and
cuCtxFromGreenCtx are not served), so every stream's is NULL, as the driver answers for a stream of
a regular context; no host pointer can come back."""

import pytest

from tests.forwarder import forwarder
from tests.native.guest_process import LOOP, PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_CONTEXT = 0, 1, 201

GUEST = (
    PRELUDE
    + LOOP
    + r"""
    if op == "stream":
        s = P()
        r = cuda.cuStreamCreate(ctypes.byref(s), 1)
        out = s.value
    elif op == "green":  # stream value, or "null": no place for the answer
        g = P(0xDEAD)
        r = cuda.cuStreamGetGreenCtx(P(int(a[0])), None if a[1:] == ["null"] else ctypes.byref(g))
        out = g.value
    elif op == "nocontext":
        r = cuda.cuCtxSetCurrent(None)
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)


def test_every_stream_of_a_guest_is_in_no_green_context(shm_path, guests):
    with forwarder(shm_path):
        g = guests(shm_path, 0, GUEST)
        s = int(g("stream")[1])
        for stream in (s, 0, 1, 2):  # its own, the NULL, legacy and per-thread streams
            assert g("green", stream) == (SUCCESS, "None"), stream
        assert g("green", s, "null")[0] == INVALID_VALUE
        assert g("nocontext")[0] == SUCCESS
        assert g("green", 0)[0] == INVALID_CONTEXT
