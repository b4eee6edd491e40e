/* SPDX-License-Identifier: Apache-2.0 */
/* A kernel function as the guest knows it: its host handle and its parameter layout. */
#ifndef VG_FUNCTION_H
#define VG_FUNCTION_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#include "vg_wire.h"

/* Kernel parameter layouts, fetched from the host once per function handle (launch.c). */
struct vg_param_layout {
	uint64_t handle;
	uint32_t nparams, bytes;
	struct vg_param_info *params;
	char *name; /* cuFuncGetName's answer, once asked */
};
CUresult vg_param_layout(uint64_t handle, struct vg_param_layout **out);

/* A function as the guest sees it may be a tools node (export table 6e163fbe): its host
 * handle (export_tools.c). */
uint64_t vg_function_handle(CUfunction f);

/* A launch configuration into a request (launch.c): api.toml's launch_config. */
struct vg_call;
void vg_put_launch_config(struct vg_call *c, const CUlaunchConfig *cfg);
/* A kernel's parameters (kernelParams or extra's packed buffer) at the host's offsets (launch.c). */
CUresult vg_put_params(struct vg_call *c, const struct vg_param_layout *fi, void **params, void **extra);

#endif
