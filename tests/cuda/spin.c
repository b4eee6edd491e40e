/* A guest that keeps the GPU busy: cuMemsetD8 over a buffer, again and again, for SECONDS,
 * then prints "ops N secs S" (how many it finished, and in how long).  Works on the simulated backend, where a
 * memset is CPU time inside the forwarder: what the compute scheduler shares out.  With
 * "async", cuMemsetD8Async on a stream of its own (synchronised at the end); with "capture", the
 * same while a stream capture of one memset is open on a second stream (ended at the end: then
 * "capture ok" if it ended whole, "capture broken" if not); with "capture-stray", the same after
 * a cuStreamEndCapture of the first stream, which is not being captured (refused); with "two",
 * async on two streams by turns; with "churn", async on a stream made for each memset and
 * destroyed after it; with "blocking", async by turns on a stream made without CU_STREAM_NON_BLOCKING
 * and on the legacy stream, and with "blocking-many" on each of ten such streams and then the legacy
 * stream, and with "blocking-capture" as "blocking", a capture open on a third stream from halfway
 * (ended at the end: "capture ok" or "capture broken"); with
 * "late-capture", async, and halfway one memset captured on that stream (a capture begun and ended
 * there, its graph destroyed); with "launch", a kernel launched by cuLaunchKernelEx on a stream of
 * its own instead of each memset, and with "coop" the same launch cooperative, and with "coop-query" the plain launch
 * after a cuOccupancyMaxActiveClusters of the cooperative configuration on its stream (a query: nothing moves);
 * with "work-first", sync, its first call to the host a memset on the legacy stream of an address it
 * does not hold (refused: work for a GPU it has no context on yet, which the host makes first).
 * IDLE: seconds it then stays without putting work on the GPU before it
 * exits (its output said first).
 *   spin SECONDS [MIB] [sync|async|capture|capture-stray|two|churn|blocking|blocking-many|blocking-capture|late-capture|
 *    launch|coop|coop-query|work-first] [IDLE] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A kernel that does nothing here (vadd over no elements: the simulated driver runs vadd). */
