/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Guest halves of what cannot be marshalled generically: copies that name host
 * memory (heap = zero-copy, small = inline, large = pipelined through the
 * channel's bulk area), module images (sized from their headers, sent through
 * bulk), kernel launches (parameters packed by the host's layout), and the
 * mapped device address of pinned memory.  Host halves: host_forwarder/native/exec.c.
 */
#include <elf.h>
#include <emmintrin.h>
#include <stdlib.h>
#include <string.h>

#include "vg_guest.h"
#include "vg_hash.h"

CUcontext vg_primary_ctx(int dev);

#define INLINE_MAX (16u << 10)

enum { BUF_INLINE = 0, BUF_HEAP = 1, BUF_BULK = 2 };

/* Copy a staged chunk with non-temporal stores: the bytes are not read again soon (the
 * GPU reads the bulk area; the program reads its buffer later), so they need not
 * displace the cache, and the destination's lines are not read first. */
static void copy_stream(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	if (n < 4096 || head > n) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t body = n & ~(size_t)63;
	for (size_t i = 0; i < body; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	_mm_sfence();
	memcpy(d + body, s + body, n - body);
}

#define DTOH_DEPTH 3 /* chunks requested ahead; at most 4 (the bulk area holds 4 chunks) */

static uint64_t chunk_size(void)
{
	uint64_t c = vg.bulk_size / 4;
	return c ? c : 4096;
}

/* ---- host to device --------------------------------------------------------------- */

static void put_stream(struct vg_call *c, int async, CUstream s)
{
	if (async)
		vg_put_u64(c, (uint64_t)(uintptr_t)s);
}

static CUresult htod(uint32_t op, CUdeviceptr dst, const void *src, size_t n, CUstream s, int async, unsigned fl)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!src)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	uint64_t off = vg_heap_offset(src, n);
	if (off != UINT64_MAX || n <= INLINE_MAX) {
		if ((r = vg_begin(&c, op, fl)) != CUDA_SUCCESS)
			return r;
		vg_put_u64(&c, dst);
		put_stream(&c, async, s);
		vg_put_u64(&c, n);
		vg_put_u64(&c, off != UINT64_MAX ? BUF_HEAP : BUF_INLINE);
		vg_put_u64(&c, off != UINT64_MAX ? off : 0);
		if (off == UINT64_MAX)
			vg_put_arr(&c, src, n, 1);
		if (async)
			return vg_send_async(&c);
		return vg_end(&c, vg_call_sync(&c));
	}
	/* pageable and large: stage through bulk; the host copies chunk k while we fill k+1 */
	vg_lock();
	const uint8_t *p = src;
	uint64_t step = chunk_size();
	for (size_t done = 0; done < n && r == CUDA_SUCCESS;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		int e = vmgpu_gchan_bulk_alloc(vg.chan, len, 24ull * 3600 * 1000000000ull, &pos, &bulk);
		if (e < 0) {
			r = VG_ERROR_LOST;
			break;
		}
		copy_stream(bulk, p + done, len);
		int last = done + len == n;
		if ((r = vg_begin(&c, op, fl)) != CUDA_SUCCESS)
			break;
		vg_put_u64(&c, dst + done);
		put_stream(&c, async, s);
		vg_put_u64(&c, len);
		vg_put_u64(&c, BUF_BULK);
		vg_put_u64(&c, pos);
		done += len;
		if (last && !async)
			r = vg_end(&c, vg_call_sync(&c));
		else
			r = vg_send_async(&c);
	}
	vg_unlock();
	return r;
}

CUresult vgc_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n, unsigned fl)
{
	return htod(VG_OP_cuMemcpyHtoD_v2, dst, src, n, NULL, 0, fl);
}

CUresult vgc_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s, unsigned fl)
{
	return htod(VG_OP_cuMemcpyHtoDAsync_v2, dst, src, n, s, 1, fl);
}

/* ---- device to host --------------------------------------------------------------- */

