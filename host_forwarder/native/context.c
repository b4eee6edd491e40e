/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A guest process's context on each of its GPUs: charged before it exists.
 *
 * A context takes device memory of its own (518 MiB on an H100 with driver 580).  A worker
 * makes none when it starts: the first call of its guest process that needs a GPU reserves
 * the context's size against the guest's quota, and only then is the context made (the
 * device's primary context, one per guest process and GPU, as natively).  Where the driver
 * can be measured the reservation is then replaced by the measurement; a context that
 * leaves the guest over its quota is destroyed again at once, so a guest process that does
 * not fit gets CUDA_ERROR_OUT_OF_MEMORY and holds nothing on the GPU.  The workers of one
 * guest make contexts one at a time (a lock shared by them), so that several processes
 * starting together cannot pass the quota between the reservation and the measurement; a
 * reservation that must wait (memory on its way back, other processes' charges not yet read) waits
 * before it takes the lock, so that processes refused together wait side by side.
 *
 * The region is registered with the driver (pinned DMA for heap and bulk copies) in the
 * first context a worker makes, and unregistered before that context goes.
 */
#include <errno.h>
#include <time.h>

#include "channel.h"
#include "context.h"
#include "log.h"
#include "meter.h"
#include "partition.h"
#include "process.h"
#include "quota.h"

static void ctx_lock(void *fwd)
{
	struct vh_fwd *f = fwd;
	if (pthread_mutex_lock(&f->shared->ctx_mu) == EOWNERDEAD)
		pthread_mutex_consistent(&f->shared->ctx_mu); /* a worker died making one: nothing to repair */
}

static void ctx_unlock(struct vh_fwd *f)
{
	pthread_mutex_unlock(&f->shared->ctx_mu);
}

/* What a context on dev is reserved before it is made: the largest one measured by any of
 * the guest's workers, or --ctx-reserve until one has been measured. */
static uint64_t estimate(struct vh_fwd *f, int dev, int measured)
{
	uint64_t seen = atomic_load(&f->shared->ctx_bytes[dev]);
	return measured && seen ? seen : f->ctx_reserve;
}

static void region_register(struct vh_chan *ch, int dev)
{
	struct vh_fwd *f = ch->fwd;
	if (f->registered)
		return;
	CUresult r = ch->backend->cuMemHostRegister_v2(f->region, f->region_size,
						       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	f->registered = r == CUDA_SUCCESS;
	f->registered_dev = dev;
	if (!f->registered) {
		const char *s = NULL;
		ch->backend->cuGetErrorName(r, &s);
		vh_log("channel %u: cannot register the region with the driver (%s); copies run at pageable speed",
		       ch->index, s ? s : "unknown CUDA error");
	}
}

static void region_unregister(struct vh_chan *ch)
{
	struct vh_fwd *f = ch->fwd;
	if (f->registered)
		ch->backend->cuMemHostUnregister(f->region);
	f->registered = 0;
}

/* Destroy the context this worker made on dev (the primary context, retained once). */
static void context_drop(struct vh_chan *ch, int dev)
{
	const struct vh_backend *B = ch->backend;
	struct vh_fwd *f = ch->fwd;
	vh_part_drop(ch, dev); /* (its green contexts hold the primary context) */
	B->cuCtxSetCurrent(ch->ctx[dev]);
	if (f->registered && f->registered_dev == dev)
		region_unregister(ch);
	B->cuCtxSetCurrent(NULL);
	/* gone for the other threads before it goes for the driver: the scheduler thread's drain
	 * counts itself in ctx_draining_on[dev] before it loads the context (worker.c: sched_drain),
	 * so one that loaded it first has finished synchronising it once that count is 0 (a context
	 * released under a synchronisation is a use after free in the driver).  Only this GPU's
	 * drains are waited for: a context dropped over the quota has no work queued, so its
	 * synchronisation ends at once; at the worker's end the scheduler threads are gone.  The
	 * quota's refresh reads it too (quota.c) */
	__atomic_store_n(&ch->ctx[dev], NULL, __ATOMIC_SEQ_CST);
	if (atomic_load(&ctx_draining_on[dev])) {
		struct timespec t = {0, 20000};
		while (atomic_load(&ctx_draining_on[dev]))
			nanosleep(&t, NULL);
		vh_log("channel %u: GPU %d: its context went once a synchronisation of it under way had ended", ch->index,
		       dev);
	}
	B->cuDevicePrimaryCtxRelease_v2(f->dev[dev]);
	vh_depth_forget(B, dev);
	if (ch->cur_dev == dev)
		ch->cur_dev = -1;
}

void vh_context_back(struct vh_chan *ch)
{
	ch->backend->cuCtxSetCurrent(ch->cur_dev >= 0 ? ch->ctx[ch->cur_dev] : NULL);
}

static CUresult context_make(struct vh_chan *ch, int dev, CUcontext *out);

CUresult vh_chan_context(struct vh_chan *ch, int dev, CUcontext *out)
{
	if (ch->ctx[dev]) {
		*out = ch->ctx[dev];
		return CUDA_SUCCESS;
	}
	/* (made in a call that may take memory, or in work for the GPU: its own call, as a peer
	 * copy naming a GPU the process had no context on, or the first work sent to one) */
	int began = vh_quota_call_begin_if_out(ch);
	CUresult r = context_make(ch, dev, out);
	vh_quota_call_end_if(ch, began);
	return r;
}

/* The worker's context on dev: the primary context, retained once, charged before it exists. */
static CUresult context_make(struct vh_chan *ch, int dev, CUcontext *out)
{
	struct vh_fwd *f = ch->fwd;
	const struct vh_backend *B = ch->backend;
	int measured = vh_meter_on(ch, dev);
	uint64_t est = estimate(f, dev, measured);
	/* (its waits for memory on its way back and for other workers' charges read come before the lock) */
	if (vh_quota_reserve_locked(ch, dev, est, ctx_lock, f)) {
		ctx_unlock(f);
		vh_oom_report(ch, dev, "context", est);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUcontext c = NULL;
	CUresult r = B->cuDevicePrimaryCtxRetain(&c, f->dev[dev]);
	if (r != CUDA_SUCCESS) {
		vh_quota_release(ch, dev, est);
		ctx_unlock(f);
		return r;
	}
	__atomic_store_n(&ch->ctx[dev], c, __ATOMIC_RELEASE); /* (the quota's refresh reads it: quota.c) */
	B->cuCtxSetCurrent(c);
	region_register(ch, dev);
	vh_context_back(ch);
	if (measured) {
		/* the reservation becomes what the driver says the worker holds now */
		int over = vh_quota_settle(ch, dev);
		uint64_t now = atomic_load(&ch->charged[dev]), seen = atomic_load(&f->shared->ctx_bytes[dev]);
		while (now > seen && !atomic_compare_exchange_weak(&f->shared->ctx_bytes[dev], &seen, now))
			;
		if (over) {
			context_drop(ch, dev);
			vh_quota_settle(ch, dev); /* back to what it held before: nothing on this GPU */
			ctx_unlock(f);
			vh_oom_report(ch, dev, "context", now);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	ctx_unlock(f);
	vh_part_setup(ch, dev);
	*out = c;
	return CUDA_SUCCESS;
}

/* What a green context is reserved before it is made where the driver cannot be measured. */
#define GREEN_RESERVE (2ull << 20)

CUresult vh_green_make(struct vh_chan *ch, int dev, CUdevResource *res, unsigned n, CUgreenCtx *g, CUcontext *c,
		       uint64_t *charge)
{
	const struct vh_backend *B = ch->backend;
	struct vh_fwd *f = ch->fwd;
	int measured = vh_meter_on(ch, dev);
	ctx_lock(f);
	/* (no wait here: the worker is in work for the GPU, through its gate or about to pass it, which
	 * a hand-over waits for) */
	if (vh_quota_reserve_here(ch, dev, GREEN_RESERVE)) {
		ctx_unlock(f);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUdevResourceDesc desc;
	*g = NULL;
	CUresult r = B->cuDevResourceGenerateDesc(&desc, res, n);
	if (r == CUDA_SUCCESS)
		r = B->cuGreenCtxCreate(g, desc, f->dev[dev], CU_GREEN_CTX_DEFAULT_STREAM);
	if (r == CUDA_SUCCESS)
		r = B->cuCtxFromGreenCtx(c, *g);
	if (r != CUDA_SUCCESS) {
		if (*g)
			B->cuGreenCtxDestroy(*g);
		vh_quota_release(ch, dev, GREEN_RESERVE);
		ctx_unlock(f);
		return r;
	}
	*charge = GREEN_RESERVE;
	if (measured && vh_quota_settle(ch, dev)) { /* (the reservation becomes what the driver says) */
		B->cuGreenCtxDestroy(*g);
		vh_quota_settle(ch, dev);
		ctx_unlock(f);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	ctx_unlock(f);
	return CUDA_SUCCESS;
}

void vh_green_drop(struct vh_chan *ch, int dev, CUgreenCtx g, CUcontext c, uint64_t charge, int sync)
{
	const struct vh_backend *B = ch->backend;
	if (sync) { /* its queued work done first (while the process lives: its own work) */
		B->cuCtxSetCurrent(c);
		B->cuCtxSynchronize();
		vh_context_back(ch);
	}
	B->cuGreenCtxDestroy(g);
	if (vh_meter_on(ch, dev))
		vh_quota_settle(ch, dev);
	else
		vh_quota_release(ch, dev, charge);
}

int vh_chan_contexts_drop(struct vh_chan *ch)
{
	int held = 0;
	for (int d = 0; d < ch->fwd->ndev; d++) {
		if (!ch->ctx[d])
			continue;
		context_drop(ch, d);
		held = 1;
	}
	return held;
}

/* Guest contexts are the primary contexts, sent as ordinal + 1 (0 = none). */
int vh_context_in(struct vh_chan *ch, CUcontext *c)
{
	uint64_t v = (uint64_t)(uintptr_t)*c;
	if (v == 0)
		return 0;
	if (v > (uint64_t)ch->fwd->ndev)
		return -1;
	return vh_chan_context(ch, (int)(v - 1), c) == CUDA_SUCCESS ? 0 : -1;
}
