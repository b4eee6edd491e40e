/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Modules: an image is received (or found in the cache: images.c), checked against its own
 * headers (image_check.c: where a module image is checked) and loaded, with the guest's JIT options
 * checked whole too (jit_options.c); its code and globals charged to the quota; its functions
 * become handles; its globals become addresses the guest process may name (addresses.c) until the
 * module goes.
 */
#include <stdlib.h>

#include "images.h"
#include "jit_options.h"
#include "protocol.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

const uint8_t *vh_module_blob(struct vh_chan *ch, uint64_t *size)
{
	*size = ch->blob_size;
	if (ch->image)
		return vh_image_bytes(ch->image);
	return ch->blob && ch->blob_filled == ch->blob_size ? ch->blob : NULL;
}

/* The image to give the driver: the bytes received (or the cache's copy of the same bytes),
 * checked against their own headers (image_check.c), with a zeroed guard after them. */
static CUresult blob_take(struct vh_chan *ch, const void **image)
{
	static unsigned logged; /* a guest sending bad images does not flood the log */
	char why[200];
	uint64_t size;
	const uint8_t *bytes = vh_module_blob(ch, &size);
	if (!bytes)
		return CUDA_ERROR_INVALID_IMAGE;
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

void vh_module_image_forget(struct vh_chan *ch)
{
	vh_image_put(ch->fwd, ch->image);
	ch->image = NULL;
	free(ch->blob);
	ch->blob = NULL;
	ch->blob_size = ch->blob_filled = 0;
}

/* The image received is forgotten; a module or library the driver loaded is charged to the quota
 * and becomes a handle in *obj, or is unloaded again. */
static CUresult load_settle(struct vh_chan *ch, CUresult r, int kind, void **obj)
{
	vh_module_image_forget(ch);
	if (r != CUDA_SUCCESS)
		return r;
	/* the code and globals of a module take device memory at once: charged, or undone */
	if (vh_quota_settle_load(ch) || vh_handle_new(ch, kind, obj, NULL)) {
		if (kind == VG_KIND_MODULE)
			ch->backend->cuModuleUnload(*obj);
		else
			ch->backend->cuLibraryUnload(*obj);
		vh_quota_settle_load(ch);
		vh_oom_report(ch, ch->cur_dev >= 0 ? ch->cur_dev : 0, kind == VG_KIND_MODULE ? "cuModuleLoadData" : "cuLibraryLoadData",
		       0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

/* Load the image received as a module, with the driver's defaults.  A fat binary is an image like
 * any other. */
static CUresult load(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int kind)
{
	(void)flags;
	(void)rd;
	const void *image;
	void *obj = NULL;
	CUresult r = blob_take(ch, &image);
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuModuleLoadData((CUmodule *)&obj, image);
	if ((r = load_settle(ch, r, kind, &obj)) == CUDA_SUCCESS)
		vh_put(wr, &obj, sizeof obj);
	return r;
}

/* Load the image received as a module or a library with the JIT options the request carries (u64
 * n, n * struct vg_jit_opt), checked whole before the driver sees them or the image (jit_options.c:
 * numbers only, log sizes at most VG_LINK_LOG_MAX, the driver's log buffers the worker's own).  A
 * request checked is answered whatever the driver says, so that the logs of an image that does
 * not load come back: u64 the CUresult, u64 the handle (0 unless loaded), the JIT answer
 * (vg_link.h).  A library is loaded with no library option: none crosses.  The guest takes
 * CU_LIBRARY_BINARY_IS_PRESERVED as the hint it is and sends nothing (here it would be false: the
 * worker's copy of the image goes after the load, so the driver must keep its own), and keeps
 * CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE, a table of guest pointers, to itself (only the
 * unserved cuLibraryGetUnifiedFunction and cuLibraryGetManaged read it); the wire has no place for
 * either. */
static CUresult load_with_options(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int kind)
{
	(void)flags;
	uint64_t n;
	const struct vg_jit_opt *o = vh_get_arr(rd, sizeof *o, &n);
	struct vh_jit jit = {0};
	const void *image;
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (!rd->bad && rd->pos == rd->len && (r = vh_jit_check(ch, &jit, o, n, 0)) == CUDA_SUCCESS &&
	    (r = blob_take(ch, &image)) == CUDA_SUCCESS)
		r = vh_jit_lend(&jit);
	if (r != CUDA_SUCCESS) {
		vh_jit_free(&jit);
		vh_module_image_forget(ch); /* the image is used once, loaded or not */
		return r;
	}
	void *obj = NULL;
	if (kind == VG_KIND_MODULE)
		r = ch->backend->cuModuleLoadDataEx((CUmodule *)&obj, image, jit.n, jit.option, jit.value);
	else
		r = ch->backend->cuLibraryLoadData((CUlibrary *)&obj, image, jit.option, jit.value, jit.n, NULL, NULL, 0);
	r = load_settle(ch, r, kind, &obj);
	uint64_t answer[2] = {(uint64_t)r, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)obj : 0};
	vh_put(wr, answer, sizeof answer);
	vh_jit_answer(&jit, 1, wr); /* (at most 64 options and two lengths: within any completion ring) */
	vh_jit_free(&jit);
	return CUDA_SUCCESS;
}

VH_CUSTOM_VARIANT(handwritten_cuModuleLoadData, load, VG_KIND_MODULE)
VH_CUSTOM_VARIANT(handwritten_cuModuleLoadFatBinary, load, VG_KIND_MODULE)
VH_CUSTOM_VARIANT(handwritten_cuModuleLoadDataEx, load_with_options, VG_KIND_MODULE)
VH_CUSTOM_VARIANT(handwritten_cuLibraryLoadData, load_with_options, VG_KIND_LIBRARY)

/* The guest's image of size bytes and its hash: from the cache if the same bytes are there,
 * else received in chunks (the guard after them zeroed).  Answers whether it was cached. */
CUresult vh_proto_image_begin(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
	uint64_t size = vh_get_u64(rd), hash[2];
	vh_get(rd, hash, sizeof hash);
	if (rd->bad || size == 0 || size > VG_MAX_BLOB)
		return CUDA_ERROR_INVALID_VALUE;
	vh_module_image_forget(ch);
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

/* A chunk of the image from the bulk area; chunks arrive in order, anything else is refused. */
CUresult vh_proto_image_chunk(struct vh_chan *ch, struct vh_rd *rd)
{
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

/* A module's functions as handles, each with the tag the driver keeps in its second word. */
CUresult vh_proto_module_functions(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
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

/* ---- module globals: device memory a program names by symbol ------------------------ */

static CUresult global_common(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, void *owner, CUresult r,
			      CUdeviceptr d, size_t n)
{
	if (r != CUDA_SUCCESS)
		return r;
	/* copies to and from it (cudaMemcpyToSymbol) must resolve: it is this process's until the
	 * module goes */
	if (n && vh_addr_add(ch, d, n, VH_SPAN_GLOBAL, owner) && vh_addr_ok(ch, d, n) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY; /* (already known: a library's global through its module) */
	if (dptr)
		*dptr = d;
	if (bytes)
		*bytes = n;
	return CUDA_SUCCESS;
}

CUresult guarded_cuModuleGetGlobal_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
				  const char *name)
{
	CUdeviceptr d = 0;
	size_t n = 0;
	CUresult r = ch->backend->cuModuleGetGlobal_v2(&d, &n, hmod, name);
	return global_common(ch, dptr, bytes, hmod, r, d, n);
}

CUresult guarded_cuLibraryGetGlobal(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
				const char *name)
{
	CUdeviceptr d = 0;
	size_t n = 0;
	CUresult r = ch->backend->cuLibraryGetGlobal(&d, &n, library, name);
	return global_common(ch, dptr, bytes, library, r, d, n);
}
