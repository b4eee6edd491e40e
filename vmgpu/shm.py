"""Python binding of libvmgpushm (native/shm_transport), for host-side Python and tests.

Control only: creating and formatting regions, attaching, inspecting channels,
reclaiming them.  The per-message path stays in C; the send/recv wrappers here
exist for tests and the self-test, not for serving guests.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from vmgpu import abi, files
from vmgpu.config import parse_size  # noqa: F401 - the one size parser, re-exported
from vmgpu.errors import NotFound, RegionError, VmgpuError
from vmgpu.shm_lib import lib, raise_error

WAIT_FUTEX = 1
WAIT_POLL = 2
WAIT_MODES = {"futex": WAIT_FUTEX, "poll": WAIT_POLL}

CHAN_STATES = {0: "free", 1: "claiming", 2: "active", 3: "closing", 4: "dead"}
HOST_STATUS = {0: "pending", 1: "accepted", 2: "refused-version", 3: "refused-broken", 4: "refused-limit"}
HC_EVENTS = {0: "idle", 1: "opened", 2: "serving", 3: "closed", 4: "lost", 5: "refused"}


@dataclass(frozen=True)
class Params:
    """Region geometry parameters (see native/shm_transport/include/vmgpu/shm.h)."""

    nchannels: int = 16
    req_ring_size: int = 256 << 10
    cpl_ring_size: int = 64 << 10
    wait_mode: int = WAIT_FUTEX
    bulk_size: int = 4 << 20
    heap_block_size: int = 64 << 10

    def c(self) -> abi.ShmParams:
        return abi.ShmParams(
            self.nchannels,
            self.req_ring_size,
            self.cpl_ring_size,
            self.wait_mode,
            self.bulk_size,
            self.heap_block_size,
        )

    @classmethod
    def from_header(cls, h: dict) -> Params:
        return cls(
            h["nchannels"], h["req_ring_size"], h["cpl_ring_size"], h["wait_mode"], h["bulk_size"], h["heap_block_size"]
        )

    def layout(self, size: int) -> dict:
        lay = abi.Layout()
        rc = lib().vmgpu_layout_compute(size, ctypes.byref(self.c()), ctypes.byref(lay))
        if rc:
            raise_error(rc, "layout")
        return {f: getattr(lay, f) for f, _ in abi.Layout._fields_}

    def min_size(self, min_heap: int = 0) -> int:
        n = lib().vmgpu_region_min_size(ctypes.byref(self.c()), min_heap)
        if n == 0:
            raise_error(-errno.EINVAL, "parameters")
        return n


MAGIC = abi.SHM_MAGIC


def _liveness(word: int) -> str:
    """What a channel's owner word says (ABI 1.1): see shm_abi.h."""
    if word & abi.OWNER_DIED:
        return "closed" if word & abi.OWNER_CLOSED else "died"
    return "alive" if word & abi.OWNER_TID_MASK else "unarmed"


