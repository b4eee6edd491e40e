/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a TMA descriptor's reach is checked: cuTensorMapEncodeTiled, ...Im2col, ...Im2colWide
 * and cuTensorMapReplaceAddress (api.toml, ops 122..125).
 *
 * A tensor map is a 128-byte descriptor the GPU's copy engine (TMA) follows with no further
 * check: whatever it names, a kernel given it can read and write.  So the check is made here,
 * when it is encoded: the driver's own rules for the geometry (CUDA_ERROR_INVALID_VALUE, as
 * the driver answers), then the whole region the map can reach, from globalAddress to the last
 * byte that globalDim and globalStrides address, must lie inside this guest process's own
 * device memory (addresses.c); a region that does not is refused as every address check
 * refuses (CUDA_ERROR_INVALID_VALUE, logged with VMGPU_TRACE_ERRORS=1).
 *
 * cuTensorMapReplaceAddress takes the guest's map, whose bytes the guest could have forged to
 * describe any geometry.  The host keeps, per guest process (a worker serves one, worker.c),
 * the last VH_TMAP_KEEP maps it encoded, by their exact bytes, with each one's reach; a map
 * that is not one of them is refused, and a new address is checked against the kept reach.
 * The map the driver answers is kept too, so a map can be moved again and again.
 *
 * Not covered here: a forged map given to a kernel as a parameter (__grid_constant__) is not
 * looked at, as no kernel parameter is, byte by byte.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "log.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

#define VH_TMAP_RANK_MAX 5
#define VH_TMAP_DIM_MAX (1ull << 32)    /* globalDim[i] <= 2^32 */
#define VH_TMAP_STRIDE_END (1ull << 40) /* globalStrides[i] < 2^40 */
#define VH_TMAP_BOX_MAX 256
#define VH_TMAP_ELEMENT_STRIDE_MAX 8

/* ---- the geometry: the driver's rules and the bytes a map reaches -------------------- */

/* The bits one element takes in global memory, 0 for a type the driver does not know.  The
 * packed types count individual values: 16 4-bit values packed in 8 bytes, or (the ALIGN16B
 * types) spread over 16 bytes with gaps, which is a byte per value. */
static unsigned element_bits(CUtensorMapDataType t)
{
	switch (t) {
	case CU_TENSOR_MAP_DATA_TYPE_UINT8:
		return 8;
	case CU_TENSOR_MAP_DATA_TYPE_UINT16:
	case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
	case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
		return 16;
	case CU_TENSOR_MAP_DATA_TYPE_UINT32:
	case CU_TENSOR_MAP_DATA_TYPE_INT32:
	case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
	case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
	case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
	case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
		return 32;
	case CU_TENSOR_MAP_DATA_TYPE_UINT64:
	case CU_TENSOR_MAP_DATA_TYPE_INT64:
	case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
		return 64;
	case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
		return 4;
	case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
	case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
		return 8;
	default:
		return 0;
	}
}

/* The bytes an interleaved layout moves along dimension 0 at a time (0: not interleaved), or
 * -1 for a layout the driver does not know. */
static int interleave_bytes(CUtensorMapInterleave il)
{
	switch (il) {
	case CU_TENSOR_MAP_INTERLEAVE_NONE:
		return 0;
	case CU_TENSOR_MAP_INTERLEAVE_16B:
		return 16;
	case CU_TENSOR_MAP_INTERLEAVE_32B:
		return 32;
	default:
		return -1;
	}
}

struct tmap_geometry {
	CUtensorMapDataType type;
	uint32_t rank, min_rank;
	const void *address;
	const cuuint64_t *dim, *stride; /* rank and rank - 1 of them (the generated half counted them) */
	const cuuint32_t *element_stride;
	CUtensorMapInterleave interleave;
	const cuuint32_t *box; /* a tiled map's box, rank of them; NULL for im2col */
};

/* The driver's documented rules for what the reach depends on, never stricter than the driver:
 * a map it would refuse is refused the same way, before anything is looked up. */
static int geometry_valid(const struct tmap_geometry *g)
{
	unsigned bits = element_bits(g->type);
	int chunk = interleave_bytes(g->interleave);
	if (bits == 0 || chunk < 0 || g->rank < g->min_rank || g->rank > VH_TMAP_RANK_MAX)
		return 0;
	if (chunk && g->rank < 3)
		return 0; /* an interleaved layout has at least 3 dimensions */
	int wide = g->interleave == CU_TENSOR_MAP_INTERLEAVE_32B || g->type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B ||
		   g->type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
	if ((uintptr_t)g->address % (wide ? 32 : 16))
		return 0;
	for (uint32_t i = 0; i < g->rank; i++) {
		if (g->dim[i] == 0 || g->dim[i] > VH_TMAP_DIM_MAX)
			return 0;
		/* without interleave the driver ignores dimension 0's element stride */
		if ((i > 0 || chunk) && (g->element_stride[i] == 0 || g->element_stride[i] > VH_TMAP_ELEMENT_STRIDE_MAX))
			return 0;
		if (g->box && (g->box[i] == 0 || g->box[i] > VH_TMAP_BOX_MAX))
			return 0;
	}
	for (uint32_t i = 0; i + 1 < g->rank; i++)
		if (g->stride[i] % 16 || g->stride[i] >= VH_TMAP_STRIDE_END)
			return 0;
	return 1;
}

