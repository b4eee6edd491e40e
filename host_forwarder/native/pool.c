/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream-ordered allocation and memory pools, charged to the quota (quota.c).  A pool must be
 * this guest process's alone: no exportable handle types.
 */
#include "channel.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

static int capturing(struct vh_chan *ch, CUstream s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	return ch->backend->cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult alloc_async(struct vh_chan *ch, CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s,
			    const char *call)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!dptr || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* under capture this makes a graph memory node: charged when the graph is instantiated */
	uint64_t est = capturing(ch, s) ? 0 : vh_quota_rounded(n);
	if (vh_quota_take_begin(ch, dev, est, call))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pool ? B->cuMemAllocFromPoolAsync(dptr, n, pool, s) : B->cuMemAllocAsync(dptr, n, s);
	if (r == CUDA_SUCCESS && !vh_alloc_track(ch, *dptr, est, dev, VH_MEM_ASYNC)) {
		B->cuMemFreeAsync(*dptr, s);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (r == CUDA_SUCCESS && vh_addr_add(ch, *dptr, n, VH_SPAN_MEM, NULL)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, *dptr, 1u << VH_MEM_ASYNC));
		B->cuMemFreeAsync(*dptr, s);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_take_end(ch, dev, est, r)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, *dptr, 1u << VH_MEM_ASYNC));
		vh_addr_remove(ch, *dptr, VH_SPAN_MEM);
		/* give the pool's growth back now: free, wait, trim */
		B->cuMemFreeAsync(*dptr, s);
		B->cuStreamSynchronize(s);
		CUmemoryPool p = pool;
		if (p || B->cuDeviceGetMemPool(&p, ch->fwd->dev[dev]) == CUDA_SUCCESS)
			B->cuMemPoolTrimTo(p, 0);
		return vh_quota_take_undo(ch, dev, est, call);
	}
	return vh_quota_card_full(ch, dev, r, call, est);
}

CUresult guarded_cuMemAllocAsync(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(ch, dptr, bytesize, NULL, hStream, "cuMemAllocAsync");
}

CUresult guarded_cuMemAllocFromPoolAsync(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				     CUstream hStream)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_async(ch, dptr, bytesize, pool, hStream, "cuMemAllocFromPoolAsync");
}

CUresult guarded_cuMemFreeAsync(struct vh_chan *ch, CUdeviceptr dptr, CUstream hStream)
{
	struct vh_alloc *a = vh_alloc_find(ch, dptr, 1u << VH_MEM_ASYNC | 1u << VH_MEM);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemFreeAsync(dptr, hStream);
	if (r != CUDA_SUCCESS)
		return r;
	vh_addr_remove(ch, dptr, VH_SPAN_MEM);
	int dev = a->dev;
	uint64_t charge = a->size;
	vh_alloc_untrack(ch, a);
	/* the pool gives memory back at a later synchronisation: measured at the next call that
	 * takes memory; the estimate, where nothing is measured, goes now */
	if (!vh_quota_measured(ch))
		vh_quota_release(ch, dev, charge);
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemPoolCreate(struct vh_chan *ch, CUmemoryPool *pool, const CUmemPoolProps *props)
{
	if (!pool || !props)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemPoolProps p = *props;
	/* no exportable handles: a pool's memory is this guest process's alone */
	if (p.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || p.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (vh_location_in(ch, &p.location))
		return CUDA_ERROR_INVALID_DEVICE;
	p.win32SecurityAttributes = NULL;
	return ch->backend->cuMemPoolCreate(pool, &p);
}

/* The guest GPU whose quota a pool's change goes to: the current one (pools are per GPU). */
static int pool_dev(struct vh_chan *ch, CUmemoryPool pool)
{
	(void)pool;
	return ch->cur_dev >= 0 ? ch->cur_dev : 0;
}

CUresult guarded_cuMemPoolDestroy(struct vh_chan *ch, CUmemoryPool pool)
{
	CUresult r = ch->backend->cuMemPoolDestroy(pool);
	if (r == CUDA_SUCCESS)
		vh_quota_given_back(ch, pool_dev(ch, pool), 0);
	return r;
}

CUresult guarded_cuMemPoolTrimTo(struct vh_chan *ch, CUmemoryPool pool, size_t keep)
{
	CUresult r = ch->backend->cuMemPoolTrimTo(pool, keep);
	if (r == CUDA_SUCCESS)
		vh_quota_given_back(ch, pool_dev(ch, pool), 0);
	return r;
}

/* A pool attribute set (its value decoded and sized by [sizes] in api.toml): a lower release
 * threshold can free memory, which the quota is given back. */
CUresult guarded_cuMemPoolSetAttribute(struct vh_chan *ch, CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	CUresult r = ch->backend->cuMemPoolSetAttribute(pool, attr, value);
	if (r == CUDA_SUCCESS)
		vh_quota_given_back(ch, pool_dev(ch, pool), 0);
	return r;
}
