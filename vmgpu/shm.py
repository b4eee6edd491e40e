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

from vmgpu import files
from vmgpu.config import parse_size  # noqa: F401 - the one size parser, re-exported
from vmgpu.errors import InvalidArgument, NativeLibraryMissing, NotFound, RegionError, VersionMismatch, VmgpuError

WAIT_FUTEX = 1
WAIT_POLL = 2
WAIT_MODES = {"futex": WAIT_FUTEX, "poll": WAIT_POLL}

CHAN_STATES = {0: "free", 1: "claiming", 2: "active", 3: "closing", 4: "dead"}
HOST_STATUS = {0: "pending", 1: "accepted", 2: "refused-version", 3: "refused-broken", 4: "refused-limit"}
HC_EVENTS = {0: "idle", 1: "opened", 2: "serving", 3: "closed", 4: "lost", 5: "refused"}

_REPO_ROOT = Path(__file__).resolve().parent.parent


class _Params(ctypes.Structure):
    _fields_ = [
        ("nchannels", ctypes.c_uint32),
        ("req_ring_size", ctypes.c_uint32),
        ("cpl_ring_size", ctypes.c_uint32),
        ("wait_mode", ctypes.c_uint32),
        ("bulk_size", ctypes.c_uint64),
        ("heap_block_size", ctypes.c_uint64),
    ]


class _Layout(ctypes.Structure):
    _fields_ = [
        ("region_size", ctypes.c_uint64),
        ("nchannels", ctypes.c_uint32),
        ("req_ring_size", ctypes.c_uint32),
        ("cpl_ring_size", ctypes.c_uint32),
        ("wait_mode", ctypes.c_uint32),
        ("bulk_size", ctypes.c_uint64),
        ("chan_table_off", ctypes.c_uint64),
        ("heap_map_off", ctypes.c_uint64),
        ("chan_area_off", ctypes.c_uint64),
        ("chan_stride", ctypes.c_uint64),
        ("req_ring_off", ctypes.c_uint64),
        ("cpl_ring_off", ctypes.c_uint64),
        ("bulk_off", ctypes.c_uint64),
        ("heap_off", ctypes.c_uint64),
        ("heap_size", ctypes.c_uint64),
        ("heap_block_size", ctypes.c_uint64),
        ("heap_blocks", ctypes.c_uint32),
    ]


class _WaitOpts(ctypes.Structure):
    _fields_ = [
        ("spin_ns", ctypes.c_uint64),
        ("sleep_max_ns", ctypes.c_uint64),
        ("peer_timeout_ns", ctypes.c_uint64),
        ("doorbell", ctypes.c_void_p),
        ("doorbell_ctx", ctypes.c_void_p),
    ]


class _ChanInfo(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("owner_pid", ctypes.c_uint32),
        ("guest_version", ctypes.c_uint32),
        ("host_status", ctypes.c_uint32),
        ("heartbeat", ctypes.c_uint64),
        ("owner_nonce", ctypes.c_uint64),
        ("owner_comm", ctypes.c_char * 17),
        ("req_used", ctypes.c_uint32),
        ("cpl_used", ctypes.c_uint32),
        ("bulk_used", ctypes.c_uint64),
        ("heap_blocks", ctypes.c_uint32),
        ("owner_word", ctypes.c_uint32),
    ]


def _find_library() -> Path:
    candidates = []
    if os.environ.get("VMGPU_LIBDIR"):
        candidates.append(Path(os.environ["VMGPU_LIBDIR"]) / "libvmgpushm.so")
    candidates += [
        _REPO_ROOT / "build" / "native" / "libvmgpushm.so",
        Path("/usr/local/lib/vmgpu/libvmgpushm.so"),
    ]
    for c in candidates:
        if c.exists():
            return c
    raise NativeLibraryMissing(
        "libvmgpushm.so not found (looked in: " + ", ".join(str(c) for c in candidates) + "); run `make`"
    )


_lib = None


