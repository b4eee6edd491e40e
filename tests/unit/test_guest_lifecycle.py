"""The one guest lifecycle the libvirt hook and the OCI runtime share (vmgpu/guest_lifecycle.py),
against a fake vmgpud: prepare admits, makes the region with the daemon's geometry and starts the
forwarder on it as it is; a failure after the admission releases the guest and removes its
region; a stale reservation is replaced only when asked."""

from __future__ import annotations

import os
import stat

import pytest

from vmgpu import config, files, shm
from vmgpu.errors import Conflict, ForwarderError, RegionError
from vmgpu.guest_lifecycle import Guest, Lifecycle

SMALL = shm.Params(nchannels=2, bulk_size=1 << 20)
SIZE = 8 << 20


class _Vmgpud:
    def __init__(self, fail_start=False, held=None):
        self.calls, self.fail_start, self.held = [], fail_start, held
        self.forwarders = []

    def admit(self, guest, kind, spec):
        self.calls.append(("admit", guest, kind, spec))
        if self.held is not None and self.held != spec:
            raise Conflict(f"guest {guest} holds {self.held}")
        self.held = spec

    def release(self, guest):
        self.calls.append(("release", guest))
        self.held = None
        return True

    def start_forwarder(self, guest, region, backend, size, wait):
        self.calls.append(("start", guest, backend, size, wait))
        if self.fail_start:
            raise ForwarderError("the forwarder exited at once")
        shm.Region.open(region).close()  # it serves the region the lifecycle made
        return 4321

    def stop_forwarder(self, guest):
        self.calls.append(("stop", guest))
        return True

    def status(self):
        fwd = [type("F", (), {"guest": g, "pid": 7})() for g in self.forwarders]
        return type("S", (), {"forwarders": fwd})()


def _guest(tmp_path, wait="futex"):
    return Guest("g1", "container", tmp_path / "vmgpu-g1", backend="sim", wait=wait)


def test_prepare_admits_makes_the_region_with_the_daemons_geometry_and_serves_it_as_it_is(tmp_path):
    d = _Vmgpud()
    g = _guest(tmp_path, wait="poll")
    assert Lifecycle(d, g).prepare("gpu=0,mem=1G", 128 << 20) == 4321
    assert d.calls == [("admit", "g1", "container", "gpu=0,mem=1G"), ("start", "g1", "sim", "", "poll")]
    r = shm.Region.open(g.region)
    try:
        assert r.check() == config.region_params("poll") and r.size == 128 << 20 and r.header()["name"] == "g1"
    finally:
        r.close()
    st = os.stat(g.region)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


def test_a_forwarder_that_does_not_start_rolls_the_admission_and_the_region_back(tmp_path):
    d = _Vmgpud(fail_start=True)
    g = _guest(tmp_path)
    with pytest.raises(ForwarderError):
        Lifecycle(d, g).prepare("gpu=0,mem=1G", SIZE, params=SMALL)
    assert d.calls[-1] == ("release", "g1") and d.held is None and not g.region.exists()


def test_a_failure_after_the_forwarder_started_rolls_everything_back(tmp_path):
    d = _Vmgpud()
    g = _guest(tmp_path)

    def then():
        raise RegionError("the container's config cannot be written")

    with pytest.raises(RegionError):
        Lifecycle(d, g).prepare("gpu=0,mem=1G", SIZE, params=SMALL, then=then)
    assert [c[0] for c in d.calls] == ["admit", "start", "release"] and not g.region.exists()


def test_a_region_that_cannot_be_made_releases_the_admission(tmp_path):
    d = _Vmgpud()
    g = Guest("g1", "vm", tmp_path / "missing-dir" / "vmgpu-g1")
    with pytest.raises(RegionError):
        Lifecycle(d, g).prepare("gpu=0,mem=1G", SIZE, params=SMALL)
    assert [c[0] for c in d.calls] == ["admit", "release"]


def test_a_planted_link_at_the_regions_path_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "target"
    target.write_text("not yours")
    g = _guest(tmp_path)
    g.region.symlink_to(target)
    Lifecycle(_Vmgpud(), g).prepare("gpu=0,mem=1G", SIZE, params=SMALL, start=False)
    assert target.read_text() == "not yours" and not g.region.is_symlink()
    g.region.unlink()


def test_a_stale_reservation_is_replaced_only_when_the_caller_says_it_is_stale(tmp_path):
    g = _guest(tmp_path)
    with pytest.raises(Conflict):
        Lifecycle(_Vmgpud(held="gpu=1,mem=1G"), g).prepare("gpu=0,mem=1G", SIZE, params=SMALL)
    assert not g.region.exists()
    d = _Vmgpud(held="gpu=1,mem=1G")
    Lifecycle(d, g).prepare("gpu=0,mem=1G", SIZE, params=SMALL, start=False, replace_stale=True)
    assert [c[0] for c in d.calls] == ["admit", "release", "admit"] and d.held == "gpu=0,mem=1G"
    Lifecycle(d, g).release()
    assert not g.region.exists() and d.held is None


def test_the_owner_gets_the_region_by_acl_entries_and_nobody_else(tmp_path):
    g = _guest(tmp_path)
    Lifecycle(_Vmgpud(), g).prepare("gpu=0,mem=1G", SIZE, (1000, 1001), params=SMALL)
    fd = os.open(g.region, os.O_RDONLY)
    try:
        assert files.granted(fd) == {"users": [1000], "groups": [1001]}
    finally:
        os.close(fd)
    g.region.unlink()


def test_a_forwarder_is_started_again_only_where_none_is_recorded(tmp_path):
    d = _Vmgpud()
    lc = Lifecycle(d, _guest(tmp_path))
    d.forwarders = ["g1"]
    assert lc.ensure_forwarder() is None and d.calls == []
    d.forwarders = ["other"]
    shm.Region.create(lc.guest.region, SIZE, SMALL, "g1").close()
    assert lc.ensure_forwarder() == 4321
    assert lc.stop_forwarder() is True and d.calls[-1] == ("stop", "g1")
    lc.release()


def test_release_removes_the_region_it_made_but_never_a_link_planted_in_its_place(tmp_path):
    g = _guest(tmp_path)
    lc = Lifecycle(_Vmgpud(), g)
    lc.prepare("gpu=0,mem=1G", SIZE, params=SMALL, start=False)
    assert g.region.exists()
    assert lc.release() and not g.region.exists()
    target = tmp_path / "target"
    target.write_text("not yours")
    g.region.symlink_to(target)
    assert lc.release()  # released all the same; the link and its target are left alone
    assert g.region.is_symlink() and target.read_text() == "not yours"


class _LabelledVmgpud(_Vmgpud):
    def admit(self, guest, kind, spec, label):
        self.labels.append(label)
        super().admit(guest, kind, spec)


def test_a_guests_label_goes_with_every_admission_the_stale_ones_replacement_too(tmp_path):
    g = Guest("ctr-0123456789ab", "container", tmp_path / "vmgpu-c", backend="sim", label="web-1")
    d = _LabelledVmgpud(held="gpu=1,mem=1G")
    d.labels = []
    Lifecycle(d, g).prepare("gpu=0,mem=1G", SIZE, params=SMALL, start=False, replace_stale=True)
    assert [c[0] for c in d.calls] == ["admit", "release", "admit"] and d.labels == ["web-1", "web-1"]
    Lifecycle(d, g).release()
