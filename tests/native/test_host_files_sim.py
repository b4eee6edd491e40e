"""The forwarder (ASan/UBSan build, simulated backend) against a local unprivileged user: a
scheduler page or directory that `nobody` made, a link planted at a region path, a region file
of nobody's.  The forwarder refuses each with one clear line and touches nothing; a region it
serves can be given to a non-root guest user without giving it to anyone else."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.forwarder import NATIVE, forwarder

pytestmark = pytest.mark.native

NOBODY = 65534
UUID_PREFIX = "vmgpu-sched-"
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

if os.geteuid() != 0:
    pytest.skip("needs root: plays user nobody against root's forwarder", allow_module_level=True)


LINK = "import os, sys; os.symlink(sys.argv[1], sys.argv[2])"


def run_as(uid: int, code: str, *args: str, env=None) -> subprocess.CompletedProcess:
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return subprocess.run(
        [PY, "-c", code, *args], preexec_fn=drop, capture_output=True, text=True, timeout=60, cwd="/", env=env
    )


@pytest.fixture
def world():
    """A directory of root's every user can reach, with `open/` anyone may write in (as /dev/shm)."""
    d = Path(tempfile.mkdtemp(prefix="vmgpu-test-hostfs-"))
    d.chmod(0o755)
    (d / "open").mkdir()
    (d / "open").chmod(0o1777)
    secret = d / "secret"
    secret.write_bytes(b"root's own bytes\n")
    secret.chmod(0o600)
    yield d
    shutil.rmtree(d)


def serve(region: Path, sched_dir: Path, create: str | None = "128M") -> tuple[bool, str]:
    """Start the ASan forwarder as guest g1 and stop it: whether it served, and its log."""
    env = {"VMGPU_SCHED_DIR": str(sched_dir)}
    with forwarder(region, size=create, asan=True, guest="g1", env=env, may_refuse=True, keep_region=True) as fwd:
        served = fwd.proc.poll() is None
    return served, fwd.log()


NOBODYS_PAGE = (
    "import os, sys, struct\n"
    "d, name = sys.argv[1], sys.argv[2]\n"
    "os.makedirs(d, exist_ok=True)\n"
    "fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT, 0o666)\n"
    "os.ftruncate(fd, 0)\n"  # empty: the forwarder that joins formats it, and nobody keeps write access
)


@pytest.mark.parametrize("plant", ["page-in-an-open-dir", "nobodys-dir", "link-to-roots-dir"])
def test_the_forwarder_refuses_a_scheduler_page_another_user_made(world, plant):
    """nobody makes the GPU's page where forwarders look for it (or the directory, or a link to
    one of root's): on a64d124 root's forwarder joined it and nobody then set the policy and the
    guest's weight."""
    sim_uuid_glob = f"{UUID_PREFIX}*"
    if plant == "page-in-an-open-dir":
        sched = world / "open"
    else:
        sched = world / "open" / "vmgpu"
    target = world / "roots-dir"
    target.mkdir(mode=0o700)
    if plant == "link-to-roots-dir":
        assert run_as(NOBODY, LINK, str(target), str(sched)).returncode == 0
    else:
        # the simulated GPU's UUID is the forwarder's to say: nobody plants every page name it may use
        r = run_as(NOBODY, "import os, sys; os.makedirs(sys.argv[1], exist_ok=True)", str(sched))
        assert r.returncode == 0, r.stderr
    region = world / "region"
    # learn the simulated GPU's UUID from a forwarder with a scheduler directory of its own
    served, text = serve(region, world / "own-sched")
    pages = list((world / "own-sched").glob(sim_uuid_glob))
    assert served and len(pages) == 1, text
    if plant != "link-to-roots-dir":
        r = run_as(NOBODY, NOBODYS_PAGE, str(sched), pages[0].name)
        assert r.returncode == 0, r.stderr
    before = {q.name: q.read_bytes() for q in list(sched.glob(sim_uuid_glob)) + list(target.iterdir())}

    served, text = serve(region, sched)
    assert not served, "the forwarder joined a scheduler page another user made:\n" + text
    assert "cannot join the compute scheduler" in text and "refusing" in text, text
    assert {q.name: q.read_bytes() for q in list(sched.glob(sim_uuid_glob)) + list(target.iterdir())} == before


def test_the_scheduler_directory_and_pages_are_roots_alone(world):
    sched = world / "sched"  # missing: the forwarder makes it
    served, text = serve(world / "region", sched)
    assert served, text
    st = os.lstat(sched)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    (page,) = sched.glob(f"{UUID_PREFIX}*")
    assert os.stat(page).st_uid == 0 and stat.S_IMODE(os.stat(page).st_mode) == 0o600
    r = run_as(NOBODY, "import os, sys; os.open(sys.argv[1], os.O_RDWR)", str(page))
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_create_replaces_a_link_planted_at_the_region_path_and_leaves_its_target(world):
    region = world / "open" / "vmgpu-g1"
    secret = world / "secret"
    assert run_as(NOBODY, LINK, str(secret), str(region)).returncode == 0
    served, text = serve(region, world / "sched")
    assert secret.read_bytes() == b"root's own bytes\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert served, text
    st = os.lstat(region)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert [q.name for q in (world / "open").iterdir()] == ["vmgpu-g1"]


@pytest.mark.parametrize("plant", ["nobodys-file", "link-to-a-root-region"])
def test_serving_an_existing_region_someone_else_made_or_linked_is_refused(world, plant):
    """Without --create (a VM's region, a restart) the forwarder serves only a region file of
    its own user's: not one nobody made (a copy of a good region), not one reached by a link."""
    from vmgpu import shm

    good = world / "good-region"
    shm.Region.create(good, 8 << 20, shm.Params(nchannels=2, bulk_size=1 << 20), "g1").close()
    good.chmod(0o644)
    region = world / "open" / "vmgpu-g1"
    if plant == "nobodys-file":
        copy = "import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])"
        assert run_as(NOBODY, copy, str(good), str(region)).returncode == 0
    else:
        assert run_as(NOBODY, LINK, str(good), str(region)).returncode == 0
    before = good.read_bytes()
    served, text = serve(region, world / "sched", create=None)
    assert not served, "the forwarder served a region someone else made:\n" + text
    reason = "belongs to uid 65534" if plant == "nobodys-file" else "is a symbolic link"
    assert f"cannot open region {region}" in text and reason in text, text
    assert good.read_bytes() == before


def test_a_non_root_guest_user_given_the_region_uses_the_gpu_and_nobody_else_can(world):
    """A container's --user 1000:1000: the runtime gives it the region (oci.give_region); a CUDA
    program run as that user works through it, one run as nobody cannot open it."""
    from vmgpu import oci

    region = world / "open" / "vmgpu-g1"
    env = {"VMGPU_SCHED_DIR": str(world / "sched")}
    with forwarder(region, size="128M", asan=True, guest="g1", env=env, may_refuse=True, keep_region=True) as fwd:
        assert fwd.proc.poll() is None, fwd.log()
        oci.give_region(region, 1000, 1000)
        env = {
            "LD_LIBRARY_PATH": str(NATIVE / "guest"),
            "VMGPU_REGION": str(region),
            "PATH": "/usr/bin:/bin",
        }
        prog = "import subprocess, sys; sys.exit(subprocess.run([sys.argv[1], '1'], input='', text=True).returncode)"
        ok = run_as(1000, prog, str(NATIVE / "hold"), env=env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        denied = run_as(NOBODY, prog, str(NATIVE / "hold"), env=env)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        assert "is not this user's" in denied.stderr and "set VMGPU_REGION" not in denied.stderr  # the right hint