static CUresult dtoh(uint32_t op, void *dst, CUdeviceptr src, size_t n, CUstream s, int async, unsigned fl)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!dst)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	uint64_t off = vg_heap_offset(dst, n);
	if (off != UINT64_MAX) {
		/* pinned: the host DMAs straight into the heap; async stays async */
		if ((r = vg_begin(&c, op, fl)) != CUDA_SUCCESS)
			return r;
		vg_put_u64(&c, src);
		put_stream(&c, async, s);
		vg_put_u64(&c, n);
		vg_put_u64(&c, BUF_HEAP);
		vg_put_u64(&c, off);
		if (async)
			return vg_send_async(&c);
		return vg_end(&c, vg_call_sync(&c));
	}
	if (n <= INLINE_MAX) {
		if ((r = vg_begin(&c, op, fl)) != CUDA_SUCCESS)
			return r;
		vg_put_u64(&c, src);
		put_stream(&c, async, s);
		vg_put_u64(&c, n);
		vg_put_u64(&c, BUF_INLINE);
		vg_put_u64(&c, 0);
		r = vg_call_sync(&c);
		if (r == CUDA_SUCCESS) {
			const void *bytes = vg_get_u64(&c) == n ? vg_get_ref(&c, n) : NULL;
			if (bytes)
				memcpy(dst, bytes, n);
			else
				r = VG_ERROR_LOST;
		}
		return vg_end(&c, r);
	}
	/* pageable and large: the host fills bulk chunks ahead of the one we copy out.  Chunks
	 * are a quarter of the bulk area and allocated in order, so a new chunk only ever takes
	 * the place of one already copied out (the host releases a chunk once it has filled it). */
	vg_lock();
	uint8_t *p = dst;
	uint64_t step = chunk_size(), sent = 0, taken = 0;
	struct inflight {
		void *bulk;
		uint64_t len;
		struct vg_call c;
	} q[DTOH_DEPTH];
	unsigned head = 0, count = 0;
	while (r == CUDA_SUCCESS && taken < n) {
		while (r == CUDA_SUCCESS && count < DTOH_DEPTH && sent < n) {
			struct inflight *f = &q[(head + count) % DTOH_DEPTH];
			uint64_t pos;
			f->len = n - sent < step ? n - sent : step;
			if (vmgpu_gchan_bulk_alloc(vg.chan, f->len, 24ull * 3600 * 1000000000ull, &pos, &f->bulk) < 0) {
				r = VG_ERROR_LOST;
				break;
			}
			if ((r = vg_begin(&f->c, op, fl)) != CUDA_SUCCESS)
				break;
			vg_put_u64(&f->c, src + sent);
			put_stream(&f->c, async, s);
			vg_put_u64(&f->c, f->len);
			vg_put_u64(&f->c, BUF_BULK);
			vg_put_u64(&f->c, pos);
			r = vg_send_request(&f->c);
			vg_end(&f->c, r); /* the outer vg_lock keeps the channel */
			sent += f->len;
			count++;
		}
		if (count == 0)
			break;
		struct inflight *f = &q[head];
		CUresult rr = vg_wait_reply(&f->c);
		if (rr == CUDA_SUCCESS && r == CUDA_SUCCESS)
			copy_stream(p + taken, f->bulk, f->len);
		if (r == CUDA_SUCCESS)
			r = rr;
		taken += f->len;
		head = (head + 1) % DTOH_DEPTH;
		count--;
		if (r != CUDA_SUCCESS) {
			/* collect the replies still owed, so the next call reads its own */
			while (count > 0 && r != VG_ERROR_LOST) {
				if (vg_wait_reply(&q[head].c) == VG_ERROR_LOST)
					r = VG_ERROR_LOST;
				head = (head + 1) % DTOH_DEPTH;
				count--;
			}
		}
	}
	vg_unlock();
	return r;
}

CUresult vgc_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n, unsigned fl)
{
	return dtoh(VG_OP_cuMemcpyDtoH_v2, dst, src, n, NULL, 0, fl);
}

CUresult vgc_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s, unsigned fl)
{
	return dtoh(VG_OP_cuMemcpyDtoHAsync_v2, dst, src, n, s, 1, fl);
}

/* ---- unified addresses: device memory or pinned heap memory ---------------------------- */

static void put_unified(struct vg_call *c, CUdeviceptr p, size_t n)
{
	uint64_t off = vg_heap_offset((const void *)(uintptr_t)p, n);
	vg_put_u64(c, off != UINT64_MAX ? BUF_HEAP : BUF_INLINE);
	vg_put_u64(c, off != UINT64_MAX ? off : p);
}