def lib() -> ctypes.CDLL:
    """The loaded native library, with argument types declared once."""
    global _lib
    if _lib is not None:
        return _lib
    so = ctypes.CDLL(str(_find_library()))
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    sigs = {
        "vmgpu_shm_params_default": (None, [ctypes.POINTER(_Params)]),
        "vmgpu_layout_compute": (i, [u64, ctypes.POINTER(_Params), ctypes.POINTER(_Layout)]),
        "vmgpu_region_min_size": (u64, [ctypes.POINTER(_Params), u64]),
        "vmgpu_region_format": (i, [vp, u64, ctypes.POINTER(_Params), ctypes.c_char_p]),
        "vmgpu_region_chan_info": (i, [vp, u64, ctypes.POINTER(_Layout), u32, ctypes.POINTER(_ChanInfo)]),
        "vmgpu_shm_errmsg": (ctypes.c_char_p, []),
        "vmgpu_now_ns": (u64, []),
        "vmgpu_wait_opts_default": (None, [ctypes.POINTER(_WaitOpts)]),
        "vmgpu_host_attach": (i, [vp, u64, ctypes.POINTER(_Params), ctypes.POINTER(_WaitOpts), ctypes.POINTER(vp)]),
        "vmgpu_host_detach": (None, [vp]),
        "vmgpu_host_beat": (None, [vp]),
        "vmgpu_host_close": (None, [vp]),
        "vmgpu_host_republish": (i, [vp]),
        "vmgpu_host_set_chans_per_owner": (i, [vp, u32]),
        "vmgpu_host_chan": (vp, [vp, u32]),
        "vmgpu_hchan_poll": (i, [vp, u64]),
        "vmgpu_hchan_reclaim": (i, [vp]),
        "vmgpu_hchan_recv": (i, [vp, vp, u32, ctypes.POINTER(ctypes.c_uint16), u64]),
        "vmgpu_hchan_send": (i, [vp, ctypes.c_uint16, vp, u32, u64]),
        "vmgpu_host_heap": (vp, [vp, u64, u64]),
        "vmgpu_guest_attach": (i, [vp, u64, ctypes.POINTER(_WaitOpts), ctypes.POINTER(vp)]),
        "vmgpu_guest_detach": (None, [vp]),
        "vmgpu_guest_claim": (i, [vp, u64, ctypes.POINTER(vp)]),
        "vmgpu_gchan_close": (None, [vp]),
        "vmgpu_gchan_index": (u32, [vp]),
        "vmgpu_gchan_generation": (u32, [vp]),
        "vmgpu_gchan_send": (i, [vp, ctypes.c_uint16, vp, u32, u64]),
        "vmgpu_gchan_recv": (i, [vp, vp, u32, ctypes.POINTER(ctypes.c_uint16), u64]),
        "vmgpu_guest_heap_alloc": (i, [vp, u64, ctypes.POINTER(u64)]),
        "vmgpu_guest_heap_free": (i, [vp, u64]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(so, name)
        fn.restype = res
        fn.argtypes = args
    _lib = so
    return so


def _errmsg() -> str:
    return (lib().vmgpu_shm_errmsg() or b"").decode(errors="replace")


def _raise(rc: int, what: str) -> None:
    err = -rc
    msg = f"{what}: {_errmsg() or os.strerror(err)}"
    if err == errno.EPROTONOSUPPORT:
        raise VersionMismatch(msg)
    if err in (errno.EINVAL, errno.ENOSPC, errno.EMSGSIZE):
        raise InvalidArgument(msg)
    raise RegionError(msg)


@dataclass(frozen=True)
class Params:
    """Region geometry parameters (see native/shm_transport/include/vmgpu/shm.h)."""

    nchannels: int = 16
    req_ring_size: int = 256 << 10
    cpl_ring_size: int = 64 << 10
    wait_mode: int = WAIT_FUTEX
    bulk_size: int = 4 << 20
    heap_block_size: int = 64 << 10

    def c(self) -> _Params:
        return _Params(
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
        lay = _Layout()
        rc = lib().vmgpu_layout_compute(size, ctypes.byref(self.c()), ctypes.byref(lay))
        if rc:
            _raise(rc, "layout")
        return {f: getattr(lay, f) for f, _ in _Layout._fields_}

    def min_size(self, min_heap: int = 0) -> int:
        n = lib().vmgpu_region_min_size(ctypes.byref(self.c()), min_heap)
        if n == 0:
            _raise(-errno.EINVAL, "parameters")
        return n


class _Header(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version_major", ctypes.c_uint16),
        ("version_minor", ctypes.c_uint16),
        ("header_size", ctypes.c_uint32),
        ("region_size", ctypes.c_uint64),
        ("features", ctypes.c_uint64),
        ("wait_mode", ctypes.c_uint32),
        ("nchannels", ctypes.c_uint32),
        ("chan_table_off", ctypes.c_uint64),
        ("chan_area_off", ctypes.c_uint64),
        ("chan_stride", ctypes.c_uint64),
        ("req_ring_size", ctypes.c_uint32),
        ("cpl_ring_size", ctypes.c_uint32),
        ("bulk_size", ctypes.c_uint64),
        ("heap_off", ctypes.c_uint64),
        ("heap_size", ctypes.c_uint64),
        ("heap_block_size", ctypes.c_uint64),
        ("heap_map_off", ctypes.c_uint64),
        ("heap_blocks", ctypes.c_uint32),
        ("region_state", ctypes.c_uint32),
        ("host_epoch", ctypes.c_uint64),
        ("name", ctypes.c_char * 64),
        ("chans_per_owner", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint8 * 56),
        ("host_heartbeat", ctypes.c_uint64),
        ("host_pid", ctypes.c_uint32),
    ]


MAGIC = 0x4D48535550474D56
OWNER_TID_MASK = 0x3FFFFFFF
OWNER_DIED = 0x40000000
OWNER_CLOSED = 0x20000000


def _liveness(word: int) -> str:
    """What a channel's owner word says (ABI 1.1): see shm_abi.h."""
    if word & OWNER_DIED:
        return "closed" if word & OWNER_CLOSED else "died"
    return "alive" if word & OWNER_TID_MASK else "unarmed"


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
            _raise(rc, "format")
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
        h = _Header.from_buffer_copy(self.mm[: ctypes.sizeof(_Header)])
        out = {f: getattr(h, f) for f, _ in _Header._fields_ if not f.startswith(("reserved", "pad"))}
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
            _raise(rc, str(self.path))
        lib().vmgpu_guest_detach(g)
        return Params.from_header(h)

    def channels(self, params: Params) -> list[dict]:
        lay = _Layout(**params.layout(self.size))
        out = []
        for i in range(params.nchannels):
            ci = _ChanInfo()
            rc = lib().vmgpu_region_chan_info(self.base, self.size, ctypes.byref(lay), i, ctypes.byref(ci))
            if rc:
                _raise(rc, "channel info")
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


def wait_opts(peer_timeout_s: float | None = None, spin_us: float | None = None) -> _WaitOpts:
    o = _WaitOpts()
    lib().vmgpu_wait_opts_default(ctypes.byref(o))
    if peer_timeout_s is not None:
        o.peer_timeout_ns = int(peer_timeout_s * 1e9)
    if spin_us is not None:
        o.spin_ns = int(spin_us * 1000)
    return o


class Host:
    """The host side of a region (what a forwarder holds)."""

    def __init__(self, region: Region, params: Params, opts: _WaitOpts | None = None):
        self.region = region
        self.params = params
        self._opts = opts or wait_opts()
        h = ctypes.c_void_p()
        rc = lib().vmgpu_host_attach(
            region.base, region.size, ctypes.byref(params.c()), ctypes.byref(self._opts), ctypes.byref(h)
        )
        if rc:
            _raise(rc, f"host attach to {region.path}")
        self.h = h

    def beat(self) -> None:
        lib().vmgpu_host_beat(self.h)

    def republish(self) -> int:
        """Rewrite what the host owns in the header where a guest changed it; returns the words rewritten."""
        return lib().vmgpu_host_republish(self.h)

    def set_chans_per_owner(self, n: int) -> None:
        rc = lib().vmgpu_host_set_chans_per_owner(self.h, n)
        if rc:
            _raise(rc, "channels per process")

    def poll(self, idx: int) -> str:
        c = lib().vmgpu_host_chan(self.h, idx)
        return HC_EVENTS[lib().vmgpu_hchan_poll(c, lib().vmgpu_now_ns())]

    def reclaim(self, idx: int) -> None:
        rc = lib().vmgpu_hchan_reclaim(lib().vmgpu_host_chan(self.h, idx))
        if rc:
            _raise(rc, f"reclaim channel {idx}")

    def recv(self, idx: int, timeout_s: float = 0.0, cap: int = 1 << 16) -> tuple[int, bytes] | None:
        buf = ctypes.create_string_buffer(cap)
        t = ctypes.c_uint16()
        n = lib().vmgpu_hchan_recv(lib().vmgpu_host_chan(self.h, idx), buf, cap, ctypes.byref(t), int(timeout_s * 1e9))
        if n in (-errno.EAGAIN, -errno.ETIMEDOUT):
            return None
        if n < 0:
            _raise(n, f"receive on channel {idx}")
        return t.value, buf.raw[:n]

    def send(self, idx: int, rtype: int, data: bytes, timeout_s: float = 1.0) -> None:
        rc = lib().vmgpu_hchan_send(lib().vmgpu_host_chan(self.h, idx), rtype, data, len(data), int(timeout_s * 1e9))
        if rc:
            _raise(rc, f"send on channel {idx}")

    def heap(self, off: int, length: int) -> int | None:
        """Checked address of [off, off+length) in the heap, or None."""
        return lib().vmgpu_host_heap(self.h, off, length)

    def close(self) -> None:
        if self.h:
            lib().vmgpu_host_detach(self.h)
            self.h = None


class GuestChannel:
    """The guest side of one channel (for tests and the self-test only)."""

    def __init__(self, region: Region, ack_timeout_s: float = 5.0, opts: _WaitOpts | None = None):
        self._opts = opts or wait_opts()
        g = ctypes.c_void_p()
        rc = lib().vmgpu_guest_attach(region.base, region.size, ctypes.byref(self._opts), ctypes.byref(g))
        if rc:
            _raise(rc, f"guest attach to {region.path}")
        self.g = g
        c = ctypes.c_void_p()
        rc = lib().vmgpu_guest_claim(g, int(ack_timeout_s * 1e9), ctypes.byref(c))
        if rc:
            lib().vmgpu_guest_detach(g)
            _raise(rc, "claim a channel")
        self.c = c
        self.index = lib().vmgpu_gchan_index(c)
        self.generation = lib().vmgpu_gchan_generation(c)

    def send(self, rtype: int, data: bytes, timeout_s: float = 1.0) -> None:
        rc = lib().vmgpu_gchan_send(self.c, rtype, data, len(data), int(timeout_s * 1e9))
        if rc:
            _raise(rc, "send")

    def recv(self, timeout_s: float = 1.0, cap: int = 1 << 16) -> tuple[int, bytes]:
        buf = ctypes.create_string_buffer(cap)
        t = ctypes.c_uint16()
        n = lib().vmgpu_gchan_recv(self.c, buf, cap, ctypes.byref(t), int(timeout_s * 1e9))
        if n < 0:
            _raise(n, "receive")
        return t.value, buf.raw[:n]

    def heap_alloc(self, size: int) -> int:
        off = ctypes.c_uint64()
        rc = lib().vmgpu_guest_heap_alloc(self.c, size, ctypes.byref(off))
        if rc:
            _raise(rc, "heap alloc")
        return off.value

    def heap_free(self, off: int) -> None:
        rc = lib().vmgpu_guest_heap_free(self.c, off)
        if rc:
            _raise(rc, "heap free")

    def close(self) -> None:
        if self.c:
            lib().vmgpu_gchan_close(self.c)
            self.c = None
        if self.g:
            lib().vmgpu_guest_detach(self.g)
            self.g = None
