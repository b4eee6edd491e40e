"""The host file system against a local unprivileged user, and guest names against the paths
they become: what `nobody` plants (a file of its own, a symbolic link to a root-only file, a
world-writable directory) is refused with one clear error and the target is left as it was;
a guest name that is not path-safe is refused everywhere a name comes in."""

from __future__ import annotations

import json
import os
import shutil
import stat
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from tests.unit.test_daemon import INVENTORY
from vmgpu import shm
from vmgpu.errors import InvalidArgument, VmgpuError

NOBODY = 65534
SMALL = shm.Params(nchannels=2, bulk_size=1 << 20)
SIZE = 8 << 20
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: plays user nobody against root's files")
# nobody cannot run a virtual environment's interpreter under /root: the system's, stdlib only
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

BAD_NAMES = ["../x", "../../etc/passwd", "/", "a/b", "a\0b", "a\nb", "x" * 5000, "it's", "", ".hidden", "-rf", "a b"]
GOOD_NAMES = ["vm1", "ctr-0123456789ab", "a.b_c-d", "_x", "x" * 64, "Web.01"]


def run_as(uid: int, gid: int, code: str, *args: str) -> subprocess.CompletedProcess:
    """Python code run as uid/gid with no other groups (argv[1:] = args)."""

    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.run([PY, "-c", code, *args], preexec_fn=drop, capture_output=True, text=True, timeout=30, cwd="/")


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    return run_as(NOBODY, NOBODY, code, *args)


