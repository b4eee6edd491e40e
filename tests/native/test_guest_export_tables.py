"""The guest library's large export tables (guest_agent/libcuda/export_tools.c), slot by slot.

Each table is one list of its slots; these tests catch a slot out of place, a slot left
NULL, or a table of the wrong length, none of which a program would notice until a library
jumped through it."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.forwarder import GUEST_LIB

pytestmark = pytest.mark.native

PROBE = """
import ctypes
cuda = ctypes.CDLL({lib!r})
slot_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)

def table(hexid):
    uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex(hexid))
    p = ctypes.c_void_p()
    assert cuda.cuGetExportTable(ctypes.byref(p), ctypes.byref(uuid)) == 0
    words = ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64))
    return [words[i] for i in range(words[0] // 8)]

def call(slots, n, *args):
    return slot_fn(slots[n])(*(list(args) + [0, 0, 0, 0])[:4])
"""


def run_probe(code: str) -> subprocess.CompletedProcess:
    """Run `code` after PROBE in a process that loads the guest library (no region: no forwarder needed)."""
    prog = PROBE.format(lib=str(GUEST_LIB / "libcuda.so.1")) + textwrap.dedent(code)
    env = dict(os.environ, VMGPU_REGION="/nonexistent")
    env.pop("VMGPU_QUIET", None)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=60)


TABLES = {
    "tools context": ("21318c6097143248 8ca641ff7324c8f2", 93),
    "tools module": ("6e163fbeb958444d 835ce182aff1991e", 99),
    "cuBLASLt": ("1734dc26800d4745 8726c0f1e7dd8bca", 17),
}


@pytest.mark.parametrize("name", TABLES)
def test_every_slot_of_a_large_export_table_is_a_function(name):
    hexid, size = TABLES[name]
    r = run_probe(f"slots = table({hexid.replace(' ', '')!r}); print(len(slots), sum(1 for s in slots[1:] if not s))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(size), "0"]  # the size word counts the slots; none is NULL


def test_known_slots_of_the_tools_tables_are_where_the_driver_has_them():
    code = """
        ctx = table("21318c60971432488ca641ff7324c8f2")
        mod = table("6e163fbeb958444d835ce182aff1991e")
        lt = table("1734dc26800d47458726c0f1e7dd8bca")
        # each known slot refuses these arguments its own way; an unknown slot would say 801
        number = ctypes.c_uint64()
        print(call(ctx, 4, 0, ctypes.addressof(number)))  # a context's number: no current context
        print(call(ctx, 39, 0, 0, 0))  # writes 0: refuses a NULL out
        print(call(ctx, 51, 0, 0, 0))  # a context's object: refuses a NULL out
        print(call(mod, 7, 0, 0, 0, 0))  # a module's functions: refuses a NULL callback
        print(call(lt, 4, 0, 0))  # cuBLASLt's slot 4: declined quietly
    """
    r = run_probe(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["201", "1", "1", "1", "801"]
    assert "slot" not in r.stderr  # known slots log nothing


def test_an_unexplained_slot_logs_its_table_and_number_once_and_refuses():
    code = """
        ctx = table("21318c60971432488ca641ff7324c8f2")
        mod = table("6e163fbeb958444d835ce182aff1991e")
        print(call(ctx, 5, 1, 2, 3, 4), call(ctx, 5), call(ctx, 92), call(mod, 98), call(mod, 1))
    """
    r = run_probe(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["801"] * 5  # CUDA_ERROR_NOT_SUPPORTED
    assert r.stderr.count("export table ctxtools slot 5 is not implemented") == 1
    assert "ctxtools slot 5 is not implemented; CUDA_ERROR_NOT_SUPPORTED (args 0x1 0x2 0x3 0x4)" in r.stderr
    for line in ("ctxtools slot 92 ", "ctxmodule slot 98 ", "ctxmodule slot 1 "):
        assert r.stderr.count(line) == 1
