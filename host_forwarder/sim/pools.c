/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory pools (objects that hand out plain allocations at once: streams complete at once) and
 * VMM (a handle is host memory; a mapping makes a range of a reserved address window resolve
 * to it).
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

/* Pools: objects that hand out plain allocations at once (streams complete at once). */
static struct sim_obj default_pool[8] = {{POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0},
					 {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0},
					 {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}};
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	*p = (CUmemoryPool)&default_pool[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) { return cuDeviceGetDefaultMemPool(p, d); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props)
{
	if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
	    props->location.id >= sim_devices())
		return CUDA_ERROR_INVALID_VALUE;
	return sim_new_obj((void **)p, POOL_MAGIC, 0);
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p)
{
	for (int i = 0; i < 8; i++)
		if ((void *)p == (void *)&default_pool[i]) return CUDA_ERROR_INVALID_VALUE;
	return sim_del_obj(p, POOL_MAGIC);
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep) { (void)keep; return sim_is_obj(p, POOL_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
	(void)a;
	return sim_is_obj(p, POOL_MAGIC) && v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
	if (!sim_is_obj(p, POOL_MAGIC) || !v) return CUDA_ERROR_INVALID_VALUE;
	if (a <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) *(int *)v = 1;
	else *(cuuint64_t *)v = 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
	(void)s;
	if (!sim_is_obj(p, POOL_MAGIC)) return CUDA_ERROR_INVALID_VALUE;
	return cuMemAlloc_v2(d, n);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(d, n); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { (void)s; return cuMemFree_v2(d); }

/* VMM: a handle is host memory; a mapping makes a range of a reserved address window sim_resolve to it. */
#define VMM_MAGIC 0x564d4d48u
/* refs: the program's holds (cuMemCreate or an import, and each retain); released when none is left */
struct sim_vmm { uint32_t magic; int released, maps, refs, dev, fd_ok; uint8_t *host; uint64_t size; };
#define VMM_GRAN (2u << 20)
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o)
{
	(void)o;
	if (!g || !p) return CUDA_ERROR_INVALID_VALUE;
	*g = VMM_GRAN;
	return CUDA_SUCCESS;
}
static void vmm_maybe_free(struct sim_vmm *v)
{
	if (!v->released || v->maps) return;
	sim_usage_add(-(int64_t)v->size);
	pthread_mutex_lock(&sim_mu);
	sim_used_bytes -= v->size;
	pthread_mutex_unlock(&sim_mu);
	free(v->host);
	v->magic = 0;
	free(v);
}
static CUresult vmm_new(CUmemGenericAllocationHandle *h, size_t size, int dev, int fd_ok)
{
	pthread_mutex_lock(&sim_mu);
	int over = size > sim_total_mem() - sim_used_bytes;
	if (!over) sim_used_bytes += size;
	pthread_mutex_unlock(&sim_mu);
	if (over) return CUDA_ERROR_OUT_OF_MEMORY;
	struct sim_vmm *v = calloc(1, sizeof *v);
	if (v) v->host = calloc(1, size);
	if (!v || !v->host) { free(v); return CUDA_ERROR_OUT_OF_MEMORY; }
	v->magic = VMM_MAGIC;
	v->size = size;
	v->refs = 1;
	v->dev = dev;
	v->fd_ok = fd_ok;
	sim_usage_add((int64_t)size);
	*h = (CUmemGenericAllocationHandle)(uintptr_t)v;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long fl)
{
	if (!h || !p || fl || !size || size % VMM_GRAN) return CUDA_ERROR_INVALID_VALUE;
	if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id < 0 || p->location.id >= sim_devices())
		return CUDA_ERROR_INVALID_DEVICE;
	if (p->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
	return vmm_new(h, size, p->location.id, p->requestedHandleTypes != 0);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (!sim_is_obj(v, VMM_MAGIC) || v->released) return CUDA_ERROR_INVALID_VALUE;
	if (--v->refs > 0) return CUDA_SUCCESS;
	v->released = 1;
	vmm_maybe_free(v);
	return CUDA_SUCCESS;
}
/* A handle shared as a descriptor: a memfd naming its size and GPU.  The simulator cannot share
 * memory between processes: an import makes memory of its own of that size (zeroed), counted as
 * the importer's.  What tests check with it is who may import what, not that bytes move. */
struct sim_vmm_fd { char magic[8]; uint64_t size; int32_t dev, pid; };
static const char VMM_FD_MAGIC[8] = "simvmmfd";
EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
					     unsigned long long fl)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (!out || fl || !sim_is_obj(v, VMM_MAGIC) || v->released) return CUDA_ERROR_INVALID_VALUE;
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !v->fd_ok) return CUDA_ERROR_INVALID_VALUE;
	struct sim_vmm_fd d = {.size = v->size, .dev = v->dev, .pid = (int32_t)getpid()};
	memcpy(d.magic, VMM_FD_MAGIC, sizeof d.magic);
	int fd = memfd_create("sim-vmm", MFD_CLOEXEC);
	if (fd < 0 || pwrite(fd, &d, sizeof d, 0) != (ssize_t)sizeof d) {
		if (fd >= 0) close(fd);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	memcpy(out, &fd, sizeof fd);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t)
{
	if (!h || t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
	struct sim_vmm_fd d;
	if (pread((int)(intptr_t)os, &d, sizeof d, 0) != (ssize_t)sizeof d || memcmp(d.magic, VMM_FD_MAGIC, sizeof d.magic) ||
	    !d.size || d.size % VMM_GRAN || d.dev < 0 || d.dev >= sim_devices())
		return CUDA_ERROR_INVALID_VALUE;
	return vmm_new(h, d.size, d.dev, 1);
}
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *p, CUmemGenericAllocationHandle h)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (!p || !sim_is_obj(v, VMM_MAGIC) || v->released) return CUDA_ERROR_INVALID_VALUE;
	*p = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				   .requestedHandleTypes = v->fd_ok ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0,
				   .location = {CU_MEM_LOCATION_TYPE_DEVICE, v->dev}};
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long fl)
{
	(void)align; (void)addr; (void)fl;
	if (!p || !size || size % VMM_GRAN) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim_mu);
	*p = sim_next_dev;
	sim_next_dev += size + VMM_GRAN;
	pthread_mutex_unlock(&sim_mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return CUDA_SUCCESS; }
