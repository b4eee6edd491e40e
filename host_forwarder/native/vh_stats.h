/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forwarder's statistics page: a small file the supervisor maps before forking its
 * workers (MAP_SHARED), so every worker adds to it and vmgpud or `vmgpu breakdown` can
 * read it while the guest runs.  Host-only: the guest never sees it.  Counters only grow,
 * except memory in use; read twice and subtract to see one interval (a training step).
 */
#ifndef VH_STATS_H
#define VH_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define VH_STATS_MAGIC 0x5354415447504d56ull /* "VMPGTATS" */
#define VH_STATS_VERSION 1
#define VH_STATS_OPS 256 /* counters per opcode below this */

struct vh_op_stats {
	_Atomic uint64_t count, ns; /* calls served, time the executor spent on them */
};

struct vh_stats {
	uint64_t magic;
	uint32_t version, ndev;
	uint64_t quota[16];            /* bytes per guest GPU */
	_Atomic uint64_t used[16];     /* bytes allocated now, per guest GPU */
	_Atomic uint64_t sync_calls, async_calls, busy_ns;
	_Atomic uint64_t htod_bytes, dtoh_bytes;
	_Atomic uint64_t processes;    /* guest processes served so far */
	struct vh_op_stats op[VH_STATS_OPS];
};

#endif
