/* SPDX-License-Identifier: Apache-2.0 */
/* A 2D copy as the 3D copy of one slice it is: how both halves check and move 2D copies
 * (guest_agent/libcuda/copy2d.c, host_forwarder/native/copy2d.c). */
#ifndef VG_COPY2D_H
#define VG_COPY2D_H

#include <cuda.h>

static inline void vg_copy2d_as_3d(const CUDA_MEMCPY2D *p, CUDA_MEMCPY3D *q)
{
	*q = (CUDA_MEMCPY3D){
		.srcXInBytes = p->srcXInBytes, .srcY = p->srcY, .srcMemoryType = p->srcMemoryType,
		.srcHost = p->srcHost, .srcDevice = p->srcDevice, .srcArray = p->srcArray, .srcPitch = p->srcPitch,
		.srcHeight = p->Height, .dstXInBytes = p->dstXInBytes, .dstY = p->dstY,
		.dstMemoryType = p->dstMemoryType, .dstHost = p->dstHost, .dstDevice = p->dstDevice,
		.dstArray = p->dstArray, .dstPitch = p->dstPitch, .dstHeight = p->Height,
		.WidthInBytes = p->WidthInBytes, .Height = p->Height, .Depth = 1,
	};
}

#endif
