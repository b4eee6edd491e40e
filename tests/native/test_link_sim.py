"""The CUDA linker through vmgpu (guest_agent/libcuda/link.c, host_forwarder/native/link.c) on the
simulated backend and the ASan/UBSan forwarder: the GPU suite's program (tests/cuda/link.c), and what
the guest library keeps and answers itself: a link's state (a destroyed or made-up one is an invalid
handle), the JIT options and input types it serves, PTX given without its NUL, log buffers filled no
further than the program said, and a cubin larger than the bulk area's half (asked for again into
pinned memory).  The simulated linker links exactly one input: it answers that input's bytes."""

import json
import subprocess

import pytest

from tests.forwarder import NATIVE, PTX, forwarder, guest_env
from tests.native.guest_process import LOOP, PRELUDE

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_IMAGE = 0, 1, 2, 200
INVALID_PTX, INVALID_HANDLE, NOT_SUPPORTED = 218, 400, 801
CUBIN, PTX_INPUT, FATBIN, OBJECT = 0, 1, 2, 3
INFO_LOG, INFO_SIZE, ERROR_LOG, ERROR_SIZE, WALL_TIME = 3, 4, 5, 6, 2
GLOBAL_SYMBOL_NAMES, OPTIMIZATION_LEVEL = 17, 7

# A guest process (ctypes on the guest's libcuda.so.1): one command per line, "<CUresult> [value]".
# States are kept by number; "link" runs a whole link and answers what the program would see.
GUEST = (
    PRELUDE
    + f"PTX_PATH = {str(PTX)!r}\n"
    + r"""
import json
states = {}
def options(spec):  # "opt=value,..." where a value "log:N" is a buffer of N bytes
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
    return len(spec), opts, vals, bufs

keep = []
"""
    + LOOP
    + r"""
    if op == "create":  # options
        n, opts, vals, bufs = options(a[0] if a else "-")
        keep.append((opts, vals, bufs))
        st = P()
        r = cuda.cuLinkCreate_v2(n, opts if n else None, vals if n else None, ctypes.byref(st))
        if r == 0:
            states[len(states)] = (st, n, opts, vals, bufs)
            out = len(states) - 1
    elif op == "add_file":  # state type path [options]
        st = states[int(a[0])][0]
        n, opts, vals, bufs = options(a[3] if len(a) > 3 else "-")
        r = cuda.cuLinkAddFile_v2(st, int(a[1]), a[2].encode(), n, opts if n else None, vals if n else None)
    elif op == "add_hex":  # state type hexbytes name
        st = states[int(a[0])][0]
        data = bytes.fromhex(a[2])
        buf = ctypes.create_string_buffer(data, len(data))
        r = cuda.cuLinkAddData_v2(st, int(a[1]), buf, sz(len(data)), a[3].encode(), 0, None, None)
    elif op == "add_big":  # state type size: a buffer of 16 bytes said to be size bytes long
        st = states[int(a[0])][0]
        buf = ctypes.create_string_buffer(16)
        r = cuda.cuLinkAddData_v2(st, int(a[1]), buf, sz(int(a[2])), None, 0, None, None)
    elif op == "add_ptx_padded":  # state bytes: vadd.ptx padded with a comment to that many bytes, no NUL
        st = states[int(a[0])][0]
        text = open(PTX_PATH, "rb").read()
        data = text + b"//" + b"x" * (int(a[1]) - len(text) - 3) + b"\n"
        buf = ctypes.create_string_buffer(data, len(data))
        r = cuda.cuLinkAddData_v2(st, 1, buf, sz(len(data)), b"big.ptx", 0, None, None)
    elif op == "complete":  # state: cubin's first bytes, size, what the options hold, logs
        st, n, opts, vals, bufs = states[int(a[0])]
        cubin, size = P(), sz()
        r = cuda.cuLinkComplete(st, ctypes.byref(cubin), ctypes.byref(size))
        got = {"size": size.value, "values": [vals[i] or 0 for i in range(n)],
               "logs": {i: b.raw.hex() for i, b in bufs.items()}}
        if r == 0:
            got["head"] = ctypes.string_at(cubin, min(size.value, 64)).hex()
            got["sum"] = sum(ctypes.string_at(cubin, size.value)) & 0xFFFFFFFF
            mod = P()
            got["load"] = cuda.cuModuleLoadData(ctypes.byref(mod), cubin)
        out = json.dumps(got)
    elif op == "complete_null":
        r = cuda.cuLinkComplete(states[int(a[0])][0], None, None)
    elif op == "destroy":  # state
        r = cuda.cuLinkDestroy(states[int(a[0])][0])
    elif op == "destroy_raw":  # a made-up state
        r = cuda.cuLinkDestroy(P(int(a[0], 0)))
    elif op == "add_raw":  # a made-up state
        buf = ctypes.create_string_buffer(b".version 8.0\n")
        r = cuda.cuLinkAddData_v2(P(int(a[0], 0)), 1, buf, sz(14), None, 0, None, None)
    else:
        raise SystemExit("unknown command " + op)
    print(r, out, flush=True)
"""
)


