"""The Python binding of libvmgpushm, and the `vmgpu region` commands."""

import ctypes
import json
import os
import threading

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from vmgpu import abi, shm
from vmgpu.cli.main import cli
from vmgpu.errors import EXIT_CODES, InvalidArgument, NotFound, RegionError, VersionMismatch

SMALL = shm.Params(nchannels=2, bulk_size=64 << 10)


def test_parse_size():
    assert shm.parse_size("4096") == 4096
    assert shm.parse_size("64M") == 64 << 20
    assert shm.parse_size("1GiB") == 1 << 30
    assert shm.parse_size("2k") == 2048
    with pytest.raises(InvalidArgument, match="not a number of bytes"):
        shm.parse_size("lots")


def test_create_sets_exact_size_and_header(shm_path):
    size = SMALL.min_size(8 << 20)
    r = shm.Region.create(shm_path, size, SMALL, "guest-a")
    try:
        assert os.stat(shm_path).st_size == size
        assert oct(os.stat(shm_path).st_mode & 0o777) == "0o600"
        h = r.header()
        assert h["magic"] == shm.MAGIC and h["version_major"] == 1
        assert h["name"] == "guest-a" and h["nchannels"] == 2 and h["region_state"] == 1
        assert r.check() == SMALL
    finally:
        r.close()
    with pytest.raises(RegionError, match="already exists"):
        shm.Region.create(shm_path, size, SMALL)


def test_refuses_other_major_version(shm_path):
    r = shm.Region.create(shm_path, SMALL.min_size(), SMALL)
    try:
        r.mm[8:10] = (2).to_bytes(2, "little")
        with pytest.raises(VersionMismatch, match=r"speaks ABI 2\.\d"):
            r.check()
        with pytest.raises(VersionMismatch):
            shm.Host(r, SMALL)
    finally:
        r.close()


def test_bad_geometry_is_refused_before_touching_files(shm_path):
    with pytest.raises(InvalidArgument, match="power of two"):
        shm.Region.create(shm_path, 64 << 20, shm.Params(req_ring_size=5000))
    with pytest.raises(InvalidArgument, match="too small"):
        shm.Region.create(shm_path, 1 << 20, shm.Params())
    assert not shm_path.exists()
    with pytest.raises(NotFound):
        shm.Region.open(shm_path)


def _serve(host: shm.Host, stop: threading.Event, nchan: int):
    while not stop.is_set():
        host.beat()
        for i in range(nchan):
            ev = host.poll(i)
            if ev in ("closed", "lost"):
                host.reclaim(i)
            elif ev in ("opened", "serving"):
                while (m := host.recv(i, timeout_s=0.001)) is not None:
                    host.send(i, m[0] + 1, m[1][::-1])


def test_guest_and_host_round_trip_and_channel_table(shm_path):
    r = shm.Region.create(shm_path, SMALL.min_size(4 << 20), SMALL)
    host = shm.Host(r, SMALL)
    stop = threading.Event()
    t = threading.Thread(target=_serve, args=(host, stop, 2), daemon=True)
    t.start()
    try:
        g = shm.GuestChannel(r)
        g.send(10, b"abcdef")
        assert g.recv(timeout_s=5) == (11, b"fedcba")
        chans = r.channels(SMALL)
        mine = chans[g.index]
        assert mine["state"] == "active" and mine["owner_pid"] == os.getpid()
        assert mine["host_status"] == "accepted" and mine["generation"] == g.generation
        off = g.heap_alloc(100 << 10)
        assert r.channels(SMALL)[g.index]["heap_bytes"] == 2 * SMALL.heap_block_size
        assert host.heap(off, 100 << 10) == r.base + off
        assert host.heap(off, 1 << 40) is None
        g.heap_free(off)
        g.close()
        for _ in range(2000):
            if r.channels(SMALL)[g.index]["state"] == "free":
                break
            threading.Event().wait(0.001)
        assert r.channels(SMALL)[g.index]["state"] == "free"
    finally:
        stop.set()
        t.join()
        host.close()
        r.close()


def test_claim_without_host_times_out_clearly(shm_path):
    r = shm.Region.create(shm_path, SMALL.min_size(), SMALL)
    try:
        with pytest.raises(RegionError, match="no host forwarder answered"):
            shm.GuestChannel(r, ack_timeout_s=0.05)
    finally:
        r.close()


@settings(max_examples=300, deadline=None)
@given(
    nch=st.integers(0, 5000),
    req=st.sampled_from([0, 100, 4096, 1 << 16, 1 << 20, 3 << 20, 1 << 29]),
    bulk=st.sampled_from([0, 4096, 65536, 100000, 1 << 22, 1 << 33]),
    block=st.sampled_from([1024, 4096, 65536, 1 << 21, 1 << 31]),
    size=st.integers(0, 1 << 34),
)
def test_layout_is_inside_the_region_or_refused(nch, req, bulk, block, size):
    p = shm.Params(nchannels=nch, req_ring_size=req, cpl_ring_size=4096, bulk_size=bulk, heap_block_size=block)
    try:
        lay = p.layout(size)
    except InvalidArgument:
        return
    areas = [
        (lay["chan_table_off"], nch * 64),
        (lay["heap_map_off"], lay["heap_blocks"] * 8),
        (lay["chan_area_off"], nch * lay["chan_stride"]),
        (lay["heap_off"], lay["heap_size"]),
    ]
    end = 4096
    for off, length in areas:
        assert off >= end and off % 4096 == 0
        end = off + length
    assert end <= size
    assert lay["heap_off"] % block == 0


def _run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_cli_region_create_show_and_errors(shm_path):
    res = _run(["region", "create", str(shm_path), "--size", "96M", "--channels", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["size"] == 96 << 20 and out["channels"] == 4 and os.stat(shm_path).st_size == 96 << 20
    res = _run(["region", "show", str(shm_path), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["header"]["nchannels"] == 4 and len(shown["channels"]) == 4
    res = _run(["region", "show", str(shm_path)])
    assert "ABI 1." in res.output and "no channel has been used yet" in res.output
    # errors: one line, stable exit code
    res = _run(["region", "create", str(shm_path)])
    assert res.exit_code == EXIT_CODES["REGION"] and "already exists" in res.output
    res = _run(["region", "create", str(shm_path) + "-x", "--size", "1M"])
    assert res.exit_code == EXIT_CODES["INVALID_ARGUMENT"] and "too small" in res.output
    res = _run(["region", "show", "/dev/shm/vmgpu-does-not-exist"])
    assert res.exit_code == EXIT_CODES["NOT_FOUND"]


def test_selftest_runs_a_guest_process():
    from vmgpu.selftest import run_selftest

    res = run_selftest(300)
    assert res["exchanges"] == 300
    assert all(res["checks"].values()), res["checks"]
    assert not os.path.exists(res["region"])


def test_binding_struct_sizes_match_the_abi():
    # vmgpu/abi.py mirrors C structs; a drift would corrupt reads (all of them, field by field:
    # tests/native/test_abi_layouts.py)
    assert ctypes.sizeof(abi.ShmParams) == 32
    assert ctypes.sizeof(abi.WaitOpts) == 40
