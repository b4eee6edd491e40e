/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Devices and contexts: VMGPU_SIM_DEVICES GPUs told apart by UUID and PCI bus, each with its
 * primary context; the last release of a primary context frees the memory allocated in it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* VMGPU_SIM_INIT_LOG=FILE: each cuInit appends "mps DIR cache PATH MAX": its
 * CUDA_MPS_PIPE_DIRECTORY (where a driver would look for an MPS control daemon), its
 * CUDA_CACHE_PATH (where it would keep the PTX it compiles; "off" with CUDA_CACHE_DISABLE=1) and
 * CUDA_CACHE_MAXSIZE, "-" for one not set. */
EXPORT CUresult cuInit(unsigned int flags)
{
	const char *log = getenv("VMGPU_SIM_INIT_LOG"), *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
	const char *cache = getenv("CUDA_CACHE_PATH"), *off = getenv("CUDA_CACHE_DISABLE");
	const char *max = getenv("CUDA_CACHE_MAXSIZE");
	if (log && *log) {
		FILE *f = fopen(log, "a");
		if (f) {
			fprintf(f, "mps %s cache %s %s\n", mps && *mps ? mps : "-",
				off && !strcmp(off, "1") ? "off" : cache && *cache ? cache : "-", max && *max ? max : "-");
			fclose(f);
		}
	}
	return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { if (!n) return CUDA_ERROR_INVALID_VALUE; *n = sim_devices(); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord)
{
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	if (ord < 0 || ord >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	*d = ord;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	strncpy(name, "vmgpu simulated GPU", (size_t)len - 1);
	name[len - 1] = 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	static const char id[16] = {'v', 'm', 'g', 'p', 'u', '-', 's', 'i', 'm', 0, 0, 0, 0, 0, 0, 1};
	if (!u) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	memcpy(u->bytes, id, 16);
	u->bytes[15] = (char)(d + 1);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
	if (!b) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	*b = sim_total_mem();
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d)
{
	if (!pi) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 8; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1000000; break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x42 + d; break;
	/* VMGPU_SIM_PAGEABLE_ACCESS=1: a GPU whose kernels reach pageable host memory (HMM/ATS) */
	case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: *pi = sim_pageable_access(); break;
	/* VMGPU_SIM_NVSWITCH: as on an HGX board, multicast objects and fabric handles */
	case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
		*pi = sim_hgx(); break;
	default: *pi = 0; break;
	}
	return CUDA_SUCCESS;
}
static int primary_ctx[8];
/* Synchronisations of each primary context under way, and how many times each was destroyed: a
 * context released while another thread synchronises it, or synchronised after its release, is a
 * use after free in the real driver, which the simulated one ends the process for (sim_fatal). */
static _Atomic int primary_syncing[8];
static _Atomic unsigned primary_gone[8];
static uint64_t primary_bytes[8]; /* what each held as it was made (VMGPU_SIM_CTX_MIB may change) */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	*c = (CUcontext)&primary_ctx[d];
	if (__atomic_fetch_add(&primary_ctx[d], 1, __ATOMIC_RELAXED) == 0) { /* made by the first retain */
		primary_bytes[d] = sim_ctx_bytes();
		sim_usage_add((int64_t)primary_bytes[d]);
	}
	return CUDA_SUCCESS;
}
/* The last release destroys the primary context, and the device memory allocated in it. */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	int was = __atomic_load_n(&primary_ctx[d], __ATOMIC_RELAXED);
	if (was <= 0) return CUDA_ERROR_INVALID_CONTEXT;
	if (__atomic_sub_fetch(&primary_ctx[d], 1, __ATOMIC_SEQ_CST) != 0)
		return CUDA_SUCCESS;
	atomic_fetch_add(&primary_gone[d], 1);
	if (atomic_load(&primary_syncing[d]))
		sim_fatal("cuDevicePrimaryCtxRelease: GPU %d's primary context destroyed while another thread "
			  "synchronises it",
			  d);
	int64_t freed = (int64_t)primary_bytes[d];
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges;) {
		if (!sim_ranges[i].registered) { /* cuMemAlloc's, not mappings */
			free(sim_ranges[i].host);
			sim_used_bytes -= sim_ranges[i].size;
			freed += (int64_t)sim_round(sim_ranges[i].size);
			sim_ranges[i] = sim_ranges[--sim_nranges];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&sim_mu);
	sim_usage_add(-freed);
	return CUDA_SUCCESS;
}
/* Contexts: the primary one, and any number created (all share the one address space). */
#define CTX_MAGIC 0x43545853u
struct made_ctx {
	uint32_t magic; /* first: what cuCtxSetCurrent looks at */
	uint64_t bytes; /* what it held as it was made */
};
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice d)
{
	(void)p; (void)flags;
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	struct made_ctx *x = malloc(sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	*x = (struct made_ctx){CTX_MAGIC, sim_ctx_bytes()};
	*c = (CUcontext)x;
	sim_usage_add((int64_t)x->bytes);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
	if ((uintptr_t)c < 4096 || *(uint32_t *)c != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
	struct made_ctx *x = (struct made_ctx *)c;
	x->magic = 0;
	sim_usage_add(-(int64_t)x->bytes);
	free(x);
	return CUDA_SUCCESS;
}
/* The device of a primary context, or -1 (not one). */
static int primary_device(CUcontext c)
{
	return (int *)c >= primary_ctx && (int *)c < primary_ctx + 8 ? (int)((int *)c - primary_ctx) : -1;
}
int sim_ctx_device(CUcontext c)
{
	int d = primary_device(c);
	return d >= 0 ? d : sim_green_device(c); /* (a green context's is its device's) */
}
__thread CUcontext sim_current;
EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
	if (c && sim_ctx_device(c) < 0 && ((uintptr_t)c < 4096 || *(uint32_t *)c != CTX_MAGIC))
		return CUDA_ERROR_INVALID_CONTEXT;
	sim_current = c;
	return CUDA_SUCCESS;
}
/* Push: the context becomes current, the one before it kept (a few deep); pop: back to it. */
static __thread CUcontext pushed[8];
static __thread int npushed;
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	CUcontext was = sim_current;
	if (npushed == 8) return CUDA_ERROR_NOT_SUPPORTED; /* (the simulated stack's depth) */
	CUresult r = cuCtxSetCurrent(c);
	if (r == CUDA_SUCCESS) pushed[npushed++] = was;
	return r;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *out)
{
	if (!npushed) return CUDA_ERROR_INVALID_CONTEXT;
	if (out) *out = sim_current;
	sim_current = pushed[--npushed];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void)
{
	sim_ctx_synchronized();
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c)
{
	int d = primary_device(c);
	if (d < 0) {
		sim_ctx_synchronized();
		return cuCtxSetCurrent(c);
	}
	if (d >= sim_devices())
		return CUDA_ERROR_INVALID_CONTEXT;
	atomic_fetch_add(&primary_syncing[d], 1);
	unsigned gone = atomic_load(&primary_gone[d]);
	if (__atomic_load_n(&primary_ctx[d], __ATOMIC_SEQ_CST) <= 0)
		sim_fatal("cuCtxSynchronize_v2: GPU %d's primary context was destroyed", d);
	sim_ctx_synchronized();
	if (atomic_load(&primary_gone[d]) != gone)
		sim_fatal("cuCtxSynchronize_v2: GPU %d's primary context destroyed while this thread synchronised it", d);
	atomic_fetch_sub(&primary_syncing[d], 1);
	return cuCtxSetCurrent(c);
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **s)
{
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	*s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR (simulated backend)";
	return CUDA_SUCCESS;
}
