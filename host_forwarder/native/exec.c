/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hand-written host halves: what the generated marshalling cannot express
 * (host buffers, module images, kernel parameters, memory accounting) and the
 * protocol's own operations.  The wire formats here match guest_agent/libcuda/custom.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vh_dispatch.h"
#include "vh_images.h"

/* ---- host buffers -------------------------------------------------------------- */

/* Resolve a guest-named host buffer (heap offset or bulk position) of n bytes. */
static void *host_buf(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n)
{
	if (kind == VG_BUF_HEAP)
		return vmgpu_host_heap(ch->fwd->host, a, n);
	if (kind == VG_BUF_BULK)
		return vmgpu_hchan_bulk(ch->hc, a, n);
	return NULL;
}

static void done_buf(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n)
{
	if (kind == VG_BUF_BULK)
		vmgpu_hchan_bulk_release(ch->hc, a + n);
}

static CUstream stream_in(struct vh_chan *ch, uint32_t flags, uint64_t raw, int *bad)
{
	void *s = (void *)(uintptr_t)raw;
	if (vh_handle_in(ch, VG_KIND_STREAM, &s)) {
		*bad = 1;
		return NULL;
	}
	if (!s && (flags & VG_F_PTDS))
		s = CU_STREAM_PER_THREAD;
	return s;
}

static CUresult htod(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, int async)
{
	const struct vh_backend *B = ch->backend;
	CUdeviceptr dst = vh_get_u64(rd);
	uint64_t sraw = async ? vh_get_u64(rd) : 0;
	uint64_t n = vh_get_u64(rd), kind = vh_get_u64(rd), a = vh_get_u64(rd);
	int bad = 0;
	CUstream s = stream_in(ch, flags, sraw, &bad);
	const void *src;
	uint64_t inl = 0;
	if (kind == VG_BUF_INLINE) {
		src = vh_get_arr(rd, 1, &inl);
		if (inl != n)
			bad = 1;
	} else {
		src = host_buf(ch, kind, a, n);
	}
	if (rd->bad || bad || (n && !src) || vh_addr_ok(ch, dst, n)) {
		done_buf(ch, kind, a, n);
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
	done_buf(ch, kind, a, n);
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
	CUstream s = stream_in(ch, flags, sraw, &bad);
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
		dst = host_buf(ch, kind, a, n);
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
	done_buf(ch, kind, a, n);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&ch->fwd->stats->dtoh_bytes, n, memory_order_relaxed);
	return r;
}

CUresult vhc_cuMemcpyHtoD_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return htod(ch, flags, rd, 0);
}

CUresult vhc_cuMemcpyHtoDAsync_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return htod(ch, flags, rd, 1);
}

CUresult vhc_cuMemcpyDtoH_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return dtoh(ch, flags, rd, wr, 0);
}

CUresult vhc_cuMemcpyDtoHAsync_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return dtoh(ch, flags, rd, wr, 1);
}

/* The region's offset of an address inside its mapping at the guest's own address (the alias
 * that kernels use, see region_alias), or UINT64_MAX. */
static uint64_t alias_offset(struct vh_chan *ch, uint64_t addr)
{
	uint64_t base = (uint64_t)(uintptr_t)ch->alias;
	if (!ch->alias || addr < base || addr - base >= ch->fwd->region_size)
		return UINT64_MAX;
	return addr - base;
}

/* One side of a unified-address copy: a device address of this process (VG_BUF_INLINE, kept)
 * or an offset in the guest's heap (turned into its host address).  Anything else, a host
 * address of the worker above all, is refused: 0, or -1. */
static int unified_side(struct vh_chan *ch, uint64_t kind, uint64_t *addr, uint64_t n)
{
	if (kind == VG_BUF_INLINE) {
		if (vh_addr_ok(ch, *addr, n) == 0)
			return 0;
		/* the guest's own address of pinned memory, as cuMemHostGetDevicePointer gave it */
		uint64_t off = alias_offset(ch, *addr);
		if (off == UINT64_MAX)
			return -1;
		*addr = off;
	} else if (kind != VG_BUF_HEAP) {
		return -1;
	}
	void *p = host_buf(ch, VG_BUF_HEAP, *addr, n);
	if (!p)
		return -1;
	*addr = (uint64_t)(uintptr_t)p;
	return 0;
}

