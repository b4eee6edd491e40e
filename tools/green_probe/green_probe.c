/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What green contexts do on this GPU and driver, for the forwarder's SM partitions (issue 20).
 *
 *   green_probe mech N           each question below, one line each (key=value)
 *   green_probe pair first|rest N SECONDS
 *                                spin kernels on a green context of the first N SMs, or of the
 *                                rest; kernels a second and the SMs they ran on (two of these
 *                                side by side as MPS clients: are the partitions disjoint?)
 *   green_probe solo full|first|rest N SECONDS   the same alone (full: the primary context)
 *
 * Questions (mech): can a green context be made here (and under MPS); what does it cost; does
 * a kernel of a module loaded in the primary context run on a green context's stream, with
 * either context current; does memory of either work in the other; does the green context's
 * default stream keep to its SMs; does the primary context's synchronise wait for green work.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *PTX = ".version 7.0\n.target sm_70\n.address_size 64\n"
			 ".visible .entry smid_spin(.param .u64 out, .param .u64 cycles)\n{\n"
			 " .reg .pred %p<3>;\n .reg .b32 %r<4>;\n .reg .b64 %rd<8>;\n"
			 " ld.param.u64 %rd1, [out];\n ld.param.u64 %rd2, [cycles];\n"
			 " cvta.to.global.u64 %rd1, %rd1;\n mov.u64 %rd3, %clock64;\n"
			 "L1:\n mov.u64 %rd4, %clock64;\n sub.s64 %rd5, %rd4, %rd3;\n"
			 " setp.lt.s64 %p1, %rd5, %rd2;\n @%p1 bra L1;\n"
			 " mov.u32 %r3, %tid.x;\n setp.ne.s32 %p2, %r3, 0;\n @%p2 bra DONE;\n"
			 " mov.u32 %r1, %smid;\n mov.u32 %r2, %ctaid.x;\n mul.wide.u32 %rd6, %r2, 4;\n"
			 " add.s64 %rd7, %rd1, %rd6;\n st.global.u32 [%rd7], %r1;\nDONE:\n ret;\n}\n";

#define BLOCKS 2048
static CUdevice dev;
static CUcontext prim;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static const char *err(CUresult r)
{
	const char *s = NULL;
	cuGetErrorName(r, &s);
	return s ? s : "?";
}

/* launch smid_spin on s (BLOCKS blocks of 128), wait, and count the distinct SMs it used */
static int sms_used(CUfunction f, CUstream s, CUdeviceptr out, uint64_t cycles, CUresult *rc, char *mask, size_t masklen)
{
	uint32_t ids[BLOCKS];
	cuMemsetD32(out, 0xffffffff, BLOCKS);
	void *args[] = {&out, &cycles};
	*rc = cuLaunchKernel(f, BLOCKS, 1, 1, 128, 1, 1, 0, s, args, NULL);
	if (*rc == CUDA_SUCCESS)
		*rc = cuStreamSynchronize(s);
	if (*rc != CUDA_SUCCESS)
		return -1;
	if ((*rc = cuMemcpyDtoH(ids, out, sizeof ids)) != CUDA_SUCCESS)
		return -1;
	unsigned char seen[1024] = {0};
	int n = 0;
	for (int i = 0; i < BLOCKS; i++)
		if (ids[i] < 1024 && !seen[ids[i]]++)
			n++;
	if (mask) {
		size_t o = 0;
		for (int i = 0; i < 1024 && o + 8 < masklen; i++)
			if (seen[i])
				o += snprintf(mask + o, masklen - o, "%s%d", o ? "," : "", i);
	}
	return n;
}

static CUgreenCtx green(int n, int rest, int *got, double *us)
{
	CUdevResource all, grp, rem;
	unsigned int nb = 1;
	memset(&grp, 0, sizeof grp);
	memset(&rem, 0, sizeof rem);
	CUresult r = cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
	if (r == CUDA_SUCCESS)
		r = cuDevSmResourceSplitByCount(&grp, &nb, &all, &rem, 0, n);
	if (r != CUDA_SUCCESS) {
		printf("split=%s\n", err(r));
		return NULL;
	}
	CUdevResource *use = rest ? &rem : &grp;
	*got = use->sm.smCount;
	CUdevResourceDesc d;
	CUgreenCtx g = NULL;
	double t0 = now();
	r = cuDevResourceGenerateDesc(&d, use, 1);
	if (r == CUDA_SUCCESS)
		r = cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM);
	*us = (now() - t0) * 1e6;
	if (r != CUDA_SUCCESS) {
		printf("green_create=%s\n", err(r));
		return NULL;
	}
	return g;
}