struct sim_map { CUdeviceptr va; uint64_t size; struct sim_vmm *v; };
static struct sim_map maps[256];
EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long fl)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (fl || !sim_is_obj(v, VMM_MAGIC) || v->released || off > v->size || size > v->size - off) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim_mu);
	int slot = -1;
	for (int i = 0; i < 256 && slot < 0; i++)
		if (!maps[i].v) slot = i;
	if (slot >= 0) maps[slot] = (struct sim_map){va, size, v};
	pthread_mutex_unlock(&sim_mu);
	if (slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
	v->maps++;
	return sim_add_range(va, v->host + off, size, 2);
}
EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size)
{
	(void)size;
	struct sim_vmm *v = NULL;
	pthread_mutex_lock(&sim_mu);
	for (int i = 0; i < 256 && !v; i++)
		if (maps[i].v && maps[i].va == va) { v = maps[i].v; maps[i].v = NULL; }
	for (size_t i = 0; v && i < sim_nranges; i++)
		if (sim_ranges[i].dev == va && sim_ranges[i].registered == 2) { sim_ranges[i] = sim_ranges[--sim_nranges]; break; }
	pthread_mutex_unlock(&sim_mu);
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	v->maps--;
	vmm_maybe_free(v);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n)
{
	(void)p; (void)size;
	if (!d || !n) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++)
		if (d[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || d[i].location.id < 0 || d[i].location.id >= sim_devices())
			return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
	if (!h) return CUDA_ERROR_INVALID_VALUE;
	struct sim_vmm *v = NULL;
	uint64_t a = (uint64_t)(uintptr_t)addr;
	pthread_mutex_lock(&sim_mu);
	for (int i = 0; i < 256 && !v; i++)
		if (maps[i].v && a >= maps[i].va && a - maps[i].va < maps[i].size) v = maps[i].v;
	pthread_mutex_unlock(&sim_mu);
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	if (v->released) { v->released = 0; v->refs = 0; } /* held again through its mapping */
	v->refs++;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)v;
	return CUDA_SUCCESS;
}
