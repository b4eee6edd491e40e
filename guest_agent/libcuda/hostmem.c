/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pinned host memory: cuMemHostAlloc and cuMemAllocHost carve blocks from the
 * region's heap, which the host registers with its driver, so copies to and
 * from them are zero-copy DMA.  Allocation and freeing stay in the guest; only
 * the device address of pinned memory asks the host.
 *
 * When the GPU is on another machine (a region whose host is a network bridge,
 * VMGPU_FEAT_REMOTE), no host can see the heap: "pinned" memory is then the
 * process's own pages, copied like pageable memory through the bulk area, and
 * it has no device address (cuMemHostGetDevicePointer: not supported).
 *
 * cuMemHostRegister: the host cannot pin or reach memory the program allocated itself (it lies
 * outside the region), so registration is kept here, honestly: a registered range is listed
 * (overlaps refused as the driver refuses them), its copies are correct but move as pageable
 * memory does (through the bulk area, not by DMA), its pointer attributes say host memory with
 * no device mapping, and cuMemHostGetDevicePointer refuses it (CUDA_ERROR_NOT_SUPPORTED, said
 * once): a kernel cannot be given it.  IO memory is refused.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "call.h"
#include "connection.h"
#include "hostmem.h"
#include "vg_guest_protos.h"

uint64_t vg_heap_offset(const void *p, size_t n)
{
	if (!vg_conn.guest || !p)
		return UINT64_MAX;
	uint64_t off = vmgpu_guest_offset(vg_conn.guest, p);
	const struct vmgpu_layout *L = vmgpu_guest_layout(vg_conn.guest);
	if (off == UINT64_MAX || off < L->heap_off || n > L->heap_off + L->heap_size - off)
		return UINT64_MAX;
	return off;
}

/* pinned memory of a remote guest: its own pages, listed to tell them from other pointers */
struct local_block {
	void *p;
	size_t size;
	struct local_block *next;
	unsigned flags; /* a registered range's cuMemHostRegister flags */
};
static struct local_block *local_blocks;
/* ranges registered with cuMemHostRegister */
static struct local_block *registered;
static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER;

static int remote(void)
{
	return vg_conn.guest && vmgpu_guest_remote(vg_conn.guest);
}