@pytest.fixture
def world():
    """A directory of root's that every user can reach (pytest's own are root-only), removed after."""
    d = Path(tempfile.mkdtemp(prefix="vmgpu-test-hostfs-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def open_dir(world):
    """A directory anyone may write in, as /dev/shm is (sticky, 1777)."""
    d = world / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


@pytest.fixture
def secret(world):
    """A root-only file that a planted link points at: it must stay as it is."""
    p = world / "secret"
    p.write_bytes(b"root's own bytes\n")
    p.chmod(0o600)
    return p


# ---- guest names ------------------------------------------------------------------------


@given(st.text(max_size=200))
@example("../x")
@example("x" * 65)
@example("a\n")
def test_an_accepted_guest_name_is_one_plain_file_name_in_the_state_directory(name):
    from vmgpu.names import MAX_LEN, check_guest

    try:
        check_guest(name)
    except InvalidArgument as e:
        assert "\n" not in e.message and len(e.message) < 400  # one line, whatever the name
        return
    state = Path("/var/lib/vmgpu/forwarders")
    for path in (state / f"{name}.log", state / f"{name}.stats", Path("/dev/shm") / f"vmgpu-{name}"):
        assert os.path.normpath(path) == str(path) and path.parent in (state, Path("/dev/shm"))
    assert 1 <= len(name) <= MAX_LEN and name[0] not in ".-"
    assert set(name) <= set(string.ascii_letters + string.digits + "._-")


@given(st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=64))
def test_every_name_of_safe_characters_not_starting_with_a_dot_or_dash_is_accepted(name):
    from vmgpu.names import check_guest, is_guest

    assert is_guest(name) == (name[0] not in ".-")
    if name[0] not in ".-":
        assert check_guest(name) == name


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_vmgpud_refuses_a_path_unsafe_guest_name_on_every_call_that_takes_one(tmp_path, name):
    from vmgpu.client import Client
    from vmgpu.daemon import serve

    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    server, ledger = serve(tmp_path / "run" / "vmgpud.sock", tmp_path / "lib" / "ledger.db", inv)
    c = Client(str(tmp_path / "run" / "vmgpud.sock"))
    try:
        calls = [
            lambda: c.admit(name, "container", "gpu=0,mem=1G"),
            lambda: c.start_forwarder(name, str(tmp_path / "region"), "sim", "16M"),
            lambda: c.set_weight(name, "0", 10),
            lambda: c.stop_forwarder(name),
            lambda: c.release(name),
        ]
        for call in calls:
            with pytest.raises(InvalidArgument, match=r"guest name .*(not allowed|characters long|empty)"):
                call()
        assert c.status().slices == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.toml", "lib", "run"]
    finally:
        c.close()
        server.stop(grace=None).wait()
        server.supervisor.close()
        ledger.close()


@pytest.mark.parametrize("name", ["../x", "a/b", "x" * 5000, "a\nb"], ids=repr)
def test_the_cli_refuses_a_path_unsafe_guest_name_before_asking_vmgpud(tmp_path, name):
    from vmgpu.cli.main import cli

    run = CliRunner(mix_stderr=False).invoke
    for args in (["admit", name, "gpu=0,mem=1G"], ["release", name], ["weight", name, "0", "10"]):
        r = run(cli, [*args, "--socket", str(tmp_path / "none.sock")])
        assert r.exit_code == 2 and "[INVALID_ARGUMENT]" in r.stderr and "guest name" in r.stderr, (r.stderr, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit)


# ---- the qemu hook and the domain XML ----------------------------------------------------

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory>
<devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>"""


def _vmgpu_domain(name: str) -> str:
    from vmgpu import spec
    from vmgpu.virt import domain

    xml = domain.attach(DOMAIN.format(name="placeholder"), spec.parse("gpu=0,mem=1G"))
    # libvirt allows quotes, spaces and more in a name: put the name in as libvirt would
    return xml.replace("placeholder", name.replace("&", "&amp;").replace("'", "&apos;"))


def test_a_quote_in_a_domain_name_is_read_as_a_name_not_as_xpath():
    from vmgpu.virt import domain

    share, dev = domain.read(_vmgpu_domain("it's"))
    assert share is not None and dev == {"name": "vmgpu-it's", "model": "ivshmem-plain", "size_mib": 512}


@pytest.mark.parametrize("name", ["it's", "web server", "x" * 100], ids=repr)
def test_the_hook_refuses_a_vmgpu_domain_whose_name_is_not_a_guest_name_with_one_line(tmp_path, name, capsys):
    from vmgpu.virt import hook

    settings = {"socket": str(tmp_path / "none.sock"), "shm_dir": str(tmp_path), "log": str(tmp_path / "h.log")}
    assert hook.run([name, "prepare", "begin", "-"], _vmgpu_domain(name), settings) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot start" in err and "domain name" in err and "[INVALID_ARGUMENT]" in err
    assert hook.run([name, "release", "end", "-"], _vmgpu_domain(name), settings) == 0  # nothing to undo
    # a domain that is not vmgpu's is none of its business, whatever its name
    assert hook.run([name, "prepare", "begin", "-"], DOMAIN.format(name=name.replace("'", "&apos;")), settings) == 0


def test_qemus_user_comes_from_the_settings_then_qemu_conf(tmp_path):
    from vmgpu.virt import hook

    conf = tmp_path / "qemu.conf"
    conf.write_text('# user = "root"\nuser = "nobody"\ngroup = "+4242"\n')
    assert hook.qemu_identity({"qemu_conf": str(conf)}) == (NOBODY, 4242)
    assert hook.qemu_identity({"qemu_user": "+1234:+99", "qemu_conf": str(conf)}) == (1234, 99)
    assert hook.qemu_identity({"qemu_user": "root", "qemu_conf": str(conf)}) == (0, 0)
    with pytest.raises(VmgpuError, match="QEMU's user 'no-such-user' does not exist"):
        hook.qemu_identity({"qemu_user": "no-such-user"})


# ---- regions --------------------------------------------------------------------------------


@needs_root
def test_a_link_planted_at_a_region_path_is_replaced_never_written_through(open_dir, secret):
    path = open_dir / "vmgpu-vm1"
    r = as_nobody("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(secret), str(path))
    assert r.returncode == 0, r.stderr
    with pytest.raises(VmgpuError, match="already exists"):  # exclusive: refused, the link left as it is
        shm.Region.create(path, SIZE, SMALL, "vm1")
    assert secret.read_bytes() == b"root's own bytes\n" and os.path.islink(path)
    assert [p.name for p in open_dir.iterdir()] == ["vmgpu-vm1"]
    region = shm.Region.create(path, SIZE, SMALL, "vm1", exclusive=False)  # the hook's: replaced
    region.close()
    assert secret.read_bytes() == b"root's own bytes\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    st_ = os.lstat(path)
    assert stat.S_ISREG(st_.st_mode) and st_.st_uid == 0 and stat.S_IMODE(st_.st_mode) == 0o600
    assert shm.Region.open(path).check().nchannels == SMALL.nchannels
    assert [p.name for p in open_dir.iterdir()] == ["vmgpu-vm1"]  # nothing left beside it


@needs_root
def test_a_region_is_given_to_one_user_and_group_only(open_dir):
    """A region for uid/gid 1000 (a container's --user 1000:1000, or QEMU's user): they can read
    and write it, nobody else can, and it stays root's so that they cannot chmod it open."""
    path = open_dir / "vmgpu-ctr"
    shm.Region.create(path, SIZE, SMALL, "ctr", uid=1000, gid=1000).close()
    st_ = os.stat(path)
    assert st_.st_uid == 0 and stat.S_IMODE(st_.st_mode) & 0o007 == 0
    probe = "import os, sys; os.close(os.open(sys.argv[1], os.O_RDWR)); print('ok')"
    assert run_as(1000, 1000, probe, str(path)).stdout == "ok\n"
    assert run_as(1000, 2000, probe, str(path)).stdout == "ok\n"  # the user
    assert run_as(2000, 1000, probe, str(path)).stdout == "ok\n"  # the group
    denied = run_as(NOBODY, NOBODY, probe, str(path))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    chmod = run_as(1000, 1000, "import os, sys; os.chmod(sys.argv[1], 0o666)", str(path))
    assert chmod.returncode != 0 and "Operation not permitted" in chmod.stderr
    path.unlink()


# ---- the scheduler's pages ----------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("plant", ["own-dir", "link-to-root-dir", "open-dir"])
def test_vmgpud_never_writes_a_scheduler_page_another_user_made(open_dir, world, plant):
    """nobody makes the scheduler's directory (or a link to one of root's), or the page in a
    directory anyone may write: vmgpu must not set policies or weights through it."""
    from vmgpu import sched

    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    target = world / "roots-dir"
    target.mkdir(mode=0o700)
    d = open_dir if plant == "open-dir" else open_dir / "vmgpu"
    make_page = (
        "import os, sys, struct\n"
        "d, uuid = sys.argv[1], sys.argv[2]\n"
        "os.makedirs(d, exist_ok=True)\n"
        "p = os.path.join(d, 'vmgpu-sched-' + uuid)\n"
        "fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o666)\n"
        "os.ftruncate(fd, 128 + 64 * 256)\n"
        "os.pwrite(fd, struct.pack('<QII', 0x3144454843534756, 1, 64), 0)\n"
    )
    if plant == "link-to-root-dir":
        assert as_nobody("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), str(d)).returncode == 0
        page = target / f"vmgpu-sched-{uuid}"
        page.write_bytes(bytes(128 + 64 * 256))  # root's, but reached through nobody's link
    else:
        r = as_nobody(make_page, str(d), uuid)
        assert r.returncode == 0, r.stderr
        page = d / f"vmgpu-sched-{uuid}"
    before = page.read_bytes()
    with pytest.raises(sched.SchedError, match="not touching this scheduler page"):
        sched.Page(sched.page_path(uuid, d))
    assert page.read_bytes() == before


@needs_root
def test_the_scheduler_directory_is_made_root_only(tmp_path, monkeypatch):
    from vmgpu import files

    d = files.private_dir(tmp_path / "sched")
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700 and os.lstat(d).st_uid == os.geteuid()


# ---- vmgpud's state directory, the forwarders' logs and statistics --------------------------


@needs_root
@pytest.mark.parametrize("plant", ["open-dir", "nobodys-dir"])
def test_vmgpud_refuses_a_state_directory_another_user_can_write(open_dir, tmp_path, secret, plant):
    """A state directory nobody can write in: nobody plants forwarders/GUEST.stats and .log as
    links to a root file, which vmgpud's forwarders would truncate and append to."""
    from vmgpu.daemon import serve

    inv = tmp_path / "inventory.toml"
    inv.write_text(INVENTORY)
    state = open_dir if plant == "open-dir" else open_dir / "state"
    plant_links = (
        "import os, sys\n"
        "state, secret = sys.argv[1], sys.argv[2]\n"
        "os.makedirs(os.path.join(state, 'forwarders'), exist_ok=True)\n"
        "os.chmod(os.path.join(state, 'forwarders'), 0o777)\n"
        "for ext in ('stats', 'log'):\n"
        "    os.symlink(secret, os.path.join(state, 'forwarders', 'c1.' + ext))\n"
    )
    r = as_nobody(plant_links, str(state), str(secret))
    assert r.returncode == 0, r.stderr
    try:
        server, ledger = serve(tmp_path / "run" / "vmgpud.sock", state / "ledger.db", inv)
    except VmgpuError as e:
        assert e.code == "UNSAFE_PATH" and str(state) in e.message and "writable by no one else" in e.message
    else:
        from vmgpu.client import Client

        try:  # a64d124: it serves, and the guest's forwarder writes through nobody's links
            c = Client(str(tmp_path / "run" / "vmgpud.sock"))
            c.admit("c1", "container", "gpu=0,mem=1G")
            region = Path(f"/dev/shm/vmgpu-test-{os.getpid()}-state")
            try:
                c.start_forwarder("c1", str(region), "sim", "16M")
            except VmgpuError:
                pass
            c.stop_forwarder("c1")
            c.close()
            region.unlink(missing_ok=True)
        finally:
            server.stop(grace=None).wait()
            server.supervisor.close()
            ledger.close()
    assert secret.read_bytes() == b"root's own bytes\n"


@needs_root
def test_a_forwarder_log_or_statistics_path_planted_as_a_link_is_refused(open_dir, secret, tmp_path):
    from vmgpu.forwarder import Forwarder

    for ext in ("log", "stats"):
        as_nobody("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(secret), str(open_dir / f"g.{ext}"))
    region = Path(f"/dev/shm/vmgpu-test-{os.getpid()}-links")
    fwd = Forwarder(
        region, backend="sim", size="16M", log_path=open_dir / "g.log", extra=("--stats", str(open_dir / "g.stats"))
    )
    try:
        with pytest.raises(VmgpuError, match="writable by no one else"):
            fwd.start()
    finally:
        fwd.stop()
        region.unlink(missing_ok=True)
    assert secret.read_bytes() == b"root's own bytes\n" and os.path.islink(open_dir / "g.log")


# ---- the OCI runtime ------------------------------------------------------------------------


def _config(mounts=(), user=None, **linux) -> dict:
    return {
        "process": {"env": ["PATH=/bin", "VMGPU=gpu=0,mem=1G"], "user": user or {"uid": 0, "gid": 0}},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *mounts],
        "linux": {"devices": [], **linux},
    }


IPC_HOST = {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "nosuid"]}
V_DEV_SHM = {"destination": "/host-shm", "type": "bind", "source": "/dev/shm/", "options": ["rbind", "rw"]}
V_SUBDIR = {"destination": "/x", "source": "/dev/shm/vmgpu", "options": ["bind", "ro"]}
V_DEV = {"destination": "/dev", "type": "bind", "source": "/dev", "options": ["rbind", "rw"]}
V_ROOT = {"destination": "/host", "type": "bind", "source": "/", "options": ["rbind", "rw"]}
V_DATA = {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind", "rw"]}


def test_the_runtime_turns_host_dev_shm_binds_into_a_private_tmpfs_and_keeps_its_region():
    from vmgpu import oci

    cfg = oci.rewrite(_config([IPC_HOST, V_DEV_SHM, V_SUBDIR, V_DATA]), Path("/dev/shm/vmgpu-ctr-1"), Path("/lib/x"))
    by_dest = {m["destination"]: m for m in cfg["mounts"]}
    for dest in ("/dev/shm", "/host-shm", "/x"):
        assert by_dest[dest]["type"] == "tmpfs" and by_dest[dest]["source"] != "/dev/shm", by_dest[dest]
    assert by_dest["/data"] == V_DATA and by_dest["/proc"]["type"] == "proc"
    region = by_dest[oci.REGION_IN_CONTAINER]
    assert region["source"] == "/dev/shm/vmgpu-ctr-1" and region["type"] == "bind" and "rw" in region["options"]
    host_views = [m for m in cfg["mounts"] if str(m.get("source", "")).startswith("/dev/shm")]
    assert host_views == [region]


@pytest.mark.parametrize("mount", [V_DEV, V_ROOT], ids=["-v /dev:/dev", "-v /:/host"])
def test_the_runtime_refuses_a_container_that_mounts_everything_above_dev_shm(mount):
    from vmgpu import oci

    with pytest.raises(InvalidArgument, match="other guests' GPU regions"):
        oci.rewrite(_config([mount]), Path("/dev/shm/vmgpu-ctr-1"), Path("/lib/x"))


class _FakeVmgpud:
    """vmgpud as the runtime sees it: start_forwarder serves the region the runtime made."""

    def __init__(self):
        self.calls = []

    def status(self):
        return type("S", (), {"slices": []})()

    def admit(self, guest, kind, spec):
        self.calls.append(("admit", guest))

    def start_forwarder(self, guest, region, backend, size, wait):
        self.calls.append(("start", guest))
        shm.Region.open(region).close()  # the lifecycle made it before asking for a forwarder
        return 1

    def release(self, guest):
        self.calls.append(("release", guest))
        return True

    def close(self):
        pass


def _create(tmp_path, monkeypatch, config: dict, cid: str):
    from vmgpu import oci

    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(config))
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir(exist_ok=True)
    rt = oci.Runtime({"shm_dir": str(shm_dir), "runc": "true", "libdir": str(tmp_path)})
    fake = _FakeVmgpud()
    monkeypatch.setattr(rt, "_client", lambda: fake)
    rc = rt.main(["--root", str(tmp_path / "runc-root"), "create", "--bundle", str(bundle), cid])
    return rc, json.loads((bundle / "config.json").read_text()), shm_dir, fake


@needs_root
def test_a_non_root_container_gets_its_region_and_nobody_else_does(tmp_path, monkeypatch):
    from vmgpu import files, oci

    rc, cfg, shm_dir, fake = _create(tmp_path, monkeypatch, _config([IPC_HOST], {"uid": 1000, "gid": 1001}), "c" * 64)
    assert rc == 0 and fake.calls == [("admit", "ctr-cccccccccccc"), ("start", "ctr-cccccccccccc")]
    region = shm_dir / oci.REGION_DIR / "vmgpu-ctr-cccccccccccc"
    fd = os.open(region, os.O_RDONLY)
    try:
        assert files.granted(fd) == {"users": [1000], "groups": [1001]}
        st_ = os.fstat(fd)
        assert st_.st_uid == 0 and stat.S_IMODE(st_.st_mode) == 0o660  # group bits: the ACL mask; others none
    finally:
        os.close(fd)
    assert {m["destination"]: m["type"] for m in cfg["mounts"]}["/dev/shm"] == "tmpfs"
    region.unlink()


@needs_root
def test_a_container_in_a_user_namespace_gets_its_region_as_the_host_sees_its_user(tmp_path, monkeypatch):
    from vmgpu import files, oci

    maps = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    config = _config([], {"uid": 1000, "gid": 1000}, uidMappings=maps, gidMappings=maps)
    rc, _, shm_dir, _ = _create(tmp_path, monkeypatch, config, "d" * 64)
    region = shm_dir / oci.REGION_DIR / "vmgpu-ctr-dddddddddddd"
    fd = os.open(region, os.O_RDONLY)
    try:
        assert rc == 0 and files.granted(fd) == {"users": [101000], "groups": [101000]}
    finally:
        os.close(fd)
    region.unlink()


def test_the_runtime_refuses_a_container_id_that_is_not_path_safe(tmp_path, monkeypatch, capsys):
    rc, cfg, shm_dir, fake = _create(tmp_path, monkeypatch, _config(), "../../etc/x")
    assert rc == 1 and fake.calls == [] and list(shm_dir.iterdir()) == []
    assert "container guest name" in capsys.readouterr().err


def test_a_forwarder_counts_as_started_only_at_its_own_start_line():
    # Forwarder.start waits for the line the forwarder writes once it serves: `serving REGION (`
    # after its timestamp and name; the word alone is not it (a line of an earlier forwarder's
    # workers, another region's start, a region whose path says it, a line that only quotes it)
    from vmgpu.forwarder import Forwarder

    f = Forwarder(Path("/dev/shm/vmgpu-serving.x"), backend="sim", guest="g1")  # (a '.' matches only itself)
    when = "2026-12-06T20:32:39.751Z"
    start = "serving /dev/shm/vmgpu-serving.x (256 MiB, 16 channels) on 1 GPU(s): sim, quota 16384 MiB; driver 13000"
    assert f._started(f"{when} vmgpu-forwarder[g1] SIMULATED (no GPU): {start}\n")
    assert f._started(f"{when} vmgpu-forwarder[g1] a line before\n{when} vmgpu-forwarder[g1] {start}\n")
    assert f._started(f"{when} vmgpu-forwarder[vm-7] {start}\n")  # (a --guest in its extra flags names it)
    for text in (
        f"{when} vmgpu-forwarder[g1] an earlier forwarder ended with 1 worker(s) serving; removed 0 file(s)\n",
        f"{when} vmgpu-forwarder[g1] serving /dev/shm/vmgpu-serving.xy (256 MiB, 16 channels)\n",
        f"{when} vmgpu-forwarder[g1] cannot open /dev/shm/vmgpu-serving.x: {start}\n",
        f"{when} vmgpu-forwarder[g1] {start.replace('serving', 'not serving', 1)}\n",
        f"{when} vmgpu-forwarder[g1] error: --stats /x] {start}\n",  # (the name ends at its first ])
        f"{when} vmgpu-forwarder[g1] {start.replace('vmgpu-serving.x', 'vmgpu-servingAx')}\n",
        "",
    ):
        assert not f._started(text), text


def test_a_forwarder_on_a_region_whose_path_is_near_the_longest_linux_takes_starts(tmp_path):
    # the start line carries the region's whole path (up to PATH_MAX, 4,096 bytes); a line cut at
    # a kilobyte would leave Forwarder.start waiting for a line it never sees, then failing
    from vmgpu.forwarder import Forwarder

    deep = tmp_path
    while len(str(deep)) < 3600:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True, mode=0o700)
    region = deep / "vmgpu-long"
    fwd = Forwarder(region, backend="sim", size="128M", log_path=tmp_path / "g.log")
    try:
        fwd.start()
        assert fwd.proc.poll() is None and f"serving {region} (" in fwd.log()
    finally:
        fwd.stop()
