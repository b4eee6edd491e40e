/* SPDX-License-Identifier: Apache-2.0 */
/* The export table through which the guest's libnvidia-ml.so.1 reaches the host: served by the
 * guest's libcuda.so.1 (cuGetExportTable with this UUID; guest_agent/libcuda/nvml_bridge.c). */
#ifndef VG_NVML_TABLE_H
#define VG_NVML_TABLE_H

#include <cuda.h>
#include <stddef.h>

#include "vg_wire.h"

/* "vmgpu-nvml-live1" */
#define VG_NVML_TABLE_UUID \
	{0x76, 0x6d, 0x67, 0x70, 0x75, 0x2d, 0x6e, 0x76, 0x6d, 0x6c, 0x2d, 0x6c, 0x69, 0x76, 0x65, 0x31}

struct vg_nvml_table {
	size_t size; /* sizeof(struct vg_nvml_table): a newer library may append calls */
	/* What the guest's NVML shows of its GPU `ordinal` (a CUDA device ordinal). */
	CUresult (*live)(int ordinal, struct vg_nvml_live *out, size_t out_size);
};

#endif
