/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Answers from the guest's own state: devices (from the host's snapshot at
 * cuInit), primary contexts and the per-thread context stack, pinned host
 * memory from the region's heap, error names, cuGetProcAddress, and kernel
 * parameter layouts (fetched once per function).  None of these cross to the host.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vg_errors.h"
#include "vg_guest.h"
#include "vg_procaddr.h"

/* ---- initialisation and version -------------------------------------------------- */

CUresult vgc_cuInit(unsigned int Flags, unsigned f)
{
	(void)f;
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return vg_connect();
}

CUresult vgc_cuDriverGetVersion(int *v, unsigned f)
{
	(void)f;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = vg.ready ? vg.hello.driver_version : vg_probed_driver_version;
	return CUDA_SUCCESS;
}

/* ---- devices ---------------------------------------------------------------------- */

static CUresult dev_ok(CUdevice d)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	return d >= 0 && (uint32_t)d < vg.hello.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult vgc_cuDeviceGet(CUdevice *d, int ordinal, unsigned f)
{
	(void)f;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(ordinal);
	if (r == CUDA_SUCCESS)
		*d = ordinal;
	return r;
}

CUresult vgc_cuDeviceGetCount(int *n, unsigned f)
{
	(void)f;
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r == CUDA_SUCCESS)
		*n = (int)vg.hello.ndev;
	return r;
}

CUresult vgc_cuDeviceGetName(char *name, int len, CUdevice d, unsigned f)
{
	(void)f;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS)
		snprintf(name, (size_t)len, "%.*s", (int)sizeof vg.dev[d].name, vg.dev[d].name);
	return r;
}

CUresult vgc_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d, unsigned f)
{
	(void)f;
	if (!u)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS)
		memcpy(u->bytes, vg.dev[d].uuid, 16);
	return r;
}

CUresult vgc_cuDeviceGetUuid(CUuuid *u, CUdevice d, unsigned f)
{
	return vgc_cuDeviceGetUuid_v2(u, d, f);
}

CUresult vgc_cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice d, unsigned f)
{
	(void)luid;
	(void)mask;
	(void)f;
	CUresult r = dev_ok(d);
	return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : r; /* Windows only */
}

CUresult vgc_cuDeviceTotalMem_v2(size_t *b, CUdevice d, unsigned f)
{
	(void)f;
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS)
		*b = vg.dev[d].total_mem; /* the guest's quota, not the card */
	return r;
}

CUresult vgc_cuDeviceTotalMem(unsigned int *b, CUdevice d, unsigned f)
{
	size_t v;
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vgc_cuDeviceTotalMem_v2(&v, d, f);
	if (r == CUDA_SUCCESS)
		*b = v > UINT32_MAX ? UINT32_MAX : (unsigned int)v;
	return r;
}

CUresult vgc_cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d, unsigned f)
{
	(void)f;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r != CUDA_SUCCESS)
		return r;
	if ((int)a <= 0 || (int)a >= vg.dev[d].nattrs)
		return CUDA_ERROR_INVALID_VALUE;
	*pi = vg.dev[d].attrs[a];
	return CUDA_SUCCESS;
}

CUresult vgc_cuDeviceComputeCapability(int *major, int *minor, CUdevice d, unsigned f)
{
	(void)f;
	if (!major || !minor)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS) {
		*major = vg.dev[d].attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
		*minor = vg.dev[d].attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
	}
	return r;
}

CUresult vgc_cuDeviceGetPCIBusId(char *id, int len, CUdevice d, unsigned f)
{
	(void)f;
	if (!id || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS)
		snprintf(id, (size_t)len, "%08x:%02x:%02x.0", (unsigned)vg.dev[d].pci_domain,
			 (unsigned)vg.dev[d].pci_bus, (unsigned)vg.dev[d].pci_device);
	return r;
}

/* ---- contexts: the primary context of each device, per-thread stacks ---------------- */