/* Unified-address copies: each side is a device address or a heap offset. */
static CUresult unified(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, int async)
{
	uint64_t dkind = vh_get_u64(rd), dst = vh_get_u64(rd);
	uint64_t skind = vh_get_u64(rd), src = vh_get_u64(rd);
	uint64_t n = vh_get_u64(rd);
	uint64_t sraw = async ? vh_get_u64(rd) : 0;
	int bad = 0;
	CUstream s = stream_in(ch, flags, sraw, &bad);
	if (rd->bad || bad)
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	if (unified_side(ch, dkind, &dst, n) || unified_side(ch, skind, &src, n))
		return CUDA_ERROR_INVALID_VALUE;
	/* both sides are now device addresses of this context or registered region memory */
	return async ? ch->backend->cuMemcpyAsync(dst, src, n, s) : ch->backend->cuMemcpy(dst, src, n);
}

CUresult vhc_cuMemcpy(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return unified(ch, flags, rd, 0);
}

CUresult vhc_cuMemcpyAsync(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return unified(ch, flags, rd, 1);
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

/* The device address of heap memory, as the guest may see it: (kind 0, its own pointer, which
 * is the device address of the alias) where the alias exists, else (kind 2, region offset),
 * which the guest library turns into its own pointer.  Never the worker's address. */
CUresult vhc_cuMemHostGetDevicePointer_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
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
	uint64_t out[2] = {2, off};
	uint8_t *alias = region_alias(ch, guest_base);
	CUdeviceptr d;
	/* with unified addressing the device address is alias + off: the guest's own pointer */
	if (alias && ch->backend->cuMemHostGetDevicePointer_v2(&d, alias + off, 0) == CUDA_SUCCESS &&
	    d == (CUdeviceptr)(uintptr_t)(alias + off)) {
		out[0] = 0;
		out[1] = d;
	}
	vh_put(wr, out, sizeof out);
	return CUDA_SUCCESS;
}

/* ---- module images --------------------------------------------------------------- */

/* The image to give the driver: the bytes received (or the cache's copy of the same bytes),
 * checked against their own headers (image_check.c), with a zeroed guard after them. */
static CUresult blob_take(struct vh_chan *ch, const void **image)
{
	static unsigned logged; /* a guest sending bad images does not flood the log */
	char why[200];
	if (!ch->image && (!ch->blob || ch->blob_filled != ch->blob_size))
		return CUDA_ERROR_INVALID_IMAGE;
	const uint8_t *bytes = ch->image ? vh_image_bytes(ch->image) : ch->blob;
	uint64_t size = ch->blob_size;
	if (vh_image_check(bytes, size, why, sizeof why)) {
		if (logged < 16) {
			logged++;
			vh_log("channel %u: module image of %llu bytes refused (CUDA_ERROR_INVALID_IMAGE): %s", ch->index,
			       (unsigned long long)size, why);
		}
		return CUDA_ERROR_INVALID_IMAGE;
	}
	if (!ch->image) {
		/* keep it for the next load of the same bytes, if it is what the guest said */
		ch->image = vh_image_add(ch->fwd, ch->blob, ch->blob_size, ch->blob_hash);
		if (!ch->image) {
			*image = ch->blob;
			return CUDA_SUCCESS;
		}
		ch->blob = NULL; /* the image owns the bytes now */
	}
	*image = vh_image_bytes(ch->image);
	return CUDA_SUCCESS;
}

void vh_blob_drop(struct vh_chan *ch)
{
	vh_image_put(ch->fwd, ch->image);
	ch->image = NULL;
	free(ch->blob);
	ch->blob = NULL;
	ch->blob_size = ch->blob_filled = 0;
}

