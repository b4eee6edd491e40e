/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A channel being served: one guest process, in its own worker.  What the process holds is kept
 * here: its contexts, its handle table (handles.c), the records its quota follows
 * (allocations.c), the addresses it may name (addresses.c), the module image it is sending
 * (module.c).  channel.c frees all of it when the process ends.
 */
#ifndef VH_CHANNEL_H
#define VH_CHANNEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "addresses.h"
#include "allocations.h"
#include "forwarder.h"
#include "handles.h"

struct vh_image;
struct vh_part;

/* A block the guest freed, kept on the GPU for its next cuMemAlloc of the same size (alloc.c). */
struct vh_kept {
	CUdeviceptr p;
	uint64_t n, est;   /* the size asked for; what it is charged */
	uint64_t seq;      /* the channel's work_seq when it was freed */
	uint64_t at_ns;
	int dev;
};
#define VH_KEPT_MAX 16

struct vh_chan {
	struct vh_fwd *fwd;
	const struct vh_backend *backend;
	struct vmgpu_hchan *hc;
	uint32_t index;
	int cur_dev;       /* guest ordinal current on this thread, -1 none */
	/* The process's own context per device, made at first use, as a native process has:
	 * a kernel fault poisons only this context, and destroying it frees what it held. */
	CUcontext ctx[VG_MAX_DEVICES];
	CUresult latched;  /* first error of an async call, not yet reported */
	struct vh_handle *h;
	uint32_t nh, caph, free_hint;
	struct vh_alloc *allocs;
	size_t nallocs, capallocs;
	struct vh_span *spans;        /* device addresses it may name, sorted (addresses.c) */
	size_t nspans, capspans;
	uint64_t vmm_ids;             /* VMM handles given out (the guest never sees the driver's) */
	uint64_t *fn_tags;            /* driver function tags seen, by the guest-side value's index */
	uint32_t nfn_tags;
	uint8_t *alias;               /* the region mapped again at the guest's own address, or NULL */
	int alias_tried;
	_Atomic uint64_t *charged;    /* this worker's row of the quota, per device */
	pthread_mutex_t quota_mu;     /* held across a call that takes or gives memory, and a refresh */
	/* since the meter was last read (quota.c's bounded takes): bytes charged by bound rather than
	 * measured, and the takes and frees charged exactly by the driver's rounding */
	uint64_t unmeasured[VG_MAX_DEVICES];
	uint32_t unmeasured_exact[VG_MAX_DEVICES];
	_Atomic uint64_t quota_gen;   /* odd while a call that may take or give memory runs, and even
	                               * after: two a call (vh_quota_refresh) */
	pthread_t quota_owner;        /* the thread in that call (set and checked in the checked build) */
	uint8_t refresh_misses[VG_MAX_DEVICES]; /* refreshes in a row whose reading could not be taken */
	struct vh_kept kept[VH_KEPT_MAX];
	uint32_t nkept;
	uint64_t kept_bytes;          /* their charges, summed */
	uint64_t work_seq;            /* calls that may have put work on the GPU (serve.c counts them) */
	uint64_t synced_seq;          /* work_seq when the contexts were last synchronised for a kept block */
	uint8_t *blob;                /* a module image being received */
	uint64_t blob_size, blob_filled, blob_hash[2];
	struct vh_image *image;       /* or the cached image this load uses */
	uint64_t images_sent, images_cached;
	void *scratch;
	size_t scratch_cap;
	CUstream work_stream; /* the stream the call being served named last, NULL if none (sched_depth.c) */
	uint64_t work_stream_id; /* the guest's value for it (with its handle's generation) */
	/* the guest GPU whose compute scheduler let the call being served through (-1: none; -2: the
	 * GPU of the stream it names, at the stream's decode), and that decode's gate: dev the GPU
	 * the stream was made on, -1 for a default stream; nonzero refuses the stream (serve.c) */
	int gate_dev;
	uint32_t gates_more; /* the other GPUs whose gates the call holds (a graph's launch: graph_devs.h) */
	void *work_exec;     /* the executable graph the call being served named last, NULL if none */
	uint32_t cur_op;     /* the operation being served */
	uint32_t cur_flags;  /* and its header's flags (VG_F_*) */
	int (*stream_gate)(struct vh_chan *ch, int dev);
	_Atomic uint64_t ncalls; /* written by the serving thread only; read by the scheduler's */
	_Atomic int in_call;     /* 1 + the current GPU while the serving thread serves a call that puts
				  * work on the GPU or waits for its work (in the driver, at a gate or a
				  * depth), else 0: the scheduler's threads publish it (vh_sched.h, in_call) */
	uint64_t nasync;
	int end_event; /* the channel's state (VMGPU_HC_*) that ended serving */
	struct vh_texobj *texobjs;    /* texture and surface objects this process made (texture.c) */
	struct vh_part *part[VG_MAX_DEVICES]; /* its SM partitions per GPU (partition.c), or NULL */
	int part_green;               /* a green context is current for the call being served */
	int part_work;                /* the call being served puts work on the GPU (its streams may move) */
	int part_home;                /* it is a cooperative launch: its stream goes to the whole GPU (launch.c) */
	uint32_t ntexobjs, captexobjs;
};

/* A buffer of n elements of elsz bytes for one call (at most 64 MiB), or NULL. */
void *vh_scratch(struct vh_chan *ch, uint64_t n, size_t elsz);
/* Kept blocks (alloc.c): those kept over a second are given back to the driver (called while the
 * guest is quiet, under quota_mu); forget drops the table when the process's contexts go. */
void vh_kept_expire(struct vh_chan *ch, uint64_t now_ns);
void vh_kept_forget(struct vh_chan *ch);
/* Give every block kept on dev back to the driver, and its charge to the quota (1: there were
 * some): the quota does so before it refuses the guest anything on dev (quota.c). */
int vh_kept_give_back(struct vh_chan *ch, int dev);
/* Host functions (host_func.c): a thread of their own watches those in flight (one given up on
 * after the timeout); the serving thread asks whether one was, to report it. */
int vh_host_func_timed_out(void);
/* The guest process is done (its channel is reclaimed only after the worker ends): the watch
 * stops, and each function still in flight is marked done, so that no stream waits on it while
 * the contexts go. */
void vh_host_func_release_all(struct vh_chan *ch);
/* What a process that exits or dies leaves behind: free all of it (its contexts go next). */
void vh_chan_release_all(struct vh_chan *ch);

#endif
