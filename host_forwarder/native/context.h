/* SPDX-License-Identifier: Apache-2.0 */
/* A guest process's context on each of its GPUs, charged to the quota before it exists (context.c). */
#ifndef VH_CONTEXT_H
#define VH_CONTEXT_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;

/* The process's context on dev, made at its first use after its charge was reserved;
 * CUDA_ERROR_OUT_OF_MEMORY, with nothing left on the GPU, if it does not fit. */
CUresult vh_chan_context(struct vh_chan *ch, int dev, CUcontext *out);
/* A guest context (ordinal + 1, 0 none) becomes the process's context on that GPU, made if
 * need be; -1 if it names none or it cannot be made. */
int vh_context_in(struct vh_chan *ch, CUcontext *c);
/* A green context of the n SM resources on dev (an SM partition: partition.c), charged to the
 * quota first: CUDA_ERROR_OUT_OF_MEMORY, with nothing made, if it does not fit; *charge is what to
 * give back when vh_green_drop destroys it. */
CUresult vh_green_make(struct vh_chan *ch, int dev, CUdevResource *res, unsigned n, CUgreenCtx *g, CUcontext *c,
		       uint64_t *charge);
void vh_green_drop(struct vh_chan *ch, int dev, CUgreenCtx g, CUcontext c, uint64_t charge, int sync);
/* The process's context on its current GPU (none if no GPU is current) made current again, after
 * a call that made another one current for a while. */
void vh_context_back(struct vh_chan *ch);
/* Destroy every context the process has (at its end); nonzero if it had any. */
int vh_chan_contexts_drop(struct vh_chan *ch);

#endif
