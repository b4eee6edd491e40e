/* What the two-process test programs (ipc_pair.c, vmm_fd_pair.c) share: a step printed as
 * "<who> <step> <CUresult>" and remembered if it failed, and a process's context on its GPU. */
#ifndef PAIR_STEPS_H
#define PAIR_STEPS_H

#include <cuda.h>
#include <stdio.h>

static int failed;

static CUresult step(const char *who, const char *what, CUresult r)
{
	printf("%s %s %d\n", who, what, (int)r);
	fflush(stdout);
	failed |= r != CUDA_SUCCESS;
	return r;
}

static int context(int gpu, const char *who)
{
	CUdevice dev;
	CUcontext ctx;
	if (step(who, "init", cuInit(0)) || step(who, "device", cuDeviceGet(&dev, gpu)) ||
	    step(who, "context", cuDevicePrimaryCtxRetain(&ctx, dev)) || step(who, "current", cuCtxSetCurrent(ctx)))
		return -1;
	return 0;
}

#endif