/* How many bytes from the map's address it can reach: dimension 0's elements (whole chunks
 * where the layout is interleaved), then each higher dimension's last index times its stride.
 * 0 if that does not fit in 64 bits: a region no process owns. */
static uint64_t geometry_reach(const struct tmap_geometry *g)
{
	uint64_t reach = (g->dim[0] * element_bits(g->type) + 7) / 8; /* dim <= 2^32, bits <= 64 */
	uint64_t chunk = (uint64_t)interleave_bytes(g->interleave);
	if (chunk)
		reach = (reach + chunk - 1) / chunk * chunk;
	for (uint32_t i = 1; i < g->rank; i++) {
		uint64_t far;
		if (__builtin_mul_overflow(g->dim[i] - 1, g->stride[i - 1], &far) ||
		    __builtin_add_overflow(reach, far, &reach))
			return 0;
	}
	return reach;
}

/* ---- the maps this process was given, for cuTensorMapReplaceAddress ------------------ */

#define VH_TMAP_KEEP 4096   /* maps kept; an older one can no longer have its address replaced */
#define VH_TMAP_BUCKETS 1024

struct kept_map {
	CUtensorMap map;
	uint64_t reach;
	int32_t next; /* the next in its bucket, or -1 */
	int32_t bucket;
};

struct kept_maps {
	struct kept_map m[VH_TMAP_KEEP];
	int32_t head[VH_TMAP_BUCKETS];
	uint32_t used, oldest; /* filled slots; the slot written next once all are */
};

static struct kept_maps *kept; /* this worker's guest process's: made at its first map */
static int forged_logged;

static uint32_t map_bucket(const CUtensorMap *map)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the 128 bytes */
	const unsigned char *p = (const unsigned char *)map;
	for (size_t i = 0; i < sizeof *map; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return (uint32_t)(h % VH_TMAP_BUCKETS);
}

static struct kept_map *kept_find(const CUtensorMap *map)
{
	if (!kept)
		return NULL;
	for (int32_t i = kept->head[map_bucket(map)]; i >= 0; i = kept->m[i].next)
		if (!memcmp(&kept->m[i].map, map, sizeof *map))
			return &kept->m[i];
	return NULL;
}

/* Keep a map the driver answered, with its reach; the oldest goes when all slots are taken.
 * -1 if there is no memory for the table (the map is then not given out). */
static int kept_add(const CUtensorMap *map, uint64_t reach)
{
	struct kept_map *k = kept_find(map);
	if (k) {
		k->reach = reach; /* the same bytes: the same map */
		return 0;
	}
	if (!kept) {
		kept = calloc(1, sizeof *kept);
		if (!kept)
			return -1;
		for (int i = 0; i < VH_TMAP_BUCKETS; i++)
			kept->head[i] = -1;
	}
	int32_t at;
	if (kept->used < VH_TMAP_KEEP) {
		at = (int32_t)kept->used++;
	} else {
		at = (int32_t)kept->oldest;
		kept->oldest = (kept->oldest + 1) % VH_TMAP_KEEP;
		int32_t *link = &kept->head[kept->m[at].bucket];
		while (*link != at)
			link = &kept->m[*link].next;
		*link = kept->m[at].next;
	}
	uint32_t b = map_bucket(map);
	kept->m[at].map = *map;
	kept->m[at].reach = reach;
	kept->m[at].bucket = (int32_t)b;
	kept->m[at].next = kept->head[b];
	kept->head[b] = at;
	return 0;
}

/* ---- the calls ------------------------------------------------------------------------ */

/* The checks every encoding makes before the driver sees it: the geometry as the driver would
 * check it, then the region it reaches.  The reach goes to *reach. */
