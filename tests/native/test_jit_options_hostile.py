"""Hostile raw module and library loads with JIT options against the forwarder (op 67
cuModuleLoadDataEx, op 69 cuLibraryLoadData; host_forwarder/native/module.c, jit_options.c), past the
guest library, on the simulated backend and the ASan/UBSan forwarder.  The image crosses as always
(BLOB_BEGIN, then BLOB_PUT chunks through the bulk area); the request carries u64 n, then n options
(u32 option, u32 pad, u64 value).  It carries what the guest library never would: a pointer as a log
buffer, as the wall time or as a value, an option the driver does not have or vmgpu does not serve,
counts of billions or past the bytes sent, log sizes past 16 KiB, buffers without their sizes.  Each
is refused with its CUresult and no answer (a load that reached the driver is always answered with
its result), the image received is forgotten, a well-formed load on the same channel next to it
succeeds with its logs read back, and the forwarder serves on with a clean sanitizer log."""

import os
import struct

import pytest

from tests.forwarder import PTX, forwarder
from tests.native.test_generator import raw
from tests.native.test_link_hostile import LOG_MAX, Wire, opt
from vmgpu import shm

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_IMAGE, NOT_SUPPORTED = 0, 1, 200, 801
OP_MODULE_LOAD_EX, OP_LIBRARY_LOAD = 67, 69
INFO_LOG, INFO_SIZE, ERROR_LOG, ERROR_SIZE, WALL_TIME = 3, 4, 5, 6, 2
MAX_REGISTERS, OPTIMIZATION_LEVEL, TARGET_FROM_CONTEXT = 0, 7, 8
GLOBAL_SYMBOL_NAMES, GLOBAL_SYMBOL_ADDRESSES, NUM_OPTIONS = 17, 18, 35
POINTER = 0x7F0000001000  # what a guest pointer looks like
TEXT = PTX.read_bytes() + b"\0"
JUNK = b"this is not PTX\n\0"
LOGS = (opt(INFO_LOG), opt(INFO_SIZE, 256), opt(ERROR_LOG), opt(ERROR_SIZE, 256), opt(WALL_TIME))


def request(*options: bytes, n: int | None = None) -> bytes:
    return struct.pack("<Q", len(options) if n is None else n) + b"".join(options)


def answer(rep: bytes) -> tuple[int, int, list[int], bytes, bytes]:
    """A load's answer: (CUresult, handle, option values, info log, error log), logs without their NUL."""
    result, handle, n = struct.unpack_from("<QQQ", rep)
    values = list(struct.unpack_from(f"<{n}Q", rep, 24))
    at, logs = 24 + 8 * n, []
    for _ in range(2):
        (length,) = struct.unpack_from("<Q", rep, at)
        text = rep[at + 8 : at + 8 + length]
        assert length == 0 or text.endswith(b"\0"), text
        logs.append(text[:-1])
        at += 8 + (length + 7) // 8 * 8
    assert at == len(rep), (at, len(rep))
    return result, handle, values, logs[0], logs[1]


class Loads(Wire):
    """A raw channel of its own that loads images with options."""

    def load(self, op: int, body: bytes, image: bytes | None = TEXT) -> tuple[int, bytes]:
        """The image sent (None: nothing), then the load request."""
        if image is not None:
            self.blob(image)
        return self(op, body)

    def good(self, op: int) -> None:
        """vadd.ptx with both logs and the wall time: loaded, the info log and its size back, an
        empty error log, no pointer of the worker's among the values; text that is not PTX: the
        driver's answer (a module CUDA_ERROR_INVALID_IMAGE, a library loaded) with the error log."""
        r, rep = self.load(op, request(*LOGS))
        assert r == SUCCESS, r
        result, handle, values, info, error = answer(rep)
        assert result == SUCCESS and handle != 0 and len(values) == len(LOGS)
        assert values[0] == 0 and values[2] == 0 and values[4] == 0  # buffers: the worker's, never answered
        assert info.startswith(b"SIMULATED driver: PTX loaded") and values[1] == len(info) + 1
        assert error == b"" and values[3] == 0
        r, rep = self.load(op, request(*LOGS), JUNK)
        assert r == SUCCESS, r
        result, handle, values, info, error = answer(rep)
        assert result == (INVALID_IMAGE if op == OP_MODULE_LOAD_EX else SUCCESS) and (handle != 0) == (
            result == SUCCESS
        )
        assert error.startswith(b"SIMULATED driver: the image is not recognized")
        assert values[3] == len(error) + 1


@pytest.fixture
def wire(shm_path):
    """The ASan/UBSan forwarder and one raw channel; at the end its worker still loads, and the
    forwarder's log is free of sanitizer reports."""
    with forwarder(shm_path, asan=True) as fwd:
        region = shm.Region.open(shm_path)
        w = Loads(region, fwd)
        try:
            yield w
            w.good(OP_MODULE_LOAD_EX)
            w.good(OP_LIBRARY_LOAD)
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            w.chan.close()
            region.close()
        log = fwd.log()
        assert "AddressSanitizer" not in log and "runtime error" not in log, log


OPS = pytest.mark.parametrize("op", [OP_MODULE_LOAD_EX, OP_LIBRARY_LOAD], ids=["module", "library"])


