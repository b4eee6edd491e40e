/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest NVML library's way to the host (guest_agent/nvml/): an export table of vmgpu's
 * own, found through cuGetExportTable with VG_NVML_TABLE_UUID, so the NVML library shares
 * this process's channel instead of opening a second one.  Its one call asks the forwarder
 * what the guest's NVML shows of a GPU (VG_OP_NVML_QUERY); it names no device in the request
 * header, so it never makes a context on the GPU.
 */
#include <stddef.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "vg_nvml_table.h"

static CUresult nvml_live(int ordinal, struct vg_nvml_live *out, size_t size)
{
	if (!out || size != sizeof *out || ordinal < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_connect();
	if (r != CUDA_SUCCESS)
		return r;
	struct vg_call c;
	if ((r = vg_begin(&c, VG_OP_NVML_QUERY, 0)) != CUDA_SUCCESS)
		return r;
	uint16_t none = VG_NO_DEVICE;
	memcpy(c.buf + offsetof(struct vg_req_hdr, dev), &none, sizeof none);
	vg_put_u64(&c, (uint64_t)ordinal);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		vg_get(&c, out, sizeof *out);
		if (c.bad)
			r = CUDA_ERROR_UNKNOWN;
		else if (out->nprocs > VG_NVML_MAX_PROCS)
			out->nprocs = VG_NVML_MAX_PROCS;
	}
	return vg_end(&c, r);
}

const struct vg_nvml_table vg_nvml_table = {sizeof(struct vg_nvml_table), nvml_live};