static CUresult unified(uint32_t op, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async, unsigned fl)
{
	struct vg_call c;
	CUresult r = vg_begin(&c, op, fl);
	if (r != CUDA_SUCCESS)
		return r;
	put_unified(&c, dst, n);
	put_unified(&c, src, n);
	vg_put_u64(&c, n);
	put_stream(&c, async, s);
	if (async)
		return vg_send_async(&c);
	return vg_end(&c, vg_call_sync(&c));
}

CUresult vgc_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned fl)
{
	return unified(VG_OP_cuMemcpy, dst, src, n, NULL, 0, fl);
}

CUresult vgc_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, unsigned fl)
{
	return unified(VG_OP_cuMemcpyAsync, dst, src, n, s, 1, fl);
}

CUresult vgc_cuMemHostGetDevicePointer_v2(CUdeviceptr *pd, void *p, unsigned int flags, unsigned fl)
{
	if (!pd)
		return CUDA_ERROR_INVALID_VALUE;
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
	vg_put_u64(&c, (uint64_t)(uintptr_t)vmgpu_guest_ptr(vg.guest, 0));
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		/* kind 0: a device address (our own pointer); kind 2: a region offset (a kernel
		 * cannot use it, but copies can, as for any pinned pointer) */
		uint64_t v[2];
		vg_get(&c, v, sizeof v);
		*pd = v[0] == 2 ? (CUdeviceptr)(uintptr_t)vmgpu_guest_ptr(vg.guest, v[1]) : (CUdeviceptr)v[1];
	}
	return vg_end(&c, r);
}

/* ---- module images ------------------------------------------------------------------- */

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

struct fatbin_wrapper {
	uint32_t magic, version;
	const void *data;
	void *filename_or_fatbins;
};

struct fatbin_header {
	uint32_t magic;
	uint16_t version, header_size;
	uint64_t fat_size;
};

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* The image's byte size from its own headers: ELF (cubin), fatbin (back-to-back
 * containers summed, compressed entries included), else NUL-terminated PTX. */
static uint64_t image_size(const void **image)
{
	const uint8_t *p = *image;
	uint32_t magic;
	memcpy(&magic, p, 4);
	if (magic == FATBIN_WRAPPER_MAGIC) {
		const struct fatbin_wrapper *w = *image;
		*image = w->data;
		return image_size(image);
	}
	if (magic == FATBIN_MAGIC) {
		uint64_t total = 0;
		for (;;) {
			struct fatbin_header h;
			memcpy(&h, p + total, sizeof h);
			if (h.magic != FATBIN_MAGIC)
				break;
			total += h.header_size + h.fat_size;
		}
		return total;
	}
	if (!memcmp(p, ELFMAG, SELFMAG) && p[EI_CLASS] == ELFCLASS64) {
		Elf64_Ehdr eh;
		memcpy(&eh, p, sizeof eh);
		uint64_t end = max_u64(eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize,
				       eh.e_phoff + (uint64_t)eh.e_phnum * eh.e_phentsize);
		for (unsigned i = 0; i < eh.e_shnum; i++) {
			Elf64_Shdr sh;
			memcpy(&sh, p + eh.e_shoff + (uint64_t)i * eh.e_shentsize, sizeof sh);
			if (sh.sh_type != SHT_NOBITS)
				end = max_u64(end, sh.sh_offset + sh.sh_size);
		}
		return max_u64(end, sizeof eh);
	}
	return strlen((const char *)p) + 1;
}

/* Send an image to the host's staging blob, then make the load call `op`. */
static CUresult load_image(uint32_t op, const void *image, void **out, unsigned fl)
{
	if (!out || !image)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t n = image_size(&image), hash[2], cached = 0;
	vg_hash128(image, n, hash);
	struct vg_call c;
	vg_lock();
	if ((r = vg_begin(&c, VG_OP_BLOB_BEGIN, 0)) != CUDA_SUCCESS)
		goto out;
	vg_put_u64(&c, n);
	vg_put(&c, hash, sizeof hash);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS)
		cached = vg_get_u64(&c);
	if ((r = vg_end(&c, r)) != CUDA_SUCCESS)
		goto out;
	/* an image the host already holds (this or another process loaded it) does not cross again */
	uint64_t step = chunk_size();
	for (uint64_t done = cached ? n : 0; done < n && r == CUDA_SUCCESS;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		if (vmgpu_gchan_bulk_alloc(vg.chan, len, 24ull * 3600 * 1000000000ull, &pos, &bulk) < 0) {
			r = VG_ERROR_LOST;
			goto out;
		}
		memcpy(bulk, (const uint8_t *)image + done, len);
		if ((r = vg_begin(&c, VG_OP_BLOB_PUT, 0)) != CUDA_SUCCESS)
			goto out;
		vg_put_u64(&c, done);
		vg_put_u64(&c, pos);
		vg_put_u64(&c, len);
		r = vg_send_async(&c);
		done += len;
	}
	if (r != CUDA_SUCCESS || (r = vg_begin(&c, op, fl)) != CUDA_SUCCESS)
		goto out;
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS)
		vg_get(&c, out, sizeof *out);
	r = vg_end(&c, r);
