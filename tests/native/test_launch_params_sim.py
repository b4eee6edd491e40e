"""A launch's parameters through vmgpu (guest_agent/libcuda/launch.c vg_put_params,
host_forwarder/native/launch.c) on the simulated backend and the ASan/UBSan forwarder, whose
simulated driver reads every parameter at launch, as the driver does: a kernel with more parameters
than the host lays out (VG_MAX_PARAMS) is refused, never launched with an argument array shorter
than the kernel's parameters; a packed buffer (CU_LAUNCH_PARAM_BUFFER_POINTER) without its size is
refused, one shorter than the parameters is taken."""

import json
import subprocess

import pytest

from tests.forwarder import PTX, forwarder, guest_env
from tests.native.guest_process import GUEST_LIB

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 801
VG_MAX_PARAMS = 1024


def wide_ptx(nparams: int) -> bytes:
    """A kernel of nparams one-byte parameters (within the driver's 32764 bytes of them)."""
    params = ",\n".join(f".param .u8 p{i}" for i in range(nparams))
    return f".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry wide(\n{params}\n)\n{{\nret;\n}}\n".encode()


# One guest process: loads the module given (argv[3]) and vadd.ptx, and answers in JSON what each
# launch returned.
SCRIPT = r"""
import ctypes, json, sys
cuda = ctypes.CDLL(sys.argv[1])
P, sz = ctypes.c_void_p, ctypes.c_size_t
ctx = P()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
out = {}

def function(text, name):
    mod, fn = P(), P()
    r = cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(text))
    assert r == 0, ("load", r)
    r = cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name)
    assert r == 0, ("function", r)
    return fn

def launch(fn, params=None, extra=None):
    r = cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, extra)
    return r if r else cuda.cuCtxSynchronize()

wide = function(open(sys.argv[2], "rb").read() + b"\0", b"wide")
n = int(sys.argv[3])
bytes_ = (ctypes.c_uint8 * n)()
params = (P * n)(*[ctypes.addressof(bytes_) + i for i in range(n)])
out["wide"] = launch(wide, params)

vadd = function(open(sys.argv[4], "rb").read() + b"\0", b"vadd")
d = P()
assert cuda.cuMemAlloc_v2(ctypes.byref(d), 64) == 0
buf = (ctypes.c_uint64 * 4)(d.value, d.value, d.value, 4)
size = sz(28)
end, pointer, size_tag = P(0), P(1), P(2)
out["packed"] = launch(vadd, None, (P * 5)(pointer, ctypes.addressof(buf), size_tag, ctypes.addressof(size), end))
size.value = 16  # shorter than the parameters: taken, the rest zero
out["short"] = launch(vadd, None, (P * 5)(pointer, ctypes.addressof(buf), size_tag, ctypes.addressof(size), end))
out["no size"] = launch(vadd, None, (P * 3)(pointer, ctypes.addressof(buf), end))
out["no pointer"] = launch(vadd, None, (P * 3)(size_tag, ctypes.addressof(size), end))
print(json.dumps(out))
"""


def run(shm_path, tmp_path, nparams: int, fwd=None) -> dict:
    ptx = tmp_path / "wide.ptx"
    ptx.write_bytes(wide_ptx(nparams))
    r = subprocess.run(
        ["python3", "-c", SCRIPT, str(GUEST_LIB), str(ptx), str(nparams), str(PTX)],
        env=guest_env(shm_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr + (fwd.log() if fwd else "")
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("nparams", [VG_MAX_PARAMS, VG_MAX_PARAMS + 1, 1100])
def test_a_kernel_with_more_parameters_than_the_host_lays_out_is_refused(shm_path, tmp_path, nparams):
    """A kernel of VG_MAX_PARAMS parameters launches; one of more is CUDA_ERROR_NOT_SUPPORTED (on
    the old code the worker handed the driver its array of VG_MAX_PARAMS arguments for the
    kernel's more, and the driver read the words after it on the worker's stack as pointers to
    parameter bytes: a read of host memory into the kernel, or a crash)."""
    with forwarder(shm_path, asan=True) as fwd:
        got = run(shm_path, tmp_path, nparams, fwd)
        assert got["wide"] == (SUCCESS if nparams <= VG_MAX_PARAMS else NOT_SUPPORTED), (got, fwd.log()[-3000:])
        assert fwd.proc.poll() is None, fwd.log()


def test_a_packed_buffer_needs_its_size_and_may_be_shorter_than_the_parameters(shm_path, tmp_path):
    """CU_LAUNCH_PARAM_BUFFER_POINTER with its size launches, also shorter than the parameters (as
    NCCL passes it); without CU_LAUNCH_PARAM_BUFFER_SIZE the pointer has no effect (cuda.h) and a
    kernel with parameters gets none: CUDA_ERROR_INVALID_VALUE, as a size without a pointer is (on
    the old code it launched with every parameter zero)."""
    with forwarder(shm_path, asan=True) as fwd:
        got = run(shm_path, tmp_path, 1)
        assert got == {"wide": SUCCESS, "packed": SUCCESS, "short": SUCCESS, "no size": INVALID_VALUE,
                       "no pointer": INVALID_VALUE}, got  # fmt: skip
        assert fwd.proc.poll() is None, fwd.log()


def test_a_kernel_with_no_parameters_launches_through_the_sanitized_forwarder(shm_path, tmp_path):
    """A kernel of no parameters has no layout to answer: the worker's answer copied zero bytes
    from no buffer, which memcpy may not be given (UBSan stopped the ASan/UBSan worker)."""
    with forwarder(shm_path, asan=True) as fwd:
        got = run(shm_path, tmp_path, 0, fwd)
        assert got["wide"] == SUCCESS, got
        assert fwd.proc.poll() is None, fwd.log()
