/* SPDX-License-Identifier: Apache-2.0 */
/*
 * 2D and 3D copies, the guest's front (host half: host_forwarder/native/copy2d.c).  The host reads
 * and writes no host memory but the region's, so each host side is one of:
 *   - pinned memory (the region's heap): sent as its offset, and the copy is one call, async
 *     where the program asked for async;
 *   - pageable memory: moved here.  Against device memory, row by row through the 1D copies
 *     (which stage through the bulk area); against an array, through a pinned staging block of at
 *     most STAGE_MAX bytes, whole rows at a time; host to host, with memcpy.  Such a copy is done
 *     when the call returns, also for the async variants (the driver may do the same with
 *     pageable memory): the stream's earlier work is waited for first.  Rows are moved in order, so
 *     a pageable copy refused part-way (a device row that is not the process's own) has moved
 *     the rows before it.
 * A unified address in the heap is host memory; any other is a device address, checked by the
 * host.
 */
#include <stdint.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "copy.h"
#include "hostmem.h"
#include "vg_copy2d.h"
#include "vg_guest_protos.h"

#define STAGE_MAX (8u << 20)

enum side { DEVICE_SIDE, ARRAY_SIDE, PINNED_SIDE, PAGEABLE_SIDE };

/* One side of a copy as the host takes it; *orig keeps the program's host pointer. */
static enum side side_out(CUmemorytype *type, const void **host, CUdeviceptr *dev, const void **orig)
{
	*orig = *host;
	if (*type == CU_MEMORYTYPE_UNIFIED) {
		uint64_t off = vg_heap_offset((const void *)(uintptr_t)*dev, 1);
		if (off == UINT64_MAX)
			return DEVICE_SIDE;
		*orig = (const void *)(uintptr_t)*dev;
		*type = CU_MEMORYTYPE_HOST;
		*host = (const void *)(uintptr_t)off;
		*dev = 0;
		return PINNED_SIDE;
	}
	if (*type == CU_MEMORYTYPE_ARRAY)
		return ARRAY_SIDE;
	if (*type != CU_MEMORYTYPE_HOST)
		return DEVICE_SIDE; /* (the host refuses a type it does not know) */
	uint64_t off = *host ? vg_heap_offset(*host, 1) : UINT64_MAX;
	if (off == UINT64_MAX)
		return PAGEABLE_SIDE;
	*host = (const void *)(uintptr_t)off;
	return PINNED_SIDE;
}

/* The byte offset of row y, slice z of a side (x + (y0 + y) * pitch + (z0 + z) * pitch * height). */
static uint64_t row_at(uint64_t x, uint64_t y0, uint64_t z0, uint64_t pitch, uint64_t height, uint64_t y, uint64_t z)
{
	return x + (y0 + y) * pitch + (z0 + z) * pitch * height;
}

/* Whether a linear side's rows and slices can be named without overflow and do not overlap. */
static int side_fits(uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height, const CUDA_MEMCPY3D *p)
{
	uint64_t t, u;
	if (p->WidthInBytes == 0 || p->Height == 0 || p->Depth == 0)
		return 1;
	if ((p->Height > 1 || p->Depth > 1) && pitch < p->WidthInBytes)
		return 0;
	if (p->Depth > 1 && height < p->Height)
		return 0;
	return !__builtin_mul_overflow(pitch, height, &t) && !__builtin_add_overflow(z, p->Depth, &u) &&
	       !__builtin_mul_overflow(t, u, &t) && !__builtin_add_overflow(y, p->Height, &u) &&
	       !__builtin_mul_overflow(pitch, u, &u) && !__builtin_add_overflow(t, u, &t) &&
	       !__builtin_add_overflow(t, x + p->WidthInBytes, &t) && x <= UINT64_MAX - p->WidthInBytes;
}

