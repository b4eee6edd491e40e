/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TMA descriptors: a deterministic 128-byte encoding of what the call was given, so tests can
 * see the bytes come back and tell the maps apart.  Like the real driver, the encoding does
 * not look at the memory it names: the forwarder checks the geometry and the region a map
 * reaches before it gets here (host_forwarder/native/tensormap.c), and cuTensorMapReplaceAddress
 * rewrites the address of whatever bytes it is given.
 *
 * The layout (qwords): 0 the address; 1 a tag ("TMAP"), the kind of map (1 tiled, 2 im2col,
 * 3 im2col wide), type, rank, interleave, swizzle, L2 promotion, fill; 2..6 globalDim;
 * 7..10 globalStrides; 11 the box (tiled: a byte each, size - 1) or the pixel box
 * (im2col: the corners' low bytes; wide: the two widths) with the wide mode; 12 element strides
 * (a byte each); 13 channels per pixel and pixels per column; 14..15 zero.
 */
#include "sim.h"

#define TMAP_TAG 0x50414d54u /* "TMAP" */

static int head(CUtensorMap *m, uint32_t kind, CUtensorMapDataType type, cuuint32_t rank, void *address,
		const cuuint64_t *dim, const cuuint64_t *stride, const cuuint32_t *element_stride,
		CUtensorMapInterleave il, CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill)
{
	if (!m || rank == 0 || rank > 5 || !dim || (rank > 1 && !stride) || !element_stride)
		return -1;
	memset(m, 0, sizeof *m);
	uint64_t *q = m->opaque;
	q[0] = (uint64_t)(uintptr_t)address;
	q[1] = TMAP_TAG | (uint64_t)kind << 32 | (uint64_t)(type & 0xF) << 36 | (uint64_t)rank << 40 |
	       (uint64_t)(il & 3) << 44 | (uint64_t)(sw & 0xF) << 48 | (uint64_t)(l2 & 3) << 52 |
	       (uint64_t)(fill & 1) << 54;
	for (cuuint32_t i = 0; i < rank; i++) {
		q[2 + i] = dim[i];
		q[12] |= (uint64_t)(element_stride[i] & 0xFF) << (8 * i);
	}
	for (cuuint32_t i = 0; i + 1 < rank; i++)
		q[7 + i] = stride[i];
	return 0;
}

EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
				       void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
				       const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
				       CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
				       CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
	if (!boxDim || head(tensorMap, 1, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
			    elementStrides, interleave, swizzle, l2Promotion, oobFill))
		return CUDA_ERROR_INVALID_VALUE;
	for (cuuint32_t i = 0; i < tensorRank; i++)
		tensorMap->opaque[11] |= (uint64_t)((boxDim[i] - 1) & 0xFF) << (8 * i);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuTensorMapEncodeIm2col(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
					cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
					const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
					const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
					cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
					CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
					CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
	if (tensorRank < 3 || !pixelBoxLowerCorner || !pixelBoxUpperCorner ||
	    head(tensorMap, 2, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
		 interleave, swizzle, l2Promotion, oobFill))
		return CUDA_ERROR_INVALID_VALUE;
	for (cuuint32_t i = 0; i + 2 < tensorRank; i++)
		tensorMap->opaque[11] |= (uint64_t)(pixelBoxLowerCorner[i] & 0xFF) << (16 * i) |
					 (uint64_t)(pixelBoxUpperCorner[i] & 0xFF) << (16 * i + 8);
	tensorMap->opaque[13] = (uint64_t)channelsPerPixel << 32 | pixelsPerColumn;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuTensorMapEncodeIm2colWide(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
					    cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
					    const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
					    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
					    cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
					    CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
					    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
					    CUtensorMapFloatOOBfill oobFill)
{
	if (tensorRank < 3 || head(tensorMap, 3, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
				   elementStrides, interleave, swizzle, l2Promotion, oobFill))
		return CUDA_ERROR_INVALID_VALUE;
	tensorMap->opaque[11] = (uint64_t)(uint16_t)pixelBoxLowerCornerWidth | (uint64_t)(uint16_t)pixelBoxUpperCornerWidth
				<< 16 | (uint64_t)(mode & 1) << 32;
	tensorMap->opaque[13] = (uint64_t)channelsPerPixel << 32 | pixelsPerColumn;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuTensorMapReplaceAddress(CUtensorMap *tensorMap, void *globalAddress)
{
	if (!tensorMap || (uintptr_t)globalAddress % 16)
		return CUDA_ERROR_INVALID_VALUE;
	tensorMap->opaque[0] = (uint64_t)(uintptr_t)globalAddress;
	return CUDA_SUCCESS;
}
