/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory: host memory behind made-up device addresses, each allocation a range that
 * every address a call names is checked against; host memory the forwarder registers; arrays;
 * pointer attributes.
 */
#include "sim.h"

pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
struct range *sim_ranges;
size_t sim_nranges, sim_capranges;
uint64_t sim_next_dev = SIM_BASE;
uint64_t sim_used_bytes;

uint64_t sim_round(uint64_t n)
{
	uint64_t unit = n <= (1u << 20) ? (64u << 10) : (2u << 20);
	return (n + unit - 1) / unit * unit;
}

/* The bytes behind [addr, addr+n), or NULL if that is not inside one allocation. */
uint8_t *sim_resolve(uint64_t addr, uint64_t n)
{
	uint8_t *p = NULL;
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges; i++) {
		struct range *r = &sim_ranges[i];
		if (addr >= r->dev && n <= r->size && addr - r->dev <= r->size - n) {
			p = r->host + (addr - r->dev);
			break;
		}
	}
	pthread_mutex_unlock(&sim_mu);
	return p;
}

CUresult sim_add_range(uint64_t dev, uint8_t *host, uint64_t size, int registered)
{
	pthread_mutex_lock(&sim_mu);
	if (sim_nranges == sim_capranges) {
		size_t cap = sim_capranges ? sim_capranges * 2 : 64;
		struct range *r = realloc(sim_ranges, cap * sizeof *r);
		if (!r) {
			pthread_mutex_unlock(&sim_mu);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		sim_ranges = r;
		sim_capranges = cap;
	}
	sim_ranges[sim_nranges++] = (struct range){dev, host, size, registered};
	pthread_mutex_unlock(&sim_mu);
	return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim_mu);
	int over = n > sim_total_mem() - sim_used_bytes;
	uint64_t dev = sim_next_dev;
	sim_next_dev += (n + 0xFFFF) & ~0xFFFFull;
	if (!over) {
		sim_used_bytes += n;
		sim_usage_add((int64_t)sim_round(n));
	}
	pthread_mutex_unlock(&sim_mu);
	if (over) return CUDA_ERROR_OUT_OF_MEMORY;
	uint8_t *host = calloc(1, n);
	if (!host || sim_add_range(dev, host, n, 0)) {
		free(host);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*p = dev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges; i++) {
		if (sim_ranges[i].dev == p && !sim_ranges[i].registered) {
			free(sim_ranges[i].host);
			sim_used_bytes -= sim_ranges[i].size;
			sim_usage_add(-(int64_t)sim_round(sim_ranges[i].size));
			sim_ranges[i] = sim_ranges[--sim_nranges];
			pthread_mutex_unlock(&sim_mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&sim_mu);
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
	pthread_mutex_lock(&sim_mu);
	if (f) *f = sim_total_mem() - sim_used_bytes;
	if (t) *t = sim_total_mem();
	pthread_mutex_unlock(&sim_mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges; i++) {
		if (!sim_ranges[i].registered && p >= sim_ranges[i].dev && p - sim_ranges[i].dev < sim_ranges[i].size) {
			if (base) *base = sim_ranges[i].dev;
			if (size) *size = sim_ranges[i].size;
			pthread_mutex_unlock(&sim_mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&sim_mu);
	return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags)
{
	(void)flags;
	if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
	sim_sleep_ns(sim_register_ns());
	return sim_add_range((uint64_t)(uintptr_t)p, p, n, 1);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	(void)p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
	if (!d || flags) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_resolve((uint64_t)(uintptr_t)p, 1)) return CUDA_ERROR_INVALID_VALUE;
	*d = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned el)
{
	if (!pitch || !w || !h || (el != 4 && el != 8 && el != 16)) return CUDA_ERROR_INVALID_VALUE;
	size_t pw = (w + 511) & ~(size_t)511;
	CUresult r = cuMemAlloc_v2(p, pw * h);
	if (r == CUDA_SUCCESS) *pitch = pw;
	return r;
}

#define ARRAY_MAGIC 0x41525259u
struct sim_array { uint32_t magic; CUDA_ARRAY3D_DESCRIPTOR d; CUdeviceptr mem; };

static CUresult array_new(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	if (!out || !d || !d->Width || !d->NumChannels) return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * d->NumChannels * 4;
	struct sim_array *a = calloc(1, sizeof *a);
	if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = cuMemAlloc_v2(&a->mem, n);
	if (r != CUDA_SUCCESS) { free(a); return r; }
	a->magic = ARRAY_MAGIC;
	a->d = *d;
	*out = (CUarray)a;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d) { return array_new(out, d); }
EXPORT CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *d)
{
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
	return array_new(out, &d3);
}
EXPORT CUresult cuArrayDestroy(CUarray h)
{
	struct sim_array *a = (struct sim_array *)h;
	if (!sim_is_obj(a, ARRAY_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	cuMemFree_v2(a->mem);
	a->magic = 0;
	free(a);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray h)
{
	struct sim_array *a = (struct sim_array *)h;
	if (!d || !sim_is_obj(a, ARRAY_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*d = a->d;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray h)
{
	CUDA_ARRAY3D_DESCRIPTOR d3;
	CUresult r = cuArray3DGetDescriptor_v2(&d3, h);
	if (r == CUDA_SUCCESS) *d = (CUDA_ARRAY_DESCRIPTOR){d3.Width, d3.Height, d3.Format, d3.NumChannels};
	return r;
}

/* ---- texture and surface objects: their descriptions, kept; a resource must exist ---- */

#define TEX_MAGIC 0x54455854u
struct sim_tex { uint32_t magic; int surface; CUDA_RESOURCE_DESC res; CUDA_TEXTURE_DESC tex; CUDA_RESOURCE_VIEW_DESC view; };

static CUresult tex_new(unsigned long long *out, const CUDA_RESOURCE_DESC *r, const CUDA_TEXTURE_DESC *t,
			const CUDA_RESOURCE_VIEW_DESC *v, int surface)
{
	if (!out || !r || (!surface && !t)) return CUDA_ERROR_INVALID_VALUE;
	if (r->resType == CU_RESOURCE_TYPE_ARRAY) {
		if (!sim_is_obj((void *)r->res.array.hArray, ARRAY_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	} else if (surface) {
		return CUDA_ERROR_INVALID_VALUE;
	} else if (r->resType == CU_RESOURCE_TYPE_LINEAR) {
		if (!r->res.linear.sizeInBytes || !sim_resolve(r->res.linear.devPtr, r->res.linear.sizeInBytes))
			return CUDA_ERROR_INVALID_VALUE;
	} else if (r->resType == CU_RESOURCE_TYPE_PITCH2D) {
		if (!r->res.pitch2D.height || !sim_resolve(r->res.pitch2D.devPtr, r->res.pitch2D.pitchInBytes * r->res.pitch2D.height))
			return CUDA_ERROR_INVALID_VALUE;
	} else {
		return CUDA_ERROR_INVALID_VALUE;
	}
	struct sim_tex *x = calloc(1, sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	*x = (struct sim_tex){TEX_MAGIC, surface, *r};
	if (t) x->tex = *t;
	if (v) x->view = *v;
	*out = (uint64_t)(uintptr_t)x;
	return CUDA_SUCCESS;
}
static struct sim_tex *tex_of(uint64_t v, int surface)
{
	struct sim_tex *x = (struct sim_tex *)(uintptr_t)v;
	return sim_is_obj(x, TEX_MAGIC) && x->surface == surface ? x : NULL;
}
static CUresult tex_del(uint64_t v, int surface)
{
	struct sim_tex *x = tex_of(v, surface);
	if (!x) return CUDA_ERROR_INVALID_VALUE;
	x->magic = 0;
	free(x);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuTexObjectCreate(CUtexObject *o, const CUDA_RESOURCE_DESC *r, const CUDA_TEXTURE_DESC *t,
				  const CUDA_RESOURCE_VIEW_DESC *v)
{
	return tex_new(o, r, t, v, 0);
}
EXPORT CUresult cuSurfObjectCreate(CUsurfObject *o, const CUDA_RESOURCE_DESC *r) { return tex_new(o, r, NULL, NULL, 1); }
EXPORT CUresult cuTexObjectDestroy(CUtexObject o) { return tex_del(o, 0); }
EXPORT CUresult cuSurfObjectDestroy(CUsurfObject o) { return tex_del(o, 1); }
EXPORT CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC *d, CUtexObject o)
{
	struct sim_tex *x = tex_of(o, 0);
	if (!d || !x) return CUDA_ERROR_INVALID_VALUE;
	*d = x->res;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC *d, CUsurfObject o)
{
	struct sim_tex *x = tex_of(o, 1);
	if (!d || !x) return CUDA_ERROR_INVALID_VALUE;
	*d = x->res;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC *d, CUtexObject o)
{
	struct sim_tex *x = tex_of(o, 0);
	if (!d || !x) return CUDA_ERROR_INVALID_VALUE;
	*d = x->tex;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC *d, CUtexObject o)
{
	struct sim_tex *x = tex_of(o, 0);
	if (!d || !x) return CUDA_ERROR_INVALID_VALUE;
	*d = x->view;
	return CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	if (!data) return CUDA_ERROR_INVALID_VALUE;
	uint8_t *host = sim_resolve(p, 1);
	if (!host) return CUDA_ERROR_INVALID_VALUE;
	int registered = 0;
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges; i++)
		if (sim_ranges[i].registered && p >= sim_ranges[i].dev && p - sim_ranges[i].dev < sim_ranges[i].size)
			registered = 1;
	pthread_mutex_unlock(&sim_mu);
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = registered ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (!registered) return CUDA_ERROR_INVALID_VALUE;
		*(void **)data = host;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

/* As the driver: an address it does not know gets zeroes (memory type 0: unregistered). */
EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	if (!attrs || !data)
		return CUDA_ERROR_INVALID_VALUE;
	int known = sim_resolve(p, 1) != NULL;
	for (unsigned i = 0; i < n; i++) {
		if (!data[i])
			return CUDA_ERROR_INVALID_VALUE;
		memset(data[i], 0, 8);
		if (known)
			(void)cuPointerGetAttribute(data[i], attrs[i], p);
	}
	return CUDA_SUCCESS;
}
