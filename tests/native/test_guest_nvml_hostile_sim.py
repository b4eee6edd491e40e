"""The guest NVML, vmgpu-smi and `vmgpu-guest-agent install` against a hostile guest user, on
the simulated backend: a process whose name is made to forge output lines or columns, query
options a script gets wrong, and an install into a directory someone else could change."""

from __future__ import annotations

import csv
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forwarder import GUEST_LIB, NATIVE, forwarder, guest_env, run_guest
from vmgpu import shm

pytestmark = pytest.mark.native

SMI = GUEST_LIB / "vmgpu-smi"
AGENT = GUEST_LIB / "vmgpu-guest-agent"
# A process name (its first 15 bytes are what /proc/PID/comm shows) that, printed as it is,
# forges an extra column and, for whoever splits lines at a carriage return (Python's
# splitlines, its csv module), a line of another process.
FORGED = "a,b\r1, x, 9 MiB"


def hold_as(region: Path, name: Path, mib: int) -> subprocess.Popen:
    """tests/cuda/hold.c started through a link named `name`, so that the process's name is it."""
    name.symlink_to(NATIVE / "hold")
    p = subprocess.Popen(
        [str(name), str(mib)],
        env=guest_env(region),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().startswith("held"), p.stderr.read()
    return p


def test_a_process_name_cannot_forge_lines_or_columns_of_vmgpu_smi(shm_path, tmp_path):
    """A guest process named with a carriage return and commas is one line and one column in
    vmgpu-smi's csv (quoted, as csv is) and its table, and NVML gives its name without control
    characters (the driver's nvidia-smi prints what the guest NVML gives it)."""
    with forwarder(shm_path, mem="1G"):
        p = hold_as(shm_path, tmp_path / FORGED, 64)
        try:
            query = "--query-compute-apps=pid,process_name,used_memory"
            apps = run_guest([SMI, query, "--format=csv,noheader"], shm_path)
            table = run_guest([SMI], shm_path)
            code = f"import pynvml as n; n.nvmlInit(); print(repr(n.nvmlSystemGetProcessName({p.pid})))"
            name = run_guest([sys.executable, "-c", code], shm_path)
        finally:
            p.stdin.close()
            p.wait(timeout=30)
    for r in (apps, table, name):
        assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.reader(apps.stdout.splitlines(), skipinitialspace=True))
    assert len(rows) == 1 and len(rows[0]) == 3, apps.stdout
    assert rows[0][0] == str(p.pid) and rows[0][1] == "a,b?1, x, 9 MiB"
    shown = [ln.split() for ln in table.stdout.splitlines() if str(p.pid) in ln]
    assert "\r" not in table.stdout and shown == [["0", str(p.pid), "a,b?1,", "x,", "9", "MiB", rows[0][2].split()[0]]]
    assert name.stdout.strip() == repr("a,b?1, x, 9 MiB")


@pytest.mark.parametrize(
    "args",
    [
        ["--query-gpu=index,wattage", "--format=csv"],  # an unknown field after a known one
        ["--query-compute-apps=pid,nonsense", "--format=csv"],
        ["--query-gpu=", "--format=csv"],  # no field at all
        ["--query-gpu=index,,name", "--format=csv"],  # an empty field
        ["--query-gpu=index", "--format=csv,nohead"],  # a misspelt format option
        ["--query-gpu=index", "--format=csvx"],
    ],
)
def test_a_bad_query_prints_nothing_a_script_could_take_for_an_answer(shm_path, args):
    """As nvidia-smi: a query vmgpu-smi cannot answer exits 2 with the reason on stderr and no
    header or partial row on stdout."""
    with forwarder(shm_path, mem="1G"):
        r = run_guest([SMI, *args], shm_path)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.strip()


def install(prefix: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENT), "install", "--prefix", str(prefix)], capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as vmgpu-guest-agent install does in a VM")
@pytest.mark.parametrize("where", ["prefix", "lib", "bin"])
@pytest.mark.parametrize("how", ["writable by all", "owned by another user"])
def test_install_refuses_a_directory_another_user_could_change(tmp_path, where, how):
    """libcuda.so.1 and libnvidia-ml.so.1 are loaded by every guest process, root's included:
    the agent (root) refuses to put them where a user who is not root could replace them after
    it (a directory on the way owned by another user, or writable by others and not sticky),
    and writes nothing there."""
    prefix = tmp_path / "usr"
    dirs = {"prefix": prefix, "lib": prefix / "lib" / "x86_64-linux-gnu", "bin": prefix / "bin"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    target = dirs[where]
    if how == "writable by all":
        target.chmod(0o777)
    else:
        os.chown(target, 4242, 4242)
    r = install(prefix)
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(target) in r.stderr and "not root's alone" in r.stderr
    assert [p.name for p in prefix.rglob("*") if p.is_file()] == []
    # a sticky directory writable by all (as /tmp) on the way is fine: nobody but root can
    # rename or remove what root made in it
    sticky = tmp_path / "sticky"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    ok = install(sticky / "usr")
    assert ok.returncode == 0, ok.stderr


def nvml_query(chan, body: bytes, dev: int = 0xFFFF, seq: int = 1) -> tuple[int, bytes]:
    """A raw VG_OP_NVML_QUERY request (header dev: none, by default): (CUresult, reply body)."""
    chan.send(1, struct.pack("<IHHQ", 7, dev, 0, seq) + body)  # VG_REC_REQUEST
    rtype, rep = chan.recv(timeout_s=10)
    result, op, rseq = struct.unpack_from("<iIQ", rep)
    assert (rtype, op, rseq) == (2, 7, seq)  # VG_REC_REPLY
    return result, rep[16:]


def test_raw_nvml_queries_of_any_shape_are_refused_without_harm(shm_path):
    """Requests of any length and device (none, short, long, out of range, huge, negative, and a
    header naming a device the guest does not have) get an error, never a crash (ASan/UBSan) or
    a context; a good one after them answers the guest's quota with nothing used: a query that
    names no device in its header (as the guest NVML's) makes no context and charges nothing."""
    with forwarder(shm_path, mem="1G", asan=True, env={"VMGPU_SIM_CTX_MIB": "64"}) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            u64 = lambda v: struct.pack("<q" if v < 0 else "<Q", v)  # noqa: E731
            bodies = [b"", b"\0" * 4, u64(1), u64(16), u64(1 << 63), u64(-1), u64(0xFFFF)]
            results = [nvml_query(chan, b, seq=i + 1)[0] for i, b in enumerate(bodies)]
            assert results == [101] * len(bodies)  # CUDA_ERROR_INVALID_DEVICE
            assert nvml_query(chan, u64(0), dev=3, seq=20)[0] == 101  # no device 3: no context either
            r, live = nvml_query(chan, u64(0) + b"\xff" * 60000, seq=21)  # extra bytes are ignored
            assert r == 0
            quota, used, nprocs, flags = struct.unpack_from("<QQII", live)
            assert (quota, used, nprocs, flags) == (1 << 30, 0, 0, 0)  # no context was made, nothing charged
            # (a header naming device 0 would make the process's context, and charge it)
            r, live = nvml_query(chan, u64(0), dev=0, seq=22)
            assert r == 0 and struct.unpack_from("<QQ", live) == (1 << 30, 64 << 20)
        finally:
            chan.close()
            region.close()
        assert fwd.proc.poll() is None, fwd.log()