out:
	vg_unlock();
	return r;
}

CUresult vgc_cuModuleLoadData(CUmodule *m, const void *image, unsigned fl)
{
	return load_image(VG_OP_cuModuleLoadData, image, (void **)m, fl);
}

/* JIT options are not forwarded (the image loads with the driver's defaults). */
CUresult vgc_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v, unsigned fl)
{
	(void)n;
	(void)o;
	(void)v;
	return load_image(VG_OP_cuModuleLoadDataEx, image, (void **)m, fl);
}

CUresult vgc_cuModuleLoadFatBinary(CUmodule *m, const void *image, unsigned fl)
{
	return load_image(VG_OP_cuModuleLoadFatBinary, image, (void **)m, fl);
}

CUresult vgc_cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
			       CUlibraryOption *lo, void **lv, unsigned int nl, unsigned fl)
{
	(void)jo;
	(void)jv;
	(void)nj;
	(void)lo;
	(void)lv;
	(void)nl;
	return load_image(VG_OP_cuLibraryLoadData, code, (void **)lib, fl);
}

/* ---- launches ------------------------------------------------------------------------ */

/* Check a launch's parameters and append them at the host's offsets: u64 size, then the bytes. */
static CUresult put_params(struct vg_call *c, const struct vg_fninfo *fi, void **params, void **extra)
{
	const void *packed = NULL;
	size_t packed_size = 0;
	if (!params && extra) {
		for (void **e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
			if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				packed = e[1];
			else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				packed_size = *(size_t *)e[1];
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (!packed || packed_size < fi->bytes)
			return CUDA_ERROR_INVALID_VALUE;
	} else if (!params && fi->nparams) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	vg_put_u64(c, fi->bytes);
	/* the parameter bytes go straight into the request */
	size_t padded = ((size_t)fi->bytes + 7) & ~(size_t)7;
	if (padded > c->cap - c->len) {
		c->bad = 1;
		return CUDA_SUCCESS;
	}
	uint8_t *blob = c->buf + c->len;
	memset(blob, 0, padded);
	if (packed)
		memcpy(blob, packed, fi->bytes);
	else
		for (uint32_t i = 0; i < fi->nparams; i++)
			memcpy(blob + fi->params[i].offset, params[i], fi->params[i].size);
	c->len += (uint32_t)padded;
	return CUDA_SUCCESS;
}

/* A launch configuration: dims, shared memory, stream, attributes. */
static void put_config(struct vg_call *c, const CUlaunchConfig *cfg)
{
	uint32_t dims[8] = {cfg->gridDimX,  cfg->gridDimY,	 cfg->gridDimZ, cfg->blockDimX,
			    cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes, cfg->numAttrs};
	vg_put(c, dims, sizeof dims);
	vg_put_u64(c, (uint64_t)(uintptr_t)cfg->hStream);
	vg_put_arr(c, cfg->attrs, cfg->numAttrs, sizeof(CUlaunchAttribute));
}

/* A launch's common start: the function (a tools node becomes its handle), its parameter
 * layout, and the request with the function in it; the channel is held on success. */
static CUresult launch_begin(struct vg_call *c, uint32_t op, CUfunction f, unsigned fl, struct vg_fninfo **fi)
{
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t h = vg_fn_handle(f);
	CUresult r = vg_fninfo(h, fi);
	if (r == CUDA_SUCCESS && (r = vg_begin(c, op, fl)) == CUDA_SUCCESS)
		vg_put_u64(c, h);
	return r;
}

CUresult vgc_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
			    unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
			    void **extra, unsigned fl)
{
	struct vg_fninfo *fi;
	struct vg_call c;
	CUresult r = launch_begin(&c, VG_OP_cuLaunchKernel, f, fl, &fi);
	if (r != CUDA_SUCCESS)
		return r;
	uint32_t dims[8] = {gx, gy, gz, bx, by, bz, shmem, 0};
	vg_put(&c, dims, sizeof dims);
	vg_put_u64(&c, (uint64_t)(uintptr_t)s);
	if ((r = put_params(&c, fi, params, extra)) != CUDA_SUCCESS)
		return vg_end(&c, r);
	return vg_send_async(&c);
}

