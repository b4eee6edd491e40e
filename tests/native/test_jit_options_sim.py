"""The JIT options of module and library loads through vmgpu (cuModuleLoadDataEx, cuLibraryLoadData,
cuLibraryLoadFromFile; guest_agent/libcuda/jit_options.c, host_forwarder/native/jit_options.c) on the
simulated backend and the ASan/UBSan forwarder: the GPU suite's program (tests/cuda/jit_load.c), the
logs and the values the driver writes coming back into the program's buffers and slots (cut to the
sizes it gave, nothing written past them), and the options refused in the guest as the driver
refuses them, or because vmgpu does not serve them.  The simulated driver's logs say SIMULATED; text
without a .version directive is not recognized there, with an error log saying so, as the H100's
driver answers text that is not PTX: a module of it is CUDA_ERROR_INVALID_IMAGE, a library of it
loads and its kernels are CUDA_ERROR_INVALID_IMAGE."""

import json
import subprocess

import pytest

from tests.forwarder import NATIVE, PTX, forwarder, guest_env
from tests.native.guest_process import LOOP, PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_IMAGE, NOT_SUPPORTED = 0, 1, 200, 801
INFO_LOG, INFO_SIZE, ERROR_LOG, ERROR_SIZE, WALL_TIME = 3, 4, 5, 6, 2
OPTIMIZATION_LEVEL, LOG_VERBOSE, GLOBAL_SYMBOL_NAMES = 7, 12, 17
HOST_UNIVERSAL_TABLE, BINARY_IS_PRESERVED = 0, 1
MINUS_ONE = 0xBF800000  # -1.0 as a float's bits: a wall time slot the driver has not written