struct vg_ctx {
	uint32_t magic;
	int dev;
	int refs;
	unsigned flags;
};
#define CTX_MAGIC 0x43545847u
static struct vg_ctx ctxs[VG_MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
#define STACK 32
static __thread int stack[STACK];
static __thread int depth;

static CUcontext ctx_of(int dev)
{
	ctxs[dev].magic = CTX_MAGIC;
	ctxs[dev].dev = dev;
	return (CUcontext)&ctxs[dev];
}

CUcontext vg_primary_ctx(int dev)
{
	return ctx_of(dev);
}

int vg_ctx_ordinal(CUcontext c)
{
	struct vg_ctx *x = (struct vg_ctx *)c;
	if (!c)
		return vg_current_device();
	if (x < ctxs || x >= ctxs + VG_MAX_DEVICES || x->magic != CTX_MAGIC)
		return -1;
	return x->dev;
}

int vg_current_device(void)
{
	return depth > 0 ? stack[depth - 1] : -1;
}

CUresult vgc_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d, unsigned f)
{
	(void)f;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&ctx_mu);
	ctxs[d].refs++;
	*pctx = ctx_of(d);
	pthread_mutex_unlock(&ctx_mu);
	return CUDA_SUCCESS;
}

CUresult vgc_cuDevicePrimaryCtxRelease_v2(CUdevice d, unsigned f)
{
	(void)f;
	CUresult r = dev_ok(d);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&ctx_mu);
	if (ctxs[d].refs > 0)
		ctxs[d].refs--;
	else
		r = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&ctx_mu);
	return r;
}

CUresult vgc_cuDevicePrimaryCtxRelease(CUdevice d, unsigned f)
{
	return vgc_cuDevicePrimaryCtxRelease_v2(d, f);
}

CUresult vgc_cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active, unsigned f)
{
	(void)f;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS) {
		*flags = ctxs[d].flags;
		*active = ctxs[d].refs > 0;
	}
	return r;
}

CUresult vgc_cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags, unsigned f)
{
	(void)f;
	CUresult r = dev_ok(d);
	if (r == CUDA_SUCCESS)
		ctxs[d].flags = flags;
	return r;
}

CUresult vgc_cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned int flags, unsigned f)
{
	return vgc_cuDevicePrimaryCtxSetFlags_v2(d, flags, f);
}