CUresult vgc_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra, unsigned fl)
{
	if (f && (!config || (config->numAttrs && !config->attrs)))
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_fninfo *fi;
	struct vg_call c;
	CUresult r = launch_begin(&c, VG_OP_cuLaunchKernelEx, f, fl, &fi);
	if (r != CUDA_SUCCESS)
		return r;
	put_config(&c, config);
	if ((r = put_params(&c, fi, params, extra)) != CUDA_SUCCESS)
		return vg_end(&c, r);
	return vg_send_async(&c);
}

static CUresult cluster_query(uint32_t op, int *out, CUfunction f, const CUlaunchConfig *config, unsigned fl)
{
	if (!out || !config || (config->numAttrs && !config->attrs))
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, op, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, vg_fn_handle(f));
	put_config(&c, config);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS)
		vg_get(&c, out, sizeof *out);
	return vg_end(&c, r);
}

CUresult vgc_cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *config, unsigned fl)
{
	return cluster_query(VG_OP_cuOccupancyMaxActiveClusters, n, f, config, fl);
}

CUresult vgc_cuOccupancyMaxPotentialClusterSize(int *n, CUfunction f, const CUlaunchConfig *config, unsigned fl)
{
	return cluster_query(VG_OP_cuOccupancyMaxPotentialClusterSize, n, f, config, fl);
}

CUresult vgc_cuFuncGetName(const char **name, CUfunction f, unsigned fl)
{
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_fninfo *fi;
	CUresult r = vg_fninfo(vg_fn_handle(f), &fi);
	if (r != CUDA_SUCCESS)
		return r;
	if (fi->name) {
		*name = fi->name;
		return CUDA_SUCCESS;
	}
	struct vg_call c;
	if ((r = vg_begin(&c, VG_OP_cuFuncGetName, fl)) != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, vg_fn_handle(f));
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		uint64_t n = vg_get_u64(&c);
		const char *s = n && n < 65536 ? vg_get_ref(&c, n) : NULL;
		char *copy = s && s[n - 1] == '\0' ? strdup(s) : NULL;
		if (!copy)
			r = VG_ERROR_LOST;
		else if (!__atomic_compare_exchange_n(&fi->name, &(char *){NULL}, copy, 0, __ATOMIC_ACQ_REL,
						      __ATOMIC_ACQUIRE))
			free(copy);
		if (copy)
			*name = fi->name;
	}
	return vg_end(&c, r);
}

/* ---- stream capture state ------------------------------------------------------------------- */

/* Status, capture id and graph come from the host's stream.  The dependency list of a
 * capturing stream (driver-owned node arrays) is not remoted: asked for, it is refused. */
static CUresult capture_info(uint32_t op, CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
			     const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps, unsigned fl)
{
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, op, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)(uintptr_t)s);
	vg_put_u64(&c, graph != NULL);
	vg_put_u64(&c, deps || edges || ndeps);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		*status = (CUstreamCaptureStatus)vg_get_u64(&c);
		uint64_t cid = vg_get_u64(&c), g = vg_get_u64(&c);
		if (id)
			*id = cid;
		if (graph)
			*graph = (CUgraph)(uintptr_t)g;
		if (deps)
			*deps = NULL;
		if (edges)
			*edges = NULL;
		if (ndeps)
			*ndeps = 0;
	}
	return vg_end(&c, r);
}

CUresult vgc_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo, s, status, id, NULL, NULL, NULL, NULL, f);
}

CUresult vgc_cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
				       const CUgraphNode **deps, size_t *ndeps, unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo_v2, s, status, id, graph, deps, NULL, ndeps, f);
}

CUresult vgc_cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
				       const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps,
				       unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo_v3, s, status, id, graph, deps, edges, ndeps, f);
}

