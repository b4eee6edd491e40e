/* SPDX-License-Identifier: Apache-2.0 */
/* The driver the forwarder runs calls on: the real libcuda.so.1, or the simulated backend (backend.c). */
#ifndef VH_BACKEND_H
#define VH_BACKEND_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>

#include "vh_backend_fns.h"

struct vh_backend {
#define X(n) __typeof__(&n) n;
	VH_BACKEND_FNS(X)
#undef X
#define P(n, v) __typeof__(&v) n##_pt;
	VH_BACKEND_PT_FNS(P)
#undef P
	int simulated;
	void *dl;
};

/* Load the backend: "cuda" (libcuda.so.1) or "sim" (libvmgpu-simcuda.so next
 * to the forwarder, or $VMGPU_SIMCUDA).  Returns 0 or -1 with a sentence in err. */
int vh_backend_load(struct vh_backend *b, const char *which, char *err, size_t errlen);

#endif
