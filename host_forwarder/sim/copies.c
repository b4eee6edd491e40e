/* SPDX-License-Identifier: Apache-2.0 */
/* Copies and memsets: every address must lie inside one allocation or registered range. */
#include "sim.h"

static CUresult copy(uint64_t dst, uint64_t src, size_t n)
{
	uint8_t *d = sim_resolve(dst, n), *s = sim_resolve(src, n);
	if (!n) return CUDA_SUCCESS;
	if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
	memmove(d, s, n);
	return CUDA_SUCCESS;
}

static CUresult to_dev(CUdeviceptr dst, const void *src, size_t n)
{
	uint8_t *d = sim_resolve(dst, n);
	if (!n) return CUDA_SUCCESS;
	if (!d || !src) return CUDA_ERROR_INVALID_VALUE;
	memcpy(d, src, n);
	return CUDA_SUCCESS;
}

static CUresult from_dev(void *dst, CUdeviceptr src, size_t n)
{
	uint8_t *s = sim_resolve(src, n);
	if (!n) return CUDA_SUCCESS;
	if (!s || !dst) return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, s, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return to_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return from_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return to_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return from_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, s, n); }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, s, n); }

static CUresult fill(CUdeviceptr d, const void *v, size_t elsz, size_t n)
{
	if (n > SIZE_MAX / elsz) return CUDA_ERROR_INVALID_VALUE;
	uint8_t *p = sim_resolve(d, n * elsz);
	if (n && !p) return CUDA_ERROR_INVALID_VALUE;
	/* the first element, then what is filled doubled (a copy per element was 13 ms a MiB in the
	 * ASan forwarder, whose memcpy is intercepted: a guest's spin there did a tenth of its work) */
	if (n)
		memcpy(p, v, elsz);
	for (size_t done = elsz, total = n * elsz; done < total; done *= 2)
		memcpy(p + done, p, done < total - done ? done : total - done);
	return CUDA_SUCCESS;
}
/* VMGPU_SIM_EXIT_AT_MEMSET (knobs.c) can end the process here. */
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
	sim_memset_knob();
	sim_sm_log("memset", sim_sms_of(NULL));
	return fill(d, &v, 1, n);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return fill(d, &v, 4, n); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
	sim_sm_log(sim_stream_obj(s) ? "memset" : "memset default", sim_sms_of(s));
	return fill(d, &v, 1, n);
}
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)s; return fill(d, &v, 4, n); }

/* 2D and 3D copies and 2D memsets, row by row (graphs_explicit.c); arrays are not simulated. */
static CUresult copy2d(const CUDA_MEMCPY2D *p)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
	if ((p->Height > 1 && (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes))) return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMCPY3D q = {.srcXInBytes = p->srcXInBytes, .srcY = p->srcY, .srcMemoryType = p->srcMemoryType,
			   .srcHost = p->srcHost, .srcDevice = p->srcDevice, .srcPitch = p->srcPitch,
			   .dstXInBytes = p->dstXInBytes, .dstY = p->dstY, .dstMemoryType = p->dstMemoryType,
			   .dstHost = p->dstHost, .dstDevice = p->dstDevice, .dstPitch = p->dstPitch,
			   .WidthInBytes = p->WidthInBytes, .Height = p->Height, .Depth = 1};
	CUresult r = sim_copy3d(&q);
	return r == CUDA_ERROR_ILLEGAL_ADDRESS ? CUDA_ERROR_INVALID_VALUE : r;
}
static CUresult copy3d(const CUDA_MEMCPY3D *p)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
	CUresult r = sim_copy3d(p);
	return r == CUDA_ERROR_ILLEGAL_ADDRESS ? CUDA_ERROR_INVALID_VALUE : r;
}
EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p) { return copy2d(p); }
EXPORT CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *p) { return copy2d(p); }
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, CUstream s) { (void)s; return copy2d(p); }
EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *p) { return copy3d(p); }
EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *p, CUstream s) { (void)s; return copy3d(p); }
static CUresult set2d(CUdeviceptr d, size_t pitch, unsigned v, unsigned elsz, size_t w, size_t h)
{
	if (h > 1 && pitch < w * elsz) return CUDA_ERROR_INVALID_VALUE;
	CUDA_MEMSET_NODE_PARAMS p = {.dst = d, .pitch = pitch, .value = v, .elementSize = elsz, .width = w, .height = h};
	CUresult r = sim_memset2d(&p);
	return r == CUDA_ERROR_ILLEGAL_ADDRESS ? CUDA_ERROR_INVALID_VALUE : r;
}
EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) { return set2d(d, pitch, v, 1, w, h); }
EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) { return set2d(d, pitch, v, 2, w, h); }
EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) { return set2d(d, pitch, v, 4, w, h); }
EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s) { (void)s; return set2d(d, pitch, v, 1, w, h); }
EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s) { (void)s; return set2d(d, pitch, v, 2, w, h); }
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s) { (void)s; return set2d(d, pitch, v, 4, w, h); }
