/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One guest's forwarder: what its supervisor sets up (main.c, devices.c) and every worker it
 * forks inherits: the region, the GPUs and their quotas, the shared memory rows of the quota
 * (quota.c), the statistics page and the GPUs' compute schedulers.
 */
#ifndef VH_FORWARDER_H
#define VH_FORWARDER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "vg_wire.h"
#include "vh_sched.h"
#include <vmgpu/stats_abi.h>
#include "vmgpu/shm.h"

/* Time as the quota sees it: the real clock (clock.c), or a test's fake one. */
struct vh_clock {
	uint64_t (*now_ns)(void);
	void (*sleep_ns)(uint64_t ns);
};
extern const struct vh_clock vh_real_clock;

/* An IPC handle a guest process exported (ipc.c): the driver's handle behind the guest's token. */
#define VH_IPC_SLOTS 1024
struct vh_ipc_entry {
	uint32_t kind;      /* 0: free; VH_IPC_MEM, VH_IPC_EVENT, VH_IPC_VMM or VH_IPC_VMM_PENDING (ipc.c) */
	uint32_t chan;      /* the exporting process's channel */
	uint64_t base;      /* the exporter's block (memory), its host event or its driver VMM handle */
	uint64_t size;      /* the bytes the exporter may name at base (memory), or the handle's size */
	int32_t dev;        /* VMM: the guest's GPU the handle's memory is on */
	uint32_t pad;
	uint8_t token[16];  /* what the guest's handle must carry */
	uint8_t real[64];   /* the driver's CUipcMemHandle / CUipcEventHandle: never leaves the host */
};

/* What the workers of one guest share besides the quota's rows (context.c, ipc.c). */
struct vh_shared {
	pthread_mutex_t ctx_mu;                  /* contexts are made one at a time (robust) */
	_Atomic uint64_t ctx_bytes[VG_MAX_DEVICES]; /* the largest context measured on each GPU */
	_Atomic uint32_t reads_asked;            /* bumped by a worker refused on charges that others' run
	                                          * ahead of the truth: each of those reads its meter now */
	pthread_mutex_t ipc_mu;                  /* the IPC table (robust) */
	struct vh_ipc_entry ipc[VH_IPC_SLOTS];
};

struct vh_fwd {
	const struct vh_backend *backend;
	struct vmgpu_host *host;
	uint8_t *region;
	uint64_t region_size;
	uint64_t heap_off, heap_size; /* the region's pinned-memory heap (from its layout) */
	int registered;     /* this worker registered the region with the driver (pinned DMA) */
	int registered_dev; /* in its context on this GPU */
	int ndev;
	CUdevice dev[VG_MAX_DEVICES];
	int ordinal[VG_MAX_DEVICES];     /* host device index of each guest device */
	uint64_t quota[VG_MAX_DEVICES];
	_Atomic uint64_t *used;          /* per device, shared by all of this guest's workers (in stats) */
	_Atomic uint64_t (*charged)[VG_MAX_DEVICES]; /* per channel's worker, shared (quota.c) */
	_Atomic uint64_t (*ahead)[VG_MAX_DEVICES];   /* per channel's worker, shared: how far its charge may
	                                              * be ahead of what it holds (quota.c: bounds not yet
	                                              * read, pieces of pages freed) */
	/* per channel: its worker is counted in the GPU's scheduler slot; whoever clears it (the
	 * worker leaving, or the supervisor reaping it) counts it out, once */
	_Atomic uint32_t (*sched_joined)[VG_MAX_DEVICES];
	struct vh_shared *shared;
	int broker;                      /* a worker's socket to its supervisor, which holds exported
					  * VMM handles' descriptors (ipc.c, supervisor.c); -1 elsewhere */
	const struct vh_clock *clock;    /* how the quota waits (vh_real_clock but in unit tests) */
	uint64_t ctx_reserve;            /* a context's charge where the driver cannot be measured */
	const char *oom_script;          /* run with the guest's identity when it is refused memory */
	struct vmgpu_stats_page *stats;         /* shared by the workers; a file if --stats is given */
	struct vg_dev_info info[VG_MAX_DEVICES];
	int driver_version;
	const char *guest;
	int verbose;
	char image_dir[256];      /* module images by content, shared by the workers (images.c) */
	struct vh_sched sched[VG_MAX_DEVICES]; /* each GPU's compute scheduler (vh_sched.c) */
	int sm_partitions;        /* under shared, a guest's work on the SMs its slot's span names (partition.c);
	                           * -1 (auto) until a worker knows whether it is an MPS client */
	int mps;                  /* --mps: whose processes are MPS clients (VH_MPS_*) */
	const char *mps_dir;      /* --mps DIR, the clients' CUDA_MPS_PIPE_DIRECTORY */
	int sched_depth;          /* --sched-depth: a process's unfinished calls on a shared GPU (sched_depth.c) */
	int yield_depth;          /* --yield-depth: the same, under shared, near a higher guest at work (0: none) */
	int mps_priority;         /* --mps-priority: what each worker's MPS client priority is (VH_MPS_PRIO_*) */
	int high_opt[VG_MAX_DEVICES]; /* --priority high on that GPU (auto, where no page says: --no-sched) */
};

/* --mps and --mps-when: no process is an MPS client, every one is, or one that starts while one of
 * its GPUs' policy is shared (vh_mps_client) */
enum { VH_MPS_NEVER, VH_MPS_ALWAYS, VH_MPS_SHARED };

/* CUDA_MPS_PIPE_DIRECTORY of a process that is no MPS client: a name no one can make (nothing can be
 * created in /proc), so no control daemon is found there, whoever started one where */
#define VH_NO_MPS_DIR "/proc/vmgpu-no-mps"

/* --mps-priority (without --mps: driver, nothing is set) */
enum { VH_MPS_PRIO_DRIVER, VH_MPS_PRIO_AUTO, VH_MPS_PRIO_NORMAL, VH_MPS_PRIO_BELOW };

/* A GPU's UUID as NVML and nvidia-smi write it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
static inline void vh_uuid_str(const uint8_t u[16], char *out, size_t len)
{
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

#endif
