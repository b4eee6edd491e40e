/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Virtual memory management (cuMemCreate, cuMemMap, address reservations), charged to the quota
 * (quota.c).  What a guest names (a VMM handle to map, a range to map into) must be something
 * this guest process made; the driver's handles never reach the guest, and nothing that could be
 * shared with another process (exportable handle types) is let through.
 */
#include "channel.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

#define VH_MAX_ACCESS_DESCS 16

static CUresult prop_in(struct vh_chan *ch, const CUmemAllocationProp *in, CUmemAllocationProp *out)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	*out = *in;
	if (out->type != CU_MEM_ALLOCATION_TYPE_PINNED || out->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED; /* nothing exportable: no memory shared across processes */
	if (vh_location_in(ch, &out->location))
		return CUDA_ERROR_INVALID_DEVICE;
	out->win32HandleMetaData = NULL;
	return CUDA_SUCCESS;
}

/* The guest's number of the GPU a (translated) location names. */
static int guest_dev(struct vh_chan *ch, int host_dev)
{
	for (int d = 0; d < ch->fwd->ndev; d++)
		if (ch->fwd->dev[d] == host_dev)
			return d;
	return 0;
}

CUresult guarded_cuMemGetAllocationGranularity(struct vh_chan *ch, size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags option)
{
	CUmemAllocationProp p;
	CUresult r = prop_in(ch, prop, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemGetAllocationGranularity(g, &p, option);
}

CUresult guarded_cuMemCreate(struct vh_chan *ch, CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	const struct vh_backend *B = ch->backend;
	CUmemAllocationProp p;
	CUresult r = prop_in(ch, prop, &p);
	if (r != CUDA_SUCCESS)
		return r;
	if (!handle || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = guest_dev(ch, p.location.id);
	if (vh_quota_take_begin(ch, dev, size, "cuMemCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = B->cuMemCreate(handle, size, &p, flags);
	if (r == CUDA_SUCCESS && !vh_alloc_track(ch, *handle, size, dev, VH_VMM)) {
		B->cuMemRelease(*handle);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_take_end(ch, dev, size, r)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, *handle, 1u << VH_VMM));
		B->cuMemRelease(*handle);
		return vh_quota_take_undo(ch, dev, size, "cuMemCreate");
	}
	if (r == CUDA_SUCCESS) {
		/* the driver's handle is its own (a host pointer): the guest gets a number of its own */
		struct vh_alloc *a = vh_alloc_find(ch, *handle, 1u << VH_VMM);
		a->guest = (uint64_t)0x766d6d << 40 | ++ch->vmm_ids;
		*handle = a->guest;
	}
	return vh_quota_card_full(ch, dev, r, "cuMemCreate", size);
}

/* A handle's memory goes when it is released and no longer mapped. */
static void vmm_maybe_gone(struct vh_chan *ch, uint64_t handle)
{
	struct vh_alloc *h = vh_alloc_find(ch, handle, 1u << VH_VMM_RELEASED);
	if (!h)
		return;
	for (size_t i = 0; i < ch->nallocs; i++)
		if (ch->allocs[i].kind == VH_VMM_MAP && ch->allocs[i].ref == handle)
			return;
	vh_alloc_release(ch, h);
}

CUresult guarded_cuMemRelease(struct vh_chan *ch, CUmemGenericAllocationHandle guest)
{
	struct vh_alloc *a = vh_alloc_find_vmm(ch, guest, 1u << VH_VMM);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t handle = a->base;
	CUresult r = ch->backend->cuMemRelease(handle);
	if (r != CUDA_SUCCESS)
		return r;
	a->kind = VH_VMM_RELEASED;
	a->guest = 0;
	vmm_maybe_gone(ch, handle);
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemMap(struct vh_chan *ch, CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle guest, unsigned long long flags)
{
	struct vh_alloc *a = vh_alloc_find_vmm(ch, guest, 1u << VH_VMM);
	if (!a)
		return CUDA_ERROR_INVALID_HANDLE; /* only a handle this guest process made and holds */
	if (size == 0 || !vh_alloc_in_reserved(ch, ptr, size))
		return CUDA_ERROR_INVALID_VALUE; /* only inside a range this guest process reserved */
	int dev = a->dev;
	uint64_t handle = a->base;
	CUresult r = ch->backend->cuMemMap(ptr, size, offset, handle, flags);
	if (r != CUDA_SUCCESS)
		return r;
	struct vh_alloc *m = vh_alloc_track(ch, ptr, size, dev, VH_VMM_MAP);
	if (!m || vh_addr_add(ch, ptr, size, VH_SPAN_MAP, NULL)) {
		if (m)
			vh_alloc_untrack(ch, m);
		ch->backend->cuMemUnmap(ptr, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->ref = handle;
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemUnmap(struct vh_chan *ch, CUdeviceptr ptr, size_t size)
{
	struct vh_alloc *m = vh_alloc_find(ch, ptr, 1u << VH_VMM_MAP);
	if (!m || m->size != size)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemUnmap(ptr, size);
	if (r != CUDA_SUCCESS)
		return r;
	vh_addr_remove(ch, ptr, VH_SPAN_MAP);
	uint64_t handle = m->ref;
	int dev = m->dev;
	vh_alloc_untrack(ch, m);
	vmm_maybe_gone(ch, handle);
	if (vh_quota_measured(ch))
		vh_quota_settle(ch, dev);
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemSetAccess(struct vh_chan *ch, CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
			    size_t count)
{
	if (!desc || count == 0 || count > VH_MAX_ACCESS_DESCS || size == 0 || !vh_alloc_in_reserved(ch, ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	CUmemAccessDesc d[VH_MAX_ACCESS_DESCS];
	for (size_t i = 0; i < count; i++) {
		d[i] = desc[i];
		if (vh_location_in(ch, &d[i].location))
			return CUDA_ERROR_INVALID_DEVICE;
	}
	return ch->backend->cuMemSetAccess(ptr, size, d, count);
}

/* A virtual address range for VMM mappings.  The guest's address hint is not passed on: the
 * driver may place a reservation anywhere (a hint is only a wish), and a hint is a guest's
 * choice of a worker address. */
CUresult guarded_cuMemAddressReserve(struct vh_chan *ch, CUdeviceptr *ptr, size_t size, size_t alignment,
				 CUdeviceptr addr, unsigned long long flags)
{
	(void)addr;
	if (!ptr || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemAddressReserve(ptr, size, alignment, 0, flags);
	if (r != CUDA_SUCCESS)
		return r;
	if (!vh_alloc_track(ch, *ptr, size, ch->cur_dev >= 0 ? ch->cur_dev : 0, VH_VA)) {
		ch->backend->cuMemAddressFree(*ptr, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

CUresult guarded_cuMemAddressFree(struct vh_chan *ch, CUdeviceptr ptr, size_t size)
{
	struct vh_alloc *a = vh_alloc_find(ch, ptr, 1u << VH_VA);
	if (!a || a->size != size)
		return CUDA_ERROR_INVALID_VALUE; /* only a whole range this guest process reserved */
	CUresult r = ch->backend->cuMemAddressFree(ptr, size);
	if (r == CUDA_SUCCESS)
		vh_alloc_untrack(ch, a); /* an address range holds no memory: nothing to give back */
	return r;
}
