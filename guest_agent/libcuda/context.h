/* SPDX-License-Identifier: Apache-2.0 */
/* Contexts as the guest keeps them (context.c): one primary context per device, a stack per thread. */
#ifndef VG_CONTEXT_H
#define VG_CONTEXT_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

int vg_current_device(void);             /* -1 if no context is current on this thread */
int vg_context_device(CUcontext c);      /* NULL: the current one's; -1 if c is not a context */
CUcontext vg_primary_context(int dev);

#endif