/* Pageable host memory against device memory: row by row. */
static CUresult rows_device(const CUDA_MEMCPY3D *p, const void *src_host, void *dst_host, unsigned fl)
{
	CUresult r = CUDA_SUCCESS;
	for (uint64_t z = 0; z < p->Depth && r == CUDA_SUCCESS; z++)
		for (uint64_t y = 0; y < p->Height && r == CUDA_SUCCESS; y++) {
			uint64_t so = row_at(p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch, p->srcHeight, y, z);
			uint64_t d = row_at(p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch, p->dstHeight, y, z);
			if (dst_host)
				r = handwritten_cuMemcpyDtoH_v2((uint8_t *)dst_host + d, p->srcDevice + so, p->WidthInBytes, fl);
			else
				r = handwritten_cuMemcpyHtoD_v2(p->dstDevice + d, (const uint8_t *)src_host + so,
								p->WidthInBytes, fl);
		}
	return r;
}

/* Host to host (pageable on at least one side): here. */
static CUresult rows_host(const CUDA_MEMCPY3D *p, const void *src, void *dst)
{
	for (uint64_t z = 0; z < p->Depth; z++)
		for (uint64_t y = 0; y < p->Height; y++)
			memmove((uint8_t *)dst + row_at(p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch, p->dstHeight, y, z),
				(const uint8_t *)src + row_at(p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch, p->srcHeight, y, z),
				p->WidthInBytes);
	return CUDA_SUCCESS;
}

/* Pageable host memory against an array: through a pinned staging block, whole rows at a time,
 * each piece one synchronous 3D copy of one slice. */
