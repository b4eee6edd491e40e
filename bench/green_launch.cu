// SPDX-License-Identifier: Apache-2.0
// What SM spans cost a guest whose speed is set by how fast it puts work on the GPU: the host
// time per launch, and the GPU time per small kernel, the ways a forwarder's worker puts a
// guest's work on a span (host_forwarder/native/partition.c) against the whole GPU.
//
//   green_launch [launches]   (again under an MPS control daemon for MPS clients, and with
//                              CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a limit to set beside a span)
//
// Issue rows (an empty kernel, one block, launches back to back; ns per launch on the host, then
// the time to the last one's end): the process's context current, its legacy stream (how a
// guest alone runs); a green context of every group current, its legacy stream; that green
// context made current before each launch and the process's after (a forwarder's default-stream
// work on a span, call by call); a stream of that green context, the process's context current
// (a forwarder's other streams on a span).
// Work rows (a kernel of 24 blocks per SM, three waves, of a few microseconds each, back to back
// on one stream): the time per kernel on the whole GPU and on spans of 16, 13 and 3 groups.
// One line per row: `row=NAME host_ns=.. end_ns=..`.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                                                           \
	do {                                                                                            \
		CUresult r_ = (x);                                                                      \
		if (r_ != CUDA_SUCCESS) {                                                               \
			const char *s_ = "?";                                                           \
			cuGetErrorName(r_, &s_);                                                        \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_);                 \
			exit(1);                                                                        \
		}                                                                                       \
	} while (0)

__global__ void empty(int) {}

