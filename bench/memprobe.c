/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memprobe: how much device memory each allocation path really takes, seen by
 * NVML's per-process usage of this process.  Run natively on the GPU host; its
 * numbers are what the forwarder's memory charges are designed from.
 *
 *   memprobe [module.cubin]
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s_; cuGetErrorName(r_, &s_); \
	printf("FAIL %s: %s\n", #x, s_); exit(1); } } while (0)

typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvproc;
static int (*nvInit)(void);
static int (*nvByIndex)(unsigned, void **);
static int (*nvProcs)(void *, unsigned *, nvproc *);
static void *nvdev;

static long long mine(void)
{
	nvproc p[64];
	unsigned n = 64;
	if (nvProcs(nvdev, &n, p))
		return -1;
	for (unsigned i = 0; i < n; i++)
		if (p[i].pid == (unsigned)getpid())
			return (long long)p[i].used;
	return 0;
}

static long long last;
static long long step(const char *what, long long n)
{
	long long u = mine(), d = u - last;
	printf("%-44s used=%lld MiB delta=%lld B", what, u >> 20, d);
	if (n > 1)
		printf(" per=%lld", d / n);
	printf("\n");
	last = u;
	return d;
}

int main(int argc, char **argv)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!h) { printf("no nvml\n"); return 1; }
	nvInit = dlsym(h, "nvmlInit_v2");
	nvByIndex = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
	nvProcs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (nvInit() || nvByIndex(0, &nvdev)) { printf("nvml init\n"); return 1; }
	CUdevice dev;
	CUcontext ctx;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	last = 0;
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	step("context (primary, retained)", 1);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 200; i++)
		mine();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("nvml per-process query: %.1f us\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 200e3);
	CUcontext second;
	CK(cuCtxCreate(&second, NULL, 0, dev));
	step("second context (cuCtxCreate)", 1);
	CK(cuCtxDestroy(second));
	step("  destroyed", 1);
	CK(cuCtxSetCurrent(ctx));
	CUstream st;
	CK(cuStreamCreate(&st, 0));
	step("stream", 1);

	static const size_t sizes[] = {1, 256, 4096, 65536, 500000, 1 << 20, (1 << 20) + 1, 1536 << 10,
	                               2 << 20, (2 << 20) + 1, 3 << 20, 5 << 20, (10 << 20) + 1, (64 << 20) + 1};
	for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
		enum { K = 32 };
		CUdeviceptr p[K];
		char what[64];
		for (int k = 0; k < K; k++)
			CK(cuMemAlloc(&p[k], sizes[s]));
		snprintf(what, sizeof what, "cuMemAlloc %zu x%d", sizes[s], K);
		step(what, K);
		for (int k = 0; k < K; k++)
			CK(cuMemFree(p[k]));
		step("  freed", 1);
	}
	/* pitched */
	static const size_t widths[] = {1, 100, 1000, 5000, 70000};
	for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
		CUdeviceptr p;
		size_t pitch;
		CK(cuMemAllocPitch(&p, &pitch, widths[w], 1000, 4));
		char what[64];
		snprintf(what, sizeof what, "cuMemAllocPitch w=%zu h=1000 pitch=%zu", widths[w], pitch);
		long long d = step(what, 1);
		printf("  pitch*h=%zu phys/(pitch*h)=%.3f\n", pitch * 1000, (double)d / (pitch * 1000));
		CK(cuMemFree(p));
		step("  freed", 1);
	}
	/* arrays */
	static const unsigned dims[][3] = {{1024, 0, 0}, {1000, 1000, 0}, {4096, 4096, 0}, {256, 256, 64}};
	for (size_t a = 0; a < sizeof dims / sizeof *dims; a++) {
		CUDA_ARRAY3D_DESCRIPTOR d = {dims[a][0], dims[a][1], dims[a][2], CU_AD_FORMAT_FLOAT, 4, 0};
		CUarray arr;
		CK(cuArray3DCreate(&arr, &d));
		char what[96];
		size_t nominal = (size_t)dims[a][0] * (dims[a][1] ? dims[a][1] : 1) * (dims[a][2] ? dims[a][2] : 1) * 16;
		snprintf(what, sizeof what, "cuArray3DCreate %ux%ux%u float4 (%zu B)", dims[a][0], dims[a][1], dims[a][2], nominal);
		long long dd = step(what, 1);
		printf("  phys/nominal=%.3f\n", (double)dd / nominal);
		CK(cuArrayDestroy(arr));
		step("  destroyed", 1);
	}
	/* stream-ordered, default pool */
	CUmemoryPool pool;
	CK(cuDeviceGetDefaultMemPool(&pool, dev));
	cuuint64_t thr = 0, res = 0;
	CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	printf("default pool release threshold %llu\n", (unsigned long long)thr);
	static const size_t asizes[] = {256, 1 << 20, (3 << 20) + 5, 100 << 20};
	for (size_t s = 0; s < sizeof asizes / sizeof *asizes; s++) {
		enum { K = 8 };
		CUdeviceptr p[K];
		for (int k = 0; k < K; k++)
			CK(cuMemAllocAsync(&p[k], asizes[s], st));
		char what[64];
		snprintf(what, sizeof what, "cuMemAllocAsync %zu x%d (no sync)", asizes[s], K);
		step(what, K);
		CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res));
		printf("  pool reserved %llu used ", (unsigned long long)res);
		CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &res));
		printf("%llu\n", (unsigned long long)res);
		for (int k = 0; k < K; k++)
			CK(cuMemFreeAsync(p[k], st));
		step("  freeAsync, no sync", 1);
		CK(cuStreamSynchronize(st));
		step("  after sync", 1);
		CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res));
		printf("  pool reserved %llu\n", (unsigned long long)res);
	}
	/* VMM */
	CUmemAllocationProp prop = {0};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	size_t gmin = 0, grec = 0;
	CK(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CK(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	printf("VMM granularity min %zu recommended %zu\n", gmin, grec);
	CUmemGenericAllocationHandle mh;
	CK(cuMemCreate(&mh, 64 << 20, &prop, 0));
	step("cuMemCreate 64 MiB", 1);
	CUdeviceptr va;
	CK(cuMemAddressReserve(&va, 64 << 20, 0, 0, 0));
	CK(cuMemMap(va, 64 << 20, 0, mh, 0));
	CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CK(cuMemSetAccess(va, 64 << 20, &acc, 1));
	step("  mapped + access", 1);
	CK(cuMemRelease(mh));
	step("  released while mapped", 1);
	CK(cuMemUnmap(va, 64 << 20));
	step("  unmapped", 1);
	CK(cuMemAddressFree(va, 64 << 20));
	/* graph memory node, by capture */
	CUgraph g;
	CUgraphExec ge;
	CUdeviceptr gp;
	CK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CK(cuMemAllocAsync(&gp, 48 << 20, st));
	CK(cuMemsetD8Async(gp, 1, 48 << 20, st));
	CK(cuMemFreeAsync(gp, st));
	CK(cuStreamEndCapture(st, &g));
	step("graph captured (48 MiB alloc node)", 1);
	size_t nn = 0;
	CK(cuGraphGetNodes(g, NULL, &nn));
	CUgraphNode nodes[8];
	CK(cuGraphGetNodes(g, nodes, &nn));
	for (size_t i = 0; i < nn; i++) {
		CUgraphNodeType t;
		CK(cuGraphNodeGetType(nodes[i], &t));
		if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
			CUDA_MEM_ALLOC_NODE_PARAMS mp;
			CK(cuGraphMemAllocNodeGetParams(nodes[i], &mp));
			printf("  alloc node bytesize %zu dptr %llx\n", mp.bytesize, (unsigned long long)mp.dptr);
		}
	}
	CK(cuGraphInstantiate(&ge, g, 0));
	step("  instantiated", 1);
	CK(cuGraphUpload(ge, st));
	CK(cuStreamSynchronize(st));
	step("  uploaded", 1);
	CK(cuGraphLaunch(ge, st));
	CK(cuStreamSynchronize(st));
	step("  launched", 1);
	cuuint64_t gr = 0;
	CK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &gr));
	printf("  graph mem reserved %llu\n", (unsigned long long)gr);
	CK(cuGraphExecDestroy(ge));
	CK(cuGraphDestroy(g));
	step("  destroyed", 1);
	CK(cuDeviceGraphMemTrim(dev));
	step("  trimmed", 1);
	/* module globals */
	if (argc > 1) {
		CUmodule m;
		CK(cuModuleLoad(&m, argv[1]));
		step("module loaded (lazy?)", 1);
		CUfunction f;
		CK(cuModuleGetFunction(&f, m, "touch"));
		step("  function got", 1);
		CUdeviceptr gptr;
		size_t gb;
		CK(cuModuleGetGlobal(&gptr, &gb, m, "big"));
		step("  global got", 1);
		printf("  global size %zu\n", gb);
		void *args[] = {NULL};
		CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, st, args, NULL));
		CK(cuStreamSynchronize(st));
		step("  launched", 1);
		CK(cuModuleUnload(m));
		step("  unloaded", 1);
	}
	CK(cuStreamDestroy(st));
	printf("memprobe ok\n");
	return 0;
}
