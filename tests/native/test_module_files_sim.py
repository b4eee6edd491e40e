"""Modules and libraries loaded from the guest's files (cuModuleLoad, cuLibraryLoadFromFile, as
torch.compile's Inductor and Triton load them) on the simulated backend: the file is read in the
guest and loaded as an image from memory is, so the host checks it the same way; a missing file
is CUDA_ERROR_FILE_NOT_FOUND as natively, and a file of garbage is refused without harm."""

import sys
import textwrap

import pytest

from tests.forwarder import PTX, forwarder, run_guest

pytestmark = pytest.mark.native

GUEST = textwrap.dedent(
    """
    import ctypes, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    ptx, junk, empty = (a.encode() for a in sys.argv[1:4])
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    m, f, lib, k = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    out = [cuda.cuModuleLoad(ctypes.byref(m), ptx)]
    out.append(cuda.cuModuleGetFunction(ctypes.byref(f), m, b"vadd"))
    out.append(cuda.cuLibraryLoadFromFile(ctypes.byref(lib), ptx, None, None, 0, None, None, 0))
    out.append(cuda.cuLibraryGetKernel(ctypes.byref(k), lib, b"vadd"))
    out.append(cuda.cuModuleLoad(ctypes.byref(m), b"/nonexistent/kernels.cubin"))
    out.append(cuda.cuModuleLoad(ctypes.byref(m), None))
    out.append(cuda.cuModuleLoad(ctypes.byref(m), junk) != 0)
    out.append(cuda.cuModuleLoad(ctypes.byref(m), empty) != 0)
    out.append(cuda.cuModuleLoad(ctypes.byref(m), ptx))  # the worker is still serving
    print(*[int(x) for x in out])
    """
)


def test_modules_and_libraries_load_from_the_guests_files(shm_path, tmp_path):
    junk = tmp_path / "junk.cubin"
    junk.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    empty = tmp_path / "empty.ptx"
    empty.write_bytes(b"")
    with forwarder(shm_path):
        r = run_guest([sys.executable, "-c", GUEST, PTX, junk, empty], shm_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # 301: CUDA_ERROR_FILE_NOT_FOUND; 1: CUDA_ERROR_INVALID_VALUE
    assert r.stdout.split() == ["0", "0", "0", "0", "301", "1", "1", "1", "0"], r.stdout + r.stderr
