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
#include "vg_kinds.h"
#include "vh_sched.h"

static struct vh_part *part_of(struct vh_chan *ch, int dev)
{
	return dev >= 0 && dev < ch->fwd->ndev ? ch->part[dev] : NULL;
}

/* Partitioning stops for this process on dev (and says why, once): its work goes back to the
 * whole GPU at its next call on each stream. */
static void refuse(struct vh_chan *ch, int dev, const char *why)
{
	struct vh_part *p = part_of(ch, dev);
	if (p && p->state == 1) {
		p->state = -1;
		vh_log("channel %u: GPU %d: the guest process's work stays on the whole GPU: %s", ch->index, dev, why);
	}
}

void vh_part_setup(struct vh_chan *ch, int dev)
{
	const struct vh_backend *B = ch->backend;
	if (!ch->fwd->sm_partitions || ch->part[dev])
		return;
	struct vh_part *p = calloc(1, sizeof *p);
	if (!p)
		return;
	ch->part[dev] = p;
	p->state = -1;
	CUdevResource all;
	unsigned int n = VH_PART_GROUPS;
	if (B->cuDeviceGetDevResource(ch->fwd->dev[dev], &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS ||
	    !all.sm.smCoscheduledAlignment)
		return; /* (an older driver: no green contexts) */
	/* as many groups of the co-scheduled size as there are, the rest left over */
	if (B->cuDevSmResourceSplitByCount(NULL, &n, &all, NULL, 0, all.sm.smCoscheduledAlignment) != CUDA_SUCCESS ||
	    n < 2 || n > VH_PART_GROUPS)
		return;
	if (B->cuDevSmResourceSplitByCount(p->group, &n, &all, &p->rest, 0, all.sm.smCoscheduledAlignment) !=
	    CUDA_SUCCESS)
		return;
	p->groups = (int)n;
	p->has_rest = p->rest.type == CU_DEV_RESOURCE_TYPE_SM && p->rest.sm.smCount > 0;
	CUcontext c = ch->ctx[dev];
	B->cuCtxSetCurrent(c);
	int ok = B->cuEventCreate(&p->ev[0], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
		 B->cuEventCreate(&p->ev[1], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
	B->cuCtxSetCurrent(ch->cur_dev >= 0 ? ch->ctx[ch->cur_dev] : NULL);
	if (!ok)
		return;
	p->state = 1;
	struct vmgpu_sched_page *pg = ch->fwd->sched[dev].pg;
	if (pg)
		atomic_store(&pg->sm_groups, (uint32_t)n);
}

/* The green context of span (lo << 8 | hi), made and charged at its first use; NULL if it cannot
 * be (partitioning then stops for the process on dev). */
static struct vh_green *green_of(struct vh_chan *ch, int dev, uint32_t span)
{
	struct vh_part *p = ch->part[dev];
	struct vh_green *gr = NULL;
	for (int i = 0; i < p->ngreen; i++)
		if (p->green[i].span == span)
			gr = &p->green[i];
	if (!gr) {
		if (p->ngreen == VH_PART_GREENS) {
			/* the least recently used that no work is on now goes (its twins first) */
			struct vh_green *old = NULL;
			for (int i = 0; i < p->ngreen; i++)
				if (p->green[i].span != p->null_on && (!old || p->green[i].used < old->used))
					old = &p->green[i];
			int busy = 0;
			for (uint32_t i = 0; old && i < ch->nh; i++)
				busy |= ch->h[i].kind == VG_KIND_STREAM && ch->h[i].on_span == old->span &&
					(int)ch->h[i].dev == dev;
			if (!old || busy)
				return NULL; /* (every one has work on it now: this span waits) */
			for (uint32_t i = 0; i < ch->nh; i++)
				if (ch->h[i].kind == VG_KIND_STREAM && ch->h[i].twin && ch->h[i].twin_span == old->span)
					vh_part_forget(ch, &ch->h[i]);
			vh_green_drop(ch, dev, old->g, old->c, old->charge, 1);
			*old = p->green[--p->ngreen];
		}
		unsigned lo = span >> 8, hi = span & 0xff;
		if (lo >= hi || hi > (unsigned)p->groups)
			return NULL;
		CUdevResource use[VH_PART_GROUPS + 1];
		unsigned n = 0;
		for (unsigned i = lo; i < hi; i++)
			use[n++] = p->group[i];
		if (hi == (unsigned)p->groups && p->has_rest)
			use[n++] = p->rest; /* (the SMs left over go with the last group) */
		gr = &p->green[p->ngreen];
		CUresult r = vh_green_make(ch, dev, use, n, &gr->g, &gr->c, &gr->charge);
		if (r != CUDA_SUCCESS) {
			refuse(ch, dev,
			       r == CUDA_ERROR_OUT_OF_MEMORY ? "its SM partition does not fit its memory quota"
							     : "the driver would not make its SM partition");
			return NULL;
		}
		gr->span = span;
		p->ngreen++;
	}
	gr->used = atomic_load_explicit(&ch->ncalls, memory_order_relaxed);
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

/* Work on `to` waits for what was put on `from` so far (ev: an event of the process's context). */
static void order(struct vh_chan *ch, CUevent ev, CUstream from, CUstream to)
{
	const struct vh_backend *B = ch->backend;
	B->cuEventRecord(ev, from);
	B->cuStreamWaitEvent(to, ev, 0);
}

CUstream vh_part_stream(struct vh_chan *ch, struct vh_handle *e, int work)
{
	const struct vh_backend *B = ch->backend;
	CUstream cur = e->on_span ? e->twin : e->ptr;
	int dev = e->dev >= 0 ? e->dev : ch->cur_dev;
	struct vh_part *p = part_of(ch, dev);
	if (!p || !work || atomic_load(&open_captures) > 0)
		return cur; /* (no move while a capture is open: its work stays where it began) */
	uint32_t want = wanted(ch, dev);
	if (want && e->blocking < 0) {
		unsigned int fl = 0; /* (one the driver cannot say of is taken as blocking) */
		e->blocking = B->cuStreamGetFlags(e->ptr, &fl) != CUDA_SUCCESS || !(fl & CU_STREAM_NON_BLOCKING);
	}
	if (want && e->blocking == 1) {
		refuse(ch, dev, "it made a stream without CU_STREAM_NON_BLOCKING");
		want = 0;
	}
	if (want == e->on_span)
		return cur;
	CUstream next = e->ptr;
	void *dead = NULL;
	if (want) {
		struct vh_green *gr = green_of(ch, dev, want);
		if (!gr)
			return cur;
		if (e->twin_span != want) {
			int prio = 0;
			CUstream t = NULL;
			B->cuStreamGetPriority(e->ptr, &prio);
			if (B->cuGreenCtxStreamCreate(&t, gr->g, CU_STREAM_NON_BLOCKING, prio) != CUDA_SUCCESS)
				return cur;
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
	p->moves++;
	return next;
}

static CUcontext ctx_of(struct vh_chan *ch, int dev, uint32_t span)
{
	struct vh_part *p = ch->part[dev];
	for (int i = 0; span && i < p->ngreen; i++)
		if (p->green[i].span == span)
			return p->green[i].c;
	return ch->ctx[dev];
}

void vh_part_default(struct vh_chan *ch, int work)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	struct vh_part *p = part_of(ch, dev);
	if (!p)
		return;
	uint32_t want = work && atomic_load(&open_captures) == 0 ? wanted(ch, dev) : p->null_on;
	if (want != p->null_on) {
		struct vh_green *gr = want ? green_of(ch, dev, want) : NULL;
		if (!want || gr) {
			/* the default streams of the context their work went to, then the new one's wait
			 * for them: the legacy stream's and this thread's own */
			CUcontext from = ctx_of(ch, dev, p->null_on), to = gr ? gr->c : ch->ctx[dev];
			B->cuCtxSetCurrent(from);
			B->cuEventRecord(p->ev[0], CU_STREAM_LEGACY);
			B->cuEventRecord(p->ev[1], CU_STREAM_PER_THREAD);
			B->cuCtxSetCurrent(to);
			B->cuStreamWaitEvent(CU_STREAM_LEGACY, p->ev[0], 0);
			B->cuStreamWaitEvent(CU_STREAM_PER_THREAD, p->ev[1], 0);
			B->cuCtxSetCurrent(ch->ctx[dev]);
			p->null_on = want;
			p->moves++;
		}
	}
	if (p->null_on) {
		B->cuCtxSetCurrent(ctx_of(ch, dev, p->null_on));
		ch->part_green = 1;
	}
}

void vh_part_after(struct vh_chan *ch)
{
	if (!ch->part_green)
		return;
	ch->part_green = 0;
	ch->backend->cuCtxSetCurrent(ch->cur_dev >= 0 ? ch->ctx[ch->cur_dev] : NULL);
}

void vh_part_forget(struct vh_chan *ch, struct vh_handle *e)
{
	if (e->kind != VG_KIND_STREAM || !e->twin)
		return;
	/* (no work is on it: the stream was destroyed, or its work is on another span) */
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
		if (e->kind == VG_KIND_STREAM && e->twin && (e->dev == dev || (e->dev < 0 && ch->cur_dev == dev))) {
			B->cuStreamDestroy_v2(e->twin);
			e->twin = NULL;
			e->twin_span = e->on_span = 0;
		}
	}
	for (int i = 0; i < p->ngreen; i++)
		vh_green_drop(ch, dev, p->green[i].g, p->green[i].c, p->green[i].charge, 0);
	for (int i = 0; i < 2; i++)
		if (p->ev[i])
			B->cuEventDestroy_v2(p->ev[i]);
	free(p);
	ch->part[dev] = NULL;
}
