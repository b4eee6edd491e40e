"""Hostile raw links against the forwarder (op 208, cuLinkComplete; host_forwarder/native/link.c),
past the guest library, on the simulated backend and the ASan/UBSan forwarder.  A package is sent as
a module image is (BLOB_BEGIN, then BLOB_PUT chunks through the bulk area) and the request names
where the cubin goes; the package carries what the guest library never would: an input longer than
the bytes received, counts of billions, unknown input types and options, PTX without its NUL, log
sizes past the bound, a pointer as an option's value, names without their NUL, bytes after the last
input, a request cut short, an output outside the bulk area and heap.  Each is refused with its
CUresult before the driver sees anything, a well-formed link on the same channel next to it
succeeds (its cubin and logs read back), and the forwarder serves on with a clean sanitizer log."""

import ctypes
import struct

import pytest

from tests.forwarder import PTX, forwarder
from tests.native.test_generator import raw
from vmgpu import shm
from vmgpu.errors import VmgpuError

pytestmark = pytest.mark.native

SUCCESS, INVALID_VALUE, INVALID_IMAGE, NOT_SUPPORTED = 0, 1, 200, 801
OP_BLOB_BEGIN, OP_BLOB_PUT, OP_LINK = 3, 4, 208
BUF_INLINE, BUF_HEAP, BUF_BULK = 0, 1, 2
CUBIN, PTX_INPUT, FATBIN, OBJECT = 0, 1, 2, 3
INFO_LOG, INFO_SIZE, ERROR_LOG, ERROR_SIZE, WALL_TIME = 3, 4, 5, 6, 2
GLOBAL_SYMBOL_NAMES, OPTIMIZATION_LEVEL, TARGET_FROM_CONTEXT = 17, 7, 8
MAGIC = 0x4B4E4C56
LOG_MAX = 16 << 10
MiB = 1 << 20
TEXT = PTX.read_bytes() + b"\0"


def pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def opt(option: int, value: int = 0, pad: int = 0) -> bytes:
    return struct.pack("<IIQ", option, pad, value & (2**64 - 1))


def entry(data: bytes, kind: int = PTX_INPUT, name: bytes = b"vadd.ptx\0", options=(), size=None, name_len=None):
    """One input: its header (the lengths as given, or the true ones), options, name and bytes."""
    head = struct.pack(
        "<IIQQ",
        kind,
        len(options),
        len(name) if name_len is None else name_len,
        len(data) if size is None else size,
    )
    return head + b"".join(options) + pad8(name) + pad8(data)


def package(*inputs: bytes, options=(), ninputs=None, noptions=None) -> bytes:
    head = struct.pack(
        "<IIII",
        MAGIC,
        len(options) if noptions is None else noptions,
        len(inputs) if ninputs is None else ninputs,
        0,
    )
    return head + b"".join(options) + b"".join(inputs)


GOOD = package(entry(TEXT))
LOGS = (opt(INFO_LOG), opt(INFO_SIZE, 256), opt(ERROR_LOG), opt(ERROR_SIZE, 256), opt(WALL_TIME))


