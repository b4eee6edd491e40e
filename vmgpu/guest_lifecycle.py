"""A guest's life as the libvirt hook (vmgpu/virt/hook.py) and the OCI runtime (vmgpu/oci.py)
both drive it, through vmgpud: prepare (admit the share, make the region with the daemon's
geometry, start the forwarder; any failure after the admission rolls all of it back), start the
forwarder later (a VM's starts when QEMU has started), make sure it runs (libvirtd restarted),
stop it, release the guest (its share and its region).

A region is always made here, by the caller (root), with config.region_params(wait): the
geometry vmgpud's forwarders are told, the transport's default.  vmgpud's forwarder then serves
it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmgpu import config, files, shm
from vmgpu.errors import Conflict, UnsafePath, VmgpuError
from vmgpu.logging import get_logger


@dataclass
class Guest:
    """One guest as the lifecycle sees it: its name (vmgpu/names.py's rule), its kind, its
    region file and the forwarder's backend; wait: how the guest waits (poll: a VM, another
    kernel; futex: a container on this kernel)."""

    name: str
    kind: str
    region: Path
    backend: str = "cuda"
    wait: str = "futex"
    label: str = ""  # what the operator knows it by (a container's docker name); untrusted text


class Lifecycle:
    """guest's lifecycle through client (a vmgpu.client.Client, or a fake of one); as a context
    manager, it closes the client at the end."""

    def __init__(self, client, guest: Guest, log=None):
        self.client = client
        self.guest = guest
        self.log = log or get_logger(guest=guest.name)

    def __enter__(self) -> Lifecycle:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def prepare(
        self,
        spec: str,
        size: int,
        owner: tuple[int | None, int | None] = (None, None),
        params: shm.Params | None = None,
        start: bool = True,
        replace_stale: bool = False,
        then=None,
    ) -> int | None:
        """Admit spec, make the region (size bytes, params: default region_params(wait); owner:
        the uid and gid given read and write access besides root), start the forwarder (unless
        not start) and call then(); a VmgpuError after the admission releases the guest and
        removes its region.  replace_stale: a reservation the guest already holds with another
        spec is stale (its end never came) and is replaced.  The forwarder's pid, or None."""
        g = self.guest
        self.admit(spec, replace_stale)
        try:
            region = shm.Region.create(
                g.region,
                size,
                params or config.region_params(g.wait),
                g.name,
                exclusive=False,  # a stale region or a planted link is replaced, never written through
                uid=owner[0],
                gid=owner[1],
            )
            region.close()
            pid = self.start_forwarder() if start else None
            if then is not None:
                then()
        except VmgpuError:
            self.release()
            raise
        return pid

    def admit(self, spec: str, replace_stale: bool = False) -> None:
        g = self.guest
        try:
            self._admit(spec)
        except Conflict:
            if not replace_stale:
                raise
            self.log.warning("stale reservation replaced", guest=g.name)
            self.client.release(g.name)
            self._admit(spec)

    def _admit(self, spec: str) -> None:
        g = self.guest
        if g.label:
            self.client.admit(g.name, g.kind, spec, label=g.label)
        else:
            self.client.admit(g.name, g.kind, spec)

    def start_forwarder(self) -> int:
        """Start the guest's forwarder on its region as it is; its pid."""
        g = self.guest
        return self.client.start_forwarder(g.name, str(g.region), g.backend, "", g.wait)

    def ensure_forwarder(self) -> int | None:
        """Start the guest's forwarder unless one is recorded; the new one's pid, or None."""
        if self.guest.name in {f.guest for f in self.client.status().forwarders if f.pid > 0}:
            return None
        return self.start_forwarder()

    def stop_forwarder(self) -> bool:
        return self.client.stop_forwarder(self.guest.name)

    def release(self) -> bool:
        """Free the guest's share (its forwarder stops; vmgpud removes the region it served) and
        remove the guest's region if it is still there and vmgpu's own (files.remove_ours: never a
        link or another user's file planted at its path)."""
        held = self.client.release(self.guest.name)
        try:
            files.remove_ours(self.guest.region)
        except (UnsafePath, OSError) as e:
            self.log.warning("region left in place", region=str(self.guest.region), reason=str(e))
        return held
