/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Contexts, kept in the guest: one primary context per device (a created context
 * is the device's primary context) and a stack of current contexts per thread.
 * The host gives each guest process its own context per device; none of these
 * calls cross to it.
 */
#include <pthread.h>

#include "connection.h"
#include "context.h"
#include "device.h"
#include "vg_guest_protos.h"

struct guest_context {
	uint32_t magic;
	int dev;
	int refs;
	unsigned flags;
};
#define CTX_MAGIC 0x43545847u
static struct guest_context primary_contexts[VG_MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
#define STACK 32
static __thread int stack[STACK];
static __thread int depth;

static CUcontext context_of(int dev)
{
	primary_contexts[dev].magic = CTX_MAGIC;
	primary_contexts[dev].dev = dev;
	return (CUcontext)&primary_contexts[dev];
}

CUcontext vg_primary_context(int dev)
{
	return context_of(dev);
}

int vg_context_device(CUcontext c)
{
	struct guest_context *x = (struct guest_context *)c;
	if (!c)
		return vg_current_device();
	if (x < primary_contexts || x >= primary_contexts + VG_MAX_DEVICES || x->magic != CTX_MAGIC)
		return -1;
	return x->dev;
}

int vg_current_device(void)
{
	return depth > 0 ? stack[depth - 1] : -1;
}

CUresult handwritten_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d, unsigned f)
{
	(void)f;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&primary_lock);
	primary_contexts[d].refs++;
	*pctx = context_of(d);
	pthread_mutex_unlock(&primary_lock);
	return CUDA_SUCCESS;
}

CUresult handwritten_cuDevicePrimaryCtxRelease_v2(CUdevice d, unsigned f)
{
	(void)f;
	CUresult r = vg_device_valid(d);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&primary_lock);
	if (primary_contexts[d].refs > 0)
		primary_contexts[d].refs--;
	else
		r = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&primary_lock);
	return r;
}

CUresult handwritten_cuDevicePrimaryCtxRelease(CUdevice d, unsigned f)
{
	return handwritten_cuDevicePrimaryCtxRelease_v2(d, f);
}

CUresult handwritten_cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active, unsigned f)
{
	(void)f;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS) {
		*flags = primary_contexts[d].flags;
		*active = primary_contexts[d].refs > 0;
	}
	return r;
}

CUresult handwritten_cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags, unsigned f)
{
	(void)f;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS)
		primary_contexts[d].flags = flags;
	return r;
}

CUresult handwritten_cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned int flags, unsigned f)
{
	return handwritten_cuDevicePrimaryCtxSetFlags_v2(d, flags, f);
}

/* A created context is the device's primary context (documented limitation). */
CUresult handwritten_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d, unsigned f)
{
	(void)params;
	CUresult r = handwritten_cuDevicePrimaryCtxRetain(pctx, d, f);
	if (r != CUDA_SUCCESS)
		return r;
	primary_contexts[d].flags = flags;
	if (depth == STACK)
		return CUDA_ERROR_INVALID_CONTEXT;
	stack[depth++] = d;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxDestroy_v2(CUcontext ctx, unsigned f)
{
	int d = vg_context_device(ctx);
	if (!ctx || d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth > 0 && stack[depth - 1] == d)
		depth--;
	return handwritten_cuDevicePrimaryCtxRelease_v2(d, f);
}

CUresult handwritten_cuCtxDestroy(CUcontext ctx, unsigned f)
{
	return handwritten_cuCtxDestroy_v2(ctx, f);
}

CUresult handwritten_cuCtxGetCurrent(CUcontext *pctx, unsigned f)
{
	(void)f;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	*pctx = depth > 0 ? context_of(stack[depth - 1]) : NULL;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxSetCurrent(CUcontext ctx, unsigned f)
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
	int d = vg_context_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == 0)
		depth = 1;
	stack[depth - 1] = d;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxPushCurrent_v2(CUcontext ctx, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	int d = vg_context_device(ctx);
	if (!ctx || d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == STACK)
		return CUDA_ERROR_INVALID_VALUE;
	stack[depth++] = d;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxPushCurrent(CUcontext ctx, unsigned f)
{
	return handwritten_cuCtxPushCurrent_v2(ctx, f);
}

CUresult handwritten_cuCtxPopCurrent_v2(CUcontext *pctx, unsigned f)
{
	(void)f;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	int d = stack[--depth];
	if (pctx)
		*pctx = context_of(d);
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxPopCurrent(CUcontext *pctx, unsigned f)
{
	return handwritten_cuCtxPopCurrent_v2(pctx, f);
}

CUresult handwritten_cuCtxGetDevice(CUdevice *d, unsigned f)
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

CUresult handwritten_cuCtxGetDevice_v2(CUdevice *d, CUcontext ctx, unsigned f)
{
	if (!ctx)
		return handwritten_cuCtxGetDevice(d, f);
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	int o = vg_context_device(ctx);
	if (o < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = o;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxGetApiVersion(CUcontext ctx, unsigned int *v, unsigned f)
{
	(void)f;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx && vg_context_device(ctx) < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*v = 3020; /* what the driver reports for contexts made through the v2 API */
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxGetFlags(unsigned int *flags, unsigned f)
{
	(void)f;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*flags = primary_contexts[stack[depth - 1]].flags;
	return CUDA_SUCCESS;
}

/* No stream of a guest is in a green context: vmgpu makes none for it (cuGreenCtxCreate and
 * cuCtxFromGreenCtx are not served), so the answer is NULL, here, without a round trip (cuBLAS
 * asks at cublasCreate and may ask per call).  The driver leaves an invalid stream undefined; a
 * thread with no current context is CUDA_ERROR_INVALID_CONTEXT. */
CUresult handwritten_cuStreamGetGreenCtx(CUstream s, CUgreenCtx *out, unsigned f)
{
	(void)s;
	(void)f;
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*out = NULL;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuCtxGetId(CUcontext ctx, unsigned long long *id, unsigned f)
{
	(void)f;
	if (!id)
		return CUDA_ERROR_INVALID_VALUE;
	int d = vg_context_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*id = (unsigned long long)d + 1;
	return CUDA_SUCCESS;
}
