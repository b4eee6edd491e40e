/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SM partitions (partition.c): under the shared policy, while another guest of its priority or
 * above is at work, a guest's work runs on the span of the GPU's SMs the share controller gives it
 * (its slot's sm_part), so that guests run side by side on SMs of their own (as MPS clients)
 * instead of taking the whole GPU in turns; alone, it has the whole GPU again.
 *
 * A span is groups [lo, hi) of the GPU's SMs split into groups of the size the driver co-schedules
 * (cuDevSmResourceSplitByCount; 8 SMs on an H100 or H200, whose 132 SMs made 16 groups and 4 left
 * over on an H200, 15 and 12 on an H100 with driver 580; those left over go with the last group).  The page's span word gives each end in sixteenths of a
 * group: an end at n + f/16 is at n + 1 for the first f/16 of each period and at n for the rest,
 * so that a share between two whole groups is kept on average; neighbours' ends round alike at the
 * same moment, so their spans stay apart (sched_span_now, sched_policy.c).
 *
 * How the work gets there: the green context of the span (made at its first use, charged to the
 * quota first: context.c), and for each of the guest's streams a twin stream in it
 * (cuGreenCtxStreamCreate); a default stream's work runs with the green context current (its own
 * default streams).  A stream's work moves between itself and its twin only at a call that puts
 * work on it, after an event recorded on where it went last, so its order holds; calls that wait
 * for a stream's work (synchronise, query, record an event, wait for one) go where its work last
 * went, which comes after all of it.  Nothing moves while a stream capture is open; a stream a
 * capture begins on, and one a cooperative launch goes to, go home first.
 *
 * A blocking stream (made without CU_STREAM_NON_BLOCKING) has an implicit order with the legacy
 * stream that the driver keeps only within one context: each waits for what was put on the other
 * before.  Where the two run in different contexts (either on a span), that order is kept by
 * events, lazily: work on a blocking stream first waits for the legacy stream's work if there was
 * any since it last did; a call on the legacy stream (work, or any other: a synchronisation then
 * covers the blocking streams' work too) first waits for the blocking streams that had work since
 * it last did (those waits only ever point to work put there earlier, so they add no cycle).  No
 * event of ours is recorded on or waited for in a stream being captured, nor on the process's own
 * legacy stream while any capture is open (a capture on a blocking stream of that context would
 * take it in); what was not waited for then is waited for at the next call after.
 *
 * A process whose green context does not fit its quota is not partitioned: it stays on the whole
 * GPU, and the guest's slot says so (whole_ms), so that the share controller holds the guests by
 * time instead.
 */
#ifndef VH_PARTITION_H
#define VH_PARTITION_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;
struct vh_handle;

#define VH_PART_GROUPS 64 /* at most this many groups of SMs (an H200 has 16) */
#define VH_PART_GREENS 6  /* green contexts a worker keeps per GPU (a span dithers between two) */
#define VH_PART_UNFENCED 8 /* blocking streams with work the legacy stream waits for, kept by name */

struct vh_green {
	uint32_t span; /* lo << 8 | hi, whole groups */
	CUgreenCtx g;
	CUcontext c;
	uint64_t used; /* the worker's call count when work last went to it (the least recent goes first) */
	uint64_t charge;
};

/* A worker's partitions on one GPU. */
struct vh_part {
	int state;  /* 0 not looked at, 1 can partition, -1 cannot (or may not) */
	int groups; /* G */
	CUdevResource group[VH_PART_GROUPS], rest; /* the split, and the SMs left over */
	int has_rest;
	struct vh_green green[VH_PART_GREENS];
	int ngreen;
	uint32_t null_on; /* the span the default streams' work last went to (0: the whole GPU) */
	CUevent ev[2];    /* for the order across a move (default and per-thread streams) */
	uint64_t legacy_gen;   /* calls that put something on the legacy stream so far */
	uint64_t legacy_green; /* legacy_gen at the last of them on a span */
	/* the handle indices of blocking streams marked with work the legacy stream has not waited
	 * for (the first VH_PART_UNFENCED; more: every stream is looked at) */
	uint32_t unfenced[VH_PART_UNFENCED], nunfenced;
	uint64_t kept; /* waits put in for that order (said when the process's context goes) */
};

/* After the process's context on dev is made: the GPU's SMs split into groups, and their number
 * published on the GPU's scheduler page (where this forwarder partitions: --sm-partitions). */
void vh_part_setup(struct vh_chan *ch, int dev);
/* Before the process's context on dev goes: every twin and green context there destroyed. */
void vh_part_drop(struct vh_chan *ch, int dev);
/* The real stream a guest stream's call goes to: for a call that puts work on it (work), moved to
 * the span its GPU's scheduler gives now if that changed; else where its work last went.  A call
 * that begins a stream capture, or a cooperative launch (ch->part_home), moves it home first. */
CUstream vh_part_stream(struct vh_chan *ch, struct vh_handle *e, int work);
/* A stream the guest just made: one made without CU_STREAM_NON_BLOCKING is marked blocking (its
 * order with the legacy stream is kept as above). */
void vh_part_stream_made(struct vh_chan *ch, struct vh_handle *e);
/* A stream the guest destroys, before the driver does: the legacy stream waits for its work if it
 * had to (as it would have in one context). */
void vh_part_stream_ends(struct vh_chan *ch, struct vh_handle *e);
/* A call on a default stream of the current GPU (or on none: the legacy stream): the green context
 * of the span its work goes to made current (moved first, as above, if work); vh_part_after makes
 * the process's own context current again after the call. */
void vh_part_default(struct vh_chan *ch, int work);
void vh_part_after(struct vh_chan *ch);
/* A stream the guest destroyed: its twin goes too. */
void vh_part_forget(struct vh_chan *ch, struct vh_handle *e);

#endif
