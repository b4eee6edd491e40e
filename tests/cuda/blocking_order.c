/* Whether a stream made without CU_STREAM_NON_BLOCKING keeps its implicit order with the legacy
 * stream (each waits for what was put on the other before), on a real GPU.  ROUNDS times: a slow
 * kernel on the legacy stream sets x[0] = i and a kernel on the blocking stream then copies x[0]
 * into a[i]; a slow kernel on the blocking stream sets x[1] = i and a kernel on the legacy stream
 * then copies x[1] into b[i].  With the order every a[i] and b[i] is i.  Prints "order ok ROUNDS"
 * or "order broken N ROUNDS" (N copies saw an older value).  With "nonblocking" the stream is made
 * with CU_STREAM_NON_BLOCKING: there is no order then, and a GPU that overlaps the two shows it
 * broken (so the check can fail).  Exit 77 where no GPU runs the kernels.
 *   blocking_order [ROUNDS] [blocking|nonblocking] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char PTX[] =
	".version 7.0\n.target sm_70\n.address_size 64\n"
	".visible .entry slow_set(.param .u64 p, .param .u32 v, .param .u32 n)\n{\n"
	" .reg .u32 %r<4>;\n .reg .u64 %rd<3>;\n .reg .pred %q;\n"
	" ld.param.u64 %rd1, [p];\n cvta.to.global.u64 %rd2, %rd1;\n ld.param.u32 %r1, [v];\n"
	" ld.param.u32 %r2, [n];\n mov.u32 %r3, 0;\n"
	"L: setp.ge.u32 %q, %r3, %r2;\n @%q bra D;\n nanosleep.u32 1000;\n add.u32 %r3, %r3, 1;\n bra L;\n"
	"D: st.global.u32 [%rd2], %r1;\n ret;\n}\n"
	".visible .entry copy(.param .u64 dst, .param .u64 src)\n{\n"
	" .reg .u32 %r1;\n .reg .u64 %rd<5>;\n"
	" ld.param.u64 %rd1, [dst];\n cvta.to.global.u64 %rd2, %rd1;\n"
	" ld.param.u64 %rd3, [src];\n cvta.to.global.u64 %rd4, %rd3;\n"
	" ld.volatile.global.u32 %r1, [%rd4];\n st.global.u32 [%rd2], %r1;\n ret;\n}\n";

static int launch(CUfunction f, CUstream s, void **args)
{
	return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL) != CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
	unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 200;
	int nonblocking = argc > 2 && !strcmp(argv[2], "nonblocking");
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction slow, copy;
	CUstream s;
	CUdeviceptr x, a, b;
	if (!rounds || rounds > 100000)
		rounds = 200;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
		fprintf(stderr, "blocking_order: no CUDA device\n");
		return 77;
	}
	if (cuModuleLoadData(&mod, PTX) || cuModuleGetFunction(&slow, mod, "slow_set") ||
	    cuModuleGetFunction(&copy, mod, "copy") ||
	    cuStreamCreate(&s, nonblocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT) || cuMemAlloc(&x, 8) ||
	    cuMemAlloc(&a, rounds * 4) || cuMemAlloc(&b, rounds * 4) || cuMemsetD8(x, 0xff, 8) ||
	    cuMemsetD8(a, 0xff, rounds * 4) || cuMemsetD8(b, 0xff, rounds * 4)) {
		fprintf(stderr, "blocking_order: CUDA setup failed\n");
		return 1;
	}
	unsigned spins = 100; /* ~0.1 ms of nanosleep before each set */
	CUdeviceptr x1 = x + 4;
	for (unsigned i = 0; i < rounds; i++) {
		CUdeviceptr ai = a + 4 * i, bi = b + 4 * i;
		void *set0[] = {&x, &i, &spins}, *cp0[] = {&ai, &x}, *set1[] = {&x1, &i, &spins}, *cp1[] = {&bi, &x1};
		if (launch(slow, CU_STREAM_LEGACY, set0) || launch(copy, s, cp0) || launch(slow, s, set1) ||
		    launch(copy, CU_STREAM_LEGACY, cp1)) {
			fprintf(stderr, "blocking_order: a launch failed\n");
			return 1;
		}
	}
	unsigned *ha = malloc(rounds * 4), *hb = malloc(rounds * 4);
	if (!ha || !hb || cuCtxSynchronize() || cuMemcpyDtoH(ha, a, rounds * 4) || cuMemcpyDtoH(hb, b, rounds * 4)) {
		fprintf(stderr, "blocking_order: the results did not come back\n");
		return 1;
	}
	unsigned bad = 0;
	for (unsigned i = 0; i < rounds; i++)
		bad += (ha[i] != i) + (hb[i] != i);
	if (bad)
		printf("order broken %u %u\n", bad, rounds);
	else
		printf("order ok %u\n", rounds);
	return 0;
}
