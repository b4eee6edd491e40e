"""`vmgpu vm` against libvirt's test driver (no daemon): the persistent definition gains the
share and the region device, keeps everything else, and loses them again on detach."""

import pytest

from vmgpu import spec
from vmgpu.errors import InvalidArgument, NotFound
from vmgpu.virt import domain
from vmgpu.virt.libvirt_domains import Domains

# the libvirt extra; where libvirt-dev is missing `make venv` leaves it out (CI insists: LIBVIRT=yes)
pytest.importorskip("libvirt", reason="libvirt-python is not installed (the libvirt extra: make venv LIBVIRT=yes)")

XML = """<domain type='test'><name>web1</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>
<description>keep me</description><os><type>hvm</type></os>
<devices><disk type='file' device='disk'><source file='/var/lib/web1.img'/><target dev='vda'/></disk></devices>
</domain>"""


@pytest.fixture
def doms():
    d = Domains("test:///default")  # the test driver's state lives as long as this connection
    d.conn.defineXML(XML)
    yield d
    d.close()


def test_attach_show_detach(doms):
    out = doms.attach("web1", spec.parse("gpu=0,mem=8G,compute=50;gpu=1,mem=25%,compute=10"), heap_mib=16)
    assert out["share"] == "gpu=0,mem=8192M,weight=50;gpu=1,mem=25%,weight=10"
    assert [(s["gpu"], s["mem"], s["weight"]) for s in out["slices"]] == [("0", "8192 MiB", "50"), ("1", "25%", "10")]
    assert out["region"] == {"name": "vmgpu-web1", "model": "ivshmem-plain", "size_mib": domain.region_size_mib(16)}
    assert out["problem"] is None and out["running"] is False
    xml = doms.conn.lookupByName("web1").XMLDesc(0)
    assert "keep me" in xml and "/var/lib/web1.img" in xml
    assert doms.show("web1")["share"] == out["share"]
    assert doms.detach("web1") is True
    after = doms.show("web1")
    assert after["share"] is None and after["region"] is None and after["problem"] is None
    assert "/var/lib/web1.img" in doms.conn.lookupByName("web1").XMLDesc(0)
    assert doms.detach("web1") is False


def test_show_reports_a_hand_broken_definition(doms):
    doms.attach("web1", spec.parse("gpu=0,mem=1G"))
    xml = doms.conn.lookupByName("web1").XMLDesc(0).replace("<size unit='M'>512</size>", "<size unit='M'>300</size>")
    doms.conn.defineXML(xml)
    assert "must be a power of two" in doms.show("web1")["problem"]


def test_unknown_domain_and_bad_heap(doms):
    with pytest.raises(NotFound, match="no domain 'nope'"):
        doms.show("nope")
    with pytest.raises(InvalidArgument, match="--heap"):
        doms.attach("web1", spec.parse("gpu=0,mem=1G"), heap_mib=1)