static CUresult encode_check(struct vh_chan *ch, const struct tmap_geometry *g, uint64_t *reach)
{
	if (ch->cur_dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!geometry_valid(g)) {
		if (vh_tracing_errors()) /* what the driver's rules refused, for a program that expected otherwise */
			vh_log("channel %u: tensor map refused by the driver's rules: type %d rank %u address %#llx "
			       "dims %llu,%llu,%llu strides %llu,%llu element strides %u,%u box %u,%u interleave %d",
			       ch->index, (int)g->type, g->rank, (unsigned long long)(uintptr_t)g->address,
			       (unsigned long long)(g->rank > 0 ? g->dim[0] : 0),
			       (unsigned long long)(g->rank > 1 ? g->dim[1] : 0),
			       (unsigned long long)(g->rank > 2 ? g->dim[2] : 0),
			       (unsigned long long)(g->rank > 1 ? g->stride[0] : 0),
			       (unsigned long long)(g->rank > 2 ? g->stride[1] : 0), g->rank > 0 ? g->element_stride[0] : 0,
			       g->rank > 1 ? g->element_stride[1] : 0, g->box && g->rank > 0 ? g->box[0] : 0,
			       g->box && g->rank > 1 ? g->box[1] : 0, (int)g->interleave);
		return CUDA_ERROR_INVALID_VALUE;
	}
	*reach = geometry_reach(g);
	if (*reach == 0 || vh_addr_ok(ch, (uint64_t)(uintptr_t)g->address, *reach))
		return CUDA_ERROR_INVALID_VALUE; /* not inside this process's own device memory */
	return CUDA_SUCCESS;
}

static CUresult encoded(CUresult r, const CUtensorMap *map, uint64_t reach)
{
	if (r == CUDA_SUCCESS && kept_add(map, reach))
		return CUDA_ERROR_OUT_OF_MEMORY;
	return r;
}

CUresult guarded_cuTensorMapEncodeTiled(struct vh_chan *ch, CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
					cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
					const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
					const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
					CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
					CUtensorMapFloatOOBfill oobFill)
{
	uint64_t reach = 0;
	CUresult r = encode_check(ch, &(struct tmap_geometry){tensorDataType, tensorRank, 1, globalAddress, globalDim,
							      globalStrides, elementStrides, interleave, boxDim},
				  &reach);
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuTensorMapEncodeTiled(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
							globalStrides, boxDim, elementStrides, interleave, swizzle,
							l2Promotion, oobFill);
	return encoded(r, tensorMap, reach);
}

CUresult guarded_cuTensorMapEncodeIm2col(struct vh_chan *ch, CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
					 cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
					 const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
					 const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
					 cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
					 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
					 CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
	/* the pixel box's corners are offsets of the coordinates a kernel gives: what is read
	 * still lies inside globalDim (outside it, the fill value), so the reach is the same */
	uint64_t reach = 0;
	CUresult r = encode_check(ch, &(struct tmap_geometry){tensorDataType, tensorRank, 3, globalAddress, globalDim,
							      globalStrides, elementStrides, interleave},
				  &reach);
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuTensorMapEncodeIm2col(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
							 globalStrides, pixelBoxLowerCorner, pixelBoxUpperCorner,
							 channelsPerPixel, pixelsPerColumn, elementStrides, interleave, swizzle,
							 l2Promotion, oobFill);
	return encoded(r, tensorMap, reach);
}

CUresult guarded_cuTensorMapEncodeIm2colWide(struct vh_chan *ch, CUtensorMap *tensorMap,
					     CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
					     void *globalAddress, const cuuint64_t *globalDim,
					     const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
					     int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
					     cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
					     CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
					     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
					     CUtensorMapFloatOOBfill oobFill)
{
	uint64_t reach = 0;
	CUresult r = encode_check(ch, &(struct tmap_geometry){tensorDataType, tensorRank, 3, globalAddress, globalDim,
							      globalStrides, elementStrides, interleave},
				  &reach);
	if (r == CUDA_SUCCESS)
		r = ch->backend->cuTensorMapEncodeIm2colWide(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
							     globalStrides, pixelBoxLowerCornerWidth, pixelBoxUpperCornerWidth,
							     channelsPerPixel, pixelsPerColumn, elementStrides, interleave,
							     mode, swizzle, l2Promotion, oobFill);
	return encoded(r, tensorMap, reach);
}

CUresult guarded_cuTensorMapReplaceAddress(struct vh_chan *ch, CUtensorMap *tensorMap, void *globalAddress)
{
	if (ch->cur_dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (tensorMap == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	const struct kept_map *k = kept_find(tensorMap);
	if (!k) {
		if (!forged_logged) { /* once: a guest may send many */
			forged_logged = 1;
			vh_log("channel %u: cuTensorMapReplaceAddress refused a tensor map this forwarder did not "
			       "encode for this process, or not among the last %d it did: its bytes cannot be "
			       "trusted to say what it reaches; encode the map again instead (logged once)",
			       ch->index, VH_TMAP_KEEP);
		}
		return CUDA_ERROR_INVALID_VALUE;
	}
	uint64_t reach = k->reach, address = (uint64_t)(uintptr_t)globalAddress;
	if (address % 16 || vh_addr_ok(ch, address, reach))
		return CUDA_ERROR_INVALID_VALUE; /* misaligned, or not all this process's own memory */
	CUresult r = ch->backend->cuTensorMapReplaceAddress(tensorMap, globalAddress);
	return encoded(r, tensorMap, reach);
}