#define blob_drop vh_blob_drop

static CUresult load_reply(struct vh_chan *ch, struct vh_wr *wr, CUresult r, int kind, void *obj)
{
	blob_drop(ch);
	if (r != CUDA_SUCCESS)
		return r;
	/* the code and globals of a module take device memory at once: charged, or undone */
	if (vh_books_after_load(ch) || vh_handle_new(ch, kind, &obj, NULL)) {
		if (kind == VG_KIND_MODULE)
			ch->backend->cuModuleUnload(obj);
		else
			ch->backend->cuLibraryUnload(obj);
		vh_books_after_load(ch);
		vh_oom(ch, ch->cur_dev >= 0 ? ch->cur_dev : 0, kind == VG_KIND_MODULE ? "cuModuleLoadData" : "cuLibraryLoadData",
		       0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	vh_put(wr, &obj, sizeof obj);
	return CUDA_SUCCESS;
}

CUresult vhc_cuModuleLoadData(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	(void)rd;
	const void *image;
	CUresult r = blob_take(ch, &image);
	CUmodule m = NULL;
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuModuleLoadData(&m, image);
	return load_reply(ch, wr, r, VG_KIND_MODULE, m);
}

/* JIT options are not forwarded: the image is loaded with the driver's defaults. */
CUresult vhc_cuModuleLoadDataEx(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return vhc_cuModuleLoadData(ch, flags, rd, wr);
}

CUresult vhc_cuModuleLoadFatBinary(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return vhc_cuModuleLoadData(ch, flags, rd, wr);
}

CUresult vhc_cuLibraryLoadData(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	(void)rd;
	const void *image;
	CUresult r = blob_take(ch, &image);
	CUlibrary l = NULL;
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0);
	return load_reply(ch, wr, r, VG_KIND_LIBRARY, l);
}

/* ---- kernels --------------------------------------------------------------------- */

static CUresult param_layout(struct vh_chan *ch, struct vh_handle *e)
{
	if (e->params_known)
		return CUDA_SUCCESS;
	const struct vh_backend *B = ch->backend;
	struct vg_param_info tmp[VG_MAX_PARAMS];
	uint32_t n = 0;
	for (; n < VG_MAX_PARAMS; n++) {
		size_t off = 0, sz = 0;
		CUresult r = e->kind == VG_KIND_KERNEL ? B->cuKernelGetParamInfo(e->ptr, n, &off, &sz)
						       : B->cuFuncGetParamInfo(e->ptr, n, &off, &sz);
		if (r == CUDA_ERROR_INVALID_VALUE)
			break;
		if (r != CUDA_SUCCESS)
			return r;
		if (off > UINT32_MAX || sz > 4096)
			return CUDA_ERROR_INVALID_IMAGE;
		tmp[n] = (struct vg_param_info){(uint32_t)off, (uint32_t)sz};
	}
	e->params = n ? malloc(n * sizeof *tmp) : NULL;
	if (n && !e->params)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (n)
		memcpy(e->params, tmp, n * sizeof *tmp);
	e->nparams = n;
	e->params_known = 1;
	return CUDA_SUCCESS;
}

static uint64_t param_bytes(const struct vh_handle *e)
{
	uint64_t end = 0;
	for (uint32_t i = 0; i < e->nparams; i++)
		if ((uint64_t)e->params[i].offset + e->params[i].size > end)
			end = (uint64_t)e->params[i].offset + e->params[i].size;
	return end;
}

/* The guest's parameter bytes against the host's own layout; fills args. */
static CUresult params_in(struct vh_chan *ch, struct vh_handle *e, struct vh_rd *rd, void **args)
{
	uint64_t nblob;
	uint8_t *blob = vh_get_arr(rd, 1, &nblob);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = param_layout(ch, e);
	if (r != CUDA_SUCCESS)
		return r;
	/* the layout is the host's, from the driver; the guest's bytes must fill it exactly */
	if (nblob != param_bytes(e))
		return CUDA_ERROR_INVALID_VALUE;
	for (uint32_t i = 0; i < e->nparams; i++)
		args[i] = blob + e->params[i].offset;
	return CUDA_SUCCESS;
}

#define VH_MAX_LAUNCH_ATTRS 16

/* A launch configuration; attributes naming events are translated, unknown ones refused. */
static CUresult config_in(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, CUlaunchConfig *cfg,
			  CUlaunchAttribute *attrs)
{
	uint32_t dims[8];
	vh_get(rd, dims, sizeof dims);
	uint64_t sraw = vh_get_u64(rd), n;
	const CUlaunchAttribute *in = vh_get_arr(rd, sizeof *in, &n);
	if (rd->bad || n != dims[7] || n > VH_MAX_LAUNCH_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	int bad = 0;
	memset(cfg, 0, sizeof *cfg);
	cfg->gridDimX = dims[0];
	cfg->gridDimY = dims[1];
	cfg->gridDimZ = dims[2];
	cfg->blockDimX = dims[3];
	cfg->blockDimY = dims[4];
	cfg->blockDimZ = dims[5];
	cfg->sharedMemBytes = dims[6];
	cfg->hStream = stream_in(ch, flags, sraw, &bad);
	if (bad)
		return CUDA_ERROR_INVALID_HANDLE;
	for (uint64_t i = 0; i < n; i++) {
		attrs[i] = in[i];
		void **ev = NULL;
		switch (attrs[i].id) {
		case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
			ev = (void **)&attrs[i].value.programmaticEvent.event;
			break;
		case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
			ev = (void **)&attrs[i].value.launchCompletionEvent.event;
			break;
		case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
			return CUDA_ERROR_NOT_SUPPORTED; /* graphs only; holds a pointer back to the caller */
		default:
			if (attrs[i].id > CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING)
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (ev && vh_handle_in(ch, VG_KIND_EVENT, ev))
			return CUDA_ERROR_INVALID_HANDLE;
	}
	cfg->attrs = n ? attrs : NULL;
	cfg->numAttrs = (unsigned int)n;
	return CUDA_SUCCESS;
}

CUresult vhc_cuLaunchKernel(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	uint64_t fraw = vh_get_u64(rd);
	uint32_t dims[8];
	vh_get(rd, dims, sizeof dims);
	uint64_t sraw = vh_get_u64(rd);
	struct vh_handle *e = vh_handle_entry(ch, fraw, VG_KIND_FUNCTION);
	int bad = 0;
	CUstream s = stream_in(ch, flags, sraw, &bad);
	if (!e || bad)
		return rd->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	void *args[VG_MAX_PARAMS];
	CUresult r = params_in(ch, e, rd, args);
	if (r != CUDA_SUCCESS)
		return r;
	return ch->backend->cuLaunchKernel(e->ptr, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s,
					   e->nparams ? args : NULL, NULL);
}

CUresult vhc_cuLaunchKernelEx(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	CUlaunchConfig cfg;
	CUlaunchAttribute attrs[VH_MAX_LAUNCH_ATTRS];
	CUresult r = config_in(ch, flags, rd, &cfg, attrs);
	if (r != CUDA_SUCCESS)
		return r;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	void *args[VG_MAX_PARAMS];
	if ((r = params_in(ch, e, rd, args)) != CUDA_SUCCESS)
		return r;
	return ch->backend->cuLaunchKernelEx(&cfg, e->ptr, e->nparams ? args : NULL, NULL);
}

static CUresult cluster_query(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int potential)
{
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	CUlaunchConfig cfg;
	CUlaunchAttribute attrs[VH_MAX_LAUNCH_ATTRS];
	CUresult r = config_in(ch, flags, rd, &cfg, attrs);
	if (r != CUDA_SUCCESS)
		return r;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	int n = 0;
	r = potential ? ch->backend->cuOccupancyMaxPotentialClusterSize(&n, e->ptr, &cfg)
		      : ch->backend->cuOccupancyMaxActiveClusters(&n, e->ptr, &cfg);
	if (r == CUDA_SUCCESS)
		vh_put(wr, &n, sizeof n);
	return r;
}

CUresult vhc_cuOccupancyMaxActiveClusters(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return cluster_query(ch, flags, rd, wr, 0);
}

CUresult vhc_cuOccupancyMaxPotentialClusterSize(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd,
						struct vh_wr *wr)
{
	return cluster_query(ch, flags, rd, wr, 1);
}

CUresult vhc_cuFuncGetName(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	if (rd->bad || !e)
		return CUDA_ERROR_INVALID_HANDLE;
	const char *name = NULL;
	CUresult r = e->kind == VG_KIND_KERNEL ? ch->backend->cuKernelGetName(&name, e->ptr)
					       : ch->backend->cuFuncGetName(&name, e->ptr);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t n = strlen(name) + 1;
	vh_put(wr, &n, 8);
	vh_put(wr, name, n);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- a module's functions (VG_OP_MODULE_FUNCS) ------------------------------------------- */

#define VH_MAX_FN_TAGS 4095

/* The tag the driver keeps in a function object's second word is a host pointer of the driver:
 * the guest gets a number for it instead, the same number for the same tag (all the guest can do
 * with a tag is hand it on and compare it).  The numbers, (index + 1) * 16, lie below the lowest
 * address any process may map.  0 if there is no room for another. */
static uint64_t fn_tag_out(struct vh_chan *ch, uint64_t tag)
{
	if (!tag)
		return 0;
	for (uint32_t i = 0; i < ch->nfn_tags; i++)
		if (ch->fn_tags[i] == tag)
			return (uint64_t)(i + 1) << 4;
	if (ch->nfn_tags == VH_MAX_FN_TAGS)
		return 0;
	if ((ch->nfn_tags & 63) == 0) {
		uint64_t *t = realloc(ch->fn_tags, (ch->nfn_tags + 64) * sizeof *t);
		if (!t)
			return 0;
		ch->fn_tags = t;
	}
	ch->fn_tags[ch->nfn_tags++] = tag;
	return (uint64_t)ch->nfn_tags << 4;
}

/* ---- pointer attributes --------------------------------------------------------------------- */

/* What the driver says of memory it does not know: asked of this unregistered object of the
 * worker, never of an address the guest chose. */
static const uint64_t unknown_memory[8];

/* The queried address in the host's terms: a heap offset (or the guest's own address of pinned
 * memory) becomes the region's mapping; a device address must be this process's own.  0, 1 if
 * the address is none of these (*p is then an unregistered object of the worker), -1 if the
 * request is malformed. */
static int pointer_in(struct vh_chan *ch, struct vh_rd *rd, uint64_t *p)
{
	uint64_t kind = vh_get_u64(rd);
	*p = vh_get_u64(rd);
	if (rd->bad || (kind != VG_BUF_HEAP && kind != VG_BUF_INLINE))
		return -1;
	if (kind == VG_BUF_INLINE && vh_addr_ok(ch, *p, 1) == 0)
		return 0;
	uint64_t off = kind == VG_BUF_HEAP ? *p : alias_offset(ch, *p);
	void *hp = off == UINT64_MAX ? NULL : vmgpu_host_heap(ch->fwd->host, off, 1);
	if (hp) {
		*p = (uint64_t)(uintptr_t)hp;
		return 0;
	}
	if (kind == VG_BUF_HEAP)
		return -1;
	*p = (uint64_t)(uintptr_t)unknown_memory;
	return 1;
}

static int attr_is_address(CUpointer_attribute attr)
{
	return attr == CU_POINTER_ATTRIBUTE_HOST_POINTER || attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
	       attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attr == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR;
}

/* One attribute's value as the guest may see it (out[0] kind, out[1..2] value): a context
 * becomes a device index (kind 1; UINT64_MAX for none or not the guest's), an address in the
 * region a region offset (kind 2, which the guest turns into its own pointer), an address of
 * this process's device memory stays; any other address, host handle or token is withheld (0):
 * no host address of the worker leaves the host. */
static void pointer_out(struct vh_chan *ch, CUpointer_attribute attr, const uint64_t *v, uint64_t out[3])
{
	out[0] = 0;
	out[1] = v[0];
	out[2] = v[1];
	if (attr == CU_POINTER_ATTRIBUTE_CONTEXT) {
		out[0] = 1;
		out[1] = UINT64_MAX;
		for (int d = 0; v[0] && d < ch->fwd->ndev; d++)
			if (ch->ctx[d] && (uint64_t)(uintptr_t)ch->ctx[d] == v[0])
				out[1] = (uint64_t)d;
	} else if (attr_is_address(attr)) {
		uint64_t region = (uint64_t)(uintptr_t)ch->fwd->region, off = alias_offset(ch, v[0]);
		if (v[0] >= region && v[0] - region < ch->fwd->region_size)
			off = v[0] - region;
		out[2] = 0;
		if (off != UINT64_MAX) {
			out[0] = 2;
			out[1] = off;
		} else if (v[0] && !vh_addr_owned(ch, v[0])) {
			out[1] = 0;
		}
	} else if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE || attr == CU_POINTER_ATTRIBUTE_P2P_TOKENS) {
		out[1] = out[2] = 0;
	}
}

CUresult vhc_cuPointerGetAttribute(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	CUpointer_attribute attr = (CUpointer_attribute)vh_get_u64(rd);
	uint64_t p;
	if (pointer_in(ch, rd, &p))
		return CUDA_ERROR_INVALID_VALUE; /* as the driver says of memory it does not know */
	if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE || attr == CU_POINTER_ATTRIBUTE_P2P_TOKENS)
		return CUDA_ERROR_NOT_SUPPORTED; /* host handles and tokens the guest has no name for */
	uint64_t v[4] = {0}, out[3];
	CUresult r = ch->backend->cuPointerGetAttribute(v, attr, p);
	if (r != CUDA_SUCCESS)
		return r;
	pointer_out(ch, attr, v, out);
	/* alone, a context or address the guest cannot name is an error, as for a bad pointer */
	if ((out[0] == 1 && out[1] == UINT64_MAX) || (attr == CU_POINTER_ATTRIBUTE_HOST_POINTER && out[0] != 2) ||
	    (attr_is_address(attr) && out[0] == 0 && out[1] == 0))
		return CUDA_ERROR_INVALID_VALUE;
	vh_put(wr, out, sizeof out);
	return CUDA_SUCCESS;
}

CUresult vhc_cuPointerGetAttributes(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t n = vh_get_u64(rd), p;
	if (rd->bad || n == 0 || n > VG_MAX_POINTER_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	CUpointer_attribute attrs[VG_MAX_POINTER_ATTRS];
	uint64_t v[VG_MAX_POINTER_ATTRS][4];
	void *data[VG_MAX_POINTER_ATTRS];
	for (uint64_t i = 0; i < n; i++) {
		uint64_t a = vh_get_u64(rd);
		if (a > INT32_MAX)
			return CUDA_ERROR_INVALID_VALUE;
		attrs[i] = (CUpointer_attribute)a;
		memset(v[i], 0, sizeof v[i]);
		data[i] = v[i];
	}
	/* an address that is none of the guest's gets what the driver says of unknown memory (as
	 * natively for a pageable pointer): its answer for an unregistered object of the worker */
	if (pointer_in(ch, rd, &p) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuPointerGetAttributes((unsigned)n, attrs, data, p);
	if (r != CUDA_SUCCESS)
		return r;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t out[3];
		pointer_out(ch, attrs[i], v[i], out);
		vh_put(wr, out, sizeof out);
	}
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- stream capture state -------------------------------------------------------------- */

static CUresult capture_info(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	const struct vh_backend *B = ch->backend;
	uint64_t sraw = vh_get_u64(rd), want_graph = vh_get_u64(rd), want_deps = vh_get_u64(rd);
	int bad = 0;
	CUstream s = stream_in(ch, flags, sraw, &bad);
	if (rd->bad || bad)
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	__typeof__(B->cuStreamGetCaptureInfo_v3) info =
		(flags & VG_F_PTDS) ? B->cuStreamGetCaptureInfo_v3_ptsz : B->cuStreamGetCaptureInfo_v3;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	cuuint64_t id = 0;
	CUgraph g = NULL;
	const CUgraphNode *deps = NULL;
	size_t ndeps = 0;
	CUresult r = info(s, &st, &id, want_graph ? &g : NULL, want_deps ? &deps : NULL, NULL, want_deps ? &ndeps : NULL);
	if (r != CUDA_SUCCESS)
		return r;
	if (ndeps)
		return CUDA_ERROR_NOT_SUPPORTED; /* node arrays of a capture are not remoted */
	if (g && vh_handle_new(ch, VG_KIND_GRAPH, (void **)&g, NULL))
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t out[3] = {(uint64_t)st, (uint64_t)id, (uint64_t)(uintptr_t)g};
	vh_put(wr, out, sizeof out);
	return CUDA_SUCCESS;
}

CUresult vhc_cuStreamGetCaptureInfo(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return capture_info(ch, flags, rd, wr);
}

CUresult vhc_cuStreamGetCaptureInfo_v2(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return capture_info(ch, flags, rd, wr);
}

CUresult vhc_cuStreamGetCaptureInfo_v3(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	return capture_info(ch, flags, rd, wr);
}

CUresult vhc_cuGraphGetNodes(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	void *g = (void *)(uintptr_t)vh_get_u64(rd);
	uint64_t cap = vh_get_u64(rd);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	if (vh_handle_in(ch, VG_KIND_GRAPH, &g))
		return CUDA_ERROR_INVALID_HANDLE;
	size_t total = 0;
	CUresult r = ch->backend->cuGraphGetNodes(g, NULL, &total);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t want = cap < total ? cap : total;
	if (want > (wr->cap - wr->len) / 8 - 2)
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode *nodes = want ? vh_scratch(ch, want, sizeof *nodes) : NULL;
	size_t got = want;
	if (want && (!nodes || (r = ch->backend->cuGraphGetNodes(g, nodes, &got)) != CUDA_SUCCESS))
		return nodes ? r : CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t head[2] = {total, got};
	vh_put(wr, head, sizeof head);
	for (size_t i = 0; i < got; i++) {
		void *n = nodes[i];
		if (vh_handle_new(ch, VG_KIND_GRAPH_NODE, &n, g))
			return CUDA_ERROR_OUT_OF_MEMORY;
		uint64_t v = (uint64_t)(uintptr_t)n;
		vh_put(wr, &v, 8);
	}
	return CUDA_SUCCESS;
}

/* ---- the protocol's own operations --------------------------------------------------- */

static CUresult hello(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
	struct vg_hello_req req;
	vh_get(rd, &req, sizeof req);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	struct vh_fwd *f = ch->fwd;
	struct vg_hello_rep rep = {
		.proto_version = VG_PROTO_VERSION,
		.driver_version = f->driver_version,
		.ndev = (uint32_t)f->ndev,
		.flags = ch->backend->simulated ? VG_HELLO_SIMULATED : 0,
		.heap_registered = (uint64_t)f->registered,
	};
	if (req.proto_version != VG_PROTO_VERSION)
		return CUDA_ERROR_NOT_SUPPORTED;
	vh_put(wr, &rep, sizeof rep);
	for (int i = 0; i < f->ndev; i++)
		vh_put(wr, &f->info[i], sizeof f->info[i]);
	return wr->bad ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

CUresult vh_dispatch_proto(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	switch (op) {
	case VG_OP_HELLO:
		return hello(ch, rd, wr);
	case VG_OP_FUNC_PARAMS: {
		struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
		if (rd->bad || !e)
			return CUDA_ERROR_INVALID_HANDLE;
		CUresult r = param_layout(ch, e);
		if (r != CUDA_SUCCESS)
			return r;
		uint64_t n = e->nparams;
		vh_put(wr, &n, 8);
		vh_put(wr, e->params, n * sizeof *e->params);
		return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	}
	case VG_OP_BLOB_BEGIN: {
		uint64_t size = vh_get_u64(rd), hash[2];
		vh_get(rd, hash, sizeof hash);
		if (rd->bad || size == 0 || size > VG_MAX_BLOB)
			return CUDA_ERROR_INVALID_VALUE;
		blob_drop(ch);
		ch->image = vh_image_find(ch->fwd, size, hash);
		uint64_t cached = ch->image != NULL;
		ch->blob_size = size;
		if (!cached) {
			/* a reader past the bytes (a size field, a string) meets zeros of ours */
			ch->blob = malloc(size + VH_IMAGE_GUARD);
			if (!ch->blob)
				return CUDA_ERROR_OUT_OF_MEMORY;
			memset(ch->blob + size, 0, VH_IMAGE_GUARD);
			memcpy(ch->blob_hash, hash, sizeof hash);
		}
		ch->images_cached += cached;
		ch->images_sent += !cached;
		vh_put(wr, &cached, sizeof cached);
		return CUDA_SUCCESS;
	}
	case VG_OP_BLOB_PUT: {
		uint64_t off = vh_get_u64(rd), pos = vh_get_u64(rd), len = vh_get_u64(rd);
		const void *src = rd->bad ? NULL : vmgpu_hchan_bulk(ch->hc, pos, len);
		CUresult r = CUDA_ERROR_INVALID_VALUE;
		/* chunks arrive in order; anything else is refused */
		if (src && ch->blob && off == ch->blob_filled && len <= ch->blob_size - off) {
			memcpy(ch->blob + off, src, len);
			ch->blob_filled += len;
			r = CUDA_SUCCESS;
		}
		if (src)
			vmgpu_hchan_bulk_release(ch->hc, pos + len);
		return r;
	}
	case VG_OP_GOODBYE:
		return CUDA_SUCCESS;
	case VG_OP_NVML_QUERY:
		return vh_nvml_query(ch, rd, wr);
	case VG_OP_MODULE_FUNCS: {
		/* a module's functions as handles, each with the tag the driver keeps in its second word */
		void *mod = (void *)(uintptr_t)vh_get_u64(rd);
		if (rd->bad || !mod || vh_handle_in(ch, VG_KIND_MODULE, &mod))
			return CUDA_ERROR_INVALID_HANDLE;
		unsigned int n = 0;
		CUresult r = ch->backend->cuModuleGetFunctionCount(&n, mod);
		if (r != CUDA_SUCCESS)
			return r;
		if (n > (wr->cap - wr->len) / 16 - 1)
			return CUDA_ERROR_INVALID_VALUE;
		CUfunction *fns = n ? vh_scratch(ch, n, sizeof *fns) : NULL;
		if (n && (!fns || (r = ch->backend->cuModuleEnumerateFunctions(fns, n, mod)) != CUDA_SUCCESS))
			return fns ? r : CUDA_ERROR_OUT_OF_MEMORY;
		uint64_t count = n;
		vh_put(wr, &count, 8);
		for (unsigned int i = 0; i < n; i++) {
			uint64_t tag;
			memcpy(&tag, (const uint8_t *)fns[i] + 8, sizeof tag);
			tag = fn_tag_out(ch, tag);
			void *h = fns[i];
			if (vh_handle_new(ch, VG_KIND_FUNCTION, &h, mod))
				return CUDA_ERROR_OUT_OF_MEMORY;
			uint64_t pair[2] = {(uint64_t)(uintptr_t)h, tag};
			vh_put(wr, pair, sizeof pair);
		}
		return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	}
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

