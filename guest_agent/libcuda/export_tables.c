/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuGetExportTable: the driver's private tables that cudart, cuBLAS and cuDNN
 * ask for by UUID, served in the guest.  Layouts and slot meanings are facts
 * recorded in ../shared/notes/cuda-dark-api.md and measured on the GPU host
 * (native/cuda_api/driver/export_tables.txt).  Only module loading crosses to
 * the host; everything else is answered here.  A slot whose meaning is not
 * known is a function that logs once and returns CUDA_ERROR_NOT_SUPPORTED,
 * never a NULL to jump through; an unknown table fails closed.
 *
 * Here: the lookup, the runtime interface, tools hooks, TLS, context-local
 * storage and context checks.  export_integrity.c and export_tools.c hold the rest.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "connection.h"
#include "context.h"
#include "export_tables.h"
#include "vg_nvml_table.h"
#include "vg_guest_protos.h"

/* ---- slots nobody has explained: callable, logged, refused ---------------------------- */

/* The first call's register arguments are logged: they are how a slot's meaning is found. */
CUresult vg_unknown_slot(const char *table, int tid, int slot, const uint64_t a[4])
{
	static int seen[TABLE_COUNT][128];
	if (!__atomic_exchange_n(&seen[tid][slot & 127], 1, __ATOMIC_RELAXED))
		vg_log("export table %s slot %d is not implemented; CUDA_ERROR_NOT_SUPPORTED (args %#llx %#llx "
		       "%#llx %#llx)",
		       table, slot, (unsigned long long)a[0], (unsigned long long)a[1], (unsigned long long)a[2],
		       (unsigned long long)a[3]);
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- CUDART_INTERFACE: module loading and the primary context ----------------------------- */


static CUresult cudart_module_from_cubin(CUmodule *m, const void *wrapper)
{
	return handwritten_cuModuleLoadData(m, wrapper, 0);
}

static CUresult cudart_primary_context(CUcontext *pctx, CUdevice dev)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || (uint32_t)dev >= vg_conn.hello.ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*pctx = vg_primary_context(dev); /* not activated, as the driver does */
	return CUDA_SUCCESS;
}

static CUresult cudart_module_from_cubin_ext1(CUmodule *m, const void *wrapper, void *a3, void *a4, unsigned a5)
{
	if (a3 || a4 || a5)
		return CUDA_ERROR_NOT_SUPPORTED;
	return handwritten_cuModuleLoadData(m, wrapper, 0);
}

static void cudart_noop(size_t x)
{
	(void)x;
}

static CUresult cudart_module_from_cubin_ext2(const void *fatbin, CUmodule *m, void *a3, void *a4, unsigned a5)
{
	if (a3 || a4 || a5)
		return CUDA_ERROR_NOT_SUPPORTED;
	return handwritten_cuModuleLoadData(m, fatbin, 0);
}

static CUresult cudart_load_compilers(void)
{
	return CUDA_SUCCESS; /* PTX is compiled on the host */
}

UNKNOWN_SLOT(cudart, TABLE_CUDART, 3)
UNKNOWN_SLOT(cudart, TABLE_CUDART, 4)
UNKNOWN_SLOT(cudart, TABLE_CUDART, 5)
UNKNOWN_SLOT(cudart, TABLE_CUDART, 9)
UNKNOWN_SLOT(cudart, TABLE_CUDART, 10)
UNKNOWN_SLOT(cudart, TABLE_CUDART, 11)

const vg_slot vg_cudart_interface[13] = {
	(vg_slot)(uintptr_t)(13 * sizeof(void *)),
	(vg_slot)cudart_module_from_cubin,
	(vg_slot)cudart_primary_context,
	(vg_slot)unknown_cudart_3,
	(vg_slot)unknown_cudart_4,
	(vg_slot)unknown_cudart_5,
	(vg_slot)cudart_module_from_cubin_ext1,
	(vg_slot)cudart_noop,
	(vg_slot)cudart_module_from_cubin_ext2,
	(vg_slot)unknown_cudart_9,
	(vg_slot)unknown_cudart_10,
	(vg_slot)unknown_cudart_11,
	(vg_slot)cudart_load_compilers,
};

/* ---- TOOLS_RUNTIME_CALLBACK_HOOKS: two buffers and callable no-ops -------------------------- */

static uint32_t hook_buffer1[1024], hook_buffer2[14];

static void hooks_buffer1(void **p, size_t *n)
{
	*p = hook_buffer1;
	*n = sizeof hook_buffer1 / sizeof hook_buffer1[0];
}

static void hooks_buffer2(void **p, size_t *n)
{
	*p = hook_buffer2;
	*n = sizeof hook_buffer2 / sizeof hook_buffer2[0];
}

static CUresult hooks_noop(void)
{
	return CUDA_SUCCESS;
}

static const vg_slot tools_hooks[7] = {
	(vg_slot)(uintptr_t)(7 * sizeof(void *)),
	(vg_slot)hooks_noop,
	(vg_slot)hooks_buffer1,
	(vg_slot)hooks_noop,
	(vg_slot)hooks_noop,
	(vg_slot)hooks_noop,
	(vg_slot)hooks_buffer2,
};

/* ---- TOOLS_TLS ---------------------------------------------------------------------------- */

/* Slot 2 writes the calling thread's current context (NULL if none), as measured on
 * driver 580; cuBLASLt finds no kernels without it. */
static CUresult tls_current_context(CUcontext *out)
{
	int d = vg_current_device();
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	*out = d < 0 ? NULL : vg_primary_context(d);
	return CUDA_SUCCESS;
}

