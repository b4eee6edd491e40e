"""`vmgpu vm`: give a libvirt domain a GPU share, take it away, show it.  libvirt-python
reads the persistent (inactive) definition and defines the edited one; vmgpu/virt/domain.py
does the editing, so a domain written by hand and `virsh define`d is read the same way.

A running domain keeps what it was started with; an edit takes effect at its next start.
"""

from __future__ import annotations

from vmgpu import spec
from vmgpu.errors import InvalidArgument, LibvirtError, NotFound
from vmgpu.virt import domain

DEFAULT_URI = "qemu:///system"


def _libvirt():
    try:
        import libvirt
    except ImportError:
        raise LibvirtError(
            "libvirt-python is not installed; install vmgpu with its libvirt extra: pip install 'vmgpu[libvirt]'"
        ) from None
    return libvirt


class Domains:
    """One libvirt connection."""

    def __init__(self, uri: str = DEFAULT_URI):
        lv = _libvirt()
        self.lv = lv
        lv.registerErrorHandler(lambda *_: None, None)  # errors come back as exceptions, not stderr noise
        try:
            self.conn = lv.open(uri)
        except lv.libvirtError as e:
            raise LibvirtError(f"cannot connect to libvirt at {uri}: {e.get_error_message()}") from None
        self.uri = uri

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _lookup(self, name: str):
        try:
            return self.conn.lookupByName(name)
        except self.lv.libvirtError:
            raise NotFound(f"no domain '{name}' at {self.uri}") from None

    def _inactive_xml(self, dom) -> str:
        return dom.XMLDesc(self.lv.VIR_DOMAIN_XML_INACTIVE | self.lv.VIR_DOMAIN_XML_SECURE)

    def _define(self, xml: str) -> None:
        try:
            self.conn.defineXML(xml)
        except self.lv.libvirtError as e:
            raise LibvirtError(f"libvirt refused the edited definition: {e.get_error_message()}") from None

    def attach(self, name: str, share: spec.ShareSpec, heap_mib: int = domain.DEFAULT_HEAP_MIB) -> dict:
        """Give the domain this share (replacing an earlier one) and its region device."""
        if heap_mib < domain.MIN_HEAP_MIB:
            raise InvalidArgument(f"--heap: {heap_mib} MiB is less than the minimum of {domain.MIN_HEAP_MIB} MiB")
        dom = self._lookup(name)
        self._define(domain.attach(self._inactive_xml(dom), share, heap_mib))
        return self.show(name)

    def detach(self, name: str) -> bool:
        """Remove the share and the region device; False if the domain had neither."""
        dom = self._lookup(name)
        xml = self._inactive_xml(dom)
        share, dev = domain.read(xml)
        if share is None and dev is None:
            return False
        self._define(domain.detach(xml))
        return True

    def show(self, name: str) -> dict:
        """The domain's vmgpu part as defined, and whether it is consistent."""
        dom = self._lookup(name)
        xml = self._inactive_xml(dom)
        share, dev = domain.read(xml)
        problem = None
        try:
            domain.check(xml)
        except InvalidArgument as e:
            problem = e.message
        return {
            "domain": name,
            "running": bool(dom.isActive()),
            "share": share.to_text() if share else None,
            "slices": [
                {
                    "gpu": s.gpu,
                    "mem": f"{s.mem_mib} MiB" if s.mem_mib is not None else f"{(s.mem_fraction or 0) * 100:g}%",
                    **s.share_fields(),
                }
                for s in (share.slices if share else ())
            ],
            # the guest's own forwarder settings; what is not here is the host's
            "settings": share.settings.fields() if share else {},
            "region": dev,
            "problem": problem,
        }
