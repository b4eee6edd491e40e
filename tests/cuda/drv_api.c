/*
 * A plain CUDA driver-API program (links -lcuda; knows nothing of vmgpu).
 * It prints one line per step: the step, the CUresult, and what it checked.
 * The transcript is the same natively and through vmgpu; tests compare them.
 *
 *   drv_api PTX_FILE [MiB for the large copy, default 64] [CUBIN_FILE]
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transcript.h"

static void on_function(void *data, void *node, uint64_t tag)
{
	(void)tag;
	*(void **)data = node;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: drv_api PTX_FILE [MiB]\n");
		return 2;
	}
	size_t big = (size_t)(argc > 2 ? atoi(argv[2]) : 64) << 20;
	CUdevice dev;
	CUcontext ctx;
	int n = 0;
	step("cuDeviceGetCount before init", cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED, NULL);
	step("cuInit", cuInit(0), CUDA_SUCCESS, NULL);
	step("cuDeviceGetCount", cuDeviceGetCount(&n), CUDA_SUCCESS, NULL);
	check("at least one device", n >= 1);
	step("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS, NULL);
	step("cuDeviceGet out of range", cuDeviceGet(&dev, 999), CUDA_ERROR_INVALID_DEVICE, NULL);
	cuDeviceGet(&dev, 0);
	int major = 0, warp = 0;
	step("cuDeviceGetAttribute", cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
	     CUDA_SUCCESS, NULL);
	cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev);
	check("warp size is 32", warp == 32);
	size_t total = 0, free_b = 0, total2 = 0;
	step("cuDeviceTotalMem", cuDeviceTotalMem(&total, dev), CUDA_SUCCESS, NULL);
	step("cuMemAlloc without context", cuMemAlloc(&(CUdeviceptr){0}, 16), CUDA_ERROR_INVALID_CONTEXT, NULL);
	step("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS, NULL);
	step("cuCtxSetCurrent", cuCtxSetCurrent(ctx), CUDA_SUCCESS, NULL);
	CUcontext cur = NULL;
	cuCtxGetCurrent(&cur);
	check("current context is primary", cur == ctx);
	step("cuMemGetInfo", cuMemGetInfo(&free_b, &total2), CUDA_SUCCESS, NULL);
	check("cuMemGetInfo total = cuDeviceTotalMem", total2 == total && free_b <= total);

	/* small copies (inline) */
	CUdeviceptr d1, d2, d3;
	step("cuMemAlloc", cuMemAlloc(&d1, 4096), CUDA_SUCCESS, NULL);
	int small[1024], back[1024];
	for (int i = 0; i < 1024; i++)
		small[i] = i * 7 + 3;
	step("cuMemcpyHtoD small", cuMemcpyHtoD(d1, small, sizeof small), CUDA_SUCCESS, NULL);
	memset(back, 0, sizeof back);
	step("cuMemcpyDtoH small", cuMemcpyDtoH(back, d1, sizeof back), CUDA_SUCCESS, NULL);
	check("small round trip", !memcmp(small, back, sizeof small));
	step("cuMemsetD32", cuMemsetD32(d1, 0xA5A5A5A5u, 1024), CUDA_SUCCESS, NULL);
	cuMemcpyDtoH(back, d1, sizeof back);
	check("memset pattern", back[0] == (int)0xA5A5A5A5u && back[1023] == (int)0xA5A5A5A5u);
	/* an odd count of 16-bit elements: every one set, and not one past them */
	step("cuMemsetD16", cuMemsetD16(d1, 0x1234, 1001), CUDA_SUCCESS, NULL);
	cuMemcpyDtoH(back, d1, sizeof back);
	int d16 = 1;
	for (int i = 0; i < 1001; i++)
		d16 &= ((unsigned short *)back)[i] == 0x1234;
	check("memset D16 odd count", d16 && ((unsigned short *)back)[1001] == 0xA5A5);

	/* large copies (staged) */
	unsigned char *h1 = malloc(big), *h2 = malloc(big);
	for (size_t i = 0; i < big; i++)
		h1[i] = (unsigned char)(i * 131 + (i >> 13));
	step("cuMemAlloc large", cuMemAlloc(&d2, big), CUDA_SUCCESS, NULL);
	step("cuMemAlloc large 2", cuMemAlloc(&d3, big), CUDA_SUCCESS, NULL);
	step("cuMemcpyHtoD large", cuMemcpyHtoD(d2, h1, big), CUDA_SUCCESS, NULL);
	step("cuMemcpyDtoD large", cuMemcpyDtoD(d3, d2, big), CUDA_SUCCESS, NULL);
	memset(h2, 0, big);
	step("cuMemcpyDtoH large", cuMemcpyDtoH(h2, d3, big), CUDA_SUCCESS, NULL);
	check("large round trip", !memcmp(h1, h2, big));

	/* unified copies naming the program's own pageable memory (a variable on its stack, malloc'd
	 * memory), as NCCL's cudaMemcpyAsync(..., cudaMemcpyDefault) does; and host to host */
	{
		uint64_t word = 0x1122334455667788ull, got = 0;
		step("cuMemcpyAsync stack to dev", cuMemcpyAsync(d1, (CUdeviceptr)(uintptr_t)&word, 8, 0), CUDA_SUCCESS, NULL);
		step("cuMemcpyAsync dev to stack", cuMemcpyAsync((CUdeviceptr)(uintptr_t)&got, d1, 8, 0), CUDA_SUCCESS, NULL);
		check("stack round trip", got == word);
		memset(h2, 0, big);
		step("cuMemcpy large malloc to dev", cuMemcpy(d3, (CUdeviceptr)(uintptr_t)h1, big), CUDA_SUCCESS, NULL);
		step("cuMemcpy large dev to malloc", cuMemcpy((CUdeviceptr)(uintptr_t)h2, d3, big), CUDA_SUCCESS, NULL);
		check("unified large round trip", !memcmp(h1, h2, big));
		memset(h2, 0, big);
		step("cuMemcpy host to host", cuMemcpy((CUdeviceptr)(uintptr_t)h2, (CUdeviceptr)(uintptr_t)h1, 4096),
		     CUDA_SUCCESS, NULL);
		check("host to host", !memcmp(h1, h2, 4096));
	}

	/* pinned memory, async copies on a stream, events */
	void *pin = NULL;
	CUstream s;
	CUevent e0, e1;
	step("cuMemAllocHost", cuMemAllocHost(&pin, 1 << 20), CUDA_SUCCESS, NULL);
	memcpy(pin, h1, 1 << 20);
	step("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS, NULL);
	step("cuEventCreate", cuEventCreate(&e0, 0), CUDA_SUCCESS, NULL);
	cuEventCreate(&e1, 0);
	step("cuEventRecord", cuEventRecord(e0, s), CUDA_SUCCESS, NULL);
	step("cuMemcpyHtoDAsync pinned", cuMemcpyHtoDAsync(d1, pin, 4096, s), CUDA_SUCCESS, NULL);
	step("cuMemsetD8Async", cuMemsetD8Async(d2, 0x5A, 1 << 20, s), CUDA_SUCCESS, NULL);
	step("cuMemcpyDtoHAsync pinned", cuMemcpyDtoHAsync(pin, d2, 1 << 20, s), CUDA_SUCCESS, NULL);
	cuEventRecord(e1, s);
	step("cuStreamSynchronize", cuStreamSynchronize(s), CUDA_SUCCESS, NULL);
	check("pinned async round trip", ((unsigned char *)pin)[0] == 0x5A && ((unsigned char *)pin)[(1 << 20) - 1] == 0x5A);
	float ms = -1;
	step("cuEventElapsedTime", cuEventElapsedTime(&ms, e0, e1), CUDA_SUCCESS, NULL);
	check("elapsed time >= 0", ms >= 0);
	CUdeviceptr mapped = 0;
	step("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer(&mapped, pin, 0), CUDA_SUCCESS, NULL);
	unsigned int mtype = 0;
	void *hptr = NULL;
	step("cuPointerGetAttribute (device)", cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d1),
	     CUDA_SUCCESS, NULL);
	check("device memory is device memory", mtype == CU_MEMORYTYPE_DEVICE);
	step("cuPointerGetAttribute (pinned)",
	     cuPointerGetAttribute(&hptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, (CUdeviceptr)(uintptr_t)pin), CUDA_SUCCESS,
	     NULL);
	check("pinned memory's host address is itself", hptr == pin);
	/* several at once (cudaPointerGetAttributes, PyTorch's is_pinned): an address the driver
	 * does not know is no error, only "unregistered" with empty values */
	CUpointer_attribute pa[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				     CU_POINTER_ATTRIBUTE_HOST_POINTER};
	unsigned int ptype = 99;
	int pdev = 99;
	void *phost = (void *)1, *pdata[3] = {&ptype, &pdev, &phost};
	step("cuPointerGetAttributes (pinned)", cuPointerGetAttributes(3, pa, pdata, (CUdeviceptr)(uintptr_t)pin),
	     CUDA_SUCCESS, NULL);
	check("pinned: host memory of device 0 at its own address", ptype == CU_MEMORYTYPE_HOST && pdev == 0 && phost == pin);
	step("cuPointerGetAttributes (device)", cuPointerGetAttributes(2, pa, pdata, d1), CUDA_SUCCESS, NULL);
	check("device: device memory of device 0", ptype == CU_MEMORYTYPE_DEVICE && pdev == 0);
	static char plain[64];
	ptype = 99;
	step("cuPointerGetAttributes (malloc)", cuPointerGetAttributes(1, pa, pdata, (CUdeviceptr)(uintptr_t)plain),
	     CUDA_SUCCESS, NULL);
	check("plain memory is unregistered", ptype == 0);
	step("cuPointerGetAttributes no data", cuPointerGetAttributes(1, pa, NULL, d1), CUDA_ERROR_INVALID_VALUE, NULL);

	/* a module from PTX and a launch */
	char *ptx = read_file(argv[1]);
	CUmodule mod;
	CUfunction fn;
	step("cuModuleLoadData (PTX)", ptx ? cuModuleLoadData(&mod, ptx) : CUDA_ERROR_FILE_NOT_FOUND, CUDA_SUCCESS, NULL);
	step("cuModuleGetFunction", cuModuleGetFunction(&fn, mod, "vadd"), CUDA_SUCCESS, NULL);
	step("cuModuleGetFunction missing", cuModuleGetFunction(&(CUfunction){0}, mod, "nope"), CUDA_ERROR_NOT_FOUND, NULL);
	size_t poff = 0, psz = 0;
	step("cuFuncGetParamInfo 3", cuFuncGetParamInfo(fn, 3, &poff, &psz), CUDA_SUCCESS, NULL);
	check("param 3 is an int at 24", poff == 24 && psz == 4);
	/* attributes: asked often, answered from the guest's cache, fresh after a set */
	int maxthr = 0, smem = -1, same = 1;
	step("cuFuncGetAttribute", cuFuncGetAttribute(&maxthr, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn), CUDA_SUCCESS, NULL);
	for (int i = 0; i < 100; i++) {
		int again = 0;
		cuFuncGetAttribute(&again, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn);
		same &= again == maxthr;
	}
	check("attribute stable", same && maxthr > 0);
	cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn);
	step("cuFuncSetAttribute", cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024),
	     CUDA_SUCCESS, NULL);
	cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn);
	check("attribute fresh after a set", smem == 1024);
	step("cuFuncSetAttribute (same value)", cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024),
	     CUDA_SUCCESS, NULL);
	step("cuFuncSetAttribute (back to 0)", cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0),
	     CUDA_SUCCESS, NULL);
	cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn);
	check("attribute reset", smem == 0);
	int count = 1 << 20;
	float *fa = malloc(count * 4), *fb = malloc(count * 4), *fc = malloc(count * 4);
	for (int i = 0; i < count; i++) {
		fa[i] = (float)i;
		fb[i] = 0.5f * (float)i;
	}
	CUdeviceptr da, db, dc;
	cuMemAlloc(&da, count * 4);
	cuMemAlloc(&db, count * 4);
	cuMemAlloc(&dc, count * 4);
	cuMemcpyHtoD(da, fa, count * 4);
	cuMemcpyHtoD(db, fb, count * 4);
	void *args[] = {&da, &db, &dc, &count};
	step("cuLaunchKernel", cuLaunchKernel(fn, (count + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL), CUDA_SUCCESS, NULL);
	step("cuStreamSynchronize", cuStreamSynchronize(s), CUDA_SUCCESS, NULL);
	cuMemcpyDtoH(fc, dc, count * 4);
	int good = 1;
	for (int i = 0; i < count; i++)
		if (fc[i] != 1.5f * (float)i)
			good = 0;
	check("vadd result", good);
	/* the packed-buffer form of the same launch */
	struct { CUdeviceptr a, b, c; int n; int pad; } packed = {da, db, dc, count, 0};
	size_t psize = 28;
	void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
	cuMemsetD32(dc, 0, count);
	step("cuLaunchKernel (extra)", cuLaunchKernel(fn, (count + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, NULL, extra), CUDA_SUCCESS, NULL);
	cuCtxSynchronize();
	cuMemcpyDtoH(fc, dc, 4 * 16);
	check("vadd (extra) result", fc[10] == 15.0f);
	/* a packed buffer shorter than the parameters (NCCL passes only the part of its 4 KiB argument
	 * struct it filled): taken by the driver.  One thread, so whatever n it sees, at most c[0]. */
	psize = 24;
	step("cuLaunchKernel (short extra)", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra), CUDA_SUCCESS, NULL);
	step("cuCtxSynchronize (short extra)", cuCtxSynchronize(), CUDA_SUCCESS, NULL);

	/* the same kernel from a cubin, when one is given */
	if (argc > 3) {
		char *cubin = NULL;
		FILE *cf = fopen(argv[3], "rb");
		long clen = 0;
		if (cf && !fseek(cf, 0, SEEK_END) && (clen = ftell(cf)) > 0 && !fseek(cf, 0, SEEK_SET)) {
			cubin = malloc((size_t)clen);
			if (fread(cubin, 1, (size_t)clen, cf) != (size_t)clen)
				clen = 0;
		}
		if (cf)
			fclose(cf);
		CUmodule cmod;
		CUfunction cfn;
		step("cuModuleLoadData (cubin)", clen > 0 ? cuModuleLoadData(&cmod, cubin) : CUDA_ERROR_FILE_NOT_FOUND,
		     CUDA_SUCCESS, NULL);
		step("cuModuleGetFunction (cubin)", cuModuleGetFunction(&cfn, cmod, "vadd"), CUDA_SUCCESS, NULL);
		cuMemsetD32(dc, 0, count);
		step("cuLaunchKernel (cubin)", cuLaunchKernel(cfn, (count + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL),
		     CUDA_SUCCESS, NULL);
		cuCtxSynchronize();
		cuMemcpyDtoH(fc, dc, 4 * 16);
		check("vadd (cubin) result", fc[10] == 15.0f);
		step("cuModuleUnload (cubin)", cuModuleUnload(cmod), CUDA_SUCCESS, NULL);
		free(cubin);
	}

	/* what cuFFT does: enumerate a module's functions through the driver's tools table */
	static const CUuuid tools_module = {{0x6e, 0x16, 0x3f, 0xbe, (char)0xb9, 0x58, 0x44, 0x4d, (char)0x83, 0x5c,
					     (char)0xe1, (char)0x82, (char)0xaf, (char)0xf1, (char)0x99, 0x1e}};
	const void *tm = NULL;
	step("cuGetExportTable (tools module)", cuGetExportTable(&tm, &tools_module), CUDA_SUCCESS, NULL);
	if (tm) {
		uint64_t (*enumerate)(CUcontext, CUmodule, void (*)(void *, void *, uint64_t), void *) =
			(uint64_t (*)(CUcontext, CUmodule, void (*)(void *, void *, uint64_t), void *))((void *const *)tm)[7];
		void *node = NULL;
		uint64_t rr = enumerate(ctx, mod, on_function, &node);
		check("module functions enumerated", rr == 1 && node != NULL);
		const char *nodename = NULL;
		step("cuFuncGetName (node)", cuFuncGetName(&nodename, (CUfunction)node), CUDA_SUCCESS, NULL);
		check("node is vadd", nodename && !strcmp(nodename, "vadd"));
		cuMemsetD32(dc, 0, count);
		step("cuLaunchKernel (node)",
		     cuLaunchKernel((CUfunction)node, (count + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS,
		     NULL);
		cuCtxSynchronize();
		cuMemcpyDtoH(fc, dc, 4 * 16);
		check("vadd (node) result", fc[10] == 15.0f);
	}

	/* the launch-config form, and a query that takes one */
	CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PRIORITY};
	attr.value.priority = 0;
	CUlaunchConfig cfg = {.gridDimX = (count + 255) / 256, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
			      .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = 0, .hStream = NULL, .attrs = &attr,
			      .numAttrs = 1};
	cuMemsetD32(dc, 0, count);
	step("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, fn, args, NULL), CUDA_SUCCESS, NULL);
	cuCtxSynchronize();
	cuMemcpyDtoH(fc, dc, 4 * 16);
	check("vadd (Ex) result", fc[10] == 15.0f);
	int clusters = -1;
	char buf[64];
	cfg.numAttrs = 0;
	cfg.attrs = NULL;
	CUresult rc = cuOccupancyMaxActiveClusters(&clusters, fn, &cfg);
	snprintf(buf, sizeof buf, " (%s)", clusters > 0 ? "some" : "none");
	step("cuOccupancyMaxActiveClusters", rc, CUDA_SUCCESS, buf);

	/* a CUDA graph: capture the launch on a stream, instantiate, replay */
	CUstream cs;
	CUgraph graph;
	CUgraphExec gexec;
	CUstreamCaptureStatus cst = CU_STREAM_CAPTURE_STATUS_NONE;
	cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING);
	cuMemsetD32(dc, 0, count);
	step("cuStreamBeginCapture", cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS, NULL);
	cuStreamIsCapturing(cs, &cst);
	check("stream is capturing", cst == CU_STREAM_CAPTURE_STATUS_ACTIVE);
	step("cuLaunchKernel (captured)", cuLaunchKernel(fn, (count + 255) / 256, 1, 1, 256, 1, 1, 0, cs, args, NULL),
	     CUDA_SUCCESS, NULL);
	step("cuStreamEndCapture", cuStreamEndCapture(cs, &graph), CUDA_SUCCESS, NULL);
	cuMemcpyDtoH(fc, dc, 4 * 16);
	check("captured launch did not run", fc[10] == 0.0f);
	size_t nnodes = 0;
	step("cuGraphGetNodes (count)", cuGraphGetNodes(graph, NULL, &nnodes), CUDA_SUCCESS, NULL);
	check("one node captured", nnodes == 1);
	step("cuGraphInstantiate", cuGraphInstantiateWithFlags(&gexec, graph, 0), CUDA_SUCCESS, NULL);
	/* the executable graph outlives the graph it was made from */
	step("cuGraphDestroy", cuGraphDestroy(graph), CUDA_SUCCESS, NULL);
	step("cuGraphLaunch", cuGraphLaunch(gexec, cs), CUDA_SUCCESS, NULL);
	step("cuStreamSynchronize (graph)", cuStreamSynchronize(cs), CUDA_SUCCESS, NULL);
	cuMemcpyDtoH(fc, dc, 4 * 16);
	check("graph replay result", fc[10] == 15.0f);
	step("cuGraphExecDestroy", cuGraphExecDestroy(gexec), CUDA_SUCCESS, NULL);
	cuStreamDestroy(cs);

	/* error paths */
	step("cuMemFree(0)", cuMemFree(0), CUDA_SUCCESS, NULL);
	step("cuMemFree not allocated", cuMemFree(d1 + 8), CUDA_ERROR_INVALID_VALUE, NULL);
	step("cuMemAlloc over total", cuMemAlloc(&(CUdeviceptr){0}, total + (1ull << 30)), CUDA_ERROR_OUT_OF_MEMORY, NULL);
	step("cuStreamDestroy", cuStreamDestroy(s), CUDA_SUCCESS, NULL);
	step("cuModuleUnload", cuModuleUnload(mod), CUDA_SUCCESS, NULL);
	step("cuMemFreeHost", cuMemFreeHost(pin), CUDA_SUCCESS, NULL);
	step("cuMemFree", cuMemFree(d1), CUDA_SUCCESS, NULL);
	step("cuMemFree twice", cuMemFree(d1), CUDA_ERROR_INVALID_VALUE, NULL);
	printf("%s: %d unexpected\n", failures ? "FAILED" : "PASSED", failures);
	return failures ? 1 : 0;
}
