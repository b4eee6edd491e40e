"""libvmgpushm (native/shm_transport), loaded once for vmgpu/shm.py: where it is found, the C
signature of every function the binding calls (the structures they take: vmgpu/abi.py), and
its negative errno returns raised as vmgpu errors."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from vmgpu import abi
from vmgpu.errors import InvalidArgument, NativeLibraryMissing, RegionError, VersionMismatch

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _find_library() -> Path:
    """$VMGPU_LIBDIR's, the installed package's (vmgpu/_native/, a wheel's), else a checkout's build/native."""
    candidates = []
    if os.environ.get("VMGPU_LIBDIR"):
        candidates.append(Path(os.environ["VMGPU_LIBDIR"]) / "libvmgpushm.so")
    candidates += [
        Path(__file__).resolve().parent / "_native" / "libvmgpushm.so",
        _REPO_ROOT / "build" / "native" / "libvmgpushm.so",
    ]
    for c in candidates:
        if c.exists():
            return c
    raise NativeLibraryMissing(
        "libvmgpushm.so not found (looked in: " + ", ".join(str(c) for c in candidates) + "); install the vmgpu "
        "wheel, or run `make native` in a checkout, or set VMGPU_LIBDIR"
    )


_lib = None


def lib() -> ctypes.CDLL:
    """The loaded native library, with argument types declared once."""
    global _lib
    if _lib is not None:
        return _lib
    so = ctypes.CDLL(str(_find_library()))
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    params, layout, opts = (ctypes.POINTER(t) for t in (abi.ShmParams, abi.Layout, abi.WaitOpts))
    sigs = {
        "vmgpu_shm_params_default": (None, [params]),
        "vmgpu_layout_compute": (i, [u64, params, layout]),
        "vmgpu_region_min_size": (u64, [params, u64]),
        "vmgpu_region_format": (i, [vp, u64, params, ctypes.c_char_p]),
        "vmgpu_region_chan_info": (i, [vp, u64, layout, u32, ctypes.POINTER(abi.ChanInfo)]),
        "vmgpu_shm_errmsg": (ctypes.c_char_p, []),
        "vmgpu_now_ns": (u64, []),
        "vmgpu_wait_opts_default": (None, [opts]),
        "vmgpu_host_attach": (
            i,
            [vp, u64, params, opts, ctypes.POINTER(vp)],
        ),
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
        "vmgpu_guest_attach": (i, [vp, u64, opts, ctypes.POINTER(vp)]),
        "vmgpu_guest_detach": (None, [vp]),
        "vmgpu_guest_claim": (i, [vp, u64, ctypes.POINTER(vp)]),
        "vmgpu_gchan_close": (None, [vp]),
        "vmgpu_gchan_index": (u32, [vp]),
        "vmgpu_gchan_generation": (u32, [vp]),
        "vmgpu_gchan_send": (i, [vp, ctypes.c_uint16, vp, u32, u64]),
        "vmgpu_gchan_recv": (i, [vp, vp, u32, ctypes.POINTER(ctypes.c_uint16), u64]),
        "vmgpu_gchan_bulk_alloc_dir": (i, [vp, u64, u32, u64, ctypes.POINTER(u64), ctypes.POINTER(vp)]),
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


def raise_error(rc: int, what: str) -> None:
    err = -rc
    msg = f"{what}: {_errmsg() or os.strerror(err)}"
    if err == errno.EPROTONOSUPPORT:
        raise VersionMismatch(msg)
    if err in (errno.EINVAL, errno.ENOSPC, errno.EMSGSIZE):
        raise InvalidArgument(msg)
    raise RegionError(msg)
