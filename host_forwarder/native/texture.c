/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Texture and surface objects (api.toml).  A texture or surface reads (or writes) its resource
 * whenever a kernel uses it, with no further check then, so the resource is checked when the
 * object is made:
 *   - an array: the process's own (its handle through the table);
 *   - linear device memory: [devPtr, devPtr + sizeInBytes) wholly inside one object of the
 *     process's own (addresses.c);
 *   - pitched 2D device memory: from devPtr to the end of its last row, the row at least its
 *     pitch and at least width elements of the format (1, 2 or 4 channels of a format this file
 *     knows the size of; any other refused), wholly inside one object of the process's own;
 *   - mipmapped arrays are not served (nor made: cuMipmappedArrayCreate is not served).
 * The texture unit keeps reads inside the resource.  A surface takes an array only, as the driver
 * requires.  The object's value is the driver's own (a kernel receives it as an argument; it names
 * nothing outside this process's context), and only values this process made go back to the
 * driver (destroy, queries), so a guess cannot reach the driver's tables.  What a query answers
 * is put back in the guest's terms: its live handle of the array, or none once it has destroyed
 * the array (never a new handle to a freed one).
 */
#include <stdlib.h>

#include "addresses.h"
#include "allocations.h"
#include "copy.h"
#include "handles.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

#define VH_MAX_TEXOBJS 65536

struct vh_texobj {
	uint64_t value;
	int surface;
};

/* The bytes one element of a format takes, per channel; 0 if this file does not know it. */
static unsigned format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT:
		return 4;
	default:
		return 0;
	}
}

/* *a, a guest's array handle, becomes the host's array: a live handle of the process's own, of an
 * array it still holds (its record).  -1 otherwise. */
int vh_array_in(struct vh_chan *ch, CUarray *a)
{
	return !*a || vh_handle_in(ch, VG_KIND_ARRAY, (void **)a) ||
			       !vh_alloc_find(ch, (uint64_t)(uintptr_t)*a, 1u << VH_ARRAY)
		       ? -1
		       : 0;
}

