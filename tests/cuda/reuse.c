/*
 * cuMemFree and the next cuMemAlloc of the same size, as a guest sees them through vmgpu (the
 * forwarder keeps a freed block for the process's next allocation of its size: alloc.c).
 * Prints one "key value" line per step and waits for a line on stdin where it says "wait":
 *   freed_memset R    a memset of the freed block's address (must be refused)
 *   wait freed        the block is freed; the test reads the books
 *   reuse same|new    the next cuMemAlloc of the same size gave the same block or another
 *   info_delta N      cuMemGetInfo's free before the first alloc less its free after the free
 *   double_free R     cuMemFree of the same block again
 *   bogus_free R      cuMemFree of an address that was never allocated
 *   wait idle         all freed; the test waits for the books to drop
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static void step(const char *key, long long v)
{
	printf("%s %lld\n", key, v);
	fflush(stdout);
}

static void wait_line(const char *what)
{
	char line[64];
	printf("wait %s\n", what);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		exit(2);
}

int main(void)
{
	const size_t n = 4u << 20;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr a, b;
	size_t free0, free1, total;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
	    cuMemGetInfo(&free0, &total) || cuMemAlloc(&a, n) || cuMemsetD8(a, 7, n) || cuMemFree(a)) {
		fprintf(stderr, "reuse: CUDA setup failed\n");
		return 1;
	}
	step("freed_memset", cuMemsetD8(a, 0, 16));
	cuMemGetInfo(&free1, &total);
	step("info_delta", (long long)free0 - (long long)free1);
	wait_line("freed");
	if (cuMemAlloc(&b, n))
		return 1;
	printf("reuse %s\n", b == a ? "same" : "new");
	step("memset_again", cuMemsetD8(b, 1, n));
	step("free", cuMemFree(b));
	step("double_free", cuMemFree(b));
	step("bogus_free", cuMemFree(b + 4096));
	wait_line("idle");
	return 0;
}
