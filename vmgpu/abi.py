"""The C layouts vmgpu's Python reads and writes, each written down once here as a ctypes
structure and checked against its C header by tests/native/test_abi_layouts.py (which compiles
offsetof/sizeof of every field and compares them with these; a field moved on one side fails it).

Shared-memory pages (native/shm_transport/include/vmgpu/): the region header (shm_abi.h), a
GPU's scheduler page (sched_abi.h) and a forwarder's statistics page (stats_abi.h).  And the
structures libvmgpushm's functions take (shm.h).  Each class names its C struct in `c_struct`.
Standard library only: the GPU host's benchmarks use it too.
"""

from __future__ import annotations

import ctypes

u8, u16, u32, u64, i32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32

# ---- the region (shm_abi.h) -----------------------------------------------------------------

SHM_MAGIC = 0x4D48535550474D56
OWNER_TID_MASK = 0x3FFFFFFF
OWNER_DIED = 0x40000000
OWNER_CLOSED = 0x20000000
CACHELINE = 64
PAGE = 4096


class RegionHeader(ctypes.Structure):
    c_struct = "vmgpu_region_header"
    _fields_ = [
        ("magic", u64),
        ("version_major", u16),
        ("version_minor", u16),
        ("header_size", u32),
        ("region_size", u64),
        ("features", u64),
        ("wait_mode", u32),
        ("nchannels", u32),
        ("chan_table_off", u64),
        ("chan_area_off", u64),
        ("chan_stride", u64),
        ("req_ring_size", u32),
        ("cpl_ring_size", u32),
        ("bulk_size", u64),
        ("heap_off", u64),
        ("heap_size", u64),
        ("heap_block_size", u64),
        ("heap_map_off", u64),
        ("heap_blocks", u32),
        ("region_state", u32),
        ("host_epoch", u64),
        ("name", ctypes.c_char * 64),
        ("chans_per_owner", u32),
        ("pad0", u32),
        ("reserved0", u8 * (256 - 200)),
        ("host_heartbeat", u64),
        ("host_pid", u32),
        ("reserved1", u8 * (CACHELINE - 12)),
        ("agent_heartbeat", u64),
        ("reserved2", u8 * (CACHELINE - 8)),
        ("reserved3", u8 * (PAGE - 256 - 2 * CACHELINE)),
    ]


# ---- libvmgpushm's arguments (shm.h) ----------------------------------------------------------


class ShmParams(ctypes.Structure):
    c_struct = "vmgpu_shm_params"
    _fields_ = [
        ("nchannels", u32),
        ("req_ring_size", u32),
        ("cpl_ring_size", u32),
        ("wait_mode", u32),
        ("bulk_size", u64),
        ("heap_block_size", u64),
    ]


class Layout(ctypes.Structure):
    c_struct = "vmgpu_layout"
    _fields_ = [
        ("region_size", u64),
        ("nchannels", u32),
        ("req_ring_size", u32),
        ("cpl_ring_size", u32),
        ("wait_mode", u32),
        ("bulk_size", u64),
        ("chan_table_off", u64),
        ("heap_map_off", u64),
        ("chan_area_off", u64),
        ("chan_stride", u64),
        ("req_ring_off", u64),
        ("cpl_ring_off", u64),
        ("bulk_off", u64),
        ("heap_off", u64),
        ("heap_size", u64),
        ("heap_block_size", u64),
        ("heap_blocks", u32),
    ]


class WaitOpts(ctypes.Structure):
    c_struct = "vmgpu_wait_opts"
    _fields_ = [
        ("spin_ns", u64),
        ("sleep_max_ns", u64),
        ("peer_timeout_ns", u64),
        ("doorbell", ctypes.c_void_p),
        ("doorbell_ctx", ctypes.c_void_p),
    ]


class ChanInfo(ctypes.Structure):
    c_struct = "vmgpu_chan_info"
    _fields_ = [
        ("index", u32),
        ("state", u32),
        ("generation", u32),
        ("owner_pid", u32),
        ("guest_version", u32),
        ("host_status", u32),
        ("heartbeat", u64),
        ("owner_nonce", u64),
        ("owner_comm", ctypes.c_char * 17),
        ("req_used", u32),
        ("cpl_used", u32),
        ("bulk_used", u64),
        ("heap_blocks", u32),
        ("owner_word", u32),
    ]


# ---- a GPU's scheduler page (sched_abi.h) -------------------------------------------------------

SCHED_MAGIC = 0x3144454843534756
SCHED_VERSION = 1
SCHED_SLOTS = 64
SCHED_PROBE_FRESH_MS = 1000  # VMGPU_SCHED_PROBE_FRESH_MS: and a part of 1000 (a probe) this long
SCHED_CAPS_FRESH_MS = 2000  # VMGPU_SCHED_CAPS_FRESH_MS: a cap controller's parts hold this long after its last look
SCHED_DIR = "/dev/shm/vmgpu"  # VMGPU_SCHED_DIR
POLICY_NATIVE, POLICY_EQUAL, POLICY_PREEMPTIVE, POLICY_WEIGHTED, POLICY_FIXED, POLICY_SHARED = range(6)
PRIO_NORMAL, PRIO_HIGH, PRIO_LOW = range(3)


