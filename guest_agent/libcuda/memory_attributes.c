/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pointer attributes (a device address or pinned heap memory, answered by the host
 * in its terms and put back in the guest's).  Memory-pool attributes are generated (a value
 * sized by its attribute: [sizes] in api.toml).
 */
#include <string.h>

#include "call.h"
#include "connection.h"
#include "context.h"
#include "copy.h"
#include "hostmem.h"
#include "vg_guest_protos.h"

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

/* The host's answer for one attribute, in the guest's terms (vg_wire.h). */
static void pointer_attr_put(void *data, size_t size, const struct vg_attr_answer *a)
{
	if (a->kind == VG_ANSWER_DEVICE)
		*(CUcontext *)data = a->value[0] == UINT64_MAX ? NULL : vg_primary_context((int)a->value[0]);
	else if (a->kind == VG_ANSWER_REGION)
		*(void **)data = vmgpu_guest_ptr(vg_conn.guest, a->value[0]);
	else
		memcpy(data, a->value, size);
}

/* Pinned memory of a remote guest is its own pages, which the GPU's host never sees: it is
 * answered here (host memory at its own address; no device address).  1: answered, in *r. */
static int local_pinned_attr(void *data, CUpointer_attribute attr, CUdeviceptr ptr, CUresult *r)
{
	void *base;
	size_t size;
	if (!vg_local_pinned((const void *)(uintptr_t)ptr, &base, &size))
		return 0;
	*r = CUDA_SUCCESS;
	int dev = vg_current_device();
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = CU_MEMORYTYPE_HOST;
		break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		*(void **)data = (void *)(uintptr_t)ptr;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = dev < 0 ? 0 : dev;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(void **)data = base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(unsigned *)data = 0;
		break;
	default:
		*r = CUDA_ERROR_NOT_SUPPORTED;
	}
	return 1;
}

/* A pointer is a device address or, in the region's heap, pinned host memory; the host
 * answers for both, in its terms, and the answer is put back in the guest's. */
CUresult handwritten_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr, unsigned fl)
{
	size_t size = pointer_attr_size(attr);
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	if (!size)
		return CUDA_ERROR_NOT_SUPPORTED;
	CUresult r;
	if (local_pinned_attr(data, attr, ptr, &r))
		return r;
	struct vg_call c;
	r = vg_begin(&c, VG_OP_cuPointerGetAttribute, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)attr);
	vg_put_unified_address(&c, ptr, 1);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		struct vg_attr_answer a;
		vg_get(&c, &a, sizeof a);
		pointer_attr_put(data, size, &a);
	}
	return vg_end(&c, r);
}

/* Several attributes in one round trip.  Unlike the single query, an address the driver does
 * not know is no error: the host's driver fills in its defaults, and those come back. */
CUresult handwritten_cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr, unsigned fl)
{
	if (!attrs || !data || n == 0 || n > VG_MAX_POINTER_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++)
		if (!data[i] || !pointer_attr_size(attrs[i]))
			return CUDA_ERROR_INVALID_VALUE;
	CUresult r;
	void *base;
	size_t bsize;
	if (vg_local_pinned((const void *)(uintptr_t)ptr, &base, &bsize)) {
		/* what the driver fills for the attributes it has no value for: zeros */
		for (unsigned i = 0; i < n; i++)
			if (local_pinned_attr(data[i], attrs[i], ptr, &r) && r != CUDA_SUCCESS)
				memset(data[i], 0, pointer_attr_size(attrs[i]));
		return CUDA_SUCCESS;
	}
	struct vg_call c;
	r = vg_begin(&c, VG_OP_cuPointerGetAttributes, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, n);
	for (unsigned i = 0; i < n; i++)
		vg_put_u64(&c, (uint64_t)attrs[i]);
	vg_put_unified_address(&c, ptr, 1);
	r = vg_call_sync(&c);
	for (unsigned i = 0; r == CUDA_SUCCESS && i < n; i++) {
		struct vg_attr_answer a;
		vg_get(&c, &a, sizeof a);
		pointer_attr_put(data[i], pointer_attr_size(attrs[i]), &a);
	}
	return vg_end(&c, r);
}
