/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory by cuMemAlloc, cuMemAllocPitch and arrays, each charged to the quota (quota.c)
 * before the driver is asked, and freed only if it is this guest process's own.  The other ways
 * to take memory: pool.c (stream-ordered and pools), vmm.c (cuMemCreate and mappings),
 * graph.c (graph memory nodes), module.c (module images and their globals), context.c.
 *
 * The pattern is the same for each: reserve an estimate or refuse, make the call, let the
 * quota take the truth, and undo a call that left the guest over its quota.
 *
 * Kept blocks.  A block of cuMemAlloc's that the guest frees is kept on the GPU, still charged
 * to the guest, for its next cuMemAlloc of the same size: programs that allocate and free per
 * step (cuBLAS and cuDNN workspaces, XLA's autotuner) then pay no driver call either way.  The
 * guest cannot name a kept block (its addresses are removed at the free), and it is only ever
 * handed to the same guest process on the same GPU.  At most VH_KEPT_MAX blocks and KEPT_BYTES
 * are kept per process; a block kept over a second, or any block while the guest is near its
 * quota, goes back to the driver.  Since the driver's cuMemFree waits for the work that may
 * still use the block, a kept block is handed out again only after the same wait, where any
 * work may have been queued since it was freed.  The charges still equal what NVML measures: a
 * kept block is memory the worker holds, charged as such.
 */
#include "channel.h"
#include "context.h"
#include "protocol.h"
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
	struct vh_alloc *a = r == CUDA_SUCCESS ? vh_alloc_track(ch, *dptr, est, dev, VH_MEM) : NULL;
	if (r == CUDA_SUCCESS && !a) {
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (r == CUDA_SUCCESS && vh_addr_add(ch, *dptr, pitch ? (uint64_t)*pitch * height : n, VH_SPAN_MEM, NULL)) {
		vh_alloc_untrack(ch, a);
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_bounded_end(ch, dev, est, bound, r)) {
		B->cuMemFree_v2(*dptr);
		vh_alloc_untrack(ch, a);
		vh_addr_remove(ch, *dptr, VH_SPAN_MEM);
		return vh_quota_take_undo(ch, dev, est, call);
	}
	if (r == CUDA_SUCCESS && !pitch)
		a->ref = n; /* the size asked for: a kept block is handed out again for this size only */
	return vh_quota_card_full(ch, dev, r, call, est);
}

/* ---- kept blocks --------------------------------------------------------------------- */

#define KEPT_BYTES (64ull << 20)
#define KEPT_NS 1000000000ull

extern _Atomic int open_captures; /* serve.c: a context-wide wait now would break them */

/* Take kept block i out of the table (oldest first stays first). */
static struct vh_kept kept_remove(struct vh_chan *ch, uint32_t i)
{
	struct vh_kept k = ch->kept[i];
	memmove(&ch->kept[i], &ch->kept[i + 1], (ch->nkept - i - 1) * sizeof k);
	ch->nkept--;
	ch->kept_bytes -= k.est;
	return k;
}

/* Give a block out of the table back to the driver (in its GPU's context), and its charge to the quota. */
static void kept_release(struct vh_chan *ch, const struct vh_kept *k)
{
	const struct vh_backend *B = ch->backend;
	int other = k->dev != ch->cur_dev && ch->ctx[k->dev];
	if (other)
		B->cuCtxSetCurrent(ch->ctx[k->dev]);
	B->cuMemFree_v2(k->p);
	if (other)
		vh_context_back(ch);
	vh_quota_bounded_free(ch, k->dev, k->est);
}

static void kept_drop(struct vh_chan *ch, uint32_t i)
{
	struct vh_kept k = kept_remove(ch, i);
	kept_release(ch, &k);
}

void vh_kept_expire(struct vh_chan *ch, uint64_t now_ns)
{
	if (atomic_load(&open_captures))
		return; /* the driver's free would break a capture the guest has open: they wait for its end */
	while (ch->nkept && now_ns - ch->kept[0].at_ns > KEPT_NS) /* oldest first */
		kept_drop(ch, 0);
}

void vh_kept_forget(struct vh_chan *ch)
{
	ch->nkept = 0;
	ch->kept_bytes = 0;
}

int vh_kept_give_back(struct vh_chan *ch, int dev)
{
	int gave = 0;
	if (atomic_load(&open_captures))
		return 0; /* the driver's free now would break a capture the guest has open */
	for (uint32_t i = ch->nkept; i-- > 0;)
		if (ch->kept[i].dev == dev) {
			kept_drop(ch, i);
			gave = 1;
		}
	return gave;
}

/* cuMemFree of a's block: keep it rather than free it, if it may be kept (1: kept). */
static int kept_put(struct vh_chan *ch, struct vh_alloc *a)
{
	uint64_t n = a->ref; /* the size cuMemAlloc was asked for; 0 for a pitched block */
	/* an exported block may still be mapped by another process (ipc.c): the driver frees it only
	 * once those close, and no new allocation may alias it */
	if (!n || a->exported || a->size > KEPT_BYTES || atomic_load(&open_captures) || vh_quota_near(ch, a->dev, a->size))
		return 0;
	uint64_t now = vmgpu_now_ns();
	vh_kept_expire(ch, now);
	while (ch->nkept == VH_KEPT_MAX || ch->kept_bytes + a->size > KEPT_BYTES)
		kept_drop(ch, 0);
	ch->kept[ch->nkept++] = (struct vh_kept){a->base, n, a->size, ch->work_seq, now, a->dev};
	ch->kept_bytes += a->size;
	return 1;
}

/* cuMemAlloc of n bytes from a kept block: 1 if *dptr is one (or *r an error), 0 if none fits. */
static int kept_take(struct vh_chan *ch, CUdeviceptr *dptr, uint64_t n, CUresult *r)
{
	int dev = ch->cur_dev;
	for (uint32_t i = ch->nkept; i-- > 0;) {
		struct vh_kept k = ch->kept[i];
		if (k.dev != dev || k.n != n)
			continue;
		if (k.seq != ch->synced_seq) {
			/* work queued before the free may still be using it: wait, as cuMemFree would have,
			 * on every GPU of the process (work_seq counts its calls on all of them, and a kernel
			 * or copy on another GPU reaches this one's memory through peer access) */
			if (atomic_load(&open_captures))
				return 0;
			uint64_t seq = ch->work_seq;
			*r = CUDA_SUCCESS;
			for (int d = 0; d < ch->fwd->ndev && *r == CUDA_SUCCESS; d++)
				if (ch->ctx[d])
					*r = ch->backend->cuCtxSynchronize_v2(ch->ctx[d]);
			ch->backend->cuCtxSetCurrent(ch->ctx[dev]); /* as it was (the simulated one moves it) */
			if (*r != CUDA_SUCCESS)
				return 1; /* a context is broken: the guest hears it, as from the driver */
			for (uint32_t j = 0; j < ch->nkept; j++)
				ch->kept[j].seq = seq; /* none of them is in use now */
			ch->synced_seq = seq;
		}
		kept_remove(ch, i);
		struct vh_alloc *a = vh_alloc_track(ch, k.p, k.est, dev, VH_MEM);
		if (a && vh_addr_add(ch, k.p, n, VH_SPAN_MEM, NULL) == 0) {
			a->ref = n;
			*dptr = k.p;
			*r = CUDA_SUCCESS;
			return 1;
		}
		if (a)
			vh_alloc_untrack(ch, a);
		kept_release(ch, &k); /* no room to record it: the driver has it back */
		return 0;
	}
	return 0;
}

CUresult guarded_cuMemAlloc_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;
	if (ch->cur_dev >= 0 && dptr && bytesize && kept_take(ch, dptr, bytesize, &r))
		return r;
	if (ch->nkept && ch->cur_dev >= 0 && vh_quota_near(ch, ch->cur_dev, vh_quota_rounded(bytesize)))
		vh_kept_give_back(ch, ch->cur_dev); /* the guest needs its memory back */
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
	if (a->kind == VH_MEM && kept_put(ch, a)) {
		vh_addr_remove(ch, dptr, VH_SPAN_MEM); /* from now on the address names nothing */
		vh_alloc_untrack(ch, a);
		return CUDA_SUCCESS;
	}
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
	uint64_t left = used < quota ? quota - used : 0, kept = 0;
	for (uint32_t i = 0; i < ch->nkept; i++)
		kept += ch->kept[i].dev == dev ? ch->kept[i].est : 0; /* the guest's to take again */
	left += kept;
	hw_free += kept;
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