static CUresult rows_array(const CUDA_MEMCPY3D *p, const void *src_host, void *dst_host, unsigned fl)
{
	static int said;
	uint64_t w = p->WidthInBytes, per = w >= STAGE_MAX ? 1 : STAGE_MAX / w;
	if (per > p->Height)
		per = p->Height;
	void *stage = NULL;
	if (handwritten_cuMemAllocHost_v2(&stage, per * w, 0) != CUDA_SUCCESS ||
	    vg_heap_offset(stage, per * w) == UINT64_MAX) {
		if (stage)
			handwritten_cuMemFreeHost(stage, 0);
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			vg_log("a 2D/3D copy between pageable memory and an array needs a pinned staging block, "
			       "and none could be had: CUDA_ERROR_NOT_SUPPORTED (use pinned memory)");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	uint64_t off = vg_heap_offset(stage, per * w);
	CUresult r = CUDA_SUCCESS;
	for (uint64_t z = 0; z < p->Depth && r == CUDA_SUCCESS; z++)
		for (uint64_t y = 0; y < p->Height && r == CUDA_SUCCESS; y += per) {
			uint64_t n = p->Height - y < per ? p->Height - y : per;
			CUDA_MEMCPY3D q = *p;
			q.Height = n;
			q.Depth = 1;
			if (src_host) { /* host to array: pack the rows, then copy */
				for (uint64_t k = 0; k < n; k++)
					memcpy((uint8_t *)stage + k * w,
					       (const uint8_t *)src_host +
						       row_at(p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch, p->srcHeight, y + k, z),
					       w);
				q.srcMemoryType = CU_MEMORYTYPE_HOST;
				q.srcHost = (const void *)(uintptr_t)off;
				q.srcXInBytes = q.srcY = q.srcZ = 0;
				q.srcPitch = w;
				q.srcHeight = n;
				q.dstY = p->dstY + y;
				q.dstZ = p->dstZ + z;
			} else {
				q.dstMemoryType = CU_MEMORYTYPE_HOST;
				q.dstHost = (void *)(uintptr_t)off;
				q.dstXInBytes = q.dstY = q.dstZ = 0;
				q.dstPitch = w;
				q.dstHeight = n;
				q.srcY = p->srcY + y;
				q.srcZ = p->srcZ + z;
			}
			r = forward_cuMemcpy3D_v2(&q, fl);
			if (r == CUDA_SUCCESS && dst_host) /* array to host: unpack the rows */
				for (uint64_t k = 0; k < n; k++)
					memcpy((uint8_t *)dst_host +
						       row_at(p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch, p->dstHeight, y + k, z),
					       (const uint8_t *)stage + k * w, w);
		}
	handwritten_cuMemFreeHost(stage, 0);
	return r;
}

/* A copy with a pageable side, done here (q: the sides as rewritten, o*: the program's pointers). */
static CUresult pageable(const CUDA_MEMCPY3D *q, enum side s, enum side d, const void *os, const void *od, int async,
			 CUstream st, unsigned fl)
{
	CUDA_MEMCPY3D p = *q;
	int s_host = s == PINNED_SIDE || s == PAGEABLE_SIDE, d_host = d == PINNED_SIDE || d == PAGEABLE_SIDE;
	if ((s_host && !os) || (d_host && !od))
		return CUDA_ERROR_INVALID_VALUE;
	if ((s != ARRAY_SIDE && !side_fits(p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight, &p)) ||
	    (d != ARRAY_SIDE && !side_fits(p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight, &p)))
		return CUDA_ERROR_INVALID_VALUE;
	if (p.WidthInBytes == 0 || p.Height == 0 || p.Depth == 0)
		return vg_check_ready();
	CUresult r = vg_stream_wait(async, st, fl);
	if (r != CUDA_SUCCESS)
		return r;
	if (s_host && d_host)
		return rows_host(&p, os, (void *)od);
	if (s == ARRAY_SIDE || d == ARRAY_SIDE)
		return rows_array(&p, s_host ? os : NULL, d_host ? (void *)od : NULL, fl);
	return rows_device(&p, s_host ? os : NULL, d_host ? (void *)od : NULL, fl);
}

/* A 3D copy's sides rewritten into *q; 1 if one of them is pageable (then done by pageable()). */
static int sides_out(const CUDA_MEMCPY3D *in, CUDA_MEMCPY3D *q, enum side *s, enum side *d, const void **os,
		     const void **od)
{
	*q = *in;
	*s = side_out(&q->srcMemoryType, &q->srcHost, &q->srcDevice, os);
	*d = side_out(&q->dstMemoryType, (const void **)&q->dstHost, &q->dstDevice, od);
	return *s == PAGEABLE_SIDE || *d == PAGEABLE_SIDE;
}

static void from_3d(const CUDA_MEMCPY3D *q, CUDA_MEMCPY2D *p)
{
	p->srcMemoryType = q->srcMemoryType;
	p->srcHost = q->srcHost;
	p->srcDevice = q->srcDevice;
	p->dstMemoryType = q->dstMemoryType;
	p->dstHost = q->dstHost;
	p->dstDevice = q->dstDevice;
}

enum copy2d_kind { PLAIN, UNALIGNED, ASYNC };

static CUresult copy2d(const CUDA_MEMCPY2D *in, enum copy2d_kind kind, CUstream st, unsigned fl)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMCPY3D p3, q;
	enum side s, d;
	const void *os, *od;
	vg_copy2d_as_3d(in, &p3);
	if (sides_out(&p3, &q, &s, &d, &os, &od))
		return pageable(&q, s, d, os, od, kind == ASYNC, st, fl);
	CUDA_MEMCPY2D p = *in;
	from_3d(&q, &p);
	return kind == ASYNC ? forward_cuMemcpy2DAsync_v2(&p, st, fl)
	       : kind == UNALIGNED ? forward_cuMemcpy2DUnaligned_v2(&p, fl)
				   : forward_cuMemcpy2D_v2(&p, fl);
}

static CUresult copy3d(const CUDA_MEMCPY3D *in, int async, CUstream st, unsigned fl)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMCPY3D q;
	enum side s, d;
	const void *os, *od;
	if (sides_out(in, &q, &s, &d, &os, &od))
		return pageable(&q, s, d, os, od, async, st, fl);
	return async ? forward_cuMemcpy3DAsync_v2(&q, st, fl) : forward_cuMemcpy3D_v2(&q, fl);
}

CUresult handwritten_cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy, unsigned fl)
{
	return copy2d(pCopy, PLAIN, NULL, fl);
}

CUresult handwritten_cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy, unsigned fl)
{
	return copy2d(pCopy, UNALIGNED, NULL, fl);
}

CUresult handwritten_cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream, unsigned fl)
{
	return copy2d(pCopy, ASYNC, hStream, fl);
}

CUresult handwritten_cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy, unsigned fl)
{
	return copy3d(pCopy, 0, NULL, fl);
}

CUresult handwritten_cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream, unsigned fl)
{
	return copy3d(pCopy, 1, hStream, fl);
}
