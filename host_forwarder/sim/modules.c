/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Modules read from PTX text, alone or uncompressed inside a fatbin: entry names and parameter
 * layouts (the images were checked by the forwarder first); their functions and attributes.  A
 * load's JIT options get logs that say SIMULATED (jit_logs.c); no option changes what is loaded.
 */
#include "sim.h"

#define MOD_MAGIC 0x4d4f4455u
#define FN_MAGIC 0x46554e43u

struct sim_mod {
	uint32_t magic;
	int unrecognized; /* a library of an image that is none: its kernels are CUDA_ERROR_INVALID_IMAGE */
	int nfn;
	struct sim_fn fn[MAX_FN];
};

static size_t ptx_type_size(const char *t)
{
	if (!strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) || !strncmp(t, ".b64", 4) || !strncmp(t, ".f64", 4)) return 8;
	if (!strncmp(t, ".u32", 4) || !strncmp(t, ".s32", 4) || !strncmp(t, ".b32", 4) || !strncmp(t, ".f32", 4)) return 4;
	if (!strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4) || !strncmp(t, ".b16", 4)) return 2;
	if (!strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3) || !strncmp(t, ".b8", 3)) return 1;
	return 0;
}

/* Entry points and their parameter layouts, read from PTX (NUL-terminated text).  A
 * parameter whose size or alignment makes no sense ends the parse of its entry. */
static void parse_ptx(struct sim_mod *m, const char *text)
{
	const char *p = text;
	while ((p = strstr(p, ".entry ")) && m->nfn < MAX_FN) {
		p += 7;
		struct sim_fn *f = &m->fn[m->nfn++];
		f->magic = FN_MAGIC;
		size_t k = 0;
		while (*p == ' ') p++;
		while (*p && *p != '(' && *p != ' ' && *p != '\n' && k < sizeof f->name - 1) f->name[k++] = *p++;
		f->name[k] = 0;
		const char *close = strchr(p, ')');
		size_t off = 0;
		for (const char *q = p; close && (q = strstr(q, ".param")) && q < close && f->np < MAX_P; q += 6) {
			const char *t = q + 6;
			while (*t == ' ') t++;
			size_t align = 0, sz = 0;
			if (!strncmp(t, ".align", 6)) {
				align = strtoul(t + 6, (char **)&t, 10);
				while (*t == ' ') t++;
			}
			sz = ptx_type_size(t);
			const char *br = strchr(t, '[');
			if (br && br < close && (!strchr(t, ',') || br < strchr(t, ','))) {
				unsigned long count = strtoul(br + 1, NULL, 10);
				sz = count <= MAX_PARAM_BYTES ? sz * count : MAX_PARAM_BYTES + 1;
			}
			if (!align) align = sz ? (sz > 8 ? 8 : sz) : 1;
			if (sz > MAX_PARAM_BYTES || align > MAX_PARAM_BYTES || (align & (align - 1)))
				break; /* not a parameter a kernel can have */
			off = (off + align - 1) / align * align;
			if (off + sz > MAX_PARAM_BYTES)
				break;
			f->off[f->np] = off;
			f->size[f->np] = sz;
			f->np++;
			off += sz;
		}
	}
}

/* The uncompressed PTX entries of a fatbin (nvcc -no-compress), container after container.
 * Like the driver, it sizes the image from its own headers: the forwarder has checked them
 * against the bytes it received (image_check.c), and left zeros after them.  A header that
 * contradicts itself ends the walk. */
static void parse_fatbin(struct sim_mod *m, const uint8_t *image)
{
	uint64_t total = 0;
	for (;;) {
		struct { uint32_t magic; uint16_t version, header_size; uint64_t size; } h;
		memcpy(&h, image + total, sizeof h);
		if (h.magic != 0xBA55ED50u || h.header_size < sizeof h || h.size > (1ull << 30) ||
		    total + h.header_size + h.size > (1ull << 30))
			return;
		const uint8_t *e = image + total + h.header_size, *end = e + h.size;
		while (end - e >= 64) {
			uint32_t hs;
			uint64_t size, flags;
			uint16_t kind;
			memcpy(&kind, e, 2);
			memcpy(&hs, e + 4, 4);
			memcpy(&size, e + 8, 8);
			memcpy(&flags, e + 40, 8);
			if (hs < 64 || hs > (uint64_t)(end - e) || size > (uint64_t)(end - e) - hs)
				return;
			if (kind == 1 && !(flags & 0xA000)) { /* PTX, not compressed */
				char *text = malloc(size + 1);
				if (!text) return;
				memcpy(text, e + hs, size);
				text[size] = 0;
				parse_ptx(m, text);
				free(text);
			}
			e += hs + size;
		}
		total += h.header_size + h.size;
	}
}

