"""A domain's vmgpu part (share in <metadata>, ivshmem <shmem> device), edited in place:
golden input/output, nothing else touched, consistency errors that say how to fix them."""

from pathlib import Path

import pytest
from lxml import etree

from vmgpu.errors import InvalidArgument
from vmgpu.spec import parse
from vmgpu.virt import domain

DATA = Path(__file__).parent / "data"
IN = (DATA / "domain-in.xml").read_text()
SHARE = parse("gpu=0,mem=8G,compute=50;gpu=1,mem=25%")


def c14n(xml: str) -> bytes:
    parser = etree.XMLParser(remove_blank_text=True)
    return etree.tostring(etree.fromstring(xml.encode(), parser), method="c14n")


def test_attach_matches_the_golden_output():
    assert domain.attach(IN, SHARE) + "\n" == (DATA / "domain-attach-out.xml").read_text()


def test_attach_keeps_everything_else_and_detach_restores_it():
    out = domain.attach(IN, SHARE)
    assert "owned by another tool" in out and "keep me" in out and "qemu:commandline" in out
    assert c14n(domain.detach(out)) == c14n(IN)


def test_attach_twice_replaces():
    out = domain.attach(domain.attach(IN, SHARE), parse("gpu=2,mem=1G"))
    assert out.count("vmgpu:share") == 2  # one element: open and close tags
    assert out.count("<shmem") == 1
    assert domain.read(out)[0] == parse("gpu=2,mem=1G")


def test_read_and_check_a_consistent_domain():
    out = domain.attach(IN, SHARE)
    share, dev = domain.read(out)
    assert share == SHARE
    assert dev == {"name": "vmgpu-web1", "model": "ivshmem-plain", "size_mib": domain.region_size_mib()}
    assert domain.check(out) == SHARE
    assert domain.check(IN) is None


def test_region_size_is_a_power_of_two_holding_the_heap():
    for heap in (64, 256, 1000):
        mib = domain.region_size_mib(heap)
        assert mib & (mib - 1) == 0 and mib > heap


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda x: x.replace('<size unit="M">512</size>', '<size unit="M">64</size>'),
            "is 64 MiB; it must be a power of two of at least 128 MiB; set <size unit='M'>512</size>",
        ),
        (
            lambda x: x.replace('<size unit="M">512</size>', '<size unit="M">384</size>'),
            "is 384 MiB; it must be a power of two",
        ),
        (lambda x: x.replace("ivshmem-plain", "ivshmem-doorbell"), "must be ivshmem-plain"),
        (
            lambda x: x[: x.index("<shmem")] + x[x.index("</shmem>") + len("</shmem>") :],
            "has a vmgpu share but no <shmem name='vmgpu-web1'> device",
        ),
    ],
)
def test_inconsistent_xml_is_refused_with_the_fix(edit, message):
    bad = edit(domain.attach(IN, SHARE))
    with pytest.raises(InvalidArgument) as e:
        domain.check(bad)
    assert message in e.value.message and "web1" in e.value.message


def test_a_smaller_or_larger_power_of_two_is_accepted():
    for mib in (128, 1024):
        xml = domain.attach(IN, SHARE).replace('<size unit="M">512</size>', f'<size unit="M">{mib}</size>')
        assert domain.check(xml) == SHARE
    assert domain.region_size_mib(domain.MIN_HEAP_MIB) == 128


def test_a_device_without_a_share_is_refused():
    out = domain.attach(IN, SHARE)
    start = out.index("<vmgpu:share")
    bad = out[:start] + out[out.index("</vmgpu:share>") + len("</vmgpu:share>") :]
    with pytest.raises(InvalidArgument, match="has a vmgpu region device but no vmgpu share"):
        domain.check(bad)