/* A resource checked, into *out (the array handle the host's). */
static CUresult resource_in(struct vh_chan *ch, const CUDA_RESOURCE_DESC *in, CUDA_RESOURCE_DESC *out, int surface)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	*out = *in;
	switch (out->resType) {
	case CU_RESOURCE_TYPE_ARRAY:
		return vh_array_in(ch, &out->res.array.hArray) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
	case CU_RESOURCE_TYPE_LINEAR:
		if (surface)
			return CUDA_ERROR_INVALID_VALUE;
		return vh_addr_ok(ch, out->res.linear.devPtr, out->res.linear.sizeInBytes) ? CUDA_ERROR_INVALID_VALUE
											   : CUDA_SUCCESS;
	case CU_RESOURCE_TYPE_PITCH2D: {
		if (surface)
			return CUDA_ERROR_INVALID_VALUE;
		unsigned b = format_bytes(out->res.pitch2D.format), nc = out->res.pitch2D.numChannels;
		if (!b)
			return CUDA_ERROR_NOT_SUPPORTED; /* a format whose rows this file cannot measure */
		if (nc != 1 && nc != 2 && nc != 4)
			return CUDA_ERROR_INVALID_VALUE;
		uint64_t el = (uint64_t)b * nc, row, last, n;
		uint64_t pitch = out->res.pitch2D.pitchInBytes, h = out->res.pitch2D.height;
		if (h == 0 || __builtin_mul_overflow((uint64_t)out->res.pitch2D.width, el, &row))
			return CUDA_ERROR_INVALID_VALUE;
		if (row < pitch)
			row = pitch;
		if (__builtin_mul_overflow(h - 1, pitch, &last) || __builtin_add_overflow(last, row, &n) ||
		    vh_addr_ok(ch, out->res.pitch2D.devPtr, n))
			return CUDA_ERROR_INVALID_VALUE;
		return CUDA_SUCCESS;
	}
	case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
		return CUDA_ERROR_NOT_SUPPORTED;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* A resource the driver described, in the guest's terms. */
static CUresult resource_out(struct vh_chan *ch, CUDA_RESOURCE_DESC *d)
{
	if (d->resType == CU_RESOURCE_TYPE_ARRAY) {
		/* the process's live handle of the array; none for one it has destroyed since (a new
		 * entry would hand the driver a freed array at its next use) */
		void *a = d->res.array.hArray;
		d->res.array.hArray = vh_handle_find(ch, VG_KIND_ARRAY, &a) ? NULL : a;
	} else if (d->resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
		d->res.mipmap.hMipmappedArray = NULL; /* (never made here) */
	}
	return CUDA_SUCCESS;
}

/* The index of an object this process made, or -1. */
static long find(struct vh_chan *ch, uint64_t value, int surface)
{
	for (uint32_t i = 0; i < ch->ntexobjs; i++)
		if (ch->texobjs[i].value == value && ch->texobjs[i].surface == surface)
			return i;
	return -1;
}

static int remember(struct vh_chan *ch, uint64_t value, int surface)
{
	if (ch->ntexobjs == ch->captexobjs) {
		uint32_t cap = ch->captexobjs ? ch->captexobjs * 2 : 16;
		struct vh_texobj *t = cap <= VH_MAX_TEXOBJS ? realloc(ch->texobjs, cap * sizeof *t) : NULL;
		if (!t)
			return -1;
		ch->texobjs = t;
		ch->captexobjs = cap;
	}
	ch->texobjs[ch->ntexobjs++] = (struct vh_texobj){value, surface};
	return 0;
}

static void forget(struct vh_chan *ch, long i)
{
	ch->texobjs[i] = ch->texobjs[--ch->ntexobjs];
}

CUresult guarded_cuTexObjectCreate(struct vh_chan *ch, CUtexObject *pTexObject, const CUDA_RESOURCE_DESC *pResDesc,
				   const CUDA_TEXTURE_DESC *pTexDesc, const CUDA_RESOURCE_VIEW_DESC *pResViewDesc)
{
	CUDA_RESOURCE_DESC res;
	CUresult r = resource_in(ch, pResDesc, &res, 0);
	if (r != CUDA_SUCCESS)
		return r;
	if (!pTexDesc)
		return CUDA_ERROR_INVALID_VALUE;
	if ((r = ch->backend->cuTexObjectCreate(pTexObject, &res, pTexDesc, pResViewDesc)) != CUDA_SUCCESS)
		return r;
	if (remember(ch, *pTexObject, 0)) {
		ch->backend->cuTexObjectDestroy(*pTexObject);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

CUresult guarded_cuSurfObjectCreate(struct vh_chan *ch, CUsurfObject *pSurfObject, const CUDA_RESOURCE_DESC *pResDesc)
{
	CUDA_RESOURCE_DESC res;
	CUresult r = resource_in(ch, pResDesc, &res, 1);
	if (r != CUDA_SUCCESS)
		return r;
	if ((r = ch->backend->cuSurfObjectCreate(pSurfObject, &res)) != CUDA_SUCCESS)
		return r;
	if (remember(ch, *pSurfObject, 1)) {
		ch->backend->cuSurfObjectDestroy(*pSurfObject);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

CUresult guarded_cuTexObjectDestroy(struct vh_chan *ch, CUtexObject texObject)
{
	long i = find(ch, texObject, 0);
	if (i < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuTexObjectDestroy(texObject);
	if (r == CUDA_SUCCESS)
		forget(ch, i);
	return r;
}

CUresult guarded_cuSurfObjectDestroy(struct vh_chan *ch, CUsurfObject surfObject)
{
	long i = find(ch, surfObject, 1);
	if (i < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuSurfObjectDestroy(surfObject);
	if (r == CUDA_SUCCESS)
		forget(ch, i);
	return r;
}

CUresult guarded_cuTexObjectGetResourceDesc(struct vh_chan *ch, CUDA_RESOURCE_DESC *pResDesc, CUtexObject texObject)
{
	if (find(ch, texObject, 0) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuTexObjectGetResourceDesc(pResDesc, texObject);
	return r != CUDA_SUCCESS ? r : resource_out(ch, pResDesc);
}

CUresult guarded_cuSurfObjectGetResourceDesc(struct vh_chan *ch, CUDA_RESOURCE_DESC *pResDesc, CUsurfObject surfObject)
{
	if (find(ch, surfObject, 1) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuSurfObjectGetResourceDesc(pResDesc, surfObject);
	return r != CUDA_SUCCESS ? r : resource_out(ch, pResDesc);
}

CUresult guarded_cuTexObjectGetTextureDesc(struct vh_chan *ch, CUDA_TEXTURE_DESC *pTexDesc, CUtexObject texObject)
{
	if (find(ch, texObject, 0) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	return ch->backend->cuTexObjectGetTextureDesc(pTexDesc, texObject);
}

CUresult guarded_cuTexObjectGetResourceViewDesc(struct vh_chan *ch, CUDA_RESOURCE_VIEW_DESC *pResViewDesc,
						CUtexObject texObject)
{
	if (find(ch, texObject, 0) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	return ch->backend->cuTexObjectGetResourceViewDesc(pResViewDesc, texObject);
}
