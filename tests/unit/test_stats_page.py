"""Reading a forwarder's statistics page (vmgpu/stats.py): the version this build writes, and the
version 2 of a forwarder started before the page named its workers (vmgpud may read both while a
host is upgraded), each by the fields they have; anything else refused."""

import ctypes
import struct

import pytest

from vmgpu import abi, stats
from vmgpu.errors import InvalidArgument


def _page(version: int, size: int) -> bytes:
    """A page of `size` bytes: one guest GPU with a 1 GiB quota, 256 MiB used, 7 processes served."""
    p = bytearray(size)
    struct.pack_into("<QII", p, 0, abi.STATS_MAGIC, version, 1)
    struct.pack_into("<Q", p, abi.StatsPage.quota.offset, 1 << 30)
    struct.pack_into("<Q", p, abi.StatsPage.used.offset, 256 << 20)
    struct.pack_into("<Q", p, abi.StatsPage.processes.offset, 7)
    return bytes(p)


@pytest.mark.parametrize(
    "version,size", [(abi.STATS_VERSION, ctypes.sizeof(abi.StatsPage)), (2, abi.STATS_PAGE_V2_SIZE)]
)
def test_a_page_of_this_version_or_the_one_before_is_read(tmp_path, version, size):
    path = tmp_path / "g.stats"
    path.write_bytes(_page(version, size))
    s = stats.read(path)
    assert s["memory"] == [{"gpu": 0, "quota": 1 << 30, "used": 256 << 20}]
    assert s["processes"] == 7


@pytest.mark.parametrize(
    "what,data",
    [
        ("another version", _page(4, ctypes.sizeof(abi.StatsPage))),
        ("version 3 cut to version 2's size", _page(3, abi.STATS_PAGE_V2_SIZE)),
        ("version 2 cut short", _page(2, abi.STATS_PAGE_V2_SIZE - 8)),
        ("no magic", b"\0" * ctypes.sizeof(abi.StatsPage)),
        ("empty", b""),
    ],
)
def test_anything_else_is_refused_with_the_versions_read(tmp_path, what, data):
    path = tmp_path / "g.stats"
    path.write_bytes(data)
    with pytest.raises(InvalidArgument, match="statistics page"):
        stats.read(path)