MiB = 1 << 20
LOGS = f"{INFO_LOG}=log:256,{INFO_SIZE}=256,{ERROR_LOG}=log:256,{ERROR_SIZE}=256,{WALL_TIME}=0"


def completed(g, state: int) -> tuple[int, dict]:
    r, out = g("complete", state)
    return r, json.loads(out)


def log_of(got: dict, index: int) -> bytes:
    """The text of the log buffer given as option index: up to its NUL."""
    raw = bytes.fromhex(got["logs"][str(index)])
    assert b"\0" in raw, raw  # always NUL-terminated within the buffer
    return raw[: raw.index(b"\0")]


@pytest.fixture
def fwd(shm_path):
    """The ASan/UBSan forwarder on the simulated backend; alive and clean at the end."""
    with forwarder(shm_path, asan=True) as f:
        yield f
        assert f.proc.poll() is None, f.log()


def test_the_gpu_suites_link_program_links_loads_and_runs_vadd_through_vmgpu(shm_path, fwd):
    """tests/cuda/link.c through the ASan/UBSan forwarder: PTX linked from memory (with log buffers,
    the wall time and an optimisation level) and from its file, each cubin loaded and its vadd run
    with results checked; text that is not PTX refused with an error log, a missing file refused.
    Without the linker served, every link is CUDA_ERROR_NOT_SUPPORTED and the program fails."""
    r = subprocess.run(
        [str(NATIVE / "link"), str(PTX)], env=guest_env(shm_path), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
    assert r.stdout.rstrip().endswith("link ok"), r.stdout
    lines = r.stdout.splitlines()
    for s in ("ptx from memory: vadd results", "ptx from its file: vadd results", "bad ptx: error log written"):
        assert any(line.startswith(s) and line.endswith(" ok") for line in lines), (s, r.stdout)


def test_a_link_answers_its_input_with_logs_filled_as_far_as_the_program_said(shm_path, fwd, guests):
    """One PTX input (its file) linked with both logs and the wall time: the cubin is the input's
    bytes (the simulated linker's), it loads, the info log says SIMULATED and the size written back
    counts its NUL, the error log is empty, the wall time is written (0.0).  With 16-byte buffers
    the log is cut, NUL-terminated, and the sizes written back are at most 16."""
    g = guests(shm_path, 0, GUEST)
    text = PTX.read_bytes()
    st = int(g.ok("create", LOGS))
    assert g("add_file", st, PTX_INPUT, PTX) == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == SUCCESS, got
    assert got["size"] == len(text) + 1 and got["sum"] == sum(text) & 0xFFFFFFFF
    assert got["load"] == SUCCESS
    info = log_of(got, 0)
    assert info.startswith(b"SIMULATED linker: 1 input linked") and got["values"][1] == len(info) + 1
    assert log_of(got, 2) == b"" and got["values"][3] == 0
    assert got["values"][4] == 0  # the wall time: 0.0 as a float's bits
    assert g("destroy", st) == (SUCCESS, "")

    small = f"{INFO_LOG}=log:16,{INFO_SIZE}=16,{ERROR_LOG}=log:16,{ERROR_SIZE}=16"
    st = int(g.ok("create", small))
    assert g("add_hex", st, PTX_INPUT, text.hex(), "vadd.ptx") == (SUCCESS, "")  # no NUL: the library adds it
    r, got = completed(g, st)
    assert r == SUCCESS and got["size"] == len(text) + 1, got
    assert log_of(got, 0) == b"SIMULATED linke" and got["values"][1] == 16
    assert bytes.fromhex(got["logs"]["0"])[15] == 0
    assert g("destroy", st) == (SUCCESS, "")


def test_a_destroyed_or_made_up_state_is_an_invalid_handle(shm_path, fwd, guests):
    """cuLinkDestroy, cuLinkAddData and cuLinkComplete of a state destroyed already, or of one the
    library never made: CUDA_ERROR_INVALID_HANDLE, nothing followed."""
    g = guests(shm_path, 0, GUEST)
    st = int(g.ok("create"))
    assert g("destroy", st) == (SUCCESS, "")
    assert g("destroy", st)[0] == INVALID_HANDLE
    assert g("complete", st)[0] == INVALID_HANDLE
    assert g("add_file", st, PTX_INPUT, PTX)[0] == INVALID_HANDLE
    assert g("destroy_raw", "0x1234")[0] == INVALID_HANDLE
    assert g("destroy_raw", "0")[0] == INVALID_HANDLE
    assert g("add_raw", "0xdeadbeef000")[0] == INVALID_HANDLE
    st = int(g.ok("create"))
    assert g("complete_null", st)[0] == INVALID_VALUE
    assert g("destroy", st) == (SUCCESS, "")


def test_options_and_inputs_vmgpu_does_not_serve_are_refused_in_the_guest(shm_path, fwd, guests):
    """A list of host pointers (global symbol names) is not supported, an option past the driver's
    is an invalid value; host objects are not supported, an unknown input type, no bytes or more
    than 256 MiB in one link are refused before anything is read; a log buffer of one input is not
    supported.  A good option (the optimisation level) is taken."""
    g = guests(shm_path, 0, GUEST)
    assert g("create", f"{GLOBAL_SYMBOL_NAMES}=0")[0] == NOT_SUPPORTED
    assert g("create", "99=0")[0] == INVALID_VALUE
    st = int(g.ok("create", f"{OPTIMIZATION_LEVEL}=2"))
    assert g("add_hex", st, OBJECT, "7f454c46", "x.o")[0] == NOT_SUPPORTED
    assert g("add_hex", st, 42, "00", "x")[0] == INVALID_VALUE
    assert g("add_big", st, CUBIN, 0)[0] == INVALID_VALUE
    assert g("add_big", st, CUBIN, 257 * MiB)[0] == OUT_OF_MEMORY
    assert g("add_file", st, PTX_INPUT, PTX, f"{INFO_LOG}=log:64")[0] == NOT_SUPPORTED
    assert g("add_file", st, PTX_INPUT, "/nonexistent.ptx")[0] == 301  # CUDA_ERROR_FILE_NOT_FOUND
    assert g("add_file", st, PTX_INPUT, PTX) == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == SUCCESS and got["load"] == SUCCESS, got
    assert g("destroy", st) == (SUCCESS, "")


def test_the_simulated_linker_refuses_two_inputs_and_text_that_is_not_ptx_saying_why(shm_path, fwd, guests):
    """Two inputs: CUDA_ERROR_NOT_SUPPORTED at cuLinkComplete, the error log saying the simulated
    linker links one; text without .version: CUDA_ERROR_INVALID_PTX (at cuLinkComplete here, where
    the driver would say it at cuLinkAddData), the error log naming the input.  The state stays
    usable and is destroyed."""
    g = guests(shm_path, 0, GUEST)
    st = int(g.ok("create", LOGS))
    assert g("add_file", st, PTX_INPUT, PTX) == (SUCCESS, "")
    assert g("add_file", st, PTX_INPUT, PTX) == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == NOT_SUPPORTED, got
    assert log_of(got, 2) == b"SIMULATED linker: links exactly one input; this link has 2"
    assert g("destroy", st) == (SUCCESS, "")
    st = int(g.ok("create", LOGS))
    assert g("add_hex", st, PTX_INPUT, b"not ptx\n".hex(), "junk.ptx") == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == INVALID_PTX, got
    assert b"junk.ptx" in log_of(got, 2) and log_of(got, 2).startswith(b"SIMULATED")
    assert g("destroy", st) == (SUCCESS, "")


def test_a_relocatable_cubin_passes_the_hosts_image_check_and_a_lying_one_does_not(shm_path, fwd, guests):
    """ptxas -c's cubin of vadd linked from its file: the host's image check passes it and the
    simulated linker answers its bytes.  The same cubin with a section table past its end, or PTX
    text given as a cubin: CUDA_ERROR_INVALID_IMAGE from cuLinkComplete, and the forwarder logs why."""
    cubin = NATIVE / "vadd_rdc.cubin"
    if not cubin.exists():
        pytest.fail("build/native/vadd_rdc.cubin is missing: run `make cuda-programs`")
    data = cubin.read_bytes()
    g = guests(shm_path, 0, GUEST)
    st = int(g.ok("create"))
    assert g("add_file", st, CUBIN, cubin) == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == SUCCESS and got["size"] == len(data) and got["head"] == data[:64].hex(), got
    assert g("destroy", st) == (SUCCESS, "")
    lying = bytearray(data)
    lying[0x28:0x30] = (len(data) - 8).to_bytes(8, "little")  # e_shoff: the table runs off the end
    for body, kind in ((bytes(lying), CUBIN), (PTX.read_bytes() + b"\0", CUBIN), (data, FATBIN)):
        st = int(g.ok("create"))
        assert g("add_hex", st, kind, body.hex(), "bad") == (SUCCESS, "")
        assert g("complete", st)[0] == INVALID_IMAGE
        assert g("destroy", st) == (SUCCESS, "")
    assert "link refused" in fwd.log()


def test_a_cubin_larger_than_half_the_bulk_area_comes_back_through_pinned_memory(shm_path, fwd, guests):
    """A 3 MiB PTX input (the bulk area is 4 MiB, the cubin comes back in half of it): the host
    answers its size, the library asks again with pinned memory of that size, and the cubin is the
    input's bytes, whole."""
    g = guests(shm_path, 0, GUEST)
    st = int(g.ok("create"))
    assert g("add_ptx_padded", st, 3 * MiB) == (SUCCESS, "")
    r, got = completed(g, st)
    assert r == SUCCESS and got["size"] == 3 * MiB + 1, got
    assert got["load"] == SUCCESS
    text = PTX.read_bytes()
    padded = text + b"//" + b"x" * (3 * MiB - len(text) - 3) + b"\n"
    assert got["sum"] == sum(padded) & 0xFFFFFFFF
    assert g("destroy", st) == (SUCCESS, "")
