/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Virtual memory management (cuMemCreate, cuMemMap, address reservations), charged to the quota
 * (quota.c).  What a guest names (a VMM handle to map, a range to map into) must be something
 * this guest process made (or imported); the driver's handles never reach the guest.  A handle may
 * be made exportable as a file descriptor, for the guest's other processes only (ipc.c); no other
 * exportable type is let through.  Memory on the host (HOST_NUMA locations) is not made: the guest
 * could not reach it, and NCCL falls back to memory it can.
 */
#define _GNU_SOURCE
#include "channel.h"
#include "ipc.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

#define VH_MAX_ACCESS_DESCS 16

static int host_location(CUmemLocationType t)
{
	return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
	       t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

/* A guest's allocation properties as the driver takes them: on one of its GPUs (or, only where
 * host_ok, asked of the host's memory), exportable at most as a file descriptor. */
static CUresult prop_in(struct vh_chan *ch, const CUmemAllocationProp *in, CUmemAllocationProp *out, int host_ok)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	*out = *in;
	if (out->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    (out->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		return CUDA_ERROR_NOT_SUPPORTED; /* fabric and Windows handles: as on a GPU without them */
	out->win32HandleMetaData = NULL;
	if (host_location(out->location.type)) {
		out->location.id = 0; /* the host's first NUMA node: only its granularity is asked */
		return host_ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
	}
	if (vh_location_in(ch, &out->location))
		return CUDA_ERROR_INVALID_DEVICE;
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
	CUresult r = prop_in(ch, prop, &p, 1);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemGetAllocationGranularity(g, &p, option);
}

/* A new number of the guest's for a handle (the driver's is a host pointer). */
static void vmm_name(struct vh_chan *ch, struct vh_alloc *a)
{
	a->guest = (uint64_t)0x766d6d << 40 | ++ch->vmm_ids;
}

struct vh_alloc *vh_vmm_hold(struct vh_chan *ch, uint64_t real, uint64_t size, int dev, int shareable, int *again)
{
	struct vh_alloc *a = vh_alloc_find(ch, real, 1u << VH_VMM | 1u << VH_VMM_RELEASED);
	*again = a != NULL;
	if (a) {
		/* the driver gave a handle this process holds (an import of its own export): one
		 * more hold; a released one that is still mapped is the guest's again */
		if (a->kind == VH_VMM_RELEASED) {
			a->kind = VH_VMM;
			a->holds = 0;
			vmm_name(ch, a);
		}
		a->holds++;
		return a;
	}
	if (!(a = vh_alloc_track(ch, real, size, dev, VH_VMM)))
		return NULL;
	a->holds = 1;
	a->shareable = shareable;
	vmm_name(ch, a);
	return a;
}

void vh_vmm_drop(struct vh_chan *ch, struct vh_alloc *a)
{
	uint64_t real = a->base;
	vh_alloc_untrack(ch, a);
	ch->backend->cuMemRelease(real);
}

CUresult guarded_cuMemCreate(struct vh_chan *ch, CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	const struct vh_backend *B = ch->backend;
	CUmemAllocationProp p;
	CUresult r = prop_in(ch, prop, &p, 0);
	if (r != CUDA_SUCCESS)
		return r;
	if (!handle || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = guest_dev(ch, p.location.id);
	if (vh_quota_take_begin(ch, dev, size, "cuMemCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUmemGenericAllocationHandle real = 0;
	r = B->cuMemCreate(&real, size, &p, flags);
	struct vh_alloc *a = NULL;
	int again = 0;
	if (r == CUDA_SUCCESS && (!(a = vh_vmm_hold(ch, real, size, dev, p.requestedHandleTypes != 0, &again)) || again)) {
		if (!again)
			B->cuMemRelease(real);
		r = CUDA_ERROR_OUT_OF_MEMORY; /* (a new handle the process already holds: never) */
	}
	if (vh_quota_take_end(ch, dev, size, r)) {
		vh_vmm_drop(ch, a);
		return vh_quota_take_undo(ch, dev, size, "cuMemCreate");
	}
	if (r == CUDA_SUCCESS)
		*handle = a->guest; /* the driver's handle is its own (a host pointer) */
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
	if (a->holds > 1) {
		a->holds--; /* a retained hold given back: the guest still holds the handle */
		return CUDA_SUCCESS;
	}
	if (a->exported) {
		vh_ipc_unexport(ch, handle); /* its last hold: what it exported imports nothing new */
		a->exported = 0;
	}
	a->holds = 0;
	a->kind = VH_VMM_RELEASED;
	a->guest = 0;
	vmm_maybe_gone(ch, handle);
	return CUDA_SUCCESS;
}

/* The mapping (VH_VMM_MAP) of this process that holds address p, or NULL. */
static struct vh_alloc *map_at(struct vh_chan *ch, uint64_t p)
{
	for (size_t i = 0; i < ch->nallocs; i++) {
		struct vh_alloc *m = &ch->allocs[i];
		if (m->kind == VH_VMM_MAP && p >= m->base && p - m->base < m->size)
			return m;
	}
	return NULL;
}

/* The handle mapped at an address of the guest's own mappings, held once more (the guest gives
 * the hold back with cuMemRelease, as the driver's). */
CUresult guarded_cuMemRetainAllocationHandle(struct vh_chan *ch, CUmemGenericAllocationHandle *handle, void *addr)
{
	struct vh_alloc *m = map_at(ch, (uint64_t)(uintptr_t)addr);
	if (!m)
		return CUDA_ERROR_INVALID_VALUE; /* nothing this process mapped */
	uint64_t real = m->ref;
	struct vh_alloc *a = vh_alloc_find(ch, real, 1u << VH_VMM | 1u << VH_VMM_RELEASED);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemGenericAllocationHandle got = 0;
	CUresult r = ch->backend->cuMemRetainAllocationHandle(&got, addr);
	if (r != CUDA_SUCCESS)
		return r;
	if (got != real) { /* the driver and the forwarder's table disagree: give its hold back, name nothing */
		ch->backend->cuMemRelease(got);
		return CUDA_ERROR_INVALID_VALUE;
	}
	int again;
	a = vh_vmm_hold(ch, real, a->size, a->dev, a->shareable, &again);
	*handle = a->guest;
	return CUDA_SUCCESS;
}

/* A handle's properties, its location named by the guest's number of the GPU. */
CUresult guarded_cuMemGetAllocationPropertiesFromHandle(struct vh_chan *ch, CUmemAllocationProp *prop,
						     CUmemGenericAllocationHandle guest)
{
	struct vh_alloc *a = vh_alloc_find_vmm(ch, guest, 1u << VH_VMM);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemGetAllocationPropertiesFromHandle(prop, a->base);
	if (r != CUDA_SUCCESS)
		return r;
	if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
		prop->location.id = a->dev;
	prop->win32HandleMetaData = NULL;
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
