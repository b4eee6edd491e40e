/* A guest that keeps the GPU busy: cuMemsetD8 over a buffer, again and again, for SECONDS,
 * then prints "ops N" (how many it finished).  Works on the simulated backend, where a
 * memset is CPU time inside the forwarder: what the compute scheduler shares out.
 *   spin SECONDS [MIB]   */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
	    cuMemAlloc(&p, bytes)) {
		fprintf(stderr, "spin: CUDA setup failed\n");
		return 1;
	}
	unsigned long long ops = 0;
	double end = now() + secs;
	while (now() < end) {
		if (cuMemsetD8(p, (unsigned char)ops, bytes) != CUDA_SUCCESS) {
			fprintf(stderr, "spin: cuMemsetD8 failed\n");
			return 1;
		}
		ops++;
	}
	printf("ops %llu\n", ops);
	return 0;
}
