/*
 * cuMemFree and the next cuMemAlloc of the same size, as a guest sees them through vmgpu (the
 * forwarder keeps a freed block for the process's next allocation of its size: alloc.c).
 * Prints one "key value" line per step and waits for a line on stdin where it says "wait":
 *   freed_memset R    a memset of the freed block's address (must be refused)
 *   wait freed        the block is freed; the test reads the charges
 *   reuse same|new    the next cuMemAlloc of the same size gave the same block or another
 *   info_delta N      cuMemGetInfo's free before the first alloc less its free after the free
 *   double_free R     cuMemFree of the same block again
 *   bogus_free R      cuMemFree of an address that was never allocated
 *   wait idle         all freed; the test waits for the charges to drop
 * reuse others MIB: a 48 MiB block freed (kept) just before MIB MiB are asked of each of the
 * other ways to allocate; prints "pitch R" and "async R" (the kept block must give way to them
 * as the driver's free would have).
 * reuse fork: a child forked after the parent allocated frees the parent's block (not its own:
 * refused at once, "child_free R") and then synchronises ("child_sync R").
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int setup(CUcontext *ctx)
{
	CUdevice dev;
	return cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(ctx, dev) || cuCtxSetCurrent(*ctx);
}

/* A kept block must not stand in the way of the process's other allocations. */
static int others(size_t mib)
{
	const size_t kept = 48u << 20;
	CUdeviceptr a, p;
	size_t pitch;
	if (cuMemAlloc(&a, kept) || cuMemFree(a))
		return 1;
	CUresult r = cuMemAllocPitch(&p, &pitch, 1u << 20, mib, 4);
	step("pitch", r);
	if (r == CUDA_SUCCESS && cuMemFree(p))
		return 1;
	if (cuMemAlloc(&a, kept) || cuMemFree(a))
		return 1;
	r = cuMemAllocAsync(&p, mib << 20, NULL);
	step("async", r);
	if (r == CUDA_SUCCESS && (cuMemFreeAsync(p, NULL) || cuStreamSynchronize(NULL)))
		return 1;
	return 0;
}

/* A forked child connects afresh: the parent's blocks are not its own. */
static int forked(void)
{
	CUdeviceptr a;
	CUcontext ctx;
	if (cuMemAlloc(&a, 4096))
		return 1;
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		if (setup(&ctx))
			_exit(3);
		step("child_free", cuMemFree(a));
		step("child_sync", cuCtxSynchronize());
		_exit(0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		return 1;
	return cuMemFree(a) != CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
	const size_t n = 4u << 20;
	CUcontext ctx;
	CUdeviceptr a, b;
	size_t free0, free1, total;
	if (argc > 2 && !strcmp(argv[1], "others"))
		return setup(&ctx) || others((size_t)atoi(argv[2]));
	if (argc > 1 && !strcmp(argv[1], "fork"))
		return setup(&ctx) || forked();
	if (setup(&ctx) ||
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