def refused(wire: Loads, op: int, body: bytes, want: int, name: str) -> None:
    """body refused with want and no answer; the image it came with forgotten; a good load next."""
    r, rep = wire.load(op, body)
    assert (r, rep) == (want, b""), name
    assert wire(op, request())[0] == INVALID_IMAGE, name  # no image: the refused one is gone
    wire.good(op)


@OPS
def test_well_formed_loads_answer_their_logs_and_values(wire, op):
    """vadd.ptx with both logs, and text that is not PTX: each answered with the driver's result,
    the logs and the values, twice on one channel; log sizes of exactly 16 KiB are taken."""
    wire.good(op)
    wire.good(op)
    r, rep = wire.load(op, request(opt(ERROR_LOG), opt(ERROR_SIZE, LOG_MAX)), JUNK)
    assert r == SUCCESS and answer(rep)[4].startswith(b"SIMULATED driver: the image is not recognized")


@OPS
def test_pointer_valued_and_unknown_options_are_refused_before_the_driver(wire, op):
    """A pointer as a log buffer, as the wall time, as the value of an option that takes none, a
    value wider than 32 bits, an option past the driver's, a padding word set: invalid value; global
    symbol names and addresses (lists of pointers): not supported."""
    cases = {
        "a pointer as the info log": ((opt(INFO_LOG, POINTER), opt(INFO_SIZE, 64)), INVALID_VALUE),
        "a pointer as the error log": ((opt(ERROR_LOG, POINTER), opt(ERROR_SIZE, 64)), INVALID_VALUE),
        "a pointer as the wall time": ((opt(WALL_TIME, POINTER),), INVALID_VALUE),
        "a value for no value": ((opt(TARGET_FROM_CONTEXT, POINTER),), INVALID_VALUE),
        "a pointer as a number": ((opt(MAX_REGISTERS, POINTER),), INVALID_VALUE),
        "an option the driver lacks": ((opt(99),), INVALID_VALUE),
        "the options' end": ((opt(NUM_OPTIONS),), INVALID_VALUE),
        "an option 2^32-1": ((opt(0xFFFFFFFF),), INVALID_VALUE),
        "padding set": ((opt(OPTIMIZATION_LEVEL, 1, pad=1),), INVALID_VALUE),
        "global symbol names": ((opt(GLOBAL_SYMBOL_NAMES, POINTER),), NOT_SUPPORTED),
        "global symbol addresses": ((opt(GLOBAL_SYMBOL_ADDRESSES, POINTER),), NOT_SUPPORTED),
    }
    for name, (options, want) in cases.items():
        refused(wire, op, request(*options), want, name)
    assert "JIT options refused" in wire.fwd.log()


@OPS
def test_huge_counts_and_requests_that_do_not_match_their_bytes_are_refused(wire, op):
    """More options than the bound (with all their bytes), counts of 2^32 and 2^63 and 2^64-1, a
    count past the options sent, bytes after the last option, no count at all: invalid value."""
    one = opt(OPTIMIZATION_LEVEL, 2)
    cases = {
        "65 options": request(*[opt(OPTIMIZATION_LEVEL, i % 5) for i in range(65)]),
        "2^32 options": request(one, n=1 << 32),
        "2^63 options": request(one, n=1 << 63),
        "2^64-1 options": request(one, n=(1 << 64) - 1),
        "one more than sent": request(one, n=2),
        "bytes after the last option": request(one) + bytes(8),
        "no count": b"",
    }
    for name, body in cases.items():
        refused(wire, op, body, INVALID_VALUE, name)


@OPS
def test_log_sizes_past_16_kib_and_unpaired_buffers_are_refused(wire, op):
    """A log size of 16 KiB + 1, of 2^32, of 2^64-1; a log buffer without its size, one given twice,
    a size given twice: invalid value (the worker lends a buffer of the size asked for, at most
    16 KiB, and one per log)."""
    cases = {
        "16 KiB + 1": (opt(INFO_LOG), opt(INFO_SIZE, LOG_MAX + 1)),
        "2^32": (opt(ERROR_LOG), opt(ERROR_SIZE, 1 << 32)),
        "2^64-1": (opt(ERROR_LOG), opt(ERROR_SIZE, (1 << 64) - 1)),
        "a buffer without its size": (opt(INFO_LOG),),
        "a buffer twice": (opt(INFO_LOG), opt(INFO_LOG), opt(INFO_SIZE, 64)),
        "a size twice": (opt(ERROR_LOG), opt(ERROR_SIZE, 64), opt(ERROR_SIZE, 64)),
    }
    for name, options in cases.items():
        refused(wire, op, request(*options), INVALID_VALUE, name)


def test_a_guest_library_of_another_protocol_version_is_refused_at_hello(tmp_path):
    """Loads answer in the new layout (their logs), so a guest library of protocol version 1 is
    refused at its hello, where it says so, rather than misreading its first module load."""
    region = tmp_path / "r"
    with forwarder(region):
        mapped = shm.Region.open(region)
        chan = shm.GuestChannel(mapped)
        try:
            r, _ = raw(chan, 1, struct.pack("<II", 1, os.getpid()), seq=1)
            assert r == NOT_SUPPORTED
            r, rep = raw(chan, 1, struct.pack("<II", 2, os.getpid()), seq=2)
            assert r == SUCCESS and struct.unpack_from("<I", rep)[0] == 2
        finally:
            chan.close()
            mapped.close()
