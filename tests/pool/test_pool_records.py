"""The pool's pieces that need neither root nor etcd: the pool's address, the records another
host wrote (checked, never half-trusted), a guest's request from boyue's variables, and the
one-line error when no etcd member answers."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from vmgpu.errors import InvalidArgument, LedgerError, SpecError
from vmgpu.pool import admission
from vmgpu.pool.records import GpuRecord, GuestRecord, HostRecord, RecordError, SliceRecord, load_all
from vmgpu.pool.store import Entry, Store, parse_url, tls_settings

GPU = {
    "uuid": "GPU-1",
    "host": "ha",
    "index": 0,
    "name": "H100",
    "mem_mib": 1024,
    "mem_free_mib": 512,
    "compute_free_pct": 50,
}


def test_a_pool_is_named_by_its_etcd_members():
    assert parse_url("etcd://10.0.0.1:2379,etcd-2.example:2379,[fd00::3]:2379") == [
        ("10.0.0.1", 2379),
        ("etcd-2.example", 2379),
        ("fd00::3", 2379),
    ]
    for bad in (
        "http://10.0.0.1:2379",
        "etcd://10.0.0.1",
        "etcd://a:0",
        "etcd://a:70000",
        "etcd://a:1,",
        "etcd://a b:1",
    ):
        with pytest.raises(InvalidArgument):
            parse_url(bad)
    assert parse_url("etcds://10.0.0.1:2379") == [("10.0.0.1", 2379)]  # TLS


def test_an_etcds_pools_tls_comes_from_the_environment_and_a_readable_key_is_refused(tmp_path):
    cert, key, ca = tmp_path / "c.pem", tmp_path / "c.key", tmp_path / "ca.pem"
    for f in (cert, key, ca):
        f.write_text("x")
    key.chmod(0o600)
    full = {"VMGPU_POOL_CA": str(ca), "VMGPU_POOL_CERT": str(cert), "VMGPU_POOL_KEY": str(key)}
    assert tls_settings(full) == {"ca_cert": str(ca), "cert_cert": str(cert), "cert_key": str(key)}
    assert tls_settings({}) == {"ca_cert": None, "cert_cert": None, "cert_key": None}
    with pytest.raises(InvalidArgument, match="both VMGPU_POOL_CERT and VMGPU_POOL_KEY"):
        tls_settings({"VMGPU_POOL_CERT": str(cert)})
    key.chmod(0o640)
    with pytest.raises(InvalidArgument, match="only it can read"):
        tls_settings(full)
    with pytest.raises(InvalidArgument, match="no such file"):
        tls_settings({"VMGPU_POOL_CA": str(tmp_path / "missing.pem")})


@pytest.mark.parametrize(
    "change",
    [
        {"uuid": "GPU-1/../../x"},
        {"uuid": ""},
        {"host": "../etc"},
        {"host": "-rf"},
        {"mem_free_mib": 2048},  # more free than there is
        {"mem_free_mib": -1},
        {"compute_free_pct": 101},
        {"index": True},
        {"mem_mib": "1024"},
        {"name": "x\n" * 3},
    ],
)
def test_a_gpu_record_with_a_hostile_field_is_refused_whole(change):
    with pytest.raises(RecordError):
        GpuRecord.load({**GPU, **change})


def test_records_missing_a_field_or_not_objects_are_refused():
    with pytest.raises(RecordError):
        GpuRecord.load({k: v for k, v in GPU.items() if k != "mem_free_mib"})
    with pytest.raises(RecordError):
        GpuRecord.load([GPU])
    with pytest.raises(RecordError):
        HostRecord.load({"host": "ha", "address": "10.0.0.1", "port": 7471, "lease": 1, "ttl_s": 5, "gpus": ["a/b"]})
    with pytest.raises(RecordError):
        SliceRecord.load({"guest": "g", "uuid": "GPU-1", "host": "ha", "mem_mib": 0, "compute_pct": 10})
    with pytest.raises(RecordError):
        GuestRecord.load({"guest": "g", "token_sha256": "ab" * 31, "slices": ["GPU-1"], "admitted_at": 1.0})


def test_a_bad_record_is_left_out_and_the_good_ones_are_kept():
    class Log:
        def __init__(self):
            self.lines = []

        def warning(self, event, **kw):
            self.lines.append((event, kw["key"]))

    entries = [
        Entry("/vmgpu/pool/gpus/GPU-1", json.dumps(GPU).encode(), 5, 7),
        Entry("/vmgpu/pool/gpus/GPU-2", b"{not json", 6, 7),
        Entry("/vmgpu/pool/gpus/GPU-3", json.dumps({**GPU, "uuid": "GPU-3", "mem_free_mib": 9999}).encode(), 7, 7),
    ]
    log = Log()
    kept = load_all(entries, GpuRecord.load, log)
    assert [g.uuid for _, g in kept] == ["GPU-1"]
    assert [k for _, k in log.lines] == ["/vmgpu/pool/gpus/GPU-2", "/vmgpu/pool/gpus/GPU-3"]


def test_boyues_variables_are_a_pool_request_through_the_dialect_translation():
    env = {"boyue_VGPU": "2", "boyue_GMEM": "4096", "boyue_RATIO": "50", "HOME": "/root"}
    assert admission.request_from_env(env) == admission.Request(2, 4096, None, 50)
    whole = admission.request_from_env({"boyue_VGPU": "1"})
    assert whole.mem_on(81920) == 81920 and whole.compute_pct == 100
    with pytest.raises(SpecError, match="boyue_GMEM"):
        admission.request_from_env({"boyue_GMEM": "4G"})
    with pytest.raises(InvalidArgument, match="boyue_VGPU"):
        admission.request_from_env({"HOME": "/root"})


def test_a_request_from_options_is_checked():
    assert admission.request(2, "4G", 30) == admission.Request(2, 4096, None, 30)
    assert admission.request(1, "50%", 10).mem_on(1000) == 500
    for count, mem, compute in ((0, "1G", 10), (1, "1G", 0), (1, "1G", 101), (1, "lots", 10)):
        with pytest.raises(InvalidArgument):
            admission.request(count, mem, compute)


def test_no_etcd_member_answering_is_one_error_naming_each_member():
    ports = []
    for _ in range(2):  # ports nothing listens on: bound, then closed
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    store = Store(f"etcd://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", timeout_s=1)
    with pytest.raises(LedgerError) as e:
        store.get("/vmgpu/pool/hosts/ha")
    assert "no etcd member answers" in e.value.message
    assert all(f"127.0.0.1:{p}" in e.value.message for p in ports)


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / "build" / "native" / "vmgpu-netbridge").exists(),
    reason="vmgpu-netbridge not built: needs libssl-dev (make native)",
)
def test_a_hosts_data_plane_restarts_its_bridge_and_keeps_serving_its_guests(tmp_path, monkeypatch):
    """The bridge ending is not the guests ending: it is started again, and the guests' entries
    (what it serves them by) and forwarders stay."""
    from vmgpu.pool.dataplane import DataPlane

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plane = DataPlane(f"t{os.getpid()}", tmp_path / "plane", f"127.0.0.1:{port}", backend="sim")
    sha = "ab" * 32
    monkeypatch.setenv("VMGPU_SCHED_DIR", str(tmp_path / "sched"))  # its forwarder's scheduler page
    monkeypatch.setattr(plane, "_wanted", lambda store: {"g1": (sha, (0,), 64, (("GPU-t-0000", 25),))})
    plane.start()
    try:
        plane.reconcile(None)
        entry = plane.guests_dir / "g1"
        assert entry.read_text() == f"{plane.region('g1')} {sha}\n"
        first = plane.bridge
        first.kill()
        first.wait()
        plane.reconcile(None)
        assert plane.bridge is not first and plane.bridge.poll() is None
        assert entry.read_text() == f"{plane.region('g1')} {sha}\n" and "g1" in plane.served
        assert plane.served["g1"].forwarder.proc.poll() is None
    finally:
        plane.stop()
    assert not plane.region("g1").exists() and not entry.exists()
