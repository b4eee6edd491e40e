"""Review of issue 14's host file system and container boundary: a local user who shares a
group with a guest's process (a container's --user 1000:100, "users"; QEMU's group, kvm) must not
reach that guest's region by its path, and a container's create must not release a guest of
another kind that happens to be named like a container."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.unit.test_host_files import NOBODY, SIZE, SMALL, _config, _FakeVmgpud, needs_root, open_dir, run_as, world
from vmgpu import files, shm

__all__ = ["open_dir", "world"]  # fixtures used here

PROBE = "import os, sys; os.close(os.open(sys.argv[1], os.O_RDWR)); print('ok')"
USERS = 100  # the group every local user is in on most distributions ("users")


def _runtime_create(shm_dir: Path, tmp_path: Path, monkeypatch, config: dict, cid: str, fake=None):
    """The runtime's create against a fake vmgpud, its regions under shm_dir; (rc, config, fake)."""
    from vmgpu import oci

    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(config))
    rt = oci.Runtime({"shm_dir": str(shm_dir), "runc": "true", "libdir": str(tmp_path)})
    fake = fake or _FakeVmgpud()
    monkeypatch.setattr(rt, "_client", lambda: fake)
    rc = rt.main(["--root", str(tmp_path / "runc-root"), "create", "--bundle", str(bundle), cid])
    return rc, json.loads((bundle / "config.json").read_text()), fake


def _region_source(config: dict) -> Path:
    from vmgpu import oci

    return Path(next(m["source"] for m in config["mounts"] if m["destination"] == oci.REGION_IN_CONTAINER))


@needs_root
def test_a_local_user_in_a_containers_group_cannot_open_the_containers_region(open_dir, tmp_path, monkeypatch):
    """`docker run --user 1000:100`: the region's ACL names gid 100, which on the host is a
    group of local users; one of them (uid 2000) must not read or write the container's region
    (its data, its calls) by the path in /dev/shm.  The container reaches it by its bind mount."""
    config = _config([], {"uid": 1000, "gid": USERS})
    rc, cfg, _ = _runtime_create(open_dir, tmp_path, monkeypatch, config, "e" * 64)
    region = _region_source(cfg)
    try:
        assert rc == 0 and region.exists()
        fd = os.open(region, os.O_RDONLY)
        try:  # the container's user and group still have it (through the mount)
            assert files.granted(fd) == {"users": [1000], "groups": [USERS]}
        finally:
            os.close(fd)
        local = run_as(2000, USERS, PROBE, str(region))
        assert local.returncode != 0 and "Permission denied" in local.stderr, local.stdout
        assert run_as(NOBODY, NOBODY, PROBE, str(region)).returncode != 0
    finally:
        region.unlink(missing_ok=True)


@needs_root
def test_a_local_user_in_qemus_group_cannot_open_a_vms_region(open_dir, monkeypatch):
    """QEMU runs as its user (libvirt-qemu, whose group is kvm on Debian and Ubuntu, a group that
    local users are put in for /dev/kvm): the hook must give the region to QEMU's user, not to
    everyone in its group."""
    from vmgpu.logging import get_logger
    from vmgpu.spec import parse
    from vmgpu.virt import hook

    monkeypatch.setattr(hook, "_client", lambda settings: _FakeVmgpud())
    monkeypatch.setattr(hook, "region_params", lambda: SMALL)
    dev = {"name": "vmgpu-vm1", "model": "ivshmem-plain", "size_mib": SIZE >> 20}
    settings = {**hook.DEFAULTS, "shm_dir": str(open_dir), "qemu_user": f"+1000:+{USERS}"}
    hook._prepare("vm1", parse("gpu=0,mem=1G"), dev, settings, get_logger(hook="prepare"))
    region = open_dir / "vmgpu-vm1"
    try:
        assert run_as(1000, 1000, PROBE, str(region)).stdout == "ok\n"  # QEMU's user
        local = run_as(2000, USERS, PROBE, str(region))
        assert local.returncode != 0 and "Permission denied" in local.stderr, local.stdout
    finally:
        region.unlink(missing_ok=True)


class _VmNamedLikeAContainer(_FakeVmgpud):
    """vmgpud holding a VM (or a `vmgpu admit` process guest) whose name starts with ctr-."""

    def status(self):
        vm = type("Slice", (), {"guest": "ctr-0123456789ab", "kind": "vm"})()
        return type("S", (), {"slices": [vm]})()


