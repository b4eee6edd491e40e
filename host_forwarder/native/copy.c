/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Copies between the guest's host memory (inline in the request, its region's heap, its channel's
 * bulk area) and device memory, and unified-address copies.  Every device address must be this
 * guest process's own (addresses.c), every host buffer inside its region (host_memory.c): no
 * address of the worker is ever read or written for a guest.  The wire formats match
 * guest_agent/libcuda.
 */
#include "addresses.h"
#include "host_memory.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

static CUresult htod(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int async)
{
	(void)wr;
	const struct vh_backend *B = ch->backend;
	CUdeviceptr dst = vh_get_u64(rd);
	uint64_t sraw = async ? vh_get_u64(rd) : 0;
	uint64_t n = vh_get_u64(rd), kind = vh_get_u64(rd), a = vh_get_u64(rd);
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	const void *src;
	uint64_t inl = 0;
	if (kind == VG_BUF_INLINE) {
		src = vh_get_arr(rd, 1, &inl);
		if (inl != n)
			bad = 1;
	} else {
		src = vh_host_buf(ch, kind, a, n);
	}
	if (rd->bad || bad || (n && !src) || vh_addr_ok(ch, dst, n)) {
		vh_host_buf_done(ch, kind, a, n);
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	}
	CUresult r;
	if (async && kind == VG_BUF_HEAP) {
		r = B->cuMemcpyHtoDAsync_v2(dst, src, n, s);
	} else if (async) {
		/* staged bytes: the bulk space is reused once the copy has finished */
		r = B->cuMemcpyHtoDAsync_v2(dst, src, n, s);
		if (r == CUDA_SUCCESS)
			r = B->cuStreamSynchronize(s);
	} else {
		r = B->cuMemcpyHtoD_v2(dst, src, n);
	}
	vh_host_buf_done(ch, kind, a, n);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&ch->fwd->stats->htod_bytes, n, memory_order_relaxed);
	return r;
}

static CUresult dtoh(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int async)
{
	const struct vh_backend *B = ch->backend;
	CUdeviceptr src = vh_get_u64(rd);
	uint64_t sraw = async ? vh_get_u64(rd) : 0;
	uint64_t n = vh_get_u64(rd), kind = vh_get_u64(rd), a = vh_get_u64(rd);
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	if (rd->bad || bad)
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	if (vh_addr_ok(ch, src, n))
		return CUDA_ERROR_INVALID_VALUE; /* not this process's device memory */
	void *dst;
	if (kind == VG_BUF_INLINE) {
		if (n > wr->cap - wr->len - 8)
			return CUDA_ERROR_INVALID_VALUE;
		uint64_t n64 = n;
		vh_put(wr, &n64, 8);
		dst = wr->p + wr->len;
		wr->len += vh_pad8(n);
	} else {
		dst = vh_host_buf(ch, kind, a, n);
		if (n && !dst)
			return CUDA_ERROR_INVALID_VALUE;
	}
	CUresult r;
	if (async) {
		r = B->cuMemcpyDtoHAsync_v2(dst, src, n, s);
		/* only a heap destination may complete later; the guest waits for the others */
		if (r == CUDA_SUCCESS && kind != VG_BUF_HEAP)
			r = B->cuStreamSynchronize(s);
	} else {
		r = B->cuMemcpyDtoH_v2(dst, src, n);
	}
	vh_host_buf_done(ch, kind, a, n);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&ch->fwd->stats->dtoh_bytes, n, memory_order_relaxed);
	return r;
}

VH_CUSTOM_VARIANT(handwritten_cuMemcpyHtoD_v2, htod, 0)
VH_CUSTOM_VARIANT(handwritten_cuMemcpyHtoDAsync_v2, htod, 1)
VH_CUSTOM_VARIANT(handwritten_cuMemcpyDtoH_v2, dtoh, 0)
VH_CUSTOM_VARIANT(handwritten_cuMemcpyDtoHAsync_v2, dtoh, 1)

/* One side of a unified-address copy: a device address of this process (VG_BUF_INLINE, kept)
 * or an offset in the guest's heap (turned into its host address).  Anything else, a host
 * address of the worker above all, is refused: 0, or -1. */
static int unified_side(struct vh_chan *ch, uint64_t kind, uint64_t *addr, uint64_t n)
{
	if (kind == VG_BUF_INLINE) {
		if (vh_addr_ok(ch, *addr, n) == 0)
			return 0;
		/* the guest's own address of pinned memory, as cuMemHostGetDevicePointer gave it */
		uint64_t off = vh_alias_offset(ch, *addr);
		if (off == UINT64_MAX)
			return -1;
		*addr = off;
	} else if (kind != VG_BUF_HEAP) {
		return -1;
	}
	void *p = vh_host_buf(ch, VG_BUF_HEAP, *addr, n);
	if (!p)
		return -1;
	*addr = (uint64_t)(uintptr_t)p;
	return 0;
}

/* Unified-address copies: each side is a device address or a heap offset. */
static CUresult unified(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int async)
{
	(void)wr;
	uint64_t dkind = vh_get_u64(rd), dst = vh_get_u64(rd);
	uint64_t skind = vh_get_u64(rd), src = vh_get_u64(rd);
	uint64_t n = vh_get_u64(rd);
	uint64_t sraw = async ? vh_get_u64(rd) : 0;
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	if (rd->bad || bad)
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	if (unified_side(ch, dkind, &dst, n) || unified_side(ch, skind, &src, n))
		return CUDA_ERROR_INVALID_VALUE;
	/* both sides are now device addresses of this context or registered region memory */
	return async ? ch->backend->cuMemcpyAsync(dst, src, n, s) : ch->backend->cuMemcpy(dst, src, n);
}

VH_CUSTOM_VARIANT(handwritten_cuMemcpy, unified, 0)
VH_CUSTOM_VARIANT(handwritten_cuMemcpyAsync, unified, 1)
