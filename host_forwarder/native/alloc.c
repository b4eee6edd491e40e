/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory by cuMemAlloc, cuMemAllocPitch and arrays, each charged to the quota (quota.c)
 * before the driver is asked, and freed only if it is this guest process's own.  The other ways
 * to take memory: pool.c (stream-ordered and pools), vmm.c (cuMemCreate and mappings),
 * graph.c (graph memory nodes), module.c (module images and their globals), context.c.
 *
 * The pattern is the same for each: reserve an estimate or refuse, make the call, let the
 * quota take the truth, and undo a call that left the guest over its quota.
 */
#include "channel.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

static CUresult alloc_common(struct vh_chan *ch, CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
			     unsigned elsz, const char *call)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t n = width, padded = width;
	if (pitch) {
		padded = (width + 511) & ~511ull; /* the H100's pitch; the quota takes the truth after */
		if (!height || padded < width || __builtin_mul_overflow(padded, height, &n))
			return CUDA_ERROR_INVALID_VALUE;
	}
	if (!dptr || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t est = vh_quota_rounded(n), bound;
	if (vh_quota_bounded_begin(ch, dev, est, call, &bound))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pitch ? B->cuMemAllocPitch_v2(dptr, pitch, width, height, elsz) : B->cuMemAlloc_v2(dptr, n);
	if (r == CUDA_SUCCESS && pitch &&
	    vh_quota_bounded_widen(ch, dev, &est, vh_quota_rounded((uint64_t)*pitch * height), &bound)) {
		/* the driver's pitch was wider than guessed, and the difference does not fit */
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS && !vh_alloc_track(ch, *dptr, est, dev, VH_MEM)) {
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (r == CUDA_SUCCESS && vh_addr_add(ch, *dptr, pitch ? (uint64_t)*pitch * height : n, VH_SPAN_MEM, NULL)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, *dptr, 1u << VH_MEM));
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_bounded_end(ch, dev, est, bound, r)) {
		B->cuMemFree_v2(*dptr);
		vh_alloc_untrack(ch, vh_alloc_find(ch, *dptr, 1u << VH_MEM));
		vh_addr_remove(ch, *dptr, VH_SPAN_MEM);
		return vh_quota_take_undo(ch, dev, est, call);
	}
	return vh_quota_card_full(ch, dev, r, call, est);
}

CUresult guarded_cuMemAlloc_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize)
{
	return alloc_common(ch, dptr, NULL, bytesize, 1, 0, "cuMemAlloc");
}

CUresult guarded_cuMemAllocPitch_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
				size_t Height, unsigned int ElementSizeBytes)
{
	if (!pPitch)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_common(ch, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, "cuMemAllocPitch");
}

CUresult guarded_cuMemFree_v2(struct vh_chan *ch, CUdeviceptr dptr)
{
	if (dptr == 0)
		return CUDA_SUCCESS; /* freeing NULL is a no-op, as in the driver */
	struct vh_alloc *a = vh_alloc_find(ch, dptr, 1u << VH_MEM | 1u << VH_MEM_ASYNC);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE; /* not an allocation of this process: the driver would say the same */
	CUresult r = ch->backend->cuMemFree_v2(dptr);
	if (r != CUDA_SUCCESS)
		return r;
	vh_addr_remove(ch, dptr, VH_SPAN_MEM); /* from now on the address names nothing */
	/* cuMemAlloc's own memory, freed now: its bounded charge goes back (a stream-ordered free gives
	 * memory back later, so vh_alloc_release measures it instead) */
	if (a->kind == VH_MEM) {
		int dev = a->dev;
		uint64_t est = a->size;
		vh_alloc_untrack(ch, a);
		vh_quota_bounded_free(ch, dev, est);
	} else {
		vh_alloc_release(ch, a);
	}
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemGetInfo_v2(struct vh_chan *ch, size_t *free_b, size_t *total_b)
{
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	size_t hw_free = 0, hw_total = 0;
	CUresult r = ch->backend->cuMemGetInfo_v2(&hw_free, &hw_total);
	if (r != CUDA_SUCCESS)
		return r;
	vh_quota_settle(ch, dev);
	uint64_t quota = ch->fwd->quota[dev];
	uint64_t used = atomic_load(&ch->fwd->used[dev]);
	uint64_t left = used < quota ? quota - used : 0;
	if (free_b)
		*free_b = left < hw_free ? left : hw_free;
	if (total_b)
		*total_b = quota;
	return CUDA_SUCCESS;
}

/* ---- arrays ---------------------------------------------------------------------- */

static uint64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
	default: return 16; /* block-compressed and packed formats: at most this per element */
	}
}

static CUresult array_create(struct vh_chan *ch, CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d, int three)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!out || !d)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = format_bytes(d->Format) * d->NumChannels, t;
	size_t dims[3] = {d->Width, d->Height ? d->Height : 1, d->Depth ? d->Depth : 1};
	for (int i = 0; i < 3; i++) {
		if (__builtin_mul_overflow(n, dims[i], &t))
			return CUDA_ERROR_INVALID_VALUE;
		n = t;
	}
	uint64_t est = vh_quota_rounded(n);
	if (vh_quota_take_begin(ch, dev, est, "cuArrayCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r;
	if (three) {
		r = B->cuArray3DCreate_v2(out, d);
	} else {
		CUDA_ARRAY_DESCRIPTOR d2 = {d->Width, d->Height, d->Format, d->NumChannels};
		r = B->cuArrayCreate_v2(out, &d2);
	}
	if (r == CUDA_SUCCESS && !vh_alloc_track(ch, (CUdeviceptr)(uintptr_t)*out, est, dev, VH_ARRAY)) {
		B->cuArrayDestroy(*out);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_take_end(ch, dev, est, r)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, (CUdeviceptr)(uintptr_t)*out, 1u << VH_ARRAY));
		B->cuArrayDestroy(*out);
		return vh_quota_take_undo(ch, dev, est, "cuArrayCreate");
	}
	return vh_quota_card_full(ch, dev, r, "cuArrayCreate", est);
}

CUresult guarded_cuArrayCreate_v2(struct vh_chan *ch, CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR d = {p->Width, p->Height, 0, p->Format, p->NumChannels, 0};
	return array_create(ch, pHandle, &d, 0);
}

CUresult guarded_cuArray3DCreate_v2(struct vh_chan *ch, CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *p)
{
	return array_create(ch, pHandle, p, 1);
}

CUresult guarded_cuArrayDestroy(struct vh_chan *ch, CUarray hArray)
{
	struct vh_alloc *a = vh_alloc_find(ch, (CUdeviceptr)(uintptr_t)hArray, 1u << VH_ARRAY);
	if (!a)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = ch->backend->cuArrayDestroy(hArray);
	if (r != CUDA_SUCCESS)
		return r;
	vh_alloc_release(ch, a);
	return CUDA_SUCCESS;
}