/* A module from an image: a fatbin's uncompressed PTX entries, a cubin (its entries are not read),
 * or PTX text.  Text without a ".version" directive is not recognized: CUDA_ERROR_INVALID_IMAGE, as
 * the H100's driver answers text that is not PTX ("Binary format ... is not recognized" in its
 * error log); a library of it (library) loads, and its kernels are CUDA_ERROR_INVALID_IMAGE, as
 * there.  jit: the load's options, whose logs say why, or what was loaded (NULL: none given). */
static CUresult load(CUmodule *mod, const void *image, struct sim_jit *jit, int library)
{
	if (!mod || !image) return CUDA_ERROR_INVALID_VALUE;
	uint32_t magic;
	memcpy(&magic, image, 4);
	int ptx = magic != 0xBA55ED50u && memcmp(image, "\x7f" "ELF", 4) != 0;
	int unrecognized = ptx && !strstr(image, ".version");
	if (unrecognized && jit)
		sim_jit_say(jit, 1, "SIMULATED driver: the image is not recognized (no .version directive)");
	if (unrecognized && !library)
		return CUDA_ERROR_INVALID_IMAGE;
	struct sim_mod *m = calloc(1, sizeof *m);
	if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = MOD_MAGIC;
	m->unrecognized = unrecognized;
	if (magic == 0xBA55ED50u)
		parse_fatbin(m, image);
	else if (ptx && !unrecognized)
		parse_ptx(m, image);
	if (jit && !unrecognized)
		sim_jit_say(jit, 0, "SIMULATED driver: %s loaded, %d entries read", ptx ? "PTX" : magic == 0xBA55ED50u ? "a fatbin" : "a cubin", m->nfn);
	*mod = (CUmodule)m;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
	return load(mod, image, NULL, 0);
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, CUjit_option *o, void **v)
{
	struct sim_jit jit;
	CUresult r = sim_jit_begin(&jit, n, o, v);
	return r != CUDA_SUCCESS ? r : load(mod, image, &jit, 0);
}
EXPORT CUresult cuModuleUnload(CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!sim_is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	m->magic = 0;
	free(m);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *fn, CUmodule mod, const char *name)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!fn || !name) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	for (int i = 0; i < m->nfn; i++)
		if (!strcmp(m->fn[i].name, name)) {
			*fn = (CUfunction)&m->fn[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuModuleGetFunctionCount(unsigned int *n, CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!n) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*n = (unsigned int)m->nfn;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *fns, unsigned int n, CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!fns) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	for (unsigned int i = 0; i < n && i < (unsigned int)m->nfn; i++)
		fns[i] = (CUfunction)&m->fn[i];
	return CUDA_SUCCESS;
}
/* Library options are taken and change nothing (CU_LIBRARY_BINARY_IS_PRESERVED is a hint). */
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
				  CUlibraryOption *lo, void **lv, unsigned int nl)
{
	if (nl && (!lo || !lv)) return CUDA_ERROR_INVALID_VALUE;
	struct sim_jit jit;
	CUresult r = sim_jit_begin(&jit, nj, jo, jv);
	return r != CUDA_SUCCESS ? r : load((CUmodule *)lib, code, &jit, 1);
}
EXPORT CUresult cuLibraryUnload(CUlibrary lib) { return cuModuleUnload((CUmodule)lib); }
EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name)
{
	struct sim_mod *m = (struct sim_mod *)lib;
	if (sim_is_obj(m, MOD_MAGIC) && m->unrecognized) return CUDA_ERROR_INVALID_IMAGE;
	return cuModuleGetFunction((CUfunction *)k, (CUmodule)lib, name);
}
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
	if (!f) return CUDA_ERROR_INVALID_VALUE;
	*f = (CUfunction)k;
	return CUDA_SUCCESS;
}

struct sim_fn *sim_fn_of(const void *h)
{
	struct sim_fn *f = (struct sim_fn *)h;
	return sim_is_obj(f, FN_MAGIC) ? f : NULL;
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t i, size_t *off, size_t *size)
{
	struct sim_fn *f = sim_fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (i >= (size_t)f->np) return CUDA_ERROR_INVALID_VALUE;
	if (off) *off = f->off[i];
	if (size) *size = f->size[i];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size) { return cuFuncGetParamInfo((CUfunction)k, i, off, size); }
EXPORT CUresult cuFuncGetName(const char **name, CUfunction func)
{
	struct sim_fn *f = sim_fn_of(func);
	if (!name) return CUDA_ERROR_INVALID_VALUE;
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	*name = f->name;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuKernelGetName(const char **name, CUkernel k) { return cuFuncGetName(name, (CUfunction)k); }
EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction func)
{
	if (!pi) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_fn_of(func)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_fn *f = sim_fn_of(func);
	*pi = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
	      : a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ? f->max_dynamic_smem
								      : 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncSetAttribute(CUfunction func, CUfunction_attribute a, int v)
{
	struct sim_fn *f = sim_fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_NOT_SUPPORTED;
	if (v < 0 || v > 227 * 1024) return CUDA_ERROR_INVALID_VALUE;
	f->max_dynamic_smem = v;
	return CUDA_SUCCESS;
}