# A guest process (ctypes on the guest's libcuda.so.1): one command per line, "<CUresult> [value]".
GUEST = (
    PRELUDE
    + f"PTX_PATH = {str(PTX)!r}\n"
    + r"""
import json
def options(spec):  # "opt=value,..." where a value "log:N" is a buffer of N bytes; "null:N": N, no arrays
    if spec.startswith("null:"):
        return int(spec[5:]), None, None, {}
    spec = [kv.split("=") for kv in spec.split(",") if kv] if spec != "-" else []
    opts = (ctypes.c_int * max(1, len(spec)))(*[int(k) for k, _ in spec])
    vals = (P * max(1, len(spec)))()
    bufs = {}
    for i, (k, v) in enumerate(spec):
        if v.startswith("log:"):
            bufs[i] = ctypes.create_string_buffer(b"\xff" * int(v[4:]), int(v[4:]))
            vals[i] = ctypes.addressof(bufs[i])
        else:
            vals[i] = int(v, 0)
    return len(spec), opts if spec else None, vals if spec else None, bufs
"""
    + LOOP
    + r"""
    if op == "load":  # module|library|file ptx|junk [jit options] [library options]
        kind, image = a[0], a[1]
        n, opts, vals, bufs = options(a[2] if len(a) > 2 else "-")
        ln, lopts, lvals, _ = options(a[3] if len(a) > 3 else "-")
        text = open(PTX_PATH, "rb").read() + b"\0" if image == "ptx" else b"this is not PTX\n\0"
        h, f, found = P(), P(), None
        if kind == "module":
            r = cuda.cuModuleLoadDataEx(ctypes.byref(h), text, n, opts, vals)
            if r == 0:
                found = cuda.cuModuleGetFunction(ctypes.byref(f), h, b"vadd")
        else:
            if kind == "library":
                r = cuda.cuLibraryLoadData(ctypes.byref(h), text, opts, vals, n, lopts, lvals, ln)
            else:
                r = cuda.cuLibraryLoadFromFile(ctypes.byref(h), PTX_PATH.encode(), opts, vals, n, lopts, lvals, ln)
            if r == 0:
                found = cuda.cuLibraryGetKernel(ctypes.byref(f), h, b"vadd")
        out = json.dumps({"values": [vals[i] or 0 for i in range(n)] if vals else [],
                          "logs": {i: b.raw.hex() for i, b in bufs.items()}, "vadd": found})
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)

LOGS = (
    f"{INFO_LOG}=log:256,{INFO_SIZE}=256,{ERROR_LOG}=log:256,{ERROR_SIZE}=256,{WALL_TIME}={MINUS_ONE},"
    f"{LOG_VERBOSE}=1,{OPTIMIZATION_LEVEL}=3"
)
NOT_PTX = b"SIMULATED driver: the image is not recognized (no .version directive)"


def loaded(g, *words) -> tuple[int, dict]:
    r, out = g("load", *words)
    return r, json.loads(out)


def log_of(got: dict, index: int) -> bytes:
    """The text of the log buffer given as option index: up to its NUL (always within the buffer)."""
    raw = bytes.fromhex(got["logs"][str(index)])
    assert b"\0" in raw, raw
    return raw[: raw.index(b"\0")]


@pytest.fixture
def fwd(shm_path):
    """The ASan/UBSan forwarder on the simulated backend; alive and clean at the end."""
    with forwarder(shm_path, asan=True) as f:
        yield f
        assert f.proc.poll() is None, f.log()


def test_the_gpu_suites_jit_load_program_sees_its_logs_through_vmgpu(shm_path, fwd):
    """tests/cuda/jit_load.c through the ASan/UBSan forwarder: PTX loaded with both logs, the wall
    time and options as a module and as a library, text that is not PTX refused with an error log
    (cut within a log of 16 bytes) and as a library loaded with its error log, options counted but
    not given refused, the option cudart gives taken and refused from a file.  On the old code the
    options were dropped: no error log, the refusals not made."""
    r = subprocess.run(
        [str(NATIVE / "jit_load"), str(PTX)], env=guest_env(shm_path), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
    assert r.stdout.rstrip().endswith("jit_load ok"), r.stdout


def test_a_module_load_answers_its_logs_sizes_and_wall_time(shm_path, fwd, guests):
    """cuModuleLoadDataEx of vadd.ptx with both logs, the wall time, a verbose log and an
    optimisation level: loaded (vadd found), the info log says SIMULATED and its size written back
    counts its NUL, the error log is empty (size 0), the wall time is written (0.0).  Text that is
    not PTX: CUDA_ERROR_INVALID_IMAGE with the error log saying why; in buffers of 32 bytes given as
    16 the logs are cut at 16, NUL-terminated, and nothing is written past them; a log size past
    the host's 16 KiB is taken (the log comes back within it)."""
    g = guests(shm_path, 0, GUEST)
    r, got = loaded(g, "module", "ptx", LOGS)
    assert r == SUCCESS and got["vadd"] == SUCCESS, got
    info = log_of(got, 0)
    assert info.startswith(b"SIMULATED driver: PTX loaded") and got["values"][1] == len(info) + 1
    assert log_of(got, 2) == b"" and got["values"][3] == 0
    assert got["values"][4] == 0  # the wall time: 0.0, written over -1.0
    assert got["values"][5:] == [1, 3]  # what the driver only reads is left as given

    r, got = loaded(g, "module", "junk", LOGS)
    assert r == INVALID_IMAGE, got
    assert log_of(got, 2) == NOT_PTX and got["values"][3] == len(NOT_PTX) + 1
    assert log_of(got, 0) == b"" and got["values"][1] == 0

    small = f"{INFO_LOG}=log:32,{INFO_SIZE}=16,{ERROR_LOG}=log:32,{ERROR_SIZE}=16"
    r, got = loaded(g, "module", "junk", small)
    assert r == INVALID_IMAGE, got
    error = bytes.fromhex(got["logs"]["2"])
    assert error[:16] == NOT_PTX[:15] + b"\0" and error[16:] == b"\xff" * 16 and got["values"][3] == 16
    assert bytes.fromhex(got["logs"]["0"])[16:] == b"\xff" * 16

    big = f"{ERROR_LOG}=log:{1 << 20},{ERROR_SIZE}={1 << 20}"
    r, got = loaded(g, "module", "junk", big)
    assert r == INVALID_IMAGE and log_of(got, 0) == NOT_PTX and got["values"][1] == len(NOT_PTX) + 1, got


def test_a_library_load_answers_its_logs_and_takes_the_option_cudart_gives(shm_path, fwd, guests):
    """cuLibraryLoadData of vadd.ptx with both logs and CU_LIBRARY_BINARY_IS_PRESERVED (cudart gives
    it for every fatbin): loaded, vadd's kernel found, the info log says SIMULATED; text that is not
    PTX: loaded with the error log saying why, its kernel CUDA_ERROR_INVALID_IMAGE (the H100's
    driver says it at cuLibraryGetKernel, and writes the log at the load); cuLibraryLoadFromFile
    with JIT options: loaded, its log answered."""
    g = guests(shm_path, 0, GUEST)
    r, got = loaded(g, "library", "ptx", LOGS, f"{BINARY_IS_PRESERVED}=1")
    assert r == SUCCESS and got["vadd"] == SUCCESS, got
    assert log_of(got, 0).startswith(b"SIMULATED driver: PTX loaded") and got["values"][4] == 0
    r, got = loaded(g, "library", "junk", LOGS, f"{BINARY_IS_PRESERVED}=1")
    assert r == SUCCESS and got["vadd"] == INVALID_IMAGE and log_of(got, 2) == NOT_PTX, got
    assert got["values"][3] == len(NOT_PTX) + 1
    r, got = loaded(g, "file", "ptx", LOGS)
    assert r == SUCCESS and got["vadd"] == SUCCESS, got
    assert log_of(got, 0).startswith(b"SIMULATED driver: PTX loaded")


def test_a_librarys_table_of_host_functions_stays_in_the_guest_and_the_library_loads(shm_path, fwd, guests):
    """CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE, which cudart may give for the fatbins it
    registers: its pointers are the guest's, so it is not sent, and the library loads and finds
    its kernels as without it (refused, a PyTorch guest's cuBLAS found none of its kernels on the
    H100).  Counted without values it is CUDA_ERROR_INVALID_VALUE."""
    g = guests(shm_path, 0, GUEST)
    r, got = loaded(g, "library", "ptx", "-", f"{HOST_UNIVERSAL_TABLE}=0,{BINARY_IS_PRESERVED}=1")
    assert r == SUCCESS and got["vadd"] == SUCCESS, got
    assert g("load", "library", "ptx", "-", "null:1")[0] == INVALID_VALUE


def test_options_are_refused_in_the_guest_as_the_driver_refuses_them(shm_path, fwd, guests):
    """Options counted but not given, an option past the driver's, a library option past the
    driver's: CUDA_ERROR_INVALID_VALUE; a list of host pointers (global symbol names):
    CUDA_ERROR_NOT_SUPPORTED;
    CU_LIBRARY_BINARY_IS_PRESERVED to cuLibraryLoadFromFile: CUDA_ERROR_INVALID_VALUE, as the driver
    says.  The old code dropped every option and loaded."""
    g = guests(shm_path, 0, GUEST)
    cases = [
        (("module", "ptx", "null:2"), INVALID_VALUE),
        (("module", "ptx", "99=0"), INVALID_VALUE),
        (("module", "ptx", f"{GLOBAL_SYMBOL_NAMES}=0"), NOT_SUPPORTED),
        (("library", "ptx", "null:1"), INVALID_VALUE),
        (("library", "ptx", "-", "null:1"), INVALID_VALUE),
        (("library", "ptx", "-", "7=0"), INVALID_VALUE),
        (("file", "ptx", "-", f"{BINARY_IS_PRESERVED}=1"), INVALID_VALUE),
        (("file", "ptx", f"{GLOBAL_SYMBOL_NAMES}=0"), NOT_SUPPORTED),
    ]
    for words, want in cases:
        assert g("load", *words)[0] == want, words
    r, got = loaded(g, "module", "ptx", f"{OPTIMIZATION_LEVEL}=2")  # the worker serves on
    assert r == SUCCESS and got["vadd"] == SUCCESS, got