class SchedSlot(ctypes.Structure):
    c_struct = "vmgpu_sched_slot"
    _fields_ = [
        ("pid", u32),
        ("weight", u32),
        ("waiters", u32),
        ("pad0", u32),
        ("name", ctypes.c_char * 64),
        ("vtime", u64),
        ("used_ns", u64),
        ("period_start", u64),
        ("period_used", u64),
        ("joined_ns", u64),
        ("turns", u64),
        ("last_active", u64),
        ("inflight", u32),
        ("draining", u32),
        ("work_calls", u64),
        ("nworkers", u32),
        ("drained", u32),
        ("drain_gen", u32),
        ("rejoin", u32),
        ("cap", u32),
        ("priority", u32),
        ("guarantee", u32),
        ("hold", u32),
        ("depth", u32),
        ("active_ms", u32),
        ("sm_part", u32),
        ("whole_ms", u32),
        ("cap_pm", u32),
        ("time_seq", u32),  # odd while a forwarder changes its GPU time (sched.Page.gpu_time reads by it)
        ("pad", u8 * (256 - 208)),
    ]


class SchedPage(ctypes.Structure):
    """Python stores only whole aligned 32-bit control words here (policy, caps_ms, a slot's weight, cap,
    priority, guarantee, hold, depth, sm_part, cap_pm): a
    ctypes field store, one aligned 4-byte store, as the forwarders' atomic loads expect."""

    c_struct = "vmgpu_sched_page"
    _fields_ = [
        ("magic", u64),
        ("version", u32),
        ("nslots", u32),
        ("policy", u32),
        ("slice_us", u32),
        ("period_us", u32),
        ("owner", i32),
        ("gen", u32),
        ("idle_us", u32),
        ("hold_start", u64),
        ("mu_space", u8 * 64),
        ("sm_groups", u32),
        ("caps_ms", u32),
        ("turn_start", u64),
        ("slot", SchedSlot * SCHED_SLOTS),
    ]


# ---- a forwarder's statistics page (stats_abi.h) ------------------------------------------------

STATS_MAGIC = 0x5354415447504D56
STATS_VERSION = 3
STATS_OPS = 256
STATS_GPUS = 16
STATS_WORKERS = 4096


class OpStats(ctypes.Structure):
    c_struct = "vmgpu_op_stats"
    _fields_ = [("count", u64), ("ns", u64)]


STATS_PAGE_V2_SIZE = 4672  # a version-2 page: everything before the workers


class StatsWorker(ctypes.Structure):
    c_struct = "vmgpu_stats_worker"
    _fields_ = [("forked_ns", u64), ("started", u64), ("pid", u32), ("reserved", u32)]


class StatsPage(ctypes.Structure):
    c_struct = "vmgpu_stats_page"
    _fields_ = [
        ("magic", u64),
        ("version", u32),
        ("ndev", u32),
        ("quota", u64 * STATS_GPUS),
        ("used", u64 * STATS_GPUS),
        ("sync_calls", u64),
        ("async_calls", u64),
        ("busy_ns", u64),
        ("htod_bytes", u64),
        ("dtoh_bytes", u64),
        ("processes", u64),
        ("op", OpStats * STATS_OPS),
        ("throttled_ns", u64 * STATS_GPUS),
        ("oom_refusals", u64 * STATS_GPUS),
        ("boot_id", ctypes.c_char * 48),
        ("worker", StatsWorker * STATS_WORKERS),
    ]


# Every layout above, with the header that defines it; the shared-memory pages are laid out with
# explicit padding (every byte belongs to a named field), the library's arguments as C lays them.
PAGES = {
    "vmgpu/shm_abi.h": [RegionHeader],
    "vmgpu/sched_abi.h": [SchedSlot, SchedPage],
    "vmgpu/stats_abi.h": [OpStats, StatsWorker, StatsPage],
}
ARGUMENTS = {"vmgpu/shm.h": [ShmParams, Layout, WaitOpts, ChanInfo]}
# The constants each page's header defines, by C name.
CONSTANTS = {
    "VMGPU_SHM_MAGIC": SHM_MAGIC,
    "VMGPU_OWNER_TID_MASK": OWNER_TID_MASK,
    "VMGPU_OWNER_DIED": OWNER_DIED,
    "VMGPU_OWNER_CLOSED": OWNER_CLOSED,
    "VMGPU_SCHED_MAGIC": SCHED_MAGIC,
    "VMGPU_SCHED_VERSION": SCHED_VERSION,
    "VMGPU_SCHED_SLOTS": SCHED_SLOTS,
    "VMGPU_SCHED_CAPS_FRESH_MS": SCHED_CAPS_FRESH_MS,
    "VMGPU_SCHED_PROBE_FRESH_MS": SCHED_PROBE_FRESH_MS,
    "VMGPU_SCHED_DIR": SCHED_DIR,
    "VMGPU_SCHED_NATIVE": POLICY_NATIVE,
    "VMGPU_SCHED_EQUAL": POLICY_EQUAL,
    "VMGPU_SCHED_PREEMPTIVE": POLICY_PREEMPTIVE,
    "VMGPU_SCHED_WEIGHTED": POLICY_WEIGHTED,
    "VMGPU_SCHED_FIXED": POLICY_FIXED,
    "VMGPU_SCHED_SHARED": POLICY_SHARED,
    "VMGPU_SCHED_PRIO_NORMAL": PRIO_NORMAL,
    "VMGPU_SCHED_PRIO_HIGH": PRIO_HIGH,
    "VMGPU_SCHED_PRIO_LOW": PRIO_LOW,
    "VMGPU_STATS_MAGIC": STATS_MAGIC,
    "VMGPU_STATS_VERSION": STATS_VERSION,
    "VMGPU_STATS_OPS": STATS_OPS,
    "VMGPU_STATS_GPUS": STATS_GPUS,
    "VMGPU_STATS_WORKERS": STATS_WORKERS,
    "VMGPU_STATS_PAGE_V2_SIZE": STATS_PAGE_V2_SIZE,
}
