"""A libvirt domain's vmgpu part, edited in place: the share spec in <metadata> and the
ivshmem-plain <shmem> device that carries the region.  Everything else in the document is
left as it is (other tools own it).  libvirt-python reads and defines the domain; this
module only edits its XML.

Region size rule: the smallest power of two in MiB (ivshmem needs one) that holds the
region's control structures (16 channels, 4 MiB of bulk each) and a heap of pinned host
memory for the guest (256 MiB unless given: 512 MiB in all).  A hand-written size is
accepted if it is a power of two that holds the control structures and at least
MIN_HEAP_MIB of heap (128 MiB); whatever is left over becomes heap.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from lxml import etree

from vmgpu import shm, spec
from vmgpu.config import UNIT_BYTES
from vmgpu.errors import InvalidArgument

NS = spec.XML_NS
PREFIX = "vmgpu"
DEFAULT_HEAP_MIB = 256
MIN_HEAP_MIB = 16


def region_name(domain: str) -> str:
    return f"vmgpu-{domain}"


def region_size_mib(heap_mib: int = DEFAULT_HEAP_MIB, params: shm.Params | None = None) -> int:
    need = (params or shm.Params()).min_size(heap_mib << 20)
    mib = 1
    while (mib << 20) < need:
        mib <<= 1
    return mib


def _parse(xml: str) -> etree._Element:
    try:
        return etree.fromstring(xml.encode(), etree.XMLParser(remove_blank_text=False))
    except etree.XMLSyntaxError as e:
        raise InvalidArgument(f"domain XML: {e}") from None


def _shmem(root, name: str):
    """The <shmem> device named name (compared as a value: a name never becomes XPath)."""
    return next((sh for sh in root.iterfind("./devices/shmem") if sh.get("name") == name), None)


def attach(xml: str, share: spec.ShareSpec, heap_mib: int = DEFAULT_HEAP_MIB) -> str:
    """The domain with vmgpu's share and region device (replacing any earlier ones)."""
    root = _parse(xml)
    name = root.findtext("name")
    if not name:
        raise InvalidArgument("domain XML has no <name>")
    _remove(root, name)
    meta = root.find("metadata")
    if meta is None:
        meta = etree.SubElement(root, "metadata")
    # the one XML form of a share (vmgpu/spec.py), with vmgpu's prefix
    el = etree.fromstring(ET.tostring(share.to_xml()))
    clean = etree.Element(f"{{{NS}}}share", nsmap={PREFIX: NS})
    for child in el:  # the slices, and the guest's <settings> if it has any
        etree.SubElement(clean, child.tag, dict(child.attrib))
    meta.append(clean)
    devices = root.find("devices")
    if devices is None:
        devices = etree.SubElement(root, "devices")
    sh = etree.SubElement(devices, "shmem", name=region_name(name))
    etree.SubElement(sh, "model", type="ivshmem-plain")
    size = etree.SubElement(sh, "size", unit="M")
    size.text = str(region_size_mib(heap_mib))
    return etree.tostring(root, encoding="unicode")


def _remove(root, name: str) -> bool:
    found = False
    meta = root.find("metadata")
    if meta is not None:
        for el in meta.findall(f"{{{NS}}}share"):
            meta.remove(el)
            found = True
    sh = _shmem(root, region_name(name))
    if sh is not None:
        sh.getparent().remove(sh)
        found = True
    return found


def detach(xml: str) -> str:
    """The domain without vmgpu's share and region device."""
    root = _parse(xml)
    _remove(root, root.findtext("name") or "")
    return etree.tostring(root, encoding="unicode")


def read(xml: str):
    """(share spec or None, region device {name, model, size_mib} or None)."""
    root = _parse(xml)
    el = root.find(f"./metadata/{{{NS}}}share")
    share = spec.from_xml(_plain(el)) if el is not None else None
    sh = _shmem(root, region_name(root.findtext("name") or ""))
    dev = None
    if sh is not None:
        size = sh.find("size")
        unit = (size.get("unit") or "M").upper()[:1] if size is not None else "M"
        try:
            value = int(size.text) if size is not None else 0
        except ValueError:
            value = 0
        mib = _mib(value, unit)
        model = sh.find("model")
        dev = {"name": sh.get("name"), "model": model.get("type") if model is not None else "", "size_mib": mib}
    return share, dev


def _mib(value: int, unit: str) -> float:
    """<size unit=UNIT>VALUE</size> in MiB (units below MiB give a fraction; an unknown one 0)."""
    per = UNIT_BYTES[unit] if unit and unit in "BKMG" else 0
    if not per:
        return 0
    return value * per / UNIT_BYTES["M"] if per < UNIT_BYTES["M"] else value * (per // UNIT_BYTES["M"])


def _plain(el):
    """The lxml element as a standard-library element, for the one share parser."""
    return ET.fromstring(etree.tostring(el))


def size_ok(size_mib: float) -> bool:
    """Is this a region size the rule accepts (a power of two holding the minimum heap)?"""
    mib = int(size_mib)
    return mib == size_mib and mib >= region_size_mib(MIN_HEAP_MIB) and mib & (mib - 1) == 0


def check(xml: str) -> spec.ShareSpec | None:
    """The domain's share if its vmgpu part is consistent; an error that says how to fix it if
    not; None if the domain has no vmgpu part."""
    share, dev = read(xml)
    name = _parse(xml).findtext("name") or "?"
    if share is None and dev is None:
        return None
    fix = f"run `vmgpu vm attach {name} ...` again, or correct the XML and `virsh define` it"
    if share is None:
        raise InvalidArgument(f"domain {name} has a vmgpu region device but no vmgpu share in <metadata>; {fix}")
    if dev is None:
        raise InvalidArgument(
            f"domain {name} has a vmgpu share but no <shmem name='{region_name(name)}'> device; {fix}"
        )
    if dev["model"] != "ivshmem-plain":
        raise InvalidArgument(f"domain {name}: the vmgpu region device must be ivshmem-plain, not '{dev['model']}'")
    if not size_ok(dev["size_mib"]):
        want = region_size_mib()
        raise InvalidArgument(
            f"domain {name}: the vmgpu region device is {dev['size_mib']:g} MiB; it must be a power of two of "
            f"at least {region_size_mib(MIN_HEAP_MIB)} MiB; set <size unit='M'>{want}</size> in "
            f"<shmem name='{region_name(name)}'> (the default)"
        )
    return share
