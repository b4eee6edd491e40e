/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images, the guest half (host half: host_forwarder/native/module.c, checked
 * there by image_check.c): an image is sized from its own headers, announced by
 * its hash (an image the host already holds does not cross again), sent through
 * the bulk area, then loaded.  The JIT options of cuModuleLoadDataEx and cuLibraryLoad*
 * cross as the linker's do (jit_options.c): values as numbers, log buffers kept here
 * and filled from the host's answer.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "copy.h"
#include "jit_options.h"
#include "module.h"
#include "vg_hash.h"
#include "vg_guest_protos.h"

CUresult handwritten_cuModuleGetLoadingMode(CUmoduleLoadingMode *mode, unsigned f)
{
	(void)f;
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	*mode = CU_MODULE_LAZY_LOADING;
	return CUDA_SUCCESS;
}

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

/* Send n bytes to the host's staging blob (under vg_lock): announced by their hash first, so that
 * bytes the host already holds (this or another process loaded them) do not cross again. */
CUresult vg_blob_send(const void *bytes, uint64_t n)
{
	uint64_t hash[2], cached = 0;
	vg_hash128(bytes, n, hash);
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_BLOB_BEGIN, 0);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, n);
	vg_put(&c, hash, sizeof hash);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS)
		cached = vg_get_u64(&c);
	if ((r = vg_end(&c, r)) != CUDA_SUCCESS)
		return r;
	uint64_t step = vg_bulk_chunk_size();
	for (uint64_t done = cached ? n : 0; done < n && r == CUDA_SUCCESS;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		if (vmgpu_gchan_bulk_alloc_dir(vg_conn.chan, len, VMGPU_BULK_TO_HOST, VG_WAIT_FOREVER_NS, &pos, &bulk) < 0)
			return VG_ERROR_LOST;
		memcpy(bulk, (const uint8_t *)bytes + done, len);
		if ((r = vg_begin(&c, VG_OP_BLOB_PUT, 0)) != CUDA_SUCCESS)
			return r;
		vg_put_u64(&c, done);
		vg_put_u64(&c, pos);
		vg_put_u64(&c, len);
		r = vg_send_async(&c);
		done += len;
	}
	return r;
}

/* Send an image to the host's staging blob, then make the load call `op`.  A load with JIT options
 * (jit: cuModuleLoadDataEx, cuLibraryLoadData) sends them with it, and is answered with the driver's
 * result, the handle and the JIT answer (vg_link.h) whatever the result: the logs of an image that
 * does not load come back too. */
static CUresult load_image(uint32_t op, const void *image, void **out, unsigned fl, const struct vg_jit *jit)
{
	if (!out || !image)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t n = image_size(&image);
	struct vg_call c;
	vg_lock();
	if ((r = vg_blob_send(image, n)) == CUDA_SUCCESS && (r = vg_begin(&c, op, fl)) == CUDA_SUCCESS) {
		if (jit)
			vg_put_arr(&c, jit->opt, jit->nopt, sizeof *jit->opt);
		r = vg_call_sync(&c);
		if (r == CUDA_SUCCESS && jit) {
			CUresult result = (CUresult)vg_get_u64(&c);
			void *handle = (void *)(uintptr_t)vg_get_u64(&c);
			if ((r = vg_jit_answer(jit, &c)) == CUDA_SUCCESS && (r = result) == CUDA_SUCCESS)
				*out = handle;
		} else if (r == CUDA_SUCCESS) {
			vg_get(&c, out, sizeof *out);
		}
		r = vg_end(&c, r);
	}
	vg_unlock();
	return r;
}

CUresult handwritten_cuModuleLoadData(CUmodule *m, const void *image, unsigned fl)
{
	return load_image(VG_OP_cuModuleLoadData, image, (void **)m, fl, NULL);
}

CUresult handwritten_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v, unsigned fl)
{
	struct vg_jit jit;
	CUresult r = vg_jit_take(&jit, "cuModuleLoadDataEx", n, o, v);
	return r != CUDA_SUCCESS ? r : load_image(VG_OP_cuModuleLoadDataEx, image, (void **)m, fl, &jit);
}

/* ---- images from the guest's files: read here, then loaded as an image from memory is (the
 * host checks them the same way) ---------------------------------------------------------- */

#define FILE_IMAGE_MAX (1ull << 30)

