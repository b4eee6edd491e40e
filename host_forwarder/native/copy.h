/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The checks of a 2D or 3D copy's two sides (copy2d.c), shared by the immediate copies and a
 * graph's memcpy nodes (graph_nodes.c).
 */
#ifndef VH_COPY_H
#define VH_COPY_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;

/* A 3D copy's parameters checked and rewritten into *out: each side device memory wholly inside
 * one object of this process's own, an array of its own (its host handle), or host memory given
 * as an offset into the region's heap (its host address); the reserved pointers NULL.
 * CUDA_ERROR_INVALID_VALUE (or INVALID_HANDLE for an array) otherwise. */
CUresult vh_copy3d_in(struct vh_chan *ch, const CUDA_MEMCPY3D *in, CUDA_MEMCPY3D *out);

/* *a, a guest's array handle, becomes the host's array if it is a live array the process holds
 * (texture.c); -1 otherwise. */
int vh_array_in(struct vh_chan *ch, CUarray *a);

/* A 2D memset's rows: height rows of width elements of elsz bytes, pitch bytes apart, from dst,
 * wholly inside one object of this process's own (nothing reached: dst its own or 0).
 * CUDA_ERROR_INVALID_VALUE otherwise, an extent that overflows included. */
CUresult vh_rows_ok(struct vh_chan *ch, CUdeviceptr dst, uint64_t pitch, uint64_t width, uint64_t height, unsigned elsz);

#endif