UNKNOWN_SLOT(tls, TABLE_TLS, 1)
static const vg_slot tools_tls[4] = {
	(vg_slot)(uintptr_t)(3 * sizeof(void *)),
	(vg_slot)unknown_tls_1,
	(vg_slot)tls_current_context,
	NULL,
};

/* ---- CONTEXT_LOCAL_STORAGE: per-context key/value, served locally (hot) ------------------- */

typedef void (*context_storage_dtor)(CUcontext, void *, void *);
struct context_storage_entry {
	void *key, *value;
	context_storage_dtor dtor;
};
#define CONTEXT_STORAGE_MAX 64
static struct context_storage_entry context_storage[VG_MAX_DEVICES][CONTEXT_STORAGE_MAX];
static pthread_mutex_t context_storage_lock = PTHREAD_MUTEX_INITIALIZER;

static int context_storage_device(CUcontext ctx)
{
	return vg_context_device(ctx); /* NULL is the current context */
}

static CUresult context_storage_put(CUcontext ctx, void *key, void *value, context_storage_dtor dtor)
{
	int d = context_storage_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&context_storage_lock);
	for (int i = 0; i < CONTEXT_STORAGE_MAX; i++) {
		if (context_storage[d][i].key == key || !context_storage[d][i].key) {
			context_storage[d][i] = (struct context_storage_entry){key, value, dtor};
			r = CUDA_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&context_storage_lock);
	return r;
}

static CUresult context_storage_delete(CUcontext ctx, void *key)
{
	int d = context_storage_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&context_storage_lock);
	for (int i = 0; i < CONTEXT_STORAGE_MAX; i++) {
		if (context_storage[d][i].key == key) {
			memmove(&context_storage[d][i], &context_storage[d][i + 1], (CONTEXT_STORAGE_MAX - i - 1) * sizeof context_storage[d][0]);
			memset(&context_storage[d][CONTEXT_STORAGE_MAX - 1], 0, sizeof context_storage[d][0]);
			break;
		}
	}
	pthread_mutex_unlock(&context_storage_lock);
	return CUDA_SUCCESS;
}

static CUresult context_storage_get(void **value, CUcontext ctx, void *key)
{
	int d = context_storage_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&context_storage_lock);
	for (int i = 0; i < CONTEXT_STORAGE_MAX && context_storage[d][i].key; i++) {
		if (context_storage[d][i].key == key) {
			*value = context_storage[d][i].value;
			r = CUDA_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&context_storage_lock);
	return r;
}

/* no size word: the table ends at a NULL */
static const vg_slot context_local_storage[4] = {
	(vg_slot)context_storage_put,
	(vg_slot)context_storage_delete,
	(vg_slot)context_storage_get,
	NULL,
};

/* ---- CONTEXT_CHECKS ----------------------------------------------------------------------- */

static CUresult context_check(CUcontext ctx, uint32_t *result1, const void **result2)
{
	(void)ctx;
	(void)result2;
	if (result1)
		*result1 = 0;
	return CUDA_SUCCESS;
}

static uint32_t context_check3(void)
{
	return 0;
}

UNKNOWN_SLOT(checks, TABLE_CHECKS, 1)
static const vg_slot context_checks[4] = {
	(vg_slot)(uintptr_t)(4 * sizeof(void *)),
	(vg_slot)unknown_checks_1,
	(vg_slot)context_check,
	(vg_slot)context_check3,
};

/* ---- lookup -------------------------------------------------------------------------------- */

extern const struct vg_nvml_table vg_nvml_table; /* nvml_bridge.c */

struct table {
	const char *name;
	uint8_t uuid[16];
	const void *slots; /* NULL: refused with `refusal` */
	CUresult refusal;
};

static const struct table tables[] = {
	{"CUDART_INTERFACE", {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
	 vg_cudart_interface, 0},
	{"TOOLS_RUNTIME_CALLBACK_HOOKS", {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
	 tools_hooks, 0},
	{"TOOLS_TLS", {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
	 tools_tls, 0},
	{"CONTEXT_LOCAL_STORAGE", {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
	 context_local_storage, 0},
	{"CONTEXT_CHECKS", {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
	 context_checks, 0},
	{"INTEGRITY_CHECK", {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
	 vg_integrity_check_table, 0},
	{"TOOLS_CONTEXT", {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
	 vg_tools_context, 0},
	{"TOOLS_MODULE", {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e},
	 vg_tools_module, 0},
	{"LT_AUX", {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
	 vg_cublaslt_aux, 0},
	{"VMGPU_NVML", VG_NVML_TABLE_UUID, &vg_nvml_table, 0}, /* vmgpu's own: the guest NVML library */
	/* a bootstrap shortcut probe: refusing it keeps cudart on the documented path */
	{"f8cff951", {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9},
	 NULL, CUDA_ERROR_NOT_FOUND},
};

CUresult handwritten_cuGetExportTable(const void **table, const CUuuid *id, unsigned f)
{
	(void)f;
	if (!table || !id)
		return CUDA_ERROR_INVALID_VALUE;
	*table = NULL;
	for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
		if (memcmp(tables[i].uuid, id->bytes, 16))
			continue;
		if (!tables[i].slots)
			return tables[i].refusal;
		*table = tables[i].slots;
		return CUDA_SUCCESS;
	}
	/* an unknown table fails closed: never success with a pointer nobody filled */
	char hex[33];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->bytes[i]);
	vg_log("export table %s is not provided; CUDA_ERROR_INVALID_VALUE", hex);
	return CUDA_ERROR_INVALID_VALUE;
}