static CUresult local_alloc(void **pp, size_t size)
{
	size_t n = (size + 4095) & ~(size_t)4095;
	struct local_block *b = malloc(sizeof *b);
	void *p = n < size ? MAP_FAILED : mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!b || p == MAP_FAILED) {
		free(b);
		if (p != MAP_FAILED)
			munmap(p, n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*b = (struct local_block){.p = p, .size = n};
	pthread_mutex_lock(&local_lock);
	b->next = local_blocks;
	local_blocks = b;
	pthread_mutex_unlock(&local_lock);
	*pp = p;
	return CUDA_SUCCESS;
}

/* 1: p starts a local block (taken off the list and unmapped when release is set) */
static int local_block(void *p, int release)
{
	pthread_mutex_lock(&local_lock);
	struct local_block **at = &local_blocks;
	while (*at && (*at)->p != p)
		at = &(*at)->next;
	struct local_block *b = *at;
	if (b && release)
		*at = b->next;
	pthread_mutex_unlock(&local_lock);
	if (b && release) {
		munmap(b->p, b->size);
		free(b);
	}
	return b != NULL;
}

/* The block of list holding p (under local_lock), or NULL. */
static struct local_block *block_at(struct local_block *list, uintptr_t a)
{
	while (list && !(a >= (uintptr_t)list->p && a - (uintptr_t)list->p < list->size))
		list = list->next;
	return list;
}

int vg_local_pinned(const void *p, void **base, size_t *size)
{
	if (!p)
		return 0;
	pthread_mutex_lock(&local_lock);
	struct local_block *b = block_at(registered, (uintptr_t)p);
	if (!b && remote())
		b = block_at(local_blocks, (uintptr_t)p);
	if (b) {
		*base = b->p;
		*size = b->size;
	}
	pthread_mutex_unlock(&local_lock);
	return b != NULL;
}

CUresult handwritten_cuMemHostAlloc(void **pp, size_t size, unsigned int flags, unsigned f)
{
	(void)f;
	(void)flags; /* all heap memory is portable, mapped and registered by the host */
	if (!pp || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (remote())
		return local_alloc(pp, size);
	uint64_t off;
	vg_lock();
	int e = vmgpu_guest_heap_alloc(vg_conn.chan, size, &off);
	vg_unlock();
	if (e < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pp = vmgpu_guest_ptr(vg_conn.guest, off);
	/* with unified addressing, pinned memory's pointer is its device address too (programs give
	 * it to memsets and copies as such): once per process, the host maps the region at this
	 * process's address (as cuMemHostGetDevicePointer does), so that it is */
	static _Atomic int aliased;
	if (!atomic_exchange(&aliased, 1)) {
		CUdeviceptr d;
		handwritten_cuMemHostGetDevicePointer_v2(&d, *pp, 0, f);
	}
	return CUDA_SUCCESS;
}

CUresult handwritten_cuMemAllocHost_v2(void **pp, size_t size, unsigned f)
{
	return handwritten_cuMemHostAlloc(pp, size, 0, f);
}

CUresult handwritten_cuMemAllocHost(void **pp, unsigned int size, unsigned f)
{
	return handwritten_cuMemHostAlloc(pp, size, 0, f);
}

CUresult handwritten_cuMemFreeHost(void *p, unsigned f)
{
	(void)f;
	if (p && remote() && local_block(p, 1))
		return CUDA_SUCCESS; /* its own pages: freed even after the link was lost */
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t off = vg_heap_offset(p, 1);
	if (off == UINT64_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	vg_lock();
	int e = vmgpu_guest_heap_free(vg_conn.chan, off);
	vg_unlock();
	return e < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* The flags p was registered with (under local_lock); -1 if it is not registered memory. */
static long registered_flags(const void *p)
{
	struct local_block *b = p ? block_at(registered, (uintptr_t)p) : NULL;
	return b ? (long)b->flags : -1;
}

CUresult handwritten_cuMemHostGetFlags(unsigned int *flags, void *p, unsigned f)
{
	(void)f;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&local_lock);
	long rf = registered_flags(p);
	pthread_mutex_unlock(&local_lock);
	if (rf >= 0) {
		*flags = (unsigned)rf;
		return CUDA_SUCCESS;
	}
	if (p && remote() && local_block(p, 0)) {
		*flags = CU_MEMHOSTALLOC_PORTABLE;
		return CUDA_SUCCESS;
	}
	if (vg_heap_offset(p, 1) == UINT64_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuMemHostGetDevicePointer_v2(CUdeviceptr *pd, void *p, unsigned int flags, unsigned fl)
{
	if (!pd)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&local_lock);
	long rf = registered_flags(p);
	pthread_mutex_unlock(&local_lock);
	if (rf >= 0) {
		static int said;
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			vg_log("cuMemHostGetDevicePointer: memory registered with cuMemHostRegister has no device "
			       "address in a guest (the GPU's host cannot reach it): CUDA_ERROR_NOT_SUPPORTED; "
			       "cuMemHostAlloc gives memory a kernel can use");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (remote())
		return CUDA_ERROR_NOT_SUPPORTED; /* the GPU's host cannot see this machine's memory */
	uint64_t off = vg_heap_offset(p, 1);
	if (off == UINT64_MAX)
		return vg_check_ready() ? vg_check_ready() : CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuMemHostGetDevicePointer_v2, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, off);
	vg_put_u64(&c, flags);
	/* where this process has the region: the host maps it there too, so that the device
	 * address of pinned memory is this process's own pointer, which a kernel can be given */
	vg_put_u64(&c, (uint64_t)(uintptr_t)vmgpu_guest_ptr(vg_conn.guest, 0));
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		/* a device address (our own pointer), or a region offset (a kernel cannot use it, but
		 * copies can, as for any pinned pointer) */
		struct vg_addr_answer a;
		vg_get(&c, &a, sizeof a);
		*pd = a.kind == VG_ANSWER_REGION ? (CUdeviceptr)(uintptr_t)vmgpu_guest_ptr(vg_conn.guest, a.value)
						 : (CUdeviceptr)a.value;
	}
	return vg_end(&c, r);
}

/* ---- cuMemHostRegister: listed here (see the top of this file) --------------------------- */

#define REGISTER_FLAGS                                                                               \
	(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |   \
	 CU_MEMHOSTREGISTER_READ_ONLY)

static CUresult host_register(void *p, size_t size, unsigned flags)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (!p || size == 0 || (flags & ~(unsigned)REGISTER_FLAGS) || (uintptr_t)p + size < (uintptr_t)p)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags & CU_MEMHOSTREGISTER_IOMEMORY)
		return CUDA_ERROR_NOT_SUPPORTED; /* a device's I/O memory: nothing a guest can hand over */
	/* pinned memory already, as the driver says of memory cuMemHostAlloc gave */
	if (vg_heap_offset(p, 1) != UINT64_MAX || vg_heap_offset((const uint8_t *)p + size - 1, 1) != UINT64_MAX)
		return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	struct local_block *n = malloc(sizeof *n);
	if (!n)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*n = (struct local_block){.p = p, .size = size, .flags = flags};
	uintptr_t lo = (uintptr_t)p, hi = lo + size;
	pthread_mutex_lock(&local_lock);
	for (struct local_block *b = registered; b; b = b->next)
		if (lo < (uintptr_t)b->p + b->size && (uintptr_t)b->p < hi) {
			pthread_mutex_unlock(&local_lock);
			free(n);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	n->next = registered;
	registered = n;
	pthread_mutex_unlock(&local_lock);
	static int said;
	if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		vg_log("cuMemHostRegister: registered memory is copied as pageable memory is in a guest (correct, "
		       "not zero-copy) and a kernel cannot reach it; cuMemHostAlloc gives pinned memory");
	return CUDA_SUCCESS;
}

CUresult handwritten_cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags, unsigned f)
{
	(void)f;
	return host_register(p, bytesize, Flags);
}

CUresult handwritten_cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags, unsigned f)
{
	(void)f;
	return host_register(p, bytesize, Flags);
}

CUresult handwritten_cuMemHostUnregister(void *p, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&local_lock);
	struct local_block **at = &registered;
	while (*at && (*at)->p != p)
		at = &(*at)->next;
	struct local_block *b = *at;
	if (b)
		*at = b->next;
	pthread_mutex_unlock(&local_lock);
	if (!b)
		return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED; /* only the base of a registered range */
	free(b);
	return CUDA_SUCCESS;
}
