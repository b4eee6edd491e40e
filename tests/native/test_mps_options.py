"""The forwarder's --mps DIR (its workers as clients of an MPS control daemon): the pipe directory
must be a real directory of root's or the forwarder's that no one else can reach (0700), since
whoever could put a pipe there would be served every call of the guest's and whoever reaches the
daemon's control pipe can stop it; --mps-threads is a percentage, --mps-priority one of four modes
and --mps-when always or shared, each needing --mps; the simulated backend takes --mps (and says it
opens no MPS client).  (The
client priority each worker sets, by its guest's priority: t_sched_policy.  Kernels of MPS
clients running side by side are measured on a GPU by bench/run_sharing.py.)"""

import os
import subprocess

import pytest

from tests.forwarder import NATIVE

pytestmark = pytest.mark.native


def _forwarder(tmp_path, *args):
    region = tmp_path / "region"
    r = subprocess.run(
        [str(NATIVE / "vmgpu-forwarder"), "--region", str(region), *args], capture_output=True, text=True, timeout=30
    )
    assert not region.exists()  # refused before anything was made
    return r


def test_an_mps_pipe_directory_others_could_write_or_reach_or_a_link_is_refused(tmp_path):
    open_dir, readable = tmp_path / "open", tmp_path / "readable"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    readable.mkdir()
    os.chmod(readable, 0o755)  # (others could reach the control pipe)
    good = tmp_path / "good"
    good.mkdir()
    os.chmod(good, 0o700)
    link = tmp_path / "link"
    link.symlink_to(good)
    for d in (open_dir, readable, link, tmp_path / "missing"):
        r = _forwarder(tmp_path, "--mps", str(d))
        assert r.returncode != 0 and "--mps: " in r.stderr, r.stderr
    # the good directory passes this check (here the forwarder stops later, at the GPU probe)
    r = _forwarder(tmp_path, "--mps", str(good), "--mps-threads", "30")
    assert "--mps" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mps-threads", "30"], "--mps-threads needs --mps DIR"),
        (["--mps", "{good}", "--mps-threads", "0"], "is not a percentage in 1..100"),
        (["--mps", "{good}", "--mps-threads", "101"], "is not a percentage in 1..100"),
        (["--mps-when", "shared"], "--mps-when needs --mps DIR"),
        (["--mps", "{good}", "--mps-when", "sometimes"], "is not always or shared"),
        (["--mps-priority", "below"], "--mps-priority needs --mps DIR"),
        (["--mps", "{good}", "--mps-priority", "high"], "is not auto, normal, below or driver"),
        (["--mps", "{good}", "--mps-priority", ""], "is not auto, normal, below or driver"),
    ],
)
def test_mps_options_out_of_range_are_refused_with_a_reason(tmp_path, args, message):
    good = tmp_path / "good"
    good.mkdir()
    os.chmod(good, 0o700)
    r = _forwarder(tmp_path, *[a.format(good=good) for a in args])
    assert r.returncode != 0 and message in r.stderr, r.stderr