/* The nodes of a graph: the count, and the nodes as handles when asked for. */
CUresult vgc_cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num, unsigned fl)
{
	if (!num)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuGraphGetNodes, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)(uintptr_t)g);
	vg_put_u64(&c, nodes ? *num : 0);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		uint64_t total = vg_get_u64(&c), got = vg_get_u64(&c);
		const uint64_t *h = got ? vg_get_ref(&c, got * 8) : NULL;
		if (nodes && got <= *num && (h || !got))
			for (uint64_t i = 0; i < got; i++)
				nodes[i] = (CUgraphNode)(uintptr_t)h[i];
		*num = nodes ? got : total;
	}
	return vg_end(&c, r);
}

/* ---- pointer attributes ----------------------------------------------------------------------- */

/* Bytes the driver writes for an attribute; 0: not answered (a handle the guest cannot use). */
static size_t pointer_attr_size(CUpointer_attribute a)
{
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
	case CU_POINTER_ATTRIBUTE_MAPPED:
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
	case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
		return 4;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
	case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
		return 8;
	case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
		return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
	default:
		return 0;
	}
}

/* The host's answer for one attribute: kind 1 names a device's context, kind 2 a region
 * offset; otherwise the value's bytes. */
static void pointer_attr_put(void *data, size_t size, const uint64_t *v)
{
	if (v[0] == 1)
		*(CUcontext *)data = v[1] == UINT64_MAX ? NULL : vg_primary_ctx((int)v[1]);
	else if (v[0] == 2)
		*(void **)data = vmgpu_guest_ptr(vg.guest, v[1]);
	else
		memcpy(data, &v[1], size);
}

/* A pointer is a device address or, in the region's heap, pinned host memory; the host
 * answers for both, in its terms, and the answer is put back in the guest's. */
CUresult vgc_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr, unsigned fl)
{
	size_t size = pointer_attr_size(attr);
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	if (!size)
		return CUDA_ERROR_NOT_SUPPORTED;
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuPointerGetAttribute, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)attr);
	put_unified(&c, ptr, 1);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		uint64_t v[3];
		vg_get(&c, v, sizeof v);
		pointer_attr_put(data, size, v);
	}
	return vg_end(&c, r);
}

/* Several attributes in one round trip.  Unlike the single query, an address the driver does
 * not know is no error: the host's driver fills in its defaults, and those come back. */
CUresult vgc_cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr, unsigned fl)
{
	if (!attrs || !data || n == 0 || n > VG_MAX_POINTER_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++)
		if (!data[i] || !pointer_attr_size(attrs[i]))
			return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuPointerGetAttributes, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, n);
	for (unsigned i = 0; i < n; i++)
		vg_put_u64(&c, (uint64_t)attrs[i]);
	put_unified(&c, ptr, 1);
	r = vg_call_sync(&c);
	for (unsigned i = 0; r == CUDA_SUCCESS && i < n; i++) {
		uint64_t v[3];
		vg_get(&c, v, sizeof v);
		pointer_attr_put(data[i], pointer_attr_size(attrs[i]), v);
	}
	return vg_end(&c, r);
}

/* Pool attributes: the value is an int for the three reuse switches, 64 bits for the rest;
 * it crosses as 64 bits and the host checks which attribute it is. */
static int pool_attr_is_int(CUmemPool_attribute a)
{
	return a == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES || a == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
	       a == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

static CUresult pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int set, unsigned fl)
{
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, set ? VG_OP_cuMemPoolSetAttribute : VG_OP_cuMemPoolGetAttribute, fl);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t v = 0;
	if (set)
		v = pool_attr_is_int(attr) ? (uint64_t)(int64_t) * (int *)value : *(cuuint64_t *)value;
	vg_put_u64(&c, (uint64_t)(uintptr_t)pool);
	vg_put_u64(&c, (uint64_t)attr);
	vg_put_u64(&c, v);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS && !set) {
		vg_get(&c, &v, sizeof v);
		if (pool_attr_is_int(attr))
			*(int *)value = (int)v;
		else
			*(cuuint64_t *)value = v;
	}
	return vg_end(&c, r);
}

CUresult vgc_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, unsigned fl)
{
	return pool_attr(pool, attr, value, 1, fl);
}

CUresult vgc_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, unsigned fl)
{
	return pool_attr(pool, attr, value, 0, fl);
}
