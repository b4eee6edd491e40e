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
	for (size_t i = 0; i < n; i++)
		memcpy(p + i * elsz, v, elsz);
	return CUDA_SUCCESS;
}
/* VMGPU_SIM_EXIT_AT_MEMSET (knobs.c) can end the process here. */
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
	sim_memset_knob();
	return fill(d, &v, 1, n);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return fill(d, &v, 4, n); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return fill(d, &v, 1, n); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)s; return fill(d, &v, 4, n); }
