"""The guest library (vmgpu's libcuda.so.1) without a host: the driver's exported symbols,
cuGetProcAddress as the probed driver answers, the export tables cudart and cuBLASLt ask for,
an unserved function logging once, and the MD2 of the integrity table."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.forwarder import (
    GUEST_LIB,
    NATIVE,
    ROOT,
)

pytestmark = pytest.mark.native

GEN = ROOT / "native" / "cuda_api"


def _in_guest_process(code: str, **env) -> subprocess.CompletedProcess:
    """Run Python code that loads vmgpu's libcuda.so.1 as `cuda` (no forwarder needed)."""
    prog = f"import ctypes, sys\ncuda = ctypes.CDLL({str(GUEST_LIB / 'libcuda.so.1')!r})\n" + textwrap.dedent(code)
    e = dict(os.environ, VMGPU_REGION="/nonexistent", **env)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=e, timeout=60)


def test_guest_library_exports_exactly_the_driver_abi():
    sys.path.insert(0, str(GEN))
    from probe_driver import exported_functions

    want = (GEN / "driver" / "libcuda_exports.txt").read_text().split()
    assert exported_functions(str(GUEST_LIB / "libcuda.so.1")) == sorted(want)
    assert len(want) == 682


def test_unserved_function_logs_once_and_strict_mode_aborts():
    code = """
        r1 = cuda.cuGraphicsMapResources(0, None, None)  # graphics interop: never served
        r2 = cuda.cuGraphicsMapResources(0, None, None)
        print(r1, r2)
    """
    r = _in_guest_process(code)
    assert r.stdout.split() == ["801", "801"]  # CUDA_ERROR_NOT_SUPPORTED
    assert r.stderr.count("cuGraphicsMapResources is not supported") == 1
    strict = _in_guest_process(code, VMGPU_STRICT="1")
    assert strict.returncode == -signal.SIGABRT
    assert "VMGPU_STRICT=1: aborting" in strict.stderr


def test_get_proc_address_answers_as_the_probed_driver():
    code = """
        def look(name, ver, flags=0):
            fn = ctypes.c_void_p(); st = ctypes.c_int(-1)
            rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), ver, ctypes.c_uint64(flags),
                                          ctypes.byref(st))
            got = [k for k in names if ctypes.cast(getattr(cuda, k), ctypes.c_void_p).value == fn.value]
            print(name, ver, flags, rc, st.value, got[0] if got else None)
        names = ["cuMemAlloc", "cuMemAlloc_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGetProcAddress",
                 "cuGetProcAddress_v2"]
        look("cuMemAlloc", 3000)
        look("cuMemAlloc", 12000)
        look("cuLaunchKernel", 12000, 2)
        look("cuLaunchKernel", 3000)
        look("cuGetProcAddress", 12000)
        look("cuNoSuchThing", 12000)
    """
    lines = _in_guest_process(code).stdout.splitlines()
    assert lines == [
        "cuMemAlloc 3000 0 0 0 cuMemAlloc",
        "cuMemAlloc 12000 0 0 0 cuMemAlloc_v2",
        "cuLaunchKernel 12000 2 0 0 cuLaunchKernel_ptsz",
        "cuLaunchKernel 3000 0 0 2 None",  # symbol found, version not sufficient
        "cuGetProcAddress 12000 0 0 0 cuGetProcAddress_v2",
        "cuNoSuchThing 12000 0 500 1 None",  # CUDA_ERROR_NOT_FOUND, symbol not found
    ]


def test_export_tables_known_served_unknown_refused():
    code = """
        def table(hexid):
            uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex(hexid))
            p = ctypes.c_void_p(1)
            rc = cuda.cuGetExportTable(ctypes.byref(p), ctypes.byref(uuid))
            return rc, p.value
        rc, p = table("6bd5fb6c5bf4e74a8987d93912fd9df9")
        print("cudart", rc, ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))[0])
        rc, p = table("d4082055bde6704b8d34ba123c66e1f2")
        check = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))(
            ctypes.cast(p, ctypes.POINTER(ctypes.c_void_p))[1])
        out = (ctypes.c_uint64 * 2)()
        print("integrity", check(13000, 1700000000, out), hex(out[0]), hex(out[1]))
        a = (ctypes.c_uint64 * 2)(); b = (ctypes.c_uint64 * 2)(); c = (ctypes.c_uint64 * 2)()
        check(12345, 1700000000, a); check(12345, 1700000000, b); check(12345, 1700000001, c)
        print("hash", list(a) == list(b), list(a) != list(c), a[0] != 0)
        print("f8cff951", *table("f8cff95121468b4eb9e2fb469e7c0dd9"))
        print("unknown", *table("00112233445566778899aabbccddeeff"))
        rc, p = table("1734dc26800d47458726c0f1e7dd8bca")
        slots = ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))
        get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))(slots[4])
        x, y = ctypes.c_void_p(1), ctypes.c_void_p(1)
        print("lt_aux", rc, slots[0], get(ctypes.byref(x), ctypes.byref(y)), x.value, y.value)
    """
    r = _in_guest_process(code)
    lines = r.stdout.splitlines()
    assert lines[0] == "cudart 0 104"  # 13 slots, size word first
    assert lines[1] == "integrity 0 0x3341181c03cb675c 0x8ed383aa1f4cd1e8"
    assert lines[2] == "hash True True True"
    assert lines[3] == "f8cff951 500 None"  # NOT_FOUND keeps cudart on its documented path
    assert lines[4] == "unknown 1 None"  # fails closed: INVALID_VALUE, no pointer
    assert "export table 00112233445566778899aabbccddeeff is not provided" in r.stderr
    # cuBLASLt's table: provided (refusing it kills the process); slot 4 declines, cuBLASLt falls back
    assert lines[5] == "lt_aux 0 136 801 None None"
    assert "1734dc26" not in r.stderr and "lt_aux" not in r.stderr  # a deliberate decline logs nothing


def test_md2_matches_rfc_1319():
    r = subprocess.run([str(NATIVE / "tests" / "t_md2")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "t_md2: ok", r.stdout
