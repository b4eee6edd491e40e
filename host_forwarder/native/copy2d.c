/* SPDX-License-Identifier: Apache-2.0 */
/*
 * 2D and 3D copies and 2D memsets (api.toml), and the checks of a copy's sides that a graph's
 * memcpy node shares (copy.h).  What the driver would read or write is computed from the
 * parameters before it sees them, with every product and sum checked for overflow:
 *   - a pitched side reaches from its first byte (x + y * pitch + z * pitch * height) to its last
 *     (the last row of the last slice, plus the width); device memory there must lie wholly
 *     inside one object of this guest process's own (addresses.c);
 *   - host memory is an offset into the region's heap (the guest library turns the program's
 *     pinned pointer into it, and moves pageable memory itself), so the worker reads or writes
 *     nothing but the guest's own pinned memory;
 *   - an array is the process's own (its handle), and the driver keeps the copy inside it;
 *   - a 2D memset's rows (the first byte of the first to the last of the last) must lie in the
 *     process's own memory.
 * Every pointer field the driver reads is rewritten from what was checked.
 */
#include <string.h>

#include "addresses.h"
#include "copy.h"
#include "vg_copy2d.h"
#include "handles.h"
#include "host_memory.h"
#include "log.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* What one side of a 3D copy reaches, from its base address: [*first, *first + *len).  Every
 * byte is at x + xi + (y + yi) * pitch + (z + zi) * pitch * height for xi < w, yi < h, zi < d,
 * so the lowest is at xi = yi = zi = 0 and the highest at the largest of each.  -1 on overflow. */
static int copy_extent(uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height, uint64_t w, uint64_t h,
		       uint64_t d, uint64_t *first, uint64_t *len)
{
	uint64_t slice, lo, hi, t, ylast, zlast;
	*first = *len = 0;
	if (w == 0 || h == 0 || d == 0)
		return 0;
	if (__builtin_mul_overflow(pitch, height, &slice) || __builtin_add_overflow(y, h - 1, &ylast) ||
	    __builtin_add_overflow(z, d - 1, &zlast))
		return -1;
	if (__builtin_mul_overflow(y, pitch, &lo) || __builtin_mul_overflow(z, slice, &t) ||
	    __builtin_add_overflow(lo, t, &lo) || __builtin_add_overflow(lo, x, &lo))
		return -1;
	if (__builtin_mul_overflow(ylast, pitch, &hi) || __builtin_mul_overflow(zlast, slice, &t) ||
	    __builtin_add_overflow(hi, t, &hi) || __builtin_add_overflow(hi, x, &hi) || __builtin_add_overflow(hi, w, &hi))
		return -1;
	*first = lo;
	*len = hi - lo;
	return 0;
}

/* One side of a memcpy node, rewritten from what was checked.  The guest library sends host
 * memory as an offset into the region's heap (in the host pointer field); a unified address is
 * device memory of this process (its own pinned memory there too, vh_addr_ok). */
