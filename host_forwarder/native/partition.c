/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SM partitions: a guest's work on the span of SMs its scheduler gives it (partition.h).
 */
#include <stdlib.h>

#include "channel.h"
#include "context.h"
#include "log.h"
#include "partition.h"
#include "process.h"
#include "quota.h"
#include "vg_kinds.h"
#include "vh_dispatch.h"
#include "vh_sched.h"
#include "vmgpu/shm.h"

static struct vh_part *part_of(struct vh_chan *ch, int dev)
{
	return dev >= 0 && dev < ch->fwd->ndev ? ch->part[dev] : NULL;
}

/* The GPU a stream's work goes to: the one it was made on. */
static int stream_dev(struct vh_chan *ch, const struct vh_handle *e)
{
	return e->dev >= 0 ? e->dev : ch->cur_dev;
}

enum { VH_PART_WHERE, VH_PART_WORK, VH_PART_HOME };

/* Whether a call in this mode may move work that is not where it should be now: not while a
 * stream capture is open (its work stays where it began), but for the stream a capture begins on,
 * which goes home first.  A call
 * whose work is then not where its span says tells the share controller (vh_sched.h, part_stuck),
 * as a process that is not partitioned does. */
static void off_span(struct vh_chan *ch, int dev)
{
	atomic_store_explicit(&ch->fwd->sched[dev].part_stuck, vmgpu_now_ns(), memory_order_relaxed);
}

static int may_move(struct vh_chan *ch, int dev, int mode)
{
	if (atomic_load(&open_captures) == 0 || (mode == VH_PART_HOME && vh_op_begins_capture(ch->cur_op)))
		return 1;
	off_span(ch, dev);
	return 0;
}

static CUcontext ctx_of(struct vh_chan *ch, int dev, uint32_t span)
{
	struct vh_part *p = ch->part[dev];
	for (int i = 0; span && i < p->ngreen; i++)
		if (p->green[i].span == span)
			return p->green[i].c;
	return ch->ctx[dev];
}

/* The default streams' work moves to span `want` (context `to`): the new context's legacy stream
 * and this thread's own wait first for what was put on those of the context their work went to. */
static void move_default(struct vh_chan *ch, int dev, uint32_t want, CUcontext to)
{
	const struct vh_backend *B = ch->backend;
	struct vh_part *p = ch->part[dev];
	B->cuCtxSetCurrent(ctx_of(ch, dev, p->null_on));
	B->cuEventRecord(p->ev[0], CU_STREAM_LEGACY);
	B->cuEventRecord(p->ev[1], CU_STREAM_PER_THREAD);
	B->cuCtxSetCurrent(to);
	B->cuStreamWaitEvent(CU_STREAM_LEGACY, p->ev[0], 0);
	B->cuStreamWaitEvent(CU_STREAM_PER_THREAD, p->ev[1], 0);
	vh_context_back(ch);
	p->null_on = want;
}

/* Partitioning stops for this process on dev (and says why, once): its default streams' work goes
 * back to the whole GPU now, each stream's at its next call; and the GPU's scheduler tells the
 * share controller, which then holds the guests by time (vh_sched.h, part_off). */
static void refuse(struct vh_chan *ch, int dev, const char *why)
{
	struct vh_part *p = part_of(ch, dev);
	if (!p || p->state != 1)
		return;
	p->state = -1;
	if (p->null_on)
		move_default(ch, dev, 0, ch->ctx[dev]);
	atomic_store(&ch->fwd->sched[dev].part_off, 1);
	vh_log("channel %u: GPU %d: the guest process's work stays on the whole GPU: %s", ch->index, dev, why);
}