/* A created context is the device's primary context (documented limitation). */
CUresult vgc_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d, unsigned f)
{
	(void)params;
	CUresult r = vgc_cuDevicePrimaryCtxRetain(pctx, d, f);
	if (r != CUDA_SUCCESS)
		return r;
	ctxs[d].flags = flags;
	if (depth == STACK)
		return CUDA_ERROR_INVALID_CONTEXT;
	stack[depth++] = d;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxDestroy_v2(CUcontext ctx, unsigned f)
{
	int d = vg_ctx_ordinal(ctx);
	if (!ctx || d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth > 0 && stack[depth - 1] == d)
		depth--;
	return vgc_cuDevicePrimaryCtxRelease_v2(d, f);
}

CUresult vgc_cuCtxDestroy(CUcontext ctx, unsigned f)
{
	return vgc_cuCtxDestroy_v2(ctx, f);
}

CUresult vgc_cuCtxGetCurrent(CUcontext *pctx, unsigned f)
{
	(void)f;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	*pctx = depth > 0 ? ctx_of(stack[depth - 1]) : NULL;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxSetCurrent(CUcontext ctx, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (!ctx) {
		if (depth > 0)
			depth--;
		return CUDA_SUCCESS;
	}
	int d = vg_ctx_ordinal(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == 0)
		depth = 1;
	stack[depth - 1] = d;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxPushCurrent_v2(CUcontext ctx, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	int d = vg_ctx_ordinal(ctx);
	if (!ctx || d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == STACK)
		return CUDA_ERROR_INVALID_VALUE;
	stack[depth++] = d;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxPushCurrent(CUcontext ctx, unsigned f)
{
	return vgc_cuCtxPushCurrent_v2(ctx, f);
}

CUresult vgc_cuCtxPopCurrent_v2(CUcontext *pctx, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	int d = stack[--depth];
	if (pctx)
		*pctx = ctx_of(d);
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxPopCurrent(CUcontext *pctx, unsigned f)
{
	return vgc_cuCtxPopCurrent_v2(pctx, f);
}

CUresult vgc_cuCtxGetDevice(CUdevice *d, unsigned f)
{
	(void)f;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = stack[depth - 1];
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxGetDevice_v2(CUdevice *d, CUcontext ctx, unsigned f)
{
	if (!ctx)
		return vgc_cuCtxGetDevice(d, f);
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	int o = vg_ctx_ordinal(ctx);
	if (o < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = o;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxGetApiVersion(CUcontext ctx, unsigned int *v, unsigned f)
{
	(void)f;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx && vg_ctx_ordinal(ctx) < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*v = 3020; /* what the driver reports for contexts made through the v2 API */
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxGetFlags(unsigned int *flags, unsigned f)
{
	(void)f;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*flags = ctxs[stack[depth - 1]].flags;
	return CUDA_SUCCESS;
}

CUresult vgc_cuCtxGetId(CUcontext ctx, unsigned long long *id, unsigned f)
{
	(void)f;
	if (!id)
		return CUDA_ERROR_INVALID_VALUE;
	int d = vg_ctx_ordinal(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*id = (unsigned long long)d + 1;
	return CUDA_SUCCESS;
}

CUresult vgc_cuModuleGetLoadingMode(CUmoduleLoadingMode *mode, unsigned f)
{
	(void)f;
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	*mode = CU_MODULE_LAZY_LOADING;
	return CUDA_SUCCESS;
}

/* ---- pinned host memory: the region's heap ------------------------------------------ */

CUresult vgc_cuMemHostAlloc(void **pp, size_t size, unsigned int flags, unsigned f)
{
	(void)f;
	(void)flags; /* all heap memory is portable, mapped and registered by the host */
	if (!pp || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t off;
	vg_lock();
	int e = vmgpu_guest_heap_alloc(vg.chan, size, &off);
	vg_unlock();
	if (e < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pp = vmgpu_guest_ptr(vg.guest, off);
	return CUDA_SUCCESS;
}

CUresult vgc_cuMemAllocHost_v2(void **pp, size_t size, unsigned f)
{
	return vgc_cuMemHostAlloc(pp, size, 0, f);
}

CUresult vgc_cuMemAllocHost(void **pp, unsigned int size, unsigned f)
{
	return vgc_cuMemHostAlloc(pp, size, 0, f);
}

CUresult vgc_cuMemFreeHost(void *p, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t off = vg_heap_offset(p, 1);
	if (off == UINT64_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	vg_lock();
	int e = vmgpu_guest_heap_free(vg.chan, off);
	vg_unlock();
	return e < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult vgc_cuMemHostGetFlags(unsigned int *flags, void *p, unsigned f)
{
	(void)f;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (vg_heap_offset(p, 1) == UINT64_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
	return CUDA_SUCCESS;
}

/* ---- error names ---------------------------------------------------------------------- */

static const struct vg_error_name *err_entry(CUresult e)
{
	for (unsigned i = 0; i < vg_error_nnames; i++)
		if (vg_error_names[i].code == (int)e)
			return &vg_error_names[i];
	return NULL;
}

CUresult vgc_cuGetErrorName(CUresult e, const char **s, unsigned f)
{
	(void)f;
	const struct vg_error_name *n = err_entry(e);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = n ? n->name : NULL;
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult vgc_cuGetErrorString(CUresult e, const char **s, unsigned f)
{
	(void)f;
	const struct vg_error_name *n = err_entry(e);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = n ? n->text : NULL;
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress, as the probed driver answers it --------------------------------- */

static CUresult procaddr(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)
{
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	int flag = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 2
		   : (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM)	    ? 1
									    : 0;
	/* rows are sorted by (base, flag, version): find the last row <= (symbol, flag, version) */
	unsigned lo = 0, hi = vg_procaddr_nrows;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		const struct vg_procaddr_row *r = &vg_procaddr_rows[mid];
		int c = strcmp(r->base, symbol);
		if (c == 0)
			c = r->flag - flag;
		if (c == 0)
			c = r->min_version > version ? 1 : -1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0) {
		const struct vg_procaddr_row *r = &vg_procaddr_rows[lo - 1];
		if (!strcmp(r->base, symbol) && r->flag == flag) {
			*status = r->status;
			*pfn = r->fn;
			return (CUresult)r->rc;
		}
		if (!strcmp(r->base, symbol) || (lo < vg_procaddr_nrows && !strcmp(vg_procaddr_rows[lo].base, symbol))) {
			/* asked for a version older than the symbol's first */
			*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
			return CUDA_SUCCESS;
		}
	} else if (vg_procaddr_nrows && !strcmp(vg_procaddr_rows[0].base, symbol)) {
		*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		return CUDA_SUCCESS;
	}
	*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

CUresult vgc_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *st, unsigned f)
{
	(void)f;
	int status = 0;
	CUresult r = procaddr(symbol, pfn, version, flags, &status);
	if (st)
		*st = (CUdriverProcAddressQueryResult)status;
	return r;
}

CUresult vgc_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags, unsigned f)
{
	(void)f;
	int status = 0;
	return procaddr(symbol, pfn, version, flags, &status);
}

/* ---- kernel parameter layouts ------------------------------------------------------------ */

#define FN_SLOTS 4096
static struct vg_fninfo *fn_table[FN_SLOTS];
static pthread_mutex_t fn_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned fn_slot(uint64_t h)
{
	return (unsigned)((h * 0x9E3779B97F4A7C15ull) >> 52) & (FN_SLOTS - 1);
}

CUresult vg_fninfo(uint64_t handle, struct vg_fninfo **out)
{
	pthread_mutex_lock(&fn_mu);
	unsigned s = fn_slot(handle);
	for (unsigned i = 0; i < FN_SLOTS; i++, s = (s + 1) & (FN_SLOTS - 1)) {
		if (!fn_table[s])
			break;
		if (fn_table[s]->handle == handle) {
			*out = fn_table[s];
			pthread_mutex_unlock(&fn_mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&fn_mu);

	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_FUNC_PARAMS, 0);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, handle);
	r = vg_call_sync(&c);
	struct vg_fninfo *fi = NULL;
	if (r == CUDA_SUCCESS) {
		uint64_t n = vg_get_u64(&c);
		const struct vg_param_info *p = n <= VG_MAX_PARAMS ? vg_get_ref(&c, n * sizeof *p) : NULL;
		fi = calloc(1, sizeof *fi + n * sizeof *p);
		if (!p || !fi) {
			free(fi);
			fi = NULL;
			r = p ? CUDA_ERROR_OUT_OF_MEMORY : VG_ERROR_LOST;
		} else {
			fi->handle = handle;
			fi->nparams = (uint32_t)n;
			fi->params = (struct vg_param_info *)(fi + 1);
			memcpy(fi->params, p, n * sizeof *p);
			for (uint64_t i = 0; i < n; i++)
				if (p[i].offset + p[i].size > fi->bytes)
					fi->bytes = p[i].offset + p[i].size;
		}
	}
	vg_end(&c, r);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&fn_mu);
	s = fn_slot(handle);
	for (unsigned i = 0; i < FN_SLOTS; i++, s = (s + 1) & (FN_SLOTS - 1)) {
		if (!fn_table[s]) {
			fn_table[s] = fi;
			break;
		}
		if (fn_table[s]->handle == handle) { /* another thread was first */
			free(fi);
			fi = fn_table[s];
			break;
		}
	}
	pthread_mutex_unlock(&fn_mu);
	*out = fi; /* with a full table the layout is still returned, just not kept */
	return CUDA_SUCCESS;
}

CUresult vgc_cuFuncGetParamInfo(CUfunction func, size_t i, size_t *off, size_t *size, unsigned f)
{
	(void)f;
	struct vg_fninfo *fi;
	if (!func)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = vg_fninfo(vg_fn_handle(func), &fi);
	if (r != CUDA_SUCCESS)
		return r;
	if (i >= fi->nparams)
		return CUDA_ERROR_INVALID_VALUE;
	if (off)
		*off = fi->params[i].offset;
	if (size)
		*size = fi->params[i].size;
	return CUDA_SUCCESS;
}

CUresult vgc_cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size, unsigned f)
{
	return vgc_cuFuncGetParamInfo((CUfunction)k, i, off, size, f);
}