void *vg_read_file(const char *fname, size_t *size, CUresult *r)
{
	if (!fname) {
		*r = CUDA_ERROR_INVALID_VALUE;
		return NULL;
	}
	FILE *f = fopen(fname, "rb");
	if (!f) {
		*r = CUDA_ERROR_FILE_NOT_FOUND;
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	uint8_t *buf = malloc(cap + 1);
	for (size_t got; buf; n += got) {
		if (n == cap) {
			uint8_t *more = cap < FILE_IMAGE_MAX ? realloc(buf, cap * 2 + 1) : NULL;
			if (!more) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = more;
			cap *= 2;
		}
		if ((got = fread(buf + n, 1, cap - n, f)) == 0)
			break;
	}
	int failed = ferror(f);
	fclose(f);
	if (!buf || failed || n == 0) {
		free(buf);
		*r = !buf ? CUDA_ERROR_OUT_OF_MEMORY : n == 0 && !failed ? CUDA_ERROR_INVALID_IMAGE : CUDA_ERROR_FILE_NOT_FOUND;
		return NULL;
	}
	buf[n] = 0;
	*size = n;
	return buf;
}

CUresult handwritten_cuModuleLoad(CUmodule *m, const char *fname, unsigned fl)
{
	CUresult r = CUDA_SUCCESS;
	size_t n;
	void *image = vg_read_file(fname, &n, &r);
	if (!image)
		return r;
	r = load_image(VG_OP_cuModuleLoadData, image, (void **)m, fl, NULL);
	free(image);
	return r;
}

CUresult handwritten_cuModuleLoadFatBinary(CUmodule *m, const void *image, unsigned fl)
{
	return load_image(VG_OP_cuModuleLoadFatBinary, image, (void **)m, fl, NULL);
}

/* A library's options, none of which crosses.  CU_LIBRARY_BINARY_IS_PRESERVED (cudart gives it for
 * every fatbin it registers) is a hint the driver may ignore, that it may read the program's copy of
 * the code instead of keeping its own: the host's driver loads the host's copy, so the hint is taken
 * and does nothing (from a file it is CUDA_ERROR_INVALID_VALUE, as the driver says).
 * CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE is a table of the program's host functions and
 * variables, which the driver reads only to answer cuLibraryGetUnifiedFunction and
 * cuLibraryGetManaged, neither of them served: it is left here, never sent (its pointers are the
 * guest's, which no driver on the host may follow), and the library loads as without it.  cudart
 * may give it for the fatbins it registers (refusing it, on the H100 a PyTorch guest's cuBLAS
 * found none of its kernels).  Any other option is CUDA_ERROR_INVALID_VALUE. */
static CUresult library_options(unsigned n, const CUlibraryOption *lo, void **lv, int from_file)
{
	static int once[3];
	/* every refusal is said (once per reason): a library a framework's loader cannot load shows up
	 * much later, as kernels it cannot find */
#define REFUSE(k, r, ...)                                             \
	do {                                                          \
		if (!__atomic_exchange_n(&once[k], 1, __ATOMIC_RELAXED)) \
			vg_log(__VA_ARGS__);                          \
		return r;                                             \
	} while (0)
	if (n && !lo)
		REFUSE(0, CUDA_ERROR_INVALID_VALUE, "cuLibraryLoad*: %u library options without their list", n);
	for (unsigned i = 0; i < n; i++) {
		/* its value is not read here: a list of values may be left out */
		if (lo[i] == CU_LIBRARY_BINARY_IS_PRESERVED && !from_file)
			continue;
		if (lo[i] == CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE && !lv)
			REFUSE(0, CUDA_ERROR_INVALID_VALUE, "cuLibraryLoad*: %u library options without their values", n);
		if (lo[i] == CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE)
			continue;
		if (lo[i] == CU_LIBRARY_BINARY_IS_PRESERVED)
			REFUSE(1, CUDA_ERROR_INVALID_VALUE,
			       "cuLibraryLoadFromFile: CU_LIBRARY_BINARY_IS_PRESERVED is for code in memory; "
			       "CUDA_ERROR_INVALID_VALUE");
		REFUSE(2, CUDA_ERROR_INVALID_VALUE, "cuLibraryLoad*: library option %d is not known; "
		       "CUDA_ERROR_INVALID_VALUE", (int)lo[i]);
	}
#undef REFUSE
	return CUDA_SUCCESS;
}

static CUresult library_load(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
			     CUlibraryOption *lo, void **lv, unsigned int nl, unsigned fl, int from_file)
{
	struct vg_jit jit;
	CUresult r = library_options(nl, lo, lv, from_file);
	if (r == CUDA_SUCCESS)
		r = vg_jit_take(&jit, "cuLibraryLoadData", nj, jo, jv);
	return r != CUDA_SUCCESS ? r : load_image(VG_OP_cuLibraryLoadData, code, (void **)lib, fl, &jit);
}

CUresult handwritten_cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
				       CUlibraryOption *lo, void **lv, unsigned int nl, unsigned fl)
{
	return library_load(lib, code, jo, jv, nj, lo, lv, nl, fl, 0);
}

CUresult handwritten_cuLibraryLoadFromFile(CUlibrary *lib, const char *fname, CUjit_option *jo, void **jv,
					   unsigned int nj, CUlibraryOption *lo, void **lv, unsigned int nl, unsigned fl)
{
	CUresult r = library_options(nl, lo, lv, 1);
	size_t n;
	void *image = r == CUDA_SUCCESS ? vg_read_file(fname, &n, &r) : NULL;
	if (!image)
		return r;
	r = library_load(lib, image, jo, jv, nj, lo, lv, nl, fl, 1);
	free(image);
	return r;
}
