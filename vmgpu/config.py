"""vmgpu's settings that more than one part uses, defined once: where vmgpud listens and keeps
its state, the defaults of the installed libvirt hook and OCI runtime, the names a request may
use, the geometry of the regions the control plane makes, and the one size parser.

Nothing here is read from the environment or changed at run time: a command-line option, an
installed script's SETTINGS or a test passes its own value explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmgpu.errors import InvalidArgument

if TYPE_CHECKING:
    from vmgpu.shm import Params

# ---- vmgpud ------------------------------------------------------------------------------
SOCKET = "/run/vmgpu/vmgpud.sock"  # owner-only, in an owner-only directory (vmgpu/daemon.py)
VMGPUD_CONF = "/etc/vmgpu/vmgpud.toml"  # vmgpud's configuration file (optional; `vmgpu daemon --config`)
MPS_DIR = "/run/vmgpu/mps"  # vmgpud --mps: its MPS control daemon's pipes and logs (vmgpu/mps.py)
LEDGER_DB = "/var/lib/vmgpu/ledger.db"  # its directory is the state directory: forwarders/ logs
METRICS_PORT = 9400  # Prometheus on 127.0.0.1
KINDS = ("vm", "container", "process")  # what an admitted guest is
BACKENDS = ("cuda", "sim")  # a forwarder's backend (sim: tests only)
WAITS = ("futex", "poll")  # futex: a guest on this kernel (container); poll: a VM
POLICIES = ("native", "equal", "preemptive", "weighted", "fixed", "shared")  # a GPU's compute policy

# ---- forwarders' managed settings (vmgpu/supervisor.py applies them) -------------------------
# OOM scripts run as root: only by name, from a directory of root's that no one else can write
OOM_SCRIPTS_DIR = "/etc/vmgpu/oom-scripts"
PEER_TIMEOUT_S = (1, 3600)  # a silent guest process is gone after this many seconds (forwarder: 5)
CTX_RESERVE_MAX = 16 << 30  # what a guest process's context is charged at most (forwarder: 544M)
LABEL_MAX = 64  # characters of a guest's label (a container's docker name) kept

# ---- guests' regions -------------------------------------------------------------------------
SHM_DIR = "/dev/shm"  # where regions live (a container's in SHM_DIR/vmgpu-containers/)
CONTAINER_REGION_SIZE = "256M"  # the OCI runtime's region

# ---- the libvirt hook and the OCI runtime (their installed scripts carry these) ------------
LIBVIRT_HOOKS_DIR = "/etc/libvirt/hooks"
QEMU_CONF = "/etc/libvirt/qemu.conf"
HOOK_LOG = "/var/log/vmgpu/hook.log"
RUNTIME_PATH = "/usr/local/bin/vmgpu-container-runtime"
RUNTIME_LOG = "/var/log/vmgpu/runtime.log"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
LIBVIRT_URI = "qemu:///system"


def region_params(wait: str = "futex") -> Params:
    """The geometry of every region the control plane makes or has a forwarder make: the
    transport's default (C's vmgpu_shm_params_default, which shm.Params mirrors; a unit test
    holds them equal) with the guest's wait mode."""
    from vmgpu import shm

    return shm.Params(wait_mode=shm.WAIT_MODES[wait])


def region_geometry(wait: str = "futex") -> dict:
    """region_params(wait) as a forwarder is told it (--wait, --channels, --bulk)."""
    p = region_params(wait)
    return {"wait": wait, "channels": p.nchannels, "bulk": p.bulk_size}


def label_text(text: str) -> str:
    """A guest's label as vmgpu keeps and shows it: untrusted text (a container's name) with no
    control or format character (no terminal escape, no bidirectional override), whitespace
    runs made one space, at most LABEL_MAX characters."""
    import unicodedata

    text = text[: LABEL_MAX * 16]  # what could be kept, whatever is dropped
    kept = "".join(" " if c.isspace() else c for c in text if c.isspace() or unicodedata.category(c)[0] != "C")
    return " ".join(kept.split())[:LABEL_MAX]


# ---- sizes -----------------------------------------------------------------------------------
UNIT_BYTES = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}  # binary units, every parser's


def parse_size(text: str) -> int:
    """'64M', '1G', '4096', '2GiB' -> bytes (a bare number is bytes)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if t and t[-1] in "KMGT":
            return int(float(t[:-1]) * UNIT_BYTES[t[-1]])
        return int(t)
    except ValueError:
        raise InvalidArgument(f"size {text!r} is not a number of bytes (e.g. 4096, 64M, 1G)") from None