def test_a_containers_create_never_releases_a_vm_whose_name_starts_with_ctr(tmp_path, monkeypatch):
    """The runtime releases the shares of containers runc no longer knows; a VM named
    ctr-0123456789ab is no container of runc's, and must keep its share and its region."""
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    (tmp_path / "runc-root").mkdir()  # runc's state: no container in it
    vm_region = shm_dir / "vmgpu-ctr-0123456789ab"
    shm.Region.create(vm_region, SIZE, SMALL, "ctr-0123456789ab").close()
    fake = _VmNamedLikeAContainer()
    rc, cfg, _ = _runtime_create(shm_dir, tmp_path, monkeypatch, _config(), "f" * 64, fake)
    try:
        assert rc == 0
        assert ("release", "ctr-0123456789ab") not in fake.calls, fake.calls
        assert vm_region.exists()
    finally:
        vm_region.unlink(missing_ok=True)
        _region_source(cfg).unlink(missing_ok=True)


class _SharedVmgpud(_FakeVmgpud):
    """One vmgpud for two runtimes: what was admitted shows in its status, as a container's."""

    def __init__(self):
        super().__init__()
        self.guests: set[str] = set()

    def status(self):
        kind = type("Slice", (), {"kind": "container"})
        return type("S", (), {"slices": [type("Slice", (kind,), {"guest": g})() for g in sorted(self.guests)]})()

    def admit(self, guest, kind, spec):
        super().admit(guest, kind, spec)
        self.guests.add(guest)

    def release(self, guest):
        self.guests.discard(guest)
        return super().release(guest)


def test_two_containers_created_at_once_do_not_release_each_other(tmp_path, monkeypatch):
    """A create's look for stale shares must not take a container that another create has
    admitted, but that runc has not made yet, for a stale one (docker compose starts many at
    once): creates run one at a time until runc has made the container."""
    import threading
    import time

    from vmgpu import oci

    shm_dir, root = tmp_path / "shm", tmp_path / "runc-root"
    shm_dir.mkdir()
    root.mkdir()
    slow_runc = tmp_path / "runc"  # makes the container's state after a while, as runc does
    slow_runc.write_text(f'#!/bin/sh\nsleep 1\nfor a; do id="$a"; done\nmkdir -p {root}/"$id"\n')
    slow_runc.chmod(0o755)
    fake = _SharedVmgpud()
    rcs = {}

    def create(cid: str):
        bundle = tmp_path / f"bundle-{cid[:4]}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(_config()))
        rt = oci.Runtime({"shm_dir": str(shm_dir), "runc": str(slow_runc), "libdir": str(tmp_path)})
        rt._client = lambda: fake
        rcs[cid] = rt.main(["--root", str(root), "create", "--bundle", str(bundle), cid])

    a, b = "a" * 64, "b" * 64
    ta = threading.Thread(target=create, args=(a,))
    ta.start()
    time.sleep(0.3)  # a is admitted; runc is still making it
    create(b)
    ta.join()
    try:
        assert rcs == {a: 0, b: 0}
        assert ("release", oci.guest_name(a)) not in fake.calls, fake.calls
        assert fake.guests == {oci.guest_name(a), oci.guest_name(b)}
    finally:
        for cid in (a, b):
            (shm_dir / oci.REGION_DIR / f"vmgpu-{oci.guest_name(cid)}").unlink(missing_ok=True)


def test_odd_ids_in_a_containers_spec_are_one_clear_error():
    """uids and gids the kernel would not take, or that are not JSON integers, end the create
    in one InvalidArgument, never a traceback."""
    import pytest

    from vmgpu import oci
    from vmgpu.errors import InvalidArgument

    for user in ({"uid": -1}, {"uid": 1 << 32}, {"gid": "0x10"}, {"uid": 1.5}, {"uid": True}, {"gid": (1 << 32) - 1}):
        with pytest.raises(InvalidArgument, match="is not an id"):
            oci.region_owner({"process": {"user": user}})
    wrap = {"containerID": 0, "hostID": (1 << 32) - 10, "size": 100}
    with pytest.raises(InvalidArgument, match="is not an id"):
        oci.region_owner({"process": {"user": {"uid": 50}}, "linux": {"uidMappings": [wrap]}})
    assert oci.region_owner({"process": {"user": {"uid": 1000, "gid": 100}}}) == (1000, 100)
    mapped = {"containerID": 0, "hostID": 100000, "size": 65536}
    assert oci.region_owner({"process": {"user": {"uid": 1000}}, "linux": {"uidMappings": [mapped]}}) == (101000, 0)
