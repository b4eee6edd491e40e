/*
 * 2D and 3D copies and 2D memsets, each result checked against the same operations done on the
 * CPU:  copy2d [noarray]
 * Pageable and pinned host memory, pitched device memory, a sub-rectangle at an offset, the async
 * variants on a stream, a 3D copy of a few slices, and (unless "noarray": the simulated backend
 * has no arrays) a 2D array written from pageable memory and read back into pinned memory; texture
 * objects over the pitched memory and the array, their resources answered as given.
 * Prints one line per step, "<step> <CUresult>", and exits 0 only if every step succeeded.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W 1000 /* bytes per row of the copied rectangle */
#define H 37
#define HP 1024 /* host pitch */

static int failed;

static CUresult step(const char *what, CUresult r)
{
	printf("%s %d\n", what, (int)r);
	fflush(stdout);
	failed |= r != CUDA_SUCCESS;
	return r;
}

static void same(const char *what, const void *a, const void *b, size_t n)
{
	step(what, memcmp(a, b, n) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
}

int main(int argc, char **argv)
{
	int arrays = !(argc > 1 && !strcmp(argv[1], "noarray"));
	CUdevice dev;
	CUcontext ctx;
	CUstream st;
	if (step("init", cuInit(0)) || step("device", cuDeviceGet(&dev, 0)) ||
	    step("context", cuDevicePrimaryCtxRetain(&ctx, dev)) || step("current", cuCtxSetCurrent(ctx)) ||
	    step("stream", cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)))
		return 1;
	/* pageable source: H + 2 rows of HP bytes; the rectangle starts at x 8, y 1 */
	unsigned char *src = malloc((size_t)HP * (H + 2)), *want = calloc((size_t)HP, H + 2), *got = malloc((size_t)HP * (H + 2));
	for (size_t i = 0; i < (size_t)HP * (H + 2); i++)
		src[i] = (unsigned char)(i * 13 + 5);
	CUdeviceptr a, b;
	size_t pa, pb;
	if (step("alloc_pitch_a", cuMemAllocPitch(&a, &pa, W + 64, H, 4)) ||
	    step("alloc_pitch_b", cuMemAllocPitch(&b, &pb, W + 64, H, 4)))
		return 1;
	step("zero_a", cuMemsetD2D8(a, pa, 0, W + 64, H));

	/* pageable host -> device, at x 8, y 1 of the host and x 16 of the device */
	CUDA_MEMCPY2D c = {.srcXInBytes = 8, .srcY = 1, .srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = src, .srcPitch = HP,
			   .dstXInBytes = 16, .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = a, .dstPitch = pa,
			   .WidthInBytes = W, .Height = H};
	step("htod_pageable", cuMemcpy2D(&c));
	/* a 2D memset over part of it: rows 5..14, bytes 100..299 of each */
	step("memset2d8", cuMemsetD2D8(a + 5 * pa + 100, pa, 0x77, 200, 10));
	/* 32-bit memset, async, rows 20..29, words 50..59 */
	step("memset2d32_async", cuMemsetD2D32Async(a + 20 * pa + 200, pa, 0xdeadbeef, 10, 10, st));
	step("sync1", cuStreamSynchronize(st));
	/* device -> device, the whole rectangle */
	CUDA_MEMCPY2D d = {.srcXInBytes = 16, .srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = a, .srcPitch = pa,
			   .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = b, .dstPitch = pb, .WidthInBytes = W, .Height = H};
	step("dtod", cuMemcpy2D(&d));
	/* device -> pinned host, async */
	unsigned char *pinned;
	if (step("alloc_host", cuMemAllocHost((void **)&pinned, (size_t)HP * H)))
		return 1;
	memset(pinned, 0, (size_t)HP * H);
	CUDA_MEMCPY2D e = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = b, .srcPitch = pb,
			   .dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = pinned, .dstPitch = HP, .WidthInBytes = W, .Height = H};
	step("dtoh_pinned_async", cuMemcpy2DAsync(&e, st));
	step("sync2", cuStreamSynchronize(st));
	/* the same on the CPU */
	for (int y = 0; y < H; y++)
		memcpy(want + (size_t)y * HP, src + (size_t)(y + 1) * HP + 8, W);
	for (int y = 5; y < 15; y++)
		memset(want + (size_t)y * HP + 100 - 16, 0x77, 200);
	for (int y = 20; y < 30; y++)
		for (int k = 0; k < 10; k++) {
			unsigned v = 0xdeadbeef;
			memcpy(want + (size_t)y * HP + 200 - 16 + 4 * k, &v, 4);
		}
	int ok = 1;
	for (int y = 0; y < H; y++)
		ok &= memcmp(pinned + (size_t)y * HP, want + (size_t)y * HP, W) == 0;
	step("result_2d", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	/* device -> pageable, unaligned variant */
	memset(got, 0, (size_t)HP * H);
	CUDA_MEMCPY2D f = e;
	f.dstHost = got;
	step("dtoh_pageable_unaligned", cuMemcpy2DUnaligned(&f));
	ok = 1;
	for (int y = 0; y < H; y++)
		ok &= memcmp(got + (size_t)y * HP, want + (size_t)y * HP, W) == 0;
	step("result_pageable", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);

	/* 3D: 3 slices of 8 rows of 64 bytes, pageable -> device (pitch 128, 10 rows a slice) -> pinned */
	enum { X3 = 64, Y3 = 8, Z3 = 3, P3 = 128, H3 = 10 };
	CUdeviceptr v;
	unsigned char *h3 = malloc((size_t)X3 * Y3 * Z3), *back = pinned;
	for (int i = 0; i < X3 * Y3 * Z3; i++)
		h3[i] = (unsigned char)(i * 7 + 1);
	if (step("alloc_3d", cuMemAlloc(&v, (size_t)P3 * H3 * Z3)))
		return 1;
	CUDA_MEMCPY3D g = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = h3, .srcPitch = X3, .srcHeight = Y3,
			   .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = v, .dstPitch = P3, .dstHeight = H3,
			   .WidthInBytes = X3, .Height = Y3, .Depth = Z3};
	step("htod_3d_pageable", cuMemcpy3D(&g));
	CUDA_MEMCPY3D k = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = v, .srcPitch = P3, .srcHeight = H3,
			   .dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = back, .dstPitch = X3, .dstHeight = Y3,
			   .WidthInBytes = X3, .Height = Y3, .Depth = Z3};
	step("dtoh_3d_pinned_async", cuMemcpy3DAsync(&k, st));
	step("sync3", cuStreamSynchronize(st));
	same("result_3d", back, h3, (size_t)X3 * Y3 * Z3);

	/* a texture over the pitched rectangle (its resource checked, its description answered) */
	CUDA_RESOURCE_DESC rd = {.resType = CU_RESOURCE_TYPE_PITCH2D};
	rd.res.pitch2D.devPtr = a;
	rd.res.pitch2D.format = CU_AD_FORMAT_UNSIGNED_INT8;
	rd.res.pitch2D.numChannels = 1;
	rd.res.pitch2D.width = W;
	rd.res.pitch2D.height = H;
	rd.res.pitch2D.pitchInBytes = pa;
	CUDA_TEXTURE_DESC td = {.addressMode = {CU_TR_ADDRESS_MODE_CLAMP, CU_TR_ADDRESS_MODE_CLAMP}};
	CUtexObject tex;
	if (!step("texture_pitch2d", cuTexObjectCreate(&tex, &rd, &td, NULL))) {
		CUDA_RESOURCE_DESC back_rd;
		step("texture_resource", cuTexObjectGetResourceDesc(&back_rd, tex));
		step("texture_resource_same", back_rd.resType == CU_RESOURCE_TYPE_PITCH2D && back_rd.res.pitch2D.devPtr == a
						  ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
		step("texture_destroy", cuTexObjectDestroy(tex));
	}
	if (arrays) {
		CUarray arr;
		CUDA_ARRAY_DESCRIPTOR ad = {.Width = 256, .Height = 64, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
		if (!step("array", cuArrayCreate(&arr, &ad))) {
			CUDA_MEMCPY2D ha = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = src, .srcPitch = HP,
					    .dstMemoryType = CU_MEMORYTYPE_ARRAY, .dstArray = arr, .WidthInBytes = 256, .Height = 64};
			step("htoa_pageable", cuMemcpy2D(&ha));
			memset(pinned, 0, 256 * 64);
			CUDA_MEMCPY2D ah = {.srcMemoryType = CU_MEMORYTYPE_ARRAY, .srcArray = arr, .dstMemoryType = CU_MEMORYTYPE_HOST,
					    .dstHost = pinned, .dstPitch = 256, .WidthInBytes = 256, .Height = 64};
			step("atoh_pinned", cuMemcpy2D(&ah));
			ok = 1;
			for (int y = 0; y < 64; y++)
				ok &= memcmp(pinned + y * 256, src + (size_t)y * HP, 256) == 0;
			step("result_array", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
			CUDA_RESOURCE_DESC ar = {.resType = CU_RESOURCE_TYPE_ARRAY};
			ar.res.array.hArray = arr;
			CUtexObject at;
			CUDA_RESOURCE_DESC aback;
			if (!step("texture_array", cuTexObjectCreate(&at, &ar, &td, NULL))) {
				step("texture_array_resource", cuTexObjectGetResourceDesc(&aback, at));
				step("texture_array_same", aback.res.array.hArray == arr ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
				step("texture_array_destroy", cuTexObjectDestroy(at));
			}
			step("array_destroy", cuArrayDestroy(arr));
		}
	}
	step("free", cuMemFree(a) | cuMemFree(b) | cuMemFree(v) | cuMemFreeHost(pinned));
	printf("copy2d %s\n", failed ? "FAILED" : "ok");
	return failed;
}
