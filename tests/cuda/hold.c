/*
 * A CUDA driver-API program that allocates device memory and then waits:
 *   hold MiB      allocate, print "held <free> <total>", then for each stdin line
 *                 try one more 1 MiB cuMemAlloc and print its CUresult.
 *   hold 0        print "free <free> <total>" (cuMemGetInfo) and exit.
 *   hold MiB stay as the first, but a process that is refused stays until stdin ends (an
 *                 idle process that caught its error), printing "init failed" or "alloc failed".
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 0, free_b = 0, total = 0;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	int stay = argc > 2 && !strcmp(argv[2], "stay");
	const char *failed = NULL;
	char line[64];
	CUresult r = CUDA_SUCCESS;
	if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
	    (r = cuCtxSetCurrent(ctx)))
		failed = "init failed";
	else if (mib && (r = cuMemAlloc(&p, mib << 20)))
		failed = "alloc failed";
	if (failed) {
		printf("%s\n", failed);
		fprintf(stderr, "hold: %s: CUresult %d\n", failed, (int)r); /* (which error: stdout stays as it was) */
		fflush(stdout);
		while (stay && fgets(line, sizeof line, stdin))
			;
		return 1;
	}
	cuMemGetInfo(&free_b, &total);
	printf("%s %zu %zu\n", mib ? "held" : "free", free_b, total);
	fflush(stdout);
	if (!mib)
		return 0;
	while (fgets(line, sizeof line, stdin)) {
		r = cuMemAlloc(&p, 1 << 20);
		printf("alloc %d\n", (int)r);
		fflush(stdout);
	}
	return 0;
}