class Region:
    """A mapped region file (a /dev/shm file for containers and tests; the same
    file backs a VM's ivshmem device)."""

    def __init__(self, path: str | os.PathLike, mm: mmap.mmap, fd: int):
        self.path = Path(path)
        self.mm = mm
        self.fd = fd
        self.size = len(mm)
        self._anchor = ctypes.c_char.from_buffer(mm)
        self.base = ctypes.addressof(self._anchor)

    @staticmethod
    def resolve(name: str) -> Path:
        """A bare name means /dev/shm/NAME."""
        return Path(name) if "/" in name else Path("/dev/shm") / name

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        size: int,
        params: Params,
        name: str = "",
        exclusive: bool = True,
        uid: int | None = None,
        gid: int | None = None,
    ):
        """A new region file at path, formatted, mode 0600 (uid/gid: also theirs to read and write,
        by ACL entries: files.grant).  It is made and formatted under a fresh name beside path
        (O_CREAT|O_EXCL|O_NOFOLLOW), then given path in one step: a link or a file planted at path
        is never written through.  exclusive: refuse an existing path; otherwise replace it."""
        params.layout(size)  # validate before touching the file system
        path = Path(path)
        try:
            fd, tmp = files.create_beside(path)
        except OSError as e:
            raise RegionError(f"cannot create {path}: {e.strerror}") from None
        try:
            os.ftruncate(fd, size)
            files.grant(fd, uid, gid, path)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            os.unlink(tmp)
            raise RegionError(f"cannot size or map {path}: {e.strerror}") from None
        except VmgpuError:
            os.close(fd)
            os.unlink(tmp)
            raise
        r = cls(path, mm, fd)
        rc = lib().vmgpu_region_format(r.base, size, ctypes.byref(params.c()), name.encode()[:63])
        if rc:
            r.close()
            os.unlink(tmp)
            raise_error(rc, "format")
        try:
            files.publish(tmp, path, replace=not exclusive)
        except FileExistsError:
            r.close()
            raise RegionError(f"{path} already exists; remove it or choose another name") from None
        except OSError as e:
            r.close()
            raise RegionError(f"cannot create {path}: {e.strerror}") from None
        return r

    @classmethod
    def open(cls, path: str | os.PathLike):
        """An existing region file (never through a symbolic link)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"no region at {path}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RegionError(f"{path} is a symbolic link: refusing to follow it (remove it)") from None
            raise RegionError(f"cannot open {path}: {e.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise RegionError(f"{path} is not a regular file, so not a region")
        size = st.st_size
        if size < 4096:
            os.close(fd)
            raise RegionError(f"{path} is {size} bytes, too small to be a region")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, mm, fd)

    def header(self) -> dict:
        """A copy of the header fields (as the region says; untrusted)."""
        h = abi.RegionHeader.from_buffer_copy(self.mm[: ctypes.sizeof(abi.RegionHeader)])
        shown = [f for f, _ in abi.RegionHeader._fields_ if not f.startswith(("reserved", "pad"))]
        out = {f: getattr(h, f) for f in shown[: shown.index("host_pid") + 1]}  # the agent's line is not shown
        out["name"] = h.name.decode(errors="replace")
        return out

    def check(self) -> Params:
        """Validate the header as a guest would; return the region's params."""
        h = self.header()
        if h["magic"] != MAGIC:
            raise RegionError(f"{self.path} is not a vmgpu region (magic {h['magic']:016x})")
        g = ctypes.c_void_p()
        rc = lib().vmgpu_guest_attach(self.base, self.size, None, ctypes.byref(g))
        if rc:
            raise_error(rc, str(self.path))
        lib().vmgpu_guest_detach(g)
        return Params.from_header(h)

    def channels(self, params: Params) -> list[dict]:
        lay = abi.Layout(**params.layout(self.size))
        out = []
        for i in range(params.nchannels):
            ci = abi.ChanInfo()
            rc = lib().vmgpu_region_chan_info(self.base, self.size, ctypes.byref(lay), i, ctypes.byref(ci))
            if rc:
                raise_error(rc, "channel info")
            out.append(
                {
                    "index": ci.index,
                    "state": CHAN_STATES.get(ci.state, f"invalid({ci.state})"),
                    "generation": ci.generation,
                    "owner_pid": ci.owner_pid,
                    "owner": ci.owner_comm.decode(errors="replace"),
                    "guest_version": f"{ci.guest_version >> 16}.{ci.guest_version & 0xFFFF}",
                    "host_status": HOST_STATUS.get(ci.host_status, str(ci.host_status)),
                    "heartbeat": ci.heartbeat,
                    "liveness": _liveness(ci.owner_word),
                    "req_used": ci.req_used,
                    "cpl_used": ci.cpl_used,
                    "bulk_used": ci.bulk_used,
                    "heap_bytes": ci.heap_blocks * params.heap_block_size,
                }
            )
        return out

    def close(self) -> None:
        if self.mm is None:
            return
        del self._anchor
        self.mm.close()
        os.close(self.fd)
        self.mm = None


def wait_opts(peer_timeout_s: float | None = None, spin_us: float | None = None) -> abi.WaitOpts:
    o = abi.WaitOpts()
    lib().vmgpu_wait_opts_default(ctypes.byref(o))
    if peer_timeout_s is not None:
        o.peer_timeout_ns = int(peer_timeout_s * 1e9)
    if spin_us is not None:
        o.spin_ns = int(spin_us * 1000)
    return o