__global__ void spin(unsigned long long cycles, int *out)
{
	unsigned long long t0 = clock64();
	while (clock64() - t0 < cycles)
		;
	if (threadIdx.x == 0 && cycles == 0)
		out[blockIdx.x] = 1;
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static CUfunction f_empty, f_spin;

static void launch_empty(CUstream s)
{
	int x = 0;
	void *args[] = {&x};
	CK(cuLaunchKernel(f_empty, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

// mode 0: ctx current, stream s; 1: around each launch, `green` current then `home` again
static void issue(const char *name, CUcontext home, CUcontext green, CUstream s, int around, int n)
{
	CK(cuCtxSetCurrent(green && !around ? green : home));
	for (int i = 0; i < 1000; i++)
		launch_empty(s);
	CK(cuCtxSynchronize());
	double t0 = now_ns();
	for (int i = 0; i < n; i++) {
		if (around)
			CK(cuCtxSetCurrent(green));
		launch_empty(s);
		if (around)
			CK(cuCtxSetCurrent(home));
	}
	double t1 = now_ns();
	CK(cuCtxSetCurrent(green && !around ? green : home));
	CK(cuCtxSynchronize());
	double t2 = now_ns();
	printf("row=%s host_ns=%.1f end_ns=%.1f\n", name, (t1 - t0) / n, (t2 - t0) / n);
	CK(cuCtxSetCurrent(home));
}

static void work(const char *name, CUcontext c, int sms, unsigned long long cycles, int *out, int n)
{
	CK(cuCtxSetCurrent(c));
	void *args[] = {&cycles, &out};
	unsigned blocks = 24u * (unsigned)sms; /* (three waves of 256-thread blocks at 8 per SM) */
	for (int i = 0; i < 50; i++)
		CK(cuLaunchKernel(f_spin, blocks, 1, 1, 256, 1, 1, 0, 0, args, NULL));
	CK(cuCtxSynchronize());
	double t0 = now_ns();
	for (int i = 0; i < n; i++)
		CK(cuLaunchKernel(f_spin, blocks, 1, 1, 256, 1, 1, 0, 0, args, NULL));
	CK(cuCtxSynchronize());
	printf("row=%s host_ns=0 end_ns=%.1f\n", name, (now_ns() - t0) / n);
}

static CUcontext green_of(CUdevice dev, CUdevResource *group, unsigned lo, unsigned hi, CUdevResource *rest,
			  int with_rest)
{
	CUdevResource use[70];
	unsigned n = 0;
	for (unsigned i = lo; i < hi; i++)
		use[n++] = group[i];
	if (with_rest)
		use[n++] = *rest;
	CUdevResourceDesc desc;
	CUgreenCtx g;
	CUcontext c = NULL;
	CUresult r = cuDevResourceGenerateDesc(&desc, use, n);
	if (r == CUDA_SUCCESS)
		r = cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
	if (r == CUDA_SUCCESS)
		r = cuCtxFromGreenCtx(&c, g);
	if (r != CUDA_SUCCESS) {
		const char *s = "?";
		cuGetErrorName(r, &s);
		printf("green_groups_%u_%u=%s\n", lo, hi, s);
		return NULL;
	}
	return c;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 200000;
	if (n < 1000) {
		fprintf(stderr, "launches: at least 1000\n");
		return 2;
	}
	CUdevice dev;
	CUcontext home;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&home, dev));
	CK(cuCtxSetCurrent(home));
	cudaFree(0); // (the runtime on the same context)
	CUkernel k;
	if (cudaGetKernel((cudaKernel_t *)&k, (const void *)empty) != cudaSuccess)
		return 1;
	f_empty = (CUfunction)k;
	if (cudaGetKernel((cudaKernel_t *)&k, (const void *)spin) != cudaSuccess)
		return 1;
	f_spin = (CUfunction)k;

	CUdevResource all, group[64], rest;
	unsigned groups = 0;
	CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
	CK(cuDevSmResourceSplitByCount(NULL, &groups, &all, NULL, 0, all.sm.smCoscheduledAlignment));
	if (groups < 4 || groups > 64) {
		fprintf(stderr, "%u groups of SMs: this program needs 4 to 64\n", groups);
		return 1;
	}
	CK(cuDevSmResourceSplitByCount(group, &groups, &all, &rest, 0, all.sm.smCoscheduledAlignment));
	int with_rest = rest.type == CU_DEV_RESOURCE_TYPE_SM && rest.sm.smCount > 0;
	unsigned per = group[0].sm.smCount;
	printf("gpu_sms=%u groups=%u group_sms=%u rest_sms=%u\n", all.sm.smCount, groups, per,
	       with_rest ? rest.sm.smCount : 0);
	CUcontext whole = green_of(dev, group, 0, groups, &rest, with_rest);
	CUcontext most = green_of(dev, group, 3, groups, &rest, with_rest);
	CUcontext few = green_of(dev, group, 0, 3, &rest, 0);
	CUstream gs = NULL;
	if (whole) {
		CK(cuCtxSetCurrent(whole));
		CK(cuStreamCreate(&gs, CU_STREAM_NON_BLOCKING));
		CK(cuCtxSetCurrent(home));
	}
	CUstream hs;
	CK(cuStreamCreate(&hs, CU_STREAM_NON_BLOCKING));

	for (int rep = 0; rep < 2; rep++) {
		issue("own_ctx_legacy", home, NULL, CU_STREAM_LEGACY, 0, n);
		issue("own_ctx_stream", home, NULL, hs, 0, n);
		if (!whole)
			continue;
		issue("green_current_legacy", home, whole, CU_STREAM_LEGACY, 0, n);
		issue("green_around_each_legacy", home, whole, CU_STREAM_LEGACY, 1, n);
		issue("green_stream_own_current", home, NULL, gs, 0, n);
	}
	int *out;
	CK(cuCtxSetCurrent(home));
	CK(cuMemAlloc((CUdeviceptr *)&out, 4 * 4096));
	int sms = (int)all.sm.smCount;
	unsigned long long cycles[] = {2000, 8000};
	for (int c = 0; c < 2; c++) {
		char name[64];
		snprintf(name, sizeof name, "work%llu_whole_gpu", cycles[c]);
		work(name, home, sms, cycles[c], out, n / 20);
		snprintf(name, sizeof name, "work%llu_span_all", cycles[c]);
		if (whole)
			work(name, whole, sms, cycles[c], out, n / 20);
		snprintf(name, sizeof name, "work%llu_span_%u_groups_and_the_rest", cycles[c], groups - 3);
		if (most)
			work(name, most, sms, cycles[c], out, n / 20);
		snprintf(name, sizeof name, "work%llu_span_3_groups", cycles[c]);
		if (few)
			work(name, few, sms, cycles[c], out, n / 20);
	}
	return 0;
}
