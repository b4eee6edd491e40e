/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory a guest names, checked against its region (host_memory.h), and pinned memory for kernels. */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "host_memory.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

void *vh_host_buf(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n)
{
	if (kind == VG_BUF_HEAP)
		return vmgpu_host_heap(ch->fwd->host, a, n);
	if (kind == VG_BUF_BULK)
		return vmgpu_hchan_bulk(ch->hc, a, n);
	return NULL;
}

void vh_host_buf_done(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n)
{
	if (kind == VG_BUF_BULK)
		vmgpu_hchan_bulk_release(ch->hc, a + n);
}

/* The alias is the mapping kernels use: see region_alias. */
uint64_t vh_alias_offset(struct vh_chan *ch, uint64_t addr)
{
	uint64_t base = (uint64_t)(uintptr_t)ch->alias;
	if (!ch->alias || addr < base || addr - base >= ch->fwd->region_size)
		return UINT64_MAX;
	return addr - base;
}

/* Pinned memory for kernels (cuMemHostGetDevicePointer).  A kernel must be given an address
 * its GPU can use, and with unified addressing that is the host address of the registered
 * memory; the worker's own address of the region must not leave the host.  So the worker maps
 * the region a second time at the very address the guest process has it at (never over
 * anything: the placeholder is made with MAP_FIXED_NOREPLACE) and registers that mapping: the
 * device address of pinned memory is then the guest's own pointer, which the guest already
 * knows.  It is made once, at the first request; if that address is taken in the worker, the
 * guest gets its own pointer all the same (copies work; a kernel cannot read it). */
static uint8_t *region_alias(struct vh_chan *ch, uint64_t guest_base)
{
	struct vh_fwd *f = ch->fwd;
	if (ch->alias || ch->alias_tried)
		return ch->alias && (uint64_t)(uintptr_t)ch->alias == guest_base ? ch->alias : NULL;
	ch->alias_tried = 1;
	uint64_t end;
	long page = sysconf(_SC_PAGESIZE);
	if (!f->registered || guest_base == 0 || guest_base % (uint64_t)page ||
	    __builtin_add_overflow(guest_base, f->region_size, &end) || end > (1ull << 47))
		return NULL;
	void *want = (void *)(uintptr_t)guest_base;
	void *ph = mmap(want, f->region_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
			-1, 0);
	if (ph != want) {
		if (ph != MAP_FAILED)
			munmap(ph, f->region_size); /* an old kernel that took the flag for a hint */
		vh_log("channel %u: the guest's address of the region is taken in the worker: kernels cannot use "
		       "pinned memory through cuMemHostGetDevicePointer (copies can)", ch->index);
		return NULL;
	}
	/* the same pages again (a shared mapping remapped with old size 0), over our placeholder */
	void *m = mremap(f->region, 0, f->region_size, MREMAP_MAYMOVE | MREMAP_FIXED, want);
	if (m != want) {
		munmap(want, f->region_size);
		return NULL;
	}
	CUresult r = ch->backend->cuMemHostRegister_v2(want, f->region_size,
						       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != CUDA_SUCCESS) {
		munmap(want, f->region_size);
		return NULL;
	}
	ch->alias = want;
	return ch->alias;
}

/* The device address of heap memory, as the guest may see it: (VG_ANSWER_VALUE, its own pointer,
 * which is the device address of the alias) where the alias exists, else (VG_ANSWER_REGION,
 * region offset), which the guest library turns into its own pointer.  Never the worker's address. */
CUresult handwritten_cuMemHostGetDevicePointer_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t off = vh_get_u64(rd);
	unsigned int fl = (unsigned int)vh_get_u64(rd);
	uint64_t guest_base = vh_get_u64(rd);
	void *p = vmgpu_host_heap(ch->fwd->host, off, 1);
	if (rd->bad || !p || fl != 0)
		return CUDA_ERROR_INVALID_VALUE; /* flags must be 0, as for the driver */
	if (!ch->fwd->registered)
		return CUDA_ERROR_NOT_SUPPORTED;
	struct vg_addr_answer out = {VG_ANSWER_REGION, off};
	uint8_t *alias = region_alias(ch, guest_base);
	CUdeviceptr d;
	/* with unified addressing the device address is alias + off: the guest's own pointer */
	if (alias && ch->backend->cuMemHostGetDevicePointer_v2(&d, alias + off, 0) == CUDA_SUCCESS &&
	    d == (CUdeviceptr)(uintptr_t)(alias + off)) {
		out.kind = VG_ANSWER_VALUE;
		out.value = d;
	}
	vh_put(wr, &out, sizeof out);
	return CUDA_SUCCESS;
}