static const char PTX[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
			  ".visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n{\n ret;\n}\n";

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2.0;
	size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 4) << 20;
	if (!bytes)
		bytes = 4096; /* MIB 0: 4 KiB (a guest of many small calls) */
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	CUstream s = NULL, c = NULL;
	int stray = argc > 3 && !strcmp(argv[3], "capture-stray");
	int capture = stray || (argc > 3 && !strcmp(argv[3], "capture"));
	int two = argc > 3 && !strcmp(argv[3], "two"), churn = argc > 3 && !strcmp(argv[3], "churn");
	int many = argc > 3 && !strcmp(argv[3], "blocking-many");
	int bcap = argc > 3 && !strcmp(argv[3], "blocking-capture");
	int blocking = many || bcap || (argc > 3 && !strcmp(argv[3], "blocking"));
	CUstream ten[10] = {NULL};
	int late = argc > 3 && !strcmp(argv[3], "late-capture");
	int coop = argc > 3 && !strcmp(argv[3], "coop"), query = argc > 3 && !strcmp(argv[3], "coop-query");
	int launch = coop || query || (argc > 3 && !strcmp(argv[3], "launch"));
	int async = capture || two || churn || blocking || late || launch || (argc > 3 && !strcmp(argv[3], "async"));
	CUstream t = NULL;
	int first = argc > 3 && !strcmp(argv[3], "work-first");
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
	    (first && cuMemsetD8(4096, 0, 1) != CUDA_ERROR_INVALID_VALUE) || cuMemAlloc(&p, bytes) ||
	    (async && cuStreamCreate(&s, blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING)) ||
	    (two && cuStreamCreate(&t, CU_STREAM_NON_BLOCKING)) ||
	    (capture && (cuStreamCreate(&c, CU_STREAM_NON_BLOCKING) || cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL) ||
			 cuMemsetD8Async(p, 0, bytes, c)))) {
		fprintf(stderr, "spin: CUDA setup failed\n");
		return 1;
	}
	for (int i = 0; many && i < 10; i++)
		if (cuStreamCreate(&ten[i], CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
			fprintf(stderr, "spin: cuStreamCreate failed\n");
			return 1;
		}
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	if (launch && (cuModuleLoadData(&mod, PTX) != CUDA_SUCCESS || cuModuleGetFunction(&fn, mod, "vadd") != CUDA_SUCCESS)) {
		fprintf(stderr, "spin: the kernel did not load\n");
		return 1;
	}
	CUgraph none = NULL;
	if (stray && cuStreamEndCapture(s, &none) == CUDA_SUCCESS) {
		fprintf(stderr, "spin: a stream not being captured ended a capture\n");
		return 1;
	}
	unsigned long long ops = 0;
	double start = now(), end = start + secs;
	while (now() < end) {
		CUstream on = two && (ops & 1) ? t : blocking && (ops & 1) ? CU_STREAM_LEGACY : s;
		if (many)
			on = ops % 11 == 10 ? CU_STREAM_LEGACY : ten[ops % 11];
		if (churn && cuStreamCreate(&on, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
			fprintf(stderr, "spin: cuStreamCreate failed\n");
			return 1;
		}
		if (launch) {
			int n = 0;
			void *args[] = {&p, &p, &p, &n};
			CUlaunchAttribute at = {.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value.cooperative = 1};
			CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
					      .blockDimZ = 1, .hStream = on, .attrs = &at, .numAttrs = coop || query ? 1 : 0};
			int clusters = 0;
			if (query && cuOccupancyMaxActiveClusters(&clusters, fn, &cfg) != CUDA_SUCCESS) {
				fprintf(stderr, "spin: cuOccupancyMaxActiveClusters failed\n");
				return 1;
			}
			cfg.numAttrs = coop ? 1 : 0;
			if (cuLaunchKernelEx(&cfg, fn, args, NULL) != CUDA_SUCCESS) {
				fprintf(stderr, "spin: cuLaunchKernelEx failed\n");
				return 1;
			}
		} else if ((async ? cuMemsetD8Async(p, (unsigned char)ops, bytes, on) : cuMemsetD8(p, (unsigned char)ops, bytes)) !=
		    CUDA_SUCCESS) {
			fprintf(stderr, "spin: cuMemsetD8 failed\n");
			return 1;
		}
		if (bcap && !c && now() > start + secs / 2 &&
		    (cuStreamCreate(&c, CU_STREAM_NON_BLOCKING) || cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL) ||
		     cuMemsetD8Async(p, 0, bytes, c))) {
			fprintf(stderr, "spin: the capture did not begin\n");
			return 1;
		}
		if (late && now() > start + secs / 2) {
			CUgraph g = NULL;
			late = 0;
			if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS ||
			    cuMemsetD8Async(p, 7, bytes, s) != CUDA_SUCCESS || cuStreamEndCapture(s, &g) != CUDA_SUCCESS ||
			    !g || cuGraphDestroy(g) != CUDA_SUCCESS) {
				fprintf(stderr, "spin: the late capture failed\n");
				return 1;
			}
		}
		if (churn && cuStreamDestroy(on) != CUDA_SUCCESS) {
			fprintf(stderr, "spin: cuStreamDestroy failed\n");
			return 1;
		}
		ops++;
	}
	if (two && cuStreamSynchronize(t) != CUDA_SUCCESS) {
		fprintf(stderr, "spin: cuStreamSynchronize failed\n");
		return 1;
	}
	if (churn && cuCtxSynchronize() != CUDA_SUCCESS) {
		fprintf(stderr, "spin: cuCtxSynchronize failed\n");
		return 1;
	}
	if (async && cuStreamSynchronize(s) != CUDA_SUCCESS) {
		fprintf(stderr, "spin: cuStreamSynchronize failed\n");
		return 1;
	}
	printf("ops %llu secs %.3f\n", ops, now() - start); /* secs: until the last op is done */
	if (capture || (bcap && c)) {
		CUgraph g = NULL;
		CUresult r = cuStreamEndCapture(c, &g);
		printf("capture %s\n", r == CUDA_SUCCESS ? "ok" : "broken");
		if (g)
			cuGraphDestroy(g);
	}
	if (argc > 4) {
		double idle = atof(argv[4]);
		struct timespec t = {(time_t)idle, (long)((idle - (double)(time_t)idle) * 1e9)};
		fflush(stdout);
		nanosleep(&t, NULL);
	}
	return 0;
}