class Host:
    """The host side of a region (what a forwarder holds)."""

    def __init__(self, region: Region, params: Params, opts: abi.WaitOpts | None = None):
        self.region = region
        self.params = params
        self._opts = opts or wait_opts()
        h = ctypes.c_void_p()
        rc = lib().vmgpu_host_attach(
            region.base, region.size, ctypes.byref(params.c()), ctypes.byref(self._opts), ctypes.byref(h)
        )
        if rc:
            raise_error(rc, f"host attach to {region.path}")
        self.h = h

    def beat(self) -> None:
        lib().vmgpu_host_beat(self.h)

    def republish(self) -> int:
        """Rewrite what the host owns in the header where a guest changed it; returns the words rewritten."""
        return lib().vmgpu_host_republish(self.h)

    def set_chans_per_owner(self, n: int) -> None:
        rc = lib().vmgpu_host_set_chans_per_owner(self.h, n)
        if rc:
            raise_error(rc, "channels per process")

    def poll(self, idx: int) -> str:
        c = lib().vmgpu_host_chan(self.h, idx)
        return HC_EVENTS[lib().vmgpu_hchan_poll(c, lib().vmgpu_now_ns())]

    def reclaim(self, idx: int) -> None:
        rc = lib().vmgpu_hchan_reclaim(lib().vmgpu_host_chan(self.h, idx))
        if rc:
            raise_error(rc, f"reclaim channel {idx}")

    def recv(self, idx: int, timeout_s: float = 0.0, cap: int = 1 << 16) -> tuple[int, bytes] | None:
        buf = ctypes.create_string_buffer(cap)
        t = ctypes.c_uint16()
        n = lib().vmgpu_hchan_recv(lib().vmgpu_host_chan(self.h, idx), buf, cap, ctypes.byref(t), int(timeout_s * 1e9))
        if n in (-errno.EAGAIN, -errno.ETIMEDOUT):
            return None
        if n < 0:
            raise_error(n, f"receive on channel {idx}")
        return t.value, buf.raw[:n]

    def send(self, idx: int, rtype: int, data: bytes, timeout_s: float = 1.0) -> None:
        rc = lib().vmgpu_hchan_send(lib().vmgpu_host_chan(self.h, idx), rtype, data, len(data), int(timeout_s * 1e9))
        if rc:
            raise_error(rc, f"send on channel {idx}")

    def heap(self, off: int, length: int) -> int | None:
        """Checked address of [off, off+length) in the heap, or None."""
        return lib().vmgpu_host_heap(self.h, off, length)

    def close(self) -> None:
        if self.h:
            lib().vmgpu_host_detach(self.h)
            self.h = None


class GuestChannel:
    """The guest side of one channel (for tests and the self-test only)."""

    def __init__(self, region: Region, ack_timeout_s: float = 5.0, opts: abi.WaitOpts | None = None):
        self._opts = opts or wait_opts()
        g = ctypes.c_void_p()
        rc = lib().vmgpu_guest_attach(region.base, region.size, ctypes.byref(self._opts), ctypes.byref(g))
        if rc:
            raise_error(rc, f"guest attach to {region.path}")
        self.g = g
        c = ctypes.c_void_p()
        rc = lib().vmgpu_guest_claim(g, int(ack_timeout_s * 1e9), ctypes.byref(c))
        if rc:
            lib().vmgpu_guest_detach(g)
            raise_error(rc, "claim a channel")
        self.c = c
        self.index = lib().vmgpu_gchan_index(c)
        self.generation = lib().vmgpu_gchan_generation(c)

    def send(self, rtype: int, data: bytes, timeout_s: float = 1.0) -> None:
        rc = lib().vmgpu_gchan_send(self.c, rtype, data, len(data), int(timeout_s * 1e9))
        if rc:
            raise_error(rc, "send")

    def recv(self, timeout_s: float = 1.0, cap: int = 1 << 16) -> tuple[int, bytes]:
        buf = ctypes.create_string_buffer(cap)
        t = ctypes.c_uint16()
        n = lib().vmgpu_gchan_recv(self.c, buf, cap, ctypes.byref(t), int(timeout_s * 1e9))
        if n < 0:
            raise_error(n, "receive")
        return t.value, buf.raw[:n]

    def bulk_alloc(self, size: int, to_host: bool, timeout_s: float = 5.0) -> tuple[int, int]:
        """size bytes of the channel's bulk area, written by the guest (to_host) or by the host:
        (their position, the guest's address of them)."""
        pos, ptr = ctypes.c_uint64(), ctypes.c_void_p()
        direction = 1 if to_host else 2  # VMGPU_BULK_TO_HOST, VMGPU_BULK_FROM_HOST
        timeout = int(timeout_s * 1e9)
        rc = lib().vmgpu_gchan_bulk_alloc_dir(self.c, size, direction, timeout, ctypes.byref(pos), ctypes.byref(ptr))
        if rc:
            raise_error(rc, "bulk alloc")
        return pos.value, ptr.value

    def heap_alloc(self, size: int) -> int:
        off = ctypes.c_uint64()
        rc = lib().vmgpu_guest_heap_alloc(self.c, size, ctypes.byref(off))
        if rc:
            raise_error(rc, "heap alloc")
        return off.value

    def heap_free(self, off: int) -> None:
        rc = lib().vmgpu_guest_heap_free(self.c, off)
        if rc:
            raise_error(rc, "heap free")

    def close(self) -> None:
        if self.c:
            lib().vmgpu_gchan_close(self.c)
            self.c = None
        if self.g:
            lib().vmgpu_guest_detach(self.g)
            self.g = None