/* Whether the GPU's SMs split into groups here (p->group, p->rest), with the events for moves. */
static int split(struct vh_chan *ch, int dev, struct vh_part *p)
{
	const struct vh_backend *B = ch->backend;
	CUdevResource all;
	unsigned int n = VH_PART_GROUPS;
	if (B->cuDeviceGetDevResource(ch->fwd->dev[dev], &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS ||
	    !all.sm.smCoscheduledAlignment)
		return 0; /* (an older driver: no green contexts) */
	/* as many groups of the co-scheduled size as there are, the rest left over */
	if (B->cuDevSmResourceSplitByCount(NULL, &n, &all, NULL, 0, all.sm.smCoscheduledAlignment) != CUDA_SUCCESS ||
	    n < 2 || n > VH_PART_GROUPS)
		return 0;
	if (B->cuDevSmResourceSplitByCount(p->group, &n, &all, &p->rest, 0, all.sm.smCoscheduledAlignment) !=
	    CUDA_SUCCESS)
		return 0;
	p->groups = (int)n;
	p->has_rest = p->rest.type == CU_DEV_RESOURCE_TYPE_SM && p->rest.sm.smCount > 0;
	B->cuCtxSetCurrent(ch->ctx[dev]);
	int ok = B->cuEventCreate(&p->ev[0], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
		 B->cuEventCreate(&p->ev[1], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
	vh_context_back(ch);
	return ok;
}

void vh_part_setup(struct vh_chan *ch, int dev)
{
	if (!ch->fwd->sm_partitions || ch->part[dev])
		return;
	struct vh_part *p = calloc(1, sizeof *p);
	if (!p) {
		atomic_store(&ch->fwd->sched[dev].part_off, 1);
		return;
	}
	ch->part[dev] = p;
	p->state = split(ch, dev, p) ? 1 : -1;
	if (p->state != 1) {
		atomic_store(&ch->fwd->sched[dev].part_off, 1); /* (its work keeps to no span) */
		return;
	}
	struct vmgpu_sched_page *pg = ch->fwd->sched[dev].pg;
	if (pg)
		atomic_store(&pg->sm_groups, (uint32_t)p->groups);
}

/* A green context this worker keeps on dev goes (its streams' twins first): the least recently
 * used that no work is on now; 0 if work is on every one. */
static int evict(struct vh_chan *ch, int dev)
{
	struct vh_part *p = ch->part[dev];
	struct vh_green *old = NULL;
	for (int i = 0; i < p->ngreen; i++) {
		struct vh_green *c = &p->green[i];
		int busy = c->span == p->null_on;
		for (uint32_t j = 0; !busy && j < ch->nh; j++)
			busy = ch->h[j].kind == VG_KIND_STREAM && ch->h[j].on_span == c->span &&
			       stream_dev(ch, &ch->h[j]) == dev;
		if (!busy && (!old || c->used < old->used))
			old = c;
	}
	if (!old)
		return 0;
	for (uint32_t j = 0; j < ch->nh; j++)
		if (ch->h[j].kind == VG_KIND_STREAM && ch->h[j].twin && ch->h[j].twin_span == old->span &&
		    stream_dev(ch, &ch->h[j]) == dev)
			vh_part_forget(ch, &ch->h[j]); /* (no work is on it: checked above) */
	int began = vh_quota_call_begin_if_out(ch); /* (memory given back: a call, as every one that frees) */
	vh_green_drop(ch, dev, old->g, old->c, old->charge, 1);
	vh_quota_call_end_if(ch, began);
	*old = p->green[--p->ngreen];
	return 1;
}

/* The green context of span (lo << 8 | hi), made and charged at its first use; NULL if it cannot
 * be now (a span this process's split does not have, or work on every one it keeps), or at all
 * (partitioning then stops for the process on dev). */
static struct vh_green *green_of(struct vh_chan *ch, int dev, uint32_t span)
{
	struct vh_part *p = ch->part[dev];
	uint64_t now = atomic_load_explicit(&ch->ncalls, memory_order_relaxed);
	for (int i = 0; i < p->ngreen; i++)
		if (p->green[i].span == span) {
			p->green[i].used = now;
			return &p->green[i];
		}
	unsigned lo = span >> 8, hi = span & 0xff;
	if (lo >= hi || hi > (unsigned)p->groups)
		return NULL;
	if (p->ngreen == VH_PART_GREENS && !evict(ch, dev))
		return NULL;
	CUdevResource use[VH_PART_GROUPS + 1];
	unsigned n = 0;
	for (unsigned i = lo; i < hi; i++)
		use[n++] = p->group[i];
	if (hi == (unsigned)p->groups && p->has_rest)
		use[n++] = p->rest; /* (the SMs left over go with the last group) */
	struct vh_green *gr = &p->green[p->ngreen];
	int began = vh_quota_call_begin_if_out(ch); /* (memory taken: a call, so the refresh's reading is not) */
	CUresult r = vh_green_make(ch, dev, use, n, &gr->g, &gr->c, &gr->charge);
	vh_quota_call_end_if(ch, began);
	if (r != CUDA_SUCCESS) {
		refuse(ch, dev,
		       r == CUDA_ERROR_OUT_OF_MEMORY ? "its SM partition does not fit its memory quota"
						     : "the driver would not make its SM partition");
		return NULL;
	}
	gr->span = span;
	gr->used = now;
	p->ngreen++;
	return gr;
}

/* The span work on dev goes to now: the scheduler's, where this process may be partitioned. */
static uint32_t wanted(struct vh_chan *ch, int dev)
{
	struct vh_part *p = part_of(ch, dev);
	if (!p || p->state != 1)
		return 0;
	return atomic_load_explicit(&ch->fwd->sched[dev].part, memory_order_relaxed);
}

/* Work on `to` waits for what was put on `from` so far (ev: an event of the process's context);
 * the first failure of the two calls, if any. */
static CUresult order(struct vh_chan *ch, CUevent ev, CUstream from, CUstream to)
{
	const struct vh_backend *B = ch->backend;
	CUresult r = B->cuEventRecord(ev, from), w = B->cuStreamWaitEvent(to, ev, 0);
	return r != CUDA_SUCCESS ? r : w;
}

/* What a call does to where its stream's work goes: nothing (it waits for that work, or asks of
 * the stream), follow the span (it puts work there), or go home to the whole GPU first (a capture
 * begins there, whose graph must not be a green context's, which may go before it; or a
 * cooperative launch, sized for the whole GPU). */
static int mode_of(struct vh_chan *ch, int work)
{
	if (vh_op_begins_capture(ch->cur_op) || ch->part_home)
		return VH_PART_HOME;
	return work ? VH_PART_WORK : VH_PART_WHERE;
}

/* Whether the call's work goes home (mode_of).  A cooperative launch's work is then off the span
 * it was given (a capture's begin puts none there): the share controller is told, and a guest of a
 * lower priority waits in its ring while a higher one works (sched_page.c). */
static int going_home(struct vh_chan *ch, int dev, int mode)
{
	if (mode != VH_PART_HOME)
		return 0;
	if (ch->part_home && wanted(ch, dev))
		off_span(ch, dev);
	return 1;
}

/* The context that is current for the call being served, current again (after a wait put in). */
static void current_again(struct vh_chan *ch)
{
	struct vh_part *p = part_of(ch, ch->cur_dev);
	if (ch->part_green && p && p->null_on)
		ch->backend->cuCtxSetCurrent(ctx_of(ch, ch->cur_dev, p->null_on));
	else
		vh_context_back(ch);
}

/* Whether a wait may be put on the legacy stream of the context its work goes to now: on a green
 * context's always (it has no blocking stream, so it joins no capture); on the process's own only
 * while no stream capture is open (one on a blocking stream of that context would take it in). */
static int legacy_free(const struct vh_part *p)
{
	return p->null_on || atomic_load(&open_captures) == 0;
}

/* Whether stream s is being captured (one the driver cannot say of is taken as captured): no
 * event of ours is recorded on it or waited for in it then. */
static int capturing(struct vh_chan *ch, CUstream s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	return ch->backend->cuStreamIsCapturing(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Work about to go on blocking stream e (now on its real stream s) waits for the legacy stream's
 * work since it last did, and is work the legacy stream's next work waits for (partition.h).
 * Where both are in the process's own context, and the legacy stream did no work on a span since
 * e last waited, the driver keeps the order itself. */
static void blocking_work(struct vh_chan *ch, int dev, struct vh_part *p, struct vh_handle *e, CUstream s)
{
	const struct vh_backend *B = ch->backend;
	if (!e->unfenced) {
		e->unfenced = 1;
		if (p->nunfenced < VH_PART_UNFENCED)
			p->unfenced[p->nunfenced] = (uint32_t)(e - ch->h);
		if (p->nunfenced <= VH_PART_UNFENCED)
			p->nunfenced++; /* (past the names: every stream is looked at) */
	}
	e->twin_work |= e->on_span != 0;
	if (e->legacy_seen == p->legacy_gen)
		return;
	if (e->on_span || p->null_on || p->legacy_green > e->legacy_seen) {
		if (!legacy_free(p) || capturing(ch, s))
			return; /* (left to its next call) */
		B->cuCtxSetCurrent(ctx_of(ch, dev, p->null_on));
		CUresult r = order(ch, p->ev[0], CU_STREAM_LEGACY, s);
		current_again(ch);
		if (r != CUDA_SUCCESS)
			return;
		p->kept++;
	}
	e->legacy_seen = p->legacy_gen;
}

/* The legacy stream's next work (its context current) waits for blocking stream e's so far; 0 if
 * it cannot now (e is marked still). */
static int legacy_waits_for(struct vh_chan *ch, struct vh_part *p, struct vh_handle *e)
{
	CUstream s = e->on_span ? e->twin : e->ptr;
	if (e->on_span || e->twin_work || p->null_on) {
		if (!legacy_free(p) || capturing(ch, s) || order(ch, p->ev[0], s, CU_STREAM_LEGACY) != CUDA_SUCCESS)
			return 0;
		p->kept++;
	}
	e->unfenced = e->twin_work = 0;
	return 1;
}

/* A call about to go on the legacy stream of dev (its context current): it waits for each blocking
 * stream's work since it last did (partition.h); queued: it puts something there. */
static void legacy_work(struct vh_chan *ch, int dev, struct vh_part *p, int queued)
{
	if (queued) {
		p->legacy_gen++;
		if (p->null_on)
			p->legacy_green = p->legacy_gen;
	}
	if (!p->nunfenced)
		return;
	int named = p->nunfenced <= VH_PART_UNFENCED; /* (else every stream is looked at) */
	uint32_t n = named ? p->nunfenced : ch->nh, left = 0;
	for (uint32_t j = 0; j < n; j++) {
		uint32_t i = named ? p->unfenced[j] : j;
		struct vh_handle *e = i < ch->nh ? &ch->h[i] : NULL;
		/* (one destroyed since, or its slot reused, is no longer marked) */
		if (e && e->ptr && e->kind == VG_KIND_STREAM && e->unfenced && stream_dev(ch, e) == dev &&
		    !legacy_waits_for(ch, p, e))
			left++;
	}
	p->nunfenced = left ? VH_PART_UNFENCED + 1 : 0; /* (those left: looked for among all next time) */
}

/* Whether the call being served names the legacy stream (not the per-thread one). */
static int on_legacy(const struct vh_chan *ch)
{
	uint64_t s = ch->work_stream_id;
	return s == (uint64_t)(uintptr_t)CU_STREAM_LEGACY || (s == 0 && !(ch->cur_flags & VG_F_PTDS));
}

/* Whether the call being served queues something on its stream (work, or an async call: an event
 * recorded, a wait for one), which a blocking stream's order covers. */
static int queues(const struct vh_chan *ch, int work)
{
	return work || vh_op_async(ch->cur_op);
}

/* Where a stream's work goes now (vh_part_stream, but for a blocking stream's order). */
static CUstream place(struct vh_chan *ch, struct vh_handle *e, struct vh_part *p, int dev, int mode)
{
	const struct vh_backend *B = ch->backend;
	CUstream cur = e->on_span ? e->twin : e->ptr;
	if (!p || mode == VH_PART_WHERE)
		return cur;
	uint32_t want = going_home(ch, dev, mode) ? 0 : wanted(ch, dev);
	if (want == e->on_span || !may_move(ch, dev, mode))
		return cur;
	CUstream next = e->ptr;
	void *dead = NULL;
	if (want) {
		struct vh_green *gr = green_of(ch, dev, want);
		if (!gr || p->state != 1) {
			off_span(ch, dev);
			return cur;
		}
		if (e->twin_span != want) {
			int prio = 0;
			CUstream t = NULL;
			B->cuStreamGetPriority(e->ptr, &prio);
			if (B->cuGreenCtxStreamCreate(&t, gr->g, CU_STREAM_NON_BLOCKING, prio) != CUDA_SUCCESS) {
				off_span(ch, dev);
				return cur;
			}
			dead = e->twin; /* (destroyed once the move is queued: work on it may still run) */
			e->twin = t;
			e->twin_span = want;
		}
		next = e->twin;
	}
	order(ch, p->ev[0], cur, next);
	if (dead)
		B->cuStreamDestroy_v2(dead); /* (the driver lets queued work finish first) */
	e->on_span = want;
	return next;
}

CUstream vh_part_stream(struct vh_chan *ch, struct vh_handle *e, int work)
{
	int mode = mode_of(ch, work), dev = stream_dev(ch, e);
	struct vh_part *p = part_of(ch, dev);
	CUstream s = place(ch, e, p, dev, mode);
	if (p && e->blocking && queues(ch, work))
		blocking_work(ch, dev, p, e, s);
	return s;
}

void vh_part_stream_made(struct vh_chan *ch, struct vh_handle *e)
{
	struct vh_part *p = part_of(ch, stream_dev(ch, e));
	unsigned int fl = 0;
	if (!p)
		return;
	/* (one the driver cannot say of is taken as blocking) */
	e->blocking = ch->backend->cuStreamGetFlags(e->ptr, &fl) != CUDA_SUCCESS || !(fl & CU_STREAM_NON_BLOCKING);
}

void vh_part_stream_ends(struct vh_chan *ch, struct vh_handle *e)
{
	int dev = stream_dev(ch, e);
	struct vh_part *p = part_of(ch, dev);
	if (!p || !e->blocking || !e->unfenced)
		return;
	ch->backend->cuCtxSetCurrent(ctx_of(ch, dev, p->null_on));
	legacy_waits_for(ch, p, e); /* (where it cannot now, as where the driver would not order it) */
	current_again(ch);
}

void vh_part_default(struct vh_chan *ch, int work)
{
	int mode = mode_of(ch, work);
	int dev = ch->cur_dev;
	struct vh_part *p = part_of(ch, dev);
	if (!p)
		return;
	if (mode != VH_PART_WHERE) {
		uint32_t want = going_home(ch, dev, mode) ? 0 : wanted(ch, dev);
		if (want != p->null_on && may_move(ch, dev, mode)) {
			struct vh_green *gr = want ? green_of(ch, dev, want) : NULL;
			if (!want || (gr && p->state == 1))
				move_default(ch, dev, want, gr ? gr->c : ch->ctx[dev]);
			else
				off_span(ch, dev);
		}
	}
	if (p->null_on) {
		ch->backend->cuCtxSetCurrent(ctx_of(ch, dev, p->null_on));
		ch->part_green = 1;
	}
	if (on_legacy(ch))
		legacy_work(ch, dev, p, queues(ch, work));
}

void vh_part_after(struct vh_chan *ch)
{
	if (!ch->part_green)
		return;
	ch->part_green = 0;
	vh_context_back(ch);
}

void vh_part_forget(struct vh_chan *ch, struct vh_handle *e)
{
	if (e->kind != VG_KIND_STREAM || !e->twin)
		return;
	/* (no work is on it but what may run to its end: the stream was destroyed, its work is on another
	 * span, or the context goes; the driver lets queued work finish first) */
	ch->backend->cuStreamDestroy_v2(e->twin);
	if (e->on_span == e->twin_span)
		e->on_span = 0;
	e->twin = NULL;
	e->twin_span = 0;
}

void vh_part_drop(struct vh_chan *ch, int dev)
{
	struct vh_part *p = part_of(ch, dev);
	if (!p)
		return;
	const struct vh_backend *B = ch->backend;
	for (uint32_t i = 0; i < ch->nh; i++) {
		struct vh_handle *e = &ch->h[i];
		if (e->kind == VG_KIND_STREAM && stream_dev(ch, e) == dev)
			vh_part_forget(ch, e); /* (the context goes: its twins with it) */
	}
	for (int i = 0; i < p->ngreen; i++)
		vh_green_drop(ch, dev, p->green[i].g, p->green[i].c, p->green[i].charge, 0);
	for (int i = 0; i < 2; i++)
		if (p->ev[i])
			B->cuEventDestroy_v2(p->ev[i]);
	if (p->kept)
		vh_log("channel %u: GPU %d: %llu waits kept its blocking streams in order with the legacy stream "
		       "across SM partitions",
		       ch->index, dev, (unsigned long long)p->kept);
	free(p);
	ch->part[dev] = NULL;
}