#define SAY(k, r) printf("%s=%s\n", k, err(r))

static int mech(int n)
{
	CUdevResource all;
	CUresult r = cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
	SAY("get_resource", r);
	if (r)
		return 1;
	printf("sm_count=%u min_partition=%u alignment=%u\n", all.sm.smCount, all.sm.minSmPartitionSize,
	       all.sm.smCoscheduledAlignment);
	int got = 0;
	double us = 0;
	CUgreenCtx g = green(n, 0, &got, &us);
	if (!g)
		return 1;
	printf("green_sms=%d asked=%d create_us=%.0f\n", got, n, us);
	CUcontext gc;
	SAY("from_green", cuCtxFromGreenCtx(&gc, g));
	printf("green_ctx_is_primary=%d\n", gc == prim);

	CUmodule m;
	CUfunction f;
	CUlibrary lib;
	CUkernel k;
	CUdeviceptr out, out_g;
	SAY("module_primary", cuModuleLoadData(&m, PTX));
	SAY("function_primary", cuModuleGetFunction(&f, m, "smid_spin"));
	SAY("library", cuLibraryLoadData(&lib, PTX, NULL, NULL, 0, NULL, NULL, 0));
	SAY("library_kernel", cuLibraryGetKernel(&k, lib, "smid_spin"));
	SAY("alloc_primary", cuMemAlloc(&out, BLOCKS * 4));

	CUstream sg, sp;
	double t0 = now();
	SAY("green_stream", cuGreenCtxStreamCreate(&sg, g, CU_STREAM_NON_BLOCKING, 0));
	printf("green_stream_us=%.0f\n", (now() - t0) * 1e6);
	SAY("primary_stream", cuStreamCreate(&sp, CU_STREAM_NON_BLOCKING));
	char mask[4096];
	int u;
	u = sms_used(f, sp, out, 100000, &r, NULL, 0);
	printf("primary_stream_sms=%d rc=%s\n", u, err(r));
	u = sms_used(f, sg, out, 100000, &r, mask, sizeof mask);
	printf("module_fn_on_green_stream_primary_current_sms=%d rc=%s\n", u, err(r));
	printf("green_mask=%s\n", mask);
	u = sms_used((CUfunction)k, sg, out, 100000, &r, NULL, 0);
	printf("library_kernel_on_green_stream_primary_current_sms=%d rc=%s\n", u, err(r));

	SAY("set_green_current", cuCtxSetCurrent(gc));
	u = sms_used(f, sg, out, 100000, &r, NULL, 0);
	printf("module_fn_on_green_stream_green_current_sms=%d rc=%s\n", u, err(r));
	u = sms_used((CUfunction)k, sg, out, 100000, &r, NULL, 0);
	printf("library_kernel_on_green_stream_green_current_sms=%d rc=%s\n", u, err(r));
	u = sms_used((CUfunction)k, NULL, out, 100000, &r, NULL, 0);
	printf("library_kernel_on_null_stream_green_current_sms=%d rc=%s\n", u, err(r));
	u = sms_used(f, NULL, out, 100000, &r, NULL, 0);
	printf("module_fn_on_null_stream_green_current_sms=%d rc=%s\n", u, err(r));
	u = sms_used(f, sp, out, 100000, &r, NULL, 0);
	printf("module_fn_on_primary_stream_green_current_sms=%d rc=%s\n", u, err(r));
	SAY("alloc_green_current", cuMemAlloc(&out_g, BLOCKS * 4));
	CUmodule mg;
	CUfunction fg;
	SAY("module_green_current", cuModuleLoadData(&mg, PTX));
	SAY("function_green_current", cuModuleGetFunction(&fg, mg, "smid_spin"));
	SAY("set_primary_current", cuCtxSetCurrent(prim));
	u = sms_used(f, sp, out_g, 100000, &r, NULL, 0);
	printf("green_memory_on_primary_stream_sms=%d rc=%s\n", u, err(r));
	u = sms_used(fg, sp, out, 100000, &r, NULL, 0);
	printf("green_module_fn_on_primary_stream_sms=%d rc=%s\n", u, err(r));
	u = sms_used(fg, sg, out, 100000, &r, NULL, 0);
	printf("green_module_fn_on_green_stream_primary_current_sms=%d rc=%s\n", u, err(r));
	CUcontext pc = NULL;
	r = cuPointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, out_g);
	printf("green_memory_ctx_is_primary=%d is_green=%d rc=%s\n", pc == prim, pc == gc, err(r));

	/* the primary context's synchronise and a green stream's work */
	uint64_t cyc = 2000000000ull; /* about a second */
	void *args[] = {&out, &cyc};
	r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, sg, args, NULL);
	t0 = now();
	CUresult rs = cuCtxSynchronize();
	double dt = now() - t0;
	printf("ctx_sync_waits_green_s=%.3f launch=%s sync=%s query_after=%s\n", dt, err(r), err(rs),
	       err(cuStreamQuery(sg)));
	/* an event of the primary stream waited on by the green stream, and the reverse */
	CUevent e;
	SAY("event", cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, sp, args, NULL);
	SAY("record_primary", cuEventRecord(e, sp));
	SAY("green_waits_primary_event", cuStreamWaitEvent(sg, e, 0));
	uint64_t small = 1000;
	void *args2[] = {&out, &small};
	cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, sg, args2, NULL);
	t0 = now();
	cuStreamSynchronize(sg);
	printf("green_after_primary_event_waited_s=%.3f (about 1 if ordered)\n", now() - t0);
	SAY("record_green", cuEventRecord(e, sg));
	SAY("primary_waits_green_event", cuStreamWaitEvent(sp, e, 0));
	cuCtxSynchronize();

	/* making and unmaking one, timed: could a worker resize live by making a new one? */
	double tc = 0, td = 0;
	for (int i = 0; i < 5; i++) {
		int got2;
		double c;
		CUgreenCtx g2 = green(n + 8 * (i % 2), 0, &got2, &c);
		if (!g2)
			break;
		tc += c;
		t0 = now();
		cuGreenCtxDestroy(g2);
		td += (now() - t0) * 1e6;
	}
	printf("remake_create_us=%.0f destroy_us=%.0f (mean of 5)\n", tc / 5, td / 5);

	/* throughput: a grid of spinning blocks, full vs the partition */
	for (int side = 0; side < 2; side++) {
		CUstream s = side ? sg : sp;
		uint64_t c = 20000;
		void *a[] = {&out, &c};
		cuStreamSynchronize(s);
		t0 = now();
		for (int i = 0; i < 200; i++)
			cuLaunchKernel(f, BLOCKS * 4, 1, 1, 256, 1, 1, 0, s, a, NULL);
		cuStreamSynchronize(s);
		printf("%s_grid_ms=%.3f\n", side ? "green" : "primary", (now() - t0) * 1e3 / 200);
	}
	return 0;
}