class Wire:
    """A raw channel of its own (one guest process)."""

    def __init__(self, region, fwd):
        self.fwd = fwd
        self.chan = shm.GuestChannel(region)
        self.seq = 0

    def __call__(self, op: int, body: bytes) -> tuple[int, bytes]:
        self.seq += 1
        try:
            return raw(self.chan, op, body, seq=self.seq)
        except VmgpuError as e:  # the worker died (a sanitizer report ends it): say why
            log = self.fwd.log()
            at = log.find("ERROR: AddressSanitizer")
            pytest.fail(f"op {op}: {e}\n{log[at : at + 3000] if at >= 0 else log[-3000:]}")

    def send_async(self, op: int, body: bytes) -> None:
        self.seq += 1
        self.chan.send(1, struct.pack("<IHHQ", op, 0, 2, self.seq) + body)  # VG_F_NOREPLY

    def blob(self, data: bytes) -> None:
        """The package as a module image crosses: announced, then in bulk chunks."""
        r, rep = self(OP_BLOB_BEGIN, struct.pack("<QQQ", len(data), self.seq + 1, 0x5EED))
        assert r == SUCCESS and struct.unpack_from("<Q", rep)[0] == 0, r
        step = 1 * MiB
        for off in range(0, len(data), step):
            chunk = data[off : off + step]
            pos, addr = self.chan.bulk_alloc(len(chunk), to_host=True)
            ctypes.memmove(addr, chunk, len(chunk))
            self.send_async(OP_BLOB_PUT, struct.pack("<QQQ", off, pos, len(chunk)))

    def link(self, pkg: bytes | None, cap: int = 2 * MiB, out=None) -> tuple[int, bytes, int]:
        """The package sent (None: nothing), then the link: (CUresult, reply, the output's address).
        out: (kind, where, cap) as the request says them, allocating nothing."""
        if pkg is not None:
            self.blob(pkg)
        addr = 0
        if out is None:
            pos, addr = self.chan.bulk_alloc(cap, to_host=False)
            out = (BUF_BULK, pos, cap)
        r, rep = self(OP_LINK, struct.pack("<QQQ", *out))
        return r, rep, addr

    def good(self) -> None:
        """A well-formed link of vadd.ptx with both logs: the cubin is the text, the logs come back."""
        r, rep, addr = self.link(package(entry(TEXT), options=LOGS))
        assert r == SUCCESS, r
        result, size, n = struct.unpack_from("<QQQ", rep)
        assert (result, size, n) == (SUCCESS, len(TEXT), len(LOGS))
        values = struct.unpack_from(f"<{n}Q", rep, 24)
        assert values[0] == 0 and values[2] == 0  # the worker's buffers are never answered
        assert ctypes.string_at(addr, size) == TEXT
        at = 24 + 8 * n
        (info_len,) = struct.unpack_from("<Q", rep, at)
        info = rep[at + 8 : at + 8 + info_len]
        assert info.startswith(b"SIMULATED linker") and info.endswith(b"\0") and values[1] == info_len
        (err_len,) = struct.unpack_from("<Q", rep, at + 8 + (info_len + 7) // 8 * 8)
        assert err_len == 0 and values[3] == 0


@pytest.fixture
def wire(shm_path):
    """The ASan/UBSan forwarder and one raw channel; at the end its worker still links, and the
    forwarder's log is free of sanitizer reports."""
    with forwarder(shm_path, asan=True) as fwd:
        region = shm.Region.open(shm_path)
        w = Wire(region, fwd)
        try:
            yield w
            w.good()
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            w.chan.close()
            region.close()
        log = fwd.log()
        assert "AddressSanitizer" not in log and "runtime error" not in log, log


def test_a_well_formed_raw_link_answers_the_cubin_logs_and_options(wire):
    """vadd.ptx with both logs and the wall time: the cubin (the simulated linker's: the text) in
    the bulk area, the info log and its size, an empty error log, no pointer of the worker's."""
    wire.good()
    wire.good()


def test_inputs_longer_than_the_bytes_received_and_huge_counts_are_refused(wire):
    """An input whose length runs past the package (by a byte, by 2^63, wrapping), a header that
    claims billions of inputs or options, an input with more options than the bound, an empty
    input, a link of bytes after its last input, a cut-off package: CUDA_ERROR_INVALID_VALUE."""
    body = entry(TEXT)
    cases = {
        "a byte past": package(entry(TEXT, size=len(TEXT) + 8)),
        "2^63 past": package(entry(TEXT, size=1 << 63)),
        "wraps": package(entry(TEXT, size=(1 << 64) - 8)),
        "billions of inputs": package(body, ninputs=0xFFFFFFFF),
        "one input more than sent": package(body, ninputs=2),
        "billions of options": package(body, noptions=0xFFFFFFFF),
        "an input's options past the bound": package(entry(TEXT, options=[opt(OPTIMIZATION_LEVEL, 1)] * 65)),
        "an empty input": package(entry(b"", size=0)),
        "bytes after the last input": package(body) + bytes(8),
        "cut short": package(body)[:-16],
        "no header": b"",
        "wrong magic": b"XXXX" + package(body)[4:],
    }
    for name, pkg in cases.items():
        if not pkg:
            r, _, _ = wire.link(None)  # nothing received: no package
        else:
            r, _, _ = wire.link(pkg)
        assert r == INVALID_VALUE, name
        wire.good()


def test_unknown_types_and_content_that_does_not_check_are_refused(wire):
    """An unknown input type: invalid value; a host object: not supported; PTX without its NUL, PTX
    bytes said to be a cubin or a fatbin, a cubin whose section table lies past its bytes: invalid
    image; a name without its NUL, an empty name, one past the bound: invalid value."""
    elf = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    elf[0x28:0x30] = (1 << 40).to_bytes(8, "little")  # e_shoff far past the bytes
    elf[0x3A:0x3C] = (64).to_bytes(2, "little")  # e_shentsize
    elf[0x3C:0x3E] = (4).to_bytes(2, "little")  # e_shnum
    cases = {
        "type 42": (package(entry(TEXT, kind=42)), INVALID_VALUE),
        "type 2^32-1": (package(entry(TEXT, kind=0xFFFFFFFF)), INVALID_VALUE),
        "a host object": (package(entry(b"\x7fELF" + bytes(60), kind=OBJECT)), NOT_SUPPORTED),
        "PTX without its NUL": (package(entry(TEXT[:-1])), INVALID_IMAGE),
        "PTX as a cubin": (package(entry(TEXT, kind=CUBIN)), INVALID_IMAGE),
        "PTX as a fatbin": (package(entry(TEXT, kind=FATBIN)), INVALID_IMAGE),
        "a lying cubin": (package(entry(bytes(elf), kind=CUBIN)), INVALID_IMAGE),
        "a name without its NUL": (package(entry(TEXT, name=b"vadd.ptx")), INVALID_VALUE),
        "no name at all": (package(entry(TEXT, name=b"")), INVALID_VALUE),
        "a name past the bound": (package(entry(TEXT, name=b"n" * 4096 + b"\0")), INVALID_VALUE),
        "a name longer than sent": (package(entry(TEXT, name_len=1 << 40)), INVALID_VALUE),
    }
    for name, (pkg, want) in cases.items():
        r, _, _ = wire.link(pkg)
        assert r == want, name
        wire.good()


def test_options_are_known_numbers_and_log_sizes_are_bounded(wire):
    """A log size past VG_LINK_LOG_MAX, a log buffer without its size, one given twice, a pointer
    as a log buffer's value or as a no-value option's, a value wider than 32 bits, an option the
    driver does not have, a padding word set: invalid value; a list of pointers (global symbol
    names), a log buffer of one input: not supported.  The bound itself is taken."""
    body = entry(TEXT)
    cases = {
        "a log size past the bound": ((opt(INFO_LOG), opt(INFO_SIZE, LOG_MAX + 1)), INVALID_VALUE),
        "a log size of 2^32": ((opt(ERROR_LOG), opt(ERROR_SIZE, 1 << 32)), INVALID_VALUE),
        "a buffer without its size": ((opt(INFO_LOG),), INVALID_VALUE),
        "a buffer twice": ((opt(INFO_LOG), opt(INFO_LOG), opt(INFO_SIZE, 64)), INVALID_VALUE),
        "a size twice": ((opt(INFO_LOG), opt(INFO_SIZE, 64), opt(INFO_SIZE, 64)), INVALID_VALUE),
        "a pointer as the buffer": ((opt(INFO_LOG, 0x7F0000001000), opt(INFO_SIZE, 64)), INVALID_VALUE),
        "a value for no value": ((opt(TARGET_FROM_CONTEXT, 0x1000),), INVALID_VALUE),
        "a pointer as the wall time": ((opt(WALL_TIME, 0x7F0000001000),), INVALID_VALUE),
        "a value wider than 32 bits": ((opt(OPTIMIZATION_LEVEL, 1 << 33),), INVALID_VALUE),
        "an option the driver lacks": ((opt(99),), INVALID_VALUE),
        "an option 2^32-1": ((opt(0xFFFFFFFF),), INVALID_VALUE),
        "padding set": ((opt(OPTIMIZATION_LEVEL, 1, pad=1),), INVALID_VALUE),
        "global symbol names": ((opt(GLOBAL_SYMBOL_NAMES, 0),), NOT_SUPPORTED),
    }
    for name, (options, want) in cases.items():
        r, _, _ = wire.link(package(body, options=options))
        assert r == want, name
        wire.good()
    r, _, _ = wire.link(package(entry(TEXT, options=[opt(INFO_LOG), opt(INFO_SIZE, 64)])))
    assert r == NOT_SUPPORTED  # an input's own log
    r, rep, _ = wire.link(package(body, options=(opt(INFO_LOG), opt(INFO_SIZE, LOG_MAX))))
    assert r == SUCCESS and struct.unpack_from("<Q", rep)[0] == SUCCESS


def test_a_request_cut_short_or_an_output_outside_the_guests_memory_is_refused(wire):
    """The request without its output's words, an output kind that is neither the bulk area nor the
    heap, a bulk range past the area, a heap offset outside the heap, a capacity past 1 GiB:
    CUDA_ERROR_INVALID_VALUE (the package received is forgotten all the same)."""
    for body in (b"", struct.pack("<Q", BUF_BULK), struct.pack("<QQ", BUF_BULK, 0)):
        wire.blob(GOOD)
        assert wire(OP_LINK, body)[0] == INVALID_VALUE
        wire.good()
    for out in ((BUF_INLINE, 0, 64), (7, 0, 64), (BUF_BULK, 0, 64 * MiB), (BUF_HEAP, 0, 4096),
                (BUF_HEAP, 1 << 62, 4096), (BUF_BULK, 0, (1 << 30) + 1)):  # fmt: skip
        r, _, _ = wire.link(GOOD, out=out)
        assert r == INVALID_VALUE, out
        wire.good()


def test_a_cubin_larger_than_the_output_is_answered_by_its_size_only(wire):
    """An output of 64 bytes for a cubin of the PTX's size: the link succeeds, the answer says the
    size, and nothing is written past the 64 bytes (the library asks again with room)."""
    pos, addr = wire.chan.bulk_alloc(4096, to_host=False)
    ctypes.memset(addr, 0xAB, 4096)
    r, rep, _ = wire.link(GOOD, out=(BUF_BULK, pos, 64))
    assert r == SUCCESS
    assert struct.unpack_from("<QQ", rep) == (SUCCESS, len(TEXT))
    assert ctypes.string_at(addr, 4096) == b"\xab" * 4096
