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
	static int seen[VG_EXPORT_ID_COUNT][128];
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

VG_EXPORT_TABLE_CUDART_INTERFACE

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

VG_EXPORT_TABLE_TOOLS_RUNTIME_CALLBACK_HOOKS

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

VG_EXPORT_TABLE_TOOLS_TLS

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
VG_EXPORT_TABLE_CONTEXT_LOCAL_STORAGE

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

VG_EXPORT_TABLE_CONTEXT_CHECKS

/* ---- lookup -------------------------------------------------------------------------------- */

extern const struct vg_nvml_table vg_nvml_table; /* nvml_bridge.c */

struct table {
	const char *name;
	uint8_t uuid[16];
	const void *slots; /* NULL: refused with `refusal` */
	CUresult refusal;
};

#define SERVED(name, slots, ...) {name, {__VA_ARGS__}, slots, 0},
#define OBJECT(name, object, ...) {name, {__VA_ARGS__}, &object, 0},
#define REFUSED(name, result, ...) {name, {__VA_ARGS__}, NULL, result},
static const struct table tables[] = {VG_EXPORT_TABLES(SERVED, OBJECT, REFUSED)};
#undef SERVED
#undef OBJECT
#undef REFUSED

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