static int spin(const char *how, int n, double secs)
{
	int got = 0;
	double us = 0;
	CUstream s = NULL;
	if (strcmp(how, "full")) {
		CUgreenCtx g = green(n, !strcmp(how, "rest"), &got, &us);
		if (!g)
			return 1;
		CUresult r = cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0);
		if (r) {
			SAY("green_stream", r);
			return 1;
		}
	} else {
		cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	}
	CUmodule m;
	CUfunction f;
	CUdeviceptr out;
	cuModuleLoadData(&m, PTX);
	cuModuleGetFunction(&f, m, "smid_spin");
	cuMemAlloc(&out, BLOCKS * 16);
	uint64_t c = 20000;
	void *a[] = {&out, &c};
	double t0 = now();
	long k = 0;
	while (now() - t0 < secs) {
		for (int i = 0; i < 20; i++, k++)
			cuLaunchKernel(f, BLOCKS * 4, 1, 1, 256, 1, 1, 0, s, a, NULL);
		cuStreamSynchronize(s);
	}
	double dt = now() - t0;
	char mask[4096];
	CUresult r;
	int u = sms_used(f, s, out, 100000, &r, mask, sizeof mask);
	printf("%s sms=%d kernels_per_s=%.1f used=%d rc=%s mask=%s\n", how, got, k / dt, u, err(r), mask);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: green_probe mech N | pair first|rest N SECONDS | solo full|first|rest N SECONDS\n");
		return 2;
	}
	CUresult r = cuInit(0);
	if (r == CUDA_SUCCESS)
		r = cuDeviceGet(&dev, 0);
	if (r == CUDA_SUCCESS)
		r = cuDevicePrimaryCtxRetain(&prim, dev);
	if (r == CUDA_SUCCESS)
		r = cuCtxSetCurrent(prim);
	if (r != CUDA_SUCCESS) {
		printf("init=%s\n", err(r));
		return 1;
	}
	if (!strcmp(argv[1], "mech"))
		return mech(atoi(argv[2]));
	if ((!strcmp(argv[1], "pair") || !strcmp(argv[1], "solo")) && argc == 5)
		return spin(argv[2], atoi(argv[3]), atof(argv[4]));
	fprintf(stderr, "green_probe: unknown use\n");
	return 2;
}
