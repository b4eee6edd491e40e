/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Guest caches for the queries a framework repeats thousands of times per step
 * (PyTorch: ~3,500 cuKernelGetAttribute and ~280 cuKernelGetFunction per ResNet-50 step):
 * kernel and function attributes, and the function of a kernel in the current context.
 * A miss makes the generated round trip and fills the cache; setting an attribute goes
 * to the host and drops what was cached for that kernel or function (and its partner),
 * unless the cache already holds that very value: then there is nothing to set.
 */
#include <pthread.h>
#include <string.h>

#include "call.h"
#include "context.h"
#include "function.h"
#include "vg_guest_protos.h"

#define SLOTS 16384 /* power of two */

struct entry {
	uint64_t handle; /* 0: empty */
	int32_t key1, key2;
	uint64_t value;
};

static struct entry attrs[SLOTS], funcs[SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned slot_of(uint64_t h, int32_t a, int32_t b)
{
	uint64_t x = h * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)a * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)(uint32_t)b;
	return (unsigned)(x >> 40) & (SLOTS - 1);
}

/* Linear probing over a bounded run; a full run is simply not cached. */
#define RUN 16

static int lookup(struct entry *t, uint64_t h, int32_t a, int32_t b, uint64_t *v)
{
	int found = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0, s = slot_of(h, a, b); i < RUN; i++, s = (s + 1) & (SLOTS - 1)) {
		if (t[s].handle == h && t[s].key1 == a && t[s].key2 == b) {
			*v = t[s].value;
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return found;
}

static void store(struct entry *t, uint64_t h, int32_t a, int32_t b, uint64_t v)
{
	pthread_mutex_lock(&mu);
	for (unsigned i = 0, s = slot_of(h, a, b); i < RUN; i++, s = (s + 1) & (SLOTS - 1)) {
		if (!t[s].handle || (t[s].handle == h && t[s].key1 == a && t[s].key2 == b)) {
			t[s] = (struct entry){h, a, b, v};
			break;
		}
	}
	pthread_mutex_unlock(&mu);
}

/* Forget every cached attribute of handle h (and of the function a kernel maps to). */
static void forget(uint64_t h)
{
	pthread_mutex_lock(&mu);
	uint64_t partners[SLOTS / 256 + 1];
	unsigned np = 0;
	for (unsigned s = 0; s < SLOTS; s++) {
		if (funcs[s].handle == h && np < sizeof partners / sizeof partners[0])
			partners[np++] = funcs[s].value;
		else if (funcs[s].handle && funcs[s].value == h && np < sizeof partners / sizeof partners[0])
			partners[np++] = funcs[s].handle;
	}
	for (unsigned s = 0; s < SLOTS; s++) {
		if (!attrs[s].handle)
			continue;
		int drop = attrs[s].handle == h;
		for (unsigned k = 0; k < np && !drop; k++)
			drop = attrs[s].handle == partners[k];
		if (drop)
			memset(&attrs[s], 0, sizeof attrs[s]);
	}
	pthread_mutex_unlock(&mu);
}

CUresult handwritten_cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev, unsigned f)
{
	uint64_t v, h = (uint64_t)(uintptr_t)kernel;
	if (pi && h && lookup(attrs, h, (int32_t)attrib, dev, &v)) {
		*pi = (int)v;
		return CUDA_SUCCESS;
	}
	CUresult r = forward_cuKernelGetAttribute(pi, attrib, kernel, dev, f);
	if (r == CUDA_SUCCESS && pi && h)
		store(attrs, h, (int32_t)attrib, dev, (uint64_t)(uint32_t)*pi);
	return r;
}

CUresult handwritten_cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc, unsigned f)
{
	uint64_t v, h = vg_function_handle(hfunc);
	hfunc = (CUfunction)(uintptr_t)h;
	if (pi && h && lookup(attrs, h, (int32_t)attrib, -1, &v)) {
		*pi = (int)v;
		return CUDA_SUCCESS;
	}
	CUresult r = forward_cuFuncGetAttribute(pi, attrib, hfunc, f);
	if (r == CUDA_SUCCESS && pi && h)
		store(attrs, h, (int32_t)attrib, -1, (uint64_t)(uint32_t)*pi);
	return r;
}

CUresult handwritten_cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev, unsigned f)
{
	uint64_t v, h = (uint64_t)(uintptr_t)kernel;
	/* setting what the kernel already has (frameworks do it before every launch) stays here */
	if (h && lookup(attrs, h, (int32_t)attrib, dev, &v) && (int)v == val)
		return CUDA_SUCCESS;
	CUresult r = forward_cuKernelSetAttribute(attrib, val, kernel, dev, f);
	forget((uint64_t)(uintptr_t)kernel);
	return r;
}

CUresult handwritten_cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value, unsigned f)
{
	uint64_t v, h = vg_function_handle(hfunc);
	hfunc = (CUfunction)(uintptr_t)h;
	if (h && lookup(attrs, h, (int32_t)attrib, -1, &v) && (int)v == value)
		return CUDA_SUCCESS;
	CUresult r = forward_cuFuncSetAttribute(hfunc, attrib, value, f);
	forget((uint64_t)(uintptr_t)hfunc);
	return r;
}

CUresult handwritten_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel, unsigned f)
{
	uint64_t v, h = (uint64_t)(uintptr_t)kernel;
	int dev = vg_current_device();
	if (pFunc && h && lookup(funcs, h, dev, 0, &v)) {
		*pFunc = (CUfunction)(uintptr_t)v;
		return CUDA_SUCCESS;
	}
	CUresult r = forward_cuKernelGetFunction(pFunc, kernel, f);
	if (r == CUDA_SUCCESS && pFunc && h)
		store(funcs, h, dev, 0, (uint64_t)(uintptr_t)*pFunc);
	return r;
}