static CUresult copy_side(struct vh_chan *ch, const char *side, CUmemorytype *type, const void **host,
			  CUdeviceptr *dev, CUarray *array, uint64_t first, uint64_t len)
{
	switch (*type) {
	case CU_MEMORYTYPE_DEVICE:
	case CU_MEMORYTYPE_UNIFIED: {
		uint64_t start;
		if (__builtin_add_overflow((uint64_t)*dev, first, &start) || vh_addr_ok(ch, start, len))
			return CUDA_ERROR_INVALID_VALUE;
		*type = CU_MEMORYTYPE_DEVICE;
		*host = NULL;
		*array = NULL;
		return CUDA_SUCCESS;
	}
	case CU_MEMORYTYPE_HOST: {
		uint64_t off = (uint64_t)(uintptr_t)*host, reach;
		void *p = NULL;
		if (!__builtin_add_overflow(first, len, &reach))
			p = vh_host_buf(ch, VG_BUF_HEAP, off, reach ? reach : 1);
		if (!p) {
			vh_log("channel %u: refused a copy: its %s is host memory outside the guest's "
			       "pinned heap (offset %#llx, %llu bytes)", ch->index, side, (unsigned long long)off,
			       (unsigned long long)(first + len));
			return CUDA_ERROR_INVALID_VALUE;
		}
		*host = p;
		*dev = 0;
		*array = NULL;
		return CUDA_SUCCESS;
	}
	case CU_MEMORYTYPE_ARRAY:
		/* the driver keeps the copy inside the array; the array must be the process's own */
		if (vh_array_in(ch, array))
			return CUDA_ERROR_INVALID_HANDLE;
		*host = NULL;
		*dev = 0;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

CUresult vh_copy3d_in(struct vh_chan *ch, const CUDA_MEMCPY3D *in, CUDA_MEMCPY3D *out)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMCPY3D p = *in;
	p.reserved0 = NULL; /* "must be NULL": never a pointer of the guest's */
	p.reserved1 = NULL;
	if (p.srcLOD || p.dstLOD)
		return CUDA_ERROR_INVALID_VALUE; /* "must be set to 0" */
	/* rows that do not overlap and slices that hold their rows, as the driver documents them
	 * (the extents below are right whatever the driver does with other values) */
	if ((p.Height > 1 || p.Depth > 1) &&
	    ((p.srcMemoryType != CU_MEMORYTYPE_ARRAY && (p.srcPitch < p.WidthInBytes || p.srcPitch - p.WidthInBytes < p.srcXInBytes)) ||
	     (p.dstMemoryType != CU_MEMORYTYPE_ARRAY && (p.dstPitch < p.WidthInBytes || p.dstPitch - p.WidthInBytes < p.dstXInBytes))))
		return CUDA_ERROR_INVALID_VALUE;
	if (p.Depth > 1 && ((p.srcMemoryType != CU_MEMORYTYPE_ARRAY && (p.srcHeight < p.Height || p.srcHeight - p.Height < p.srcY)) ||
			    (p.dstMemoryType != CU_MEMORYTYPE_ARRAY && (p.dstHeight < p.Height || p.dstHeight - p.Height < p.dstY))))
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t sf, sl, df, dl;
	if (copy_extent(p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight, p.WidthInBytes, p.Height, p.Depth, &sf,
			&sl) ||
	    copy_extent(p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight, p.WidthInBytes, p.Height, p.Depth, &df,
			&dl))
		return CUDA_ERROR_INVALID_VALUE;
	/* an array side is addressed in elements by the driver, inside the array: no extent here */
	CUresult r = copy_side(ch, "source", &p.srcMemoryType, &p.srcHost, &p.srcDevice, &p.srcArray, sf, sl);
	if (r == CUDA_SUCCESS)
		r = copy_side(ch, "destination", &p.dstMemoryType, (const void **)&p.dstHost, &p.dstDevice, &p.dstArray,
			      df, dl);
	if (r == CUDA_SUCCESS)
		*out = p;
	return r;
}


/* ---- 2D and 3D copies ------------------------------------------------------------------ */

/* A 2D copy's parameters checked, into *out. */
static CUresult copy2d_in(struct vh_chan *ch, const CUDA_MEMCPY2D *in, CUDA_MEMCPY2D *out)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMCPY3D q, c;
	vg_copy2d_as_3d(in, &q);
	CUresult r = vh_copy3d_in(ch, &q, &c);
	if (r != CUDA_SUCCESS)
		return r;
	*out = *in;
	out->srcMemoryType = c.srcMemoryType;
	out->srcHost = c.srcHost;
	out->srcDevice = c.srcDevice;
	out->srcArray = c.srcArray;
	out->dstMemoryType = c.dstMemoryType;
	out->dstHost = c.dstHost;
	out->dstDevice = c.dstDevice;
	out->dstArray = c.dstArray;
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemcpy2D_v2(struct vh_chan *ch, const CUDA_MEMCPY2D *pCopy)
{
	CUDA_MEMCPY2D p;
	CUresult r = copy2d_in(ch, pCopy, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemcpy2D_v2(&p);
}

CUresult guarded_cuMemcpy2DUnaligned_v2(struct vh_chan *ch, const CUDA_MEMCPY2D *pCopy)
{
	CUDA_MEMCPY2D p;
	CUresult r = copy2d_in(ch, pCopy, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemcpy2DUnaligned_v2(&p);
}

CUresult guarded_cuMemcpy2DAsync_v2(struct vh_chan *ch, const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	CUDA_MEMCPY2D p;
	CUresult r = copy2d_in(ch, pCopy, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemcpy2DAsync_v2(&p, hStream);
}

CUresult guarded_cuMemcpy3D_v2(struct vh_chan *ch, const CUDA_MEMCPY3D *pCopy)
{
	CUDA_MEMCPY3D p;
	CUresult r = vh_copy3d_in(ch, pCopy, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemcpy3D_v2(&p);
}

CUresult guarded_cuMemcpy3DAsync_v2(struct vh_chan *ch, const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
	CUDA_MEMCPY3D p;
	CUresult r = vh_copy3d_in(ch, pCopy, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemcpy3DAsync_v2(&p, hStream);
}

/* ---- 2D memsets ------------------------------------------------------------------------ */

CUresult vh_rows_ok(struct vh_chan *ch, CUdeviceptr dst, uint64_t pitch, uint64_t width, uint64_t height, unsigned elsz)
{
	uint64_t row, last, n;
	if (__builtin_mul_overflow(width, (uint64_t)elsz, &row))
		return CUDA_ERROR_INVALID_VALUE;
	if (row == 0 || height == 0)
		return vh_addr_ok(ch, dst, 0) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	if (__builtin_mul_overflow(height - 1, pitch, &last) || __builtin_add_overflow(last, row, &n))
		return CUDA_ERROR_INVALID_VALUE;
	return vh_addr_ok(ch, dst, n) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult guarded_cuMemsetD2D8_v2(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,
				 size_t height)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 1);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D8_v2(dst, pitch, uc, width, height);
}

CUresult guarded_cuMemsetD2D16_v2(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned short us, size_t width,
				  size_t height)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 2);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D16_v2(dst, pitch, us, width, height);
}

CUresult guarded_cuMemsetD2D32_v2(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,
				  size_t height)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 4);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D32_v2(dst, pitch, ui, width, height);
}

CUresult guarded_cuMemsetD2D8Async(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,
				   size_t height, CUstream hStream)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 1);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D8Async(dst, pitch, uc, width, height, hStream);
}

CUresult guarded_cuMemsetD2D16Async(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned short us,
				    size_t width, size_t height, CUstream hStream)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 2);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D16Async(dst, pitch, us, width, height, hStream);
}

CUresult guarded_cuMemsetD2D32Async(struct vh_chan *ch, CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,
				    size_t height, CUstream hStream)
{
	CUresult r = vh_rows_ok(ch, dst, pitch, width, height, 4);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemsetD2D32Async(dst, pitch, ui, width, height, hStream);
}
