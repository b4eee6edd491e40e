"""Region files as `vmgpu region` makes and shows them: a region created with the geometry the
operator asks for, and what a region's header and channels say (read-only)."""

from __future__ import annotations

from vmgpu import shm
from vmgpu.config import parse_size


def create(name: str, size: str, channels: int, wait: str, bulk: str, guest_name: str = "") -> dict:
    """Create and format region NAME (a bare name: /dev/shm/NAME); its layout."""
    params = shm.Params(nchannels=channels, wait_mode=shm.WAIT_MODES[wait], bulk_size=parse_size(bulk))
    path = shm.Region.resolve(name)
    r = shm.Region.create(path, parse_size(size), params, guest_name or path.name)
    lay = params.layout(r.size)
    r.close()
    return {
        "path": str(path),
        "size": lay["region_size"],
        "channels": channels,
        "wait": wait,
        "heap_bytes": lay["heap_size"],
        "bulk_bytes_per_channel": lay["bulk_size"],
    }


def show(name: str) -> dict:
    """Region NAME's header and channels."""
    r = shm.Region.open(shm.Region.resolve(name))
    try:
        params = r.check()
        hdr = r.header()
        chans = r.channels(params)
    finally:
        r.close()
    return {"path": str(r.path), "header": hdr, "channels": chans}
