/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu statistics page ABI, version 3: a small file the forwarder's supervisor maps before it
 * forks its workers (MAP_SHARED), so every worker adds to it and vmgpud or `vmgpu breakdown`
 * can read it while the guest runs.  Host-only: the guest never sees it.  Counters only grow,
 * except memory in use; read twice and subtract to see one interval (a training step).
 *
 * Rules of the page
 *  - This header is the single written definition of the layout.  vmgpu/abi.py mirrors it for
 *    Python; tests/native/test_abi_layouts.py compiles offsetof/sizeof of every field here and
 *    compares them with the mirror.
 *  - magic first, then the version; the supervisor stores the magic last, so a reader that sees
 *    it sees a complete header.  A reader refuses a magic or version it does not speak.
 *  - Every field is a little-endian fixed-width integer; only the forwarder writes.
 *
 * Page map:
 *   0      header and totals (320 bytes)
 *   320    struct vmgpu_op_stats[VMGPU_STATS_OPS]: per opcode (the wire's op numbers)
 *   4416   per guest GPU: time calls waited at the compute gate, memory refusals (version 2)
 *   4672   the boot the page was made in (version 3)
 *   4720   struct vmgpu_stats_worker[VMGPU_STATS_WORKERS]: the worker serving each channel now
 *          (version 3)
 *
 * Version 2 appended the per-GPU gate and refusal counters; every offset of version 1 holds.
 * Version 3 appended the workers, which the page outlives: a forwarder killed with its workers at
 * one stroke (a cgroup's kill) leaves the CUDA driver's files of its workers in /dev/shm, and the
 * next forwarder given the same page removes them (region_file.c: vh_driver_files_sweep).
 */
#ifndef VMGPU_STATS_ABI_H
#define VMGPU_STATS_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "shm_abi.h" /* VMGPU_ATOMIC */

#define VMGPU_STATS_MAGIC 0x5354415447504d56ull /* "VMPGTATS" in little-endian bytes */
#define VMGPU_STATS_VERSION 3
#define VMGPU_STATS_OPS 256 /* counters per opcode below this */
#define VMGPU_STATS_GPUS 16 /* memory counters for this many guest GPUs */
#define VMGPU_STATS_WORKERS VMGPU_MAX_CHANNELS /* one per channel */

struct vmgpu_op_stats {
	VMGPU_ATOMIC(uint64_t) count; /* 0: calls served */
	VMGPU_ATOMIC(uint64_t) ns;    /* 8: time the executor spent on them */
};

/* The worker of a channel: forked_ns written by the supervisor before the fork, pid by the worker
 * as it begins and by the supervisor after the fork, then started; pid 0 once the supervisor has
 * removed what the driver left for it, before it reaps it. */
struct vmgpu_stats_worker {
	uint64_t forked_ns;          /*  0: CLOCK_REALTIME_COARSE just before the fork: the driver's
					 files of the worker were made after it */
	uint64_t started;            /*  8: its start in clock ticks after boot (/proc/PID/stat), 0
					 until known: with pid, which process it is */
	VMGPU_ATOMIC(uint32_t) pid; /* 16: 0 where the channel has no worker */
	uint32_t reserved;           /* 20 */
};

struct vmgpu_stats_page {
	uint64_t magic;                                   /*   0: VMGPU_STATS_MAGIC, stored last */
	uint32_t version;                                 /*   8: VMGPU_STATS_VERSION */
	uint32_t ndev;                                    /*  12: guest GPUs counted below */
	uint64_t quota[VMGPU_STATS_GPUS];                 /*  16: bytes per guest GPU */
	VMGPU_ATOMIC(uint64_t) used[VMGPU_STATS_GPUS]; /* 144: bytes allocated now, per guest GPU */
	VMGPU_ATOMIC(uint64_t) sync_calls;          /* 272 */
	VMGPU_ATOMIC(uint64_t) async_calls;         /* 280 */
	VMGPU_ATOMIC(uint64_t) busy_ns;             /* 288: time the executor spent on calls */
	VMGPU_ATOMIC(uint64_t) htod_bytes;          /* 296 */
	VMGPU_ATOMIC(uint64_t) dtoh_bytes;          /* 304 */
	VMGPU_ATOMIC(uint64_t) processes;           /* 312: guest processes served so far */
	struct vmgpu_op_stats op[VMGPU_STATS_OPS];        /* 320 */
	/* 4416: ns the guest's calls waited at the GPU's compute gate for its turn (serve.c) */
	VMGPU_ATOMIC(uint64_t) throttled_ns[VMGPU_STATS_GPUS];
	/* 4544: allocations, contexts and module images refused for the quota or a full card
	 * (oom_report.c: every refusal, though the log tells of one a second) */
	VMGPU_ATOMIC(uint64_t) oom_refusals[VMGPU_STATS_GPUS];
	char boot_id[48];                                      /* 4672: /proc/sys/kernel/random/boot_id
								  (version 3) */
	struct vmgpu_stats_worker worker[VMGPU_STATS_WORKERS]; /* 4720: by channel (version 3) */
};

#define VMGPU_STATS_PAGE_V2_SIZE (320u + VMGPU_STATS_OPS * 16u + 2u * VMGPU_STATS_GPUS * 8u)
#define VMGPU_STATS_PAGE_SIZE (VMGPU_STATS_PAGE_V2_SIZE + 48u + VMGPU_STATS_WORKERS * 24u)

#ifndef __cplusplus
_Static_assert(sizeof(struct vmgpu_op_stats) == 16, "op counters");
_Static_assert(offsetof(struct vmgpu_stats_page, magic) == 0, "magic first");
_Static_assert(offsetof(struct vmgpu_stats_page, version) == 8, "version second");
_Static_assert(offsetof(struct vmgpu_stats_page, ndev) == 12, "ndev");
_Static_assert(offsetof(struct vmgpu_stats_page, quota) == 16, "quota");
_Static_assert(offsetof(struct vmgpu_stats_page, used) == 144, "used");
_Static_assert(offsetof(struct vmgpu_stats_page, sync_calls) == 272, "totals");
_Static_assert(offsetof(struct vmgpu_stats_page, processes) == 312, "processes");
_Static_assert(offsetof(struct vmgpu_stats_page, op) == 320, "per-op counters");
_Static_assert(offsetof(struct vmgpu_stats_page, throttled_ns) == 4416, "gate waits");
_Static_assert(offsetof(struct vmgpu_stats_page, oom_refusals) == 4544, "memory refusals");
_Static_assert(sizeof(struct vmgpu_stats_worker) == 24, "worker entry");
_Static_assert(offsetof(struct vmgpu_stats_page, boot_id) == 4672, "boot");
_Static_assert(offsetof(struct vmgpu_stats_page, worker) == 4720, "workers");
_Static_assert(sizeof(struct vmgpu_stats_page) == VMGPU_STATS_PAGE_SIZE, "page size");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the vmgpu statistics page is little-endian"
#endif
#endif

#endif /* VMGPU_STATS_ABI_H */
