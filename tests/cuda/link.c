/*
 * The CUDA linker from a plain driver-API program (links -lcuda; knows nothing of vmgpu): PTX linked
 * from memory with log buffers and options, the same PTX linked from its file, a relocatable cubin
 * linked from its file (if given), each loaded as a module whose vadd kernel is run and checked;
 * text that is not PTX refused with a log, a missing file refused.  Each link has one input, so
 * the simulated backend links it too.  It prints one line per step, the same natively and through
 * vmgpu (no addresses, sizes, times or log text).
 *
 *   link PTX_FILE [RELOCATABLE_CUBIN_FILE]
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transcript.h"

#define N 1000
#define LOG 8192

/* Load the linked cubin, run vadd on N elements and check c = a + b. */
static void run_vadd(const char *label, const void *cubin)
{
	char what[64];
	CUmodule mod;
	CUfunction fn;
	snprintf(what, sizeof what, "%s: cuModuleLoadData", label);
	CUresult r = cuModuleLoadData(&mod, cubin);
	step(what, r, CUDA_SUCCESS, NULL);
	if (r != CUDA_SUCCESS)
		return;
	snprintf(what, sizeof what, "%s: cuModuleGetFunction vadd", label);
	step(what, r = cuModuleGetFunction(&fn, mod, "vadd"), CUDA_SUCCESS, NULL);
	float a[N], b[N], c[N];
	for (int i = 0; i < N; i++) {
		a[i] = (float)i;
		b[i] = (float)(2 * i + 1);
		c[i] = -1;
	}
	CUdeviceptr da, db, dc;
	cuMemAlloc(&da, sizeof a);
	cuMemAlloc(&db, sizeof b);
	cuMemAlloc(&dc, sizeof c);
	cuMemcpyHtoD(da, a, sizeof a);
	cuMemcpyHtoD(db, b, sizeof b);
	int n = N;
	void *args[] = {&da, &db, &dc, &n};
	if (r == CUDA_SUCCESS) {
		snprintf(what, sizeof what, "%s: cuLaunchKernel", label);
		step(what, cuLaunchKernel(fn, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS, NULL);
	}
	cuMemcpyDtoH(c, dc, sizeof c);
	int good = 0;
	for (int i = 0; i < N; i++)
		good += c[i] == a[i] + b[i];
	snprintf(what, sizeof what, "%s: vadd results", label);
	check(what, good == N);
	cuMemFree(da);
	cuMemFree(db);
	cuMemFree(dc);
	cuModuleUnload(mod);
}

/* One link of one input (text from memory, or a file of the given type), loaded and run. */
static void link_one(const char *label, const char *text, CUjitInputType type, const char *path)
{
	char info[LOG] = "", error[LOG] = "", what[64];
	float wall = -1;
	CUjit_option opt[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
			      CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE, CU_JIT_WALL_TIME,
			      CU_JIT_OPTIMIZATION_LEVEL};
	void *val[] = {info, (void *)(uintptr_t)LOG, error, (void *)(uintptr_t)LOG, (void *)(uintptr_t)1, NULL,
		       (void *)(uintptr_t)3};
	unsigned nopt = text ? 7 : 0; /* the file links take the driver's defaults */
	CUlinkState link;
	snprintf(what, sizeof what, "%s: cuLinkCreate", label);
	CUresult r = cuLinkCreate(nopt, nopt ? opt : NULL, nopt ? val : NULL, &link);
	step(what, r, CUDA_SUCCESS, NULL);
	if (r != CUDA_SUCCESS)
		return;
	if (text) {
		snprintf(what, sizeof what, "%s: cuLinkAddData", label);
		step(what, cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)text, strlen(text) + 1, "vadd.ptx", 0, NULL, NULL),
		     CUDA_SUCCESS, NULL);
	} else {
		snprintf(what, sizeof what, "%s: cuLinkAddFile", label);
		step(what, cuLinkAddFile(link, type, path, 0, NULL, NULL), CUDA_SUCCESS, NULL);
	}
	void *cubin = NULL;
	size_t size = 0;
	snprintf(what, sizeof what, "%s: cuLinkComplete", label);
	step(what, r = cuLinkComplete(link, &cubin, &size), CUDA_SUCCESS, NULL);
	snprintf(what, sizeof what, "%s: a cubin", label);
	check(what, cubin && size > 0);
	if (text) {
		memcpy(&wall, &val[5], sizeof wall);
		snprintf(what, sizeof what, "%s: logs within their buffers", label);
		check(what, (uintptr_t)val[1] <= LOG && (uintptr_t)val[3] <= LOG && strlen(info) < LOG &&
				    strlen(error) < LOG);
		snprintf(what, sizeof what, "%s: wall time written", label);
		check(what, wall >= 0);
	}
	if (r == CUDA_SUCCESS && cubin)
		run_vadd(label, cubin); /* loaded before the link is destroyed, as the driver asks */
	snprintf(what, sizeof what, "%s: cuLinkDestroy", label);
	step(what, cuLinkDestroy(link), CUDA_SUCCESS, NULL);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: link PTX_FILE [RELOCATABLE_CUBIN_FILE]\n");
		return 2;
	}
	CUdevice dev;
	CUcontext ctx;
	step("cuInit", cuInit(0), CUDA_SUCCESS, NULL);
	cuDeviceGet(&dev, 0);
	step("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS, NULL);
	cuCtxSetCurrent(ctx);
	char *ptx = read_file(argv[1]);
	check("PTX file read", ptx != NULL);
	if (!ptx)
		return 1;

	link_one("ptx from memory", ptx, CU_JIT_INPUT_PTX, NULL);
	link_one("ptx from its file", NULL, CU_JIT_INPUT_PTX, argv[1]);
	if (argc > 2)
		link_one("cubin from its file", NULL, CU_JIT_INPUT_CUBIN, argv[2]);

	/* text that is not PTX: refused (when its input is added, or at the latest when the link
	 * completes), and the error log says something */
	char error[LOG] = "";
	CUjit_option opt[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *val[] = {error, (void *)(uintptr_t)LOG};
	CUlinkState link;
	step("bad ptx: cuLinkCreate", cuLinkCreate(2, opt, val, &link), CUDA_SUCCESS, NULL);
	static char junk[] = "this is not PTX at all\n";
	CUresult r = cuLinkAddData(link, CU_JIT_INPUT_PTX, junk, sizeof junk, "junk.ptx", 0, NULL, NULL);
	void *cubin = NULL;
	size_t size = 0;
	if (r == CUDA_SUCCESS)
		r = cuLinkComplete(link, &cubin, &size);
	check("bad ptx: refused", r != CUDA_SUCCESS);
	check("bad ptx: error log written", error[0] != '\0' && strlen(error) < LOG);
	step("bad ptx: cuLinkDestroy", cuLinkDestroy(link), CUDA_SUCCESS, NULL);

	step("missing file: cuLinkCreate", cuLinkCreate(0, NULL, NULL, &link), CUDA_SUCCESS, NULL);
	step("missing file: cuLinkAddFile", cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/vadd.ptx", 0, NULL, NULL),
	     CUDA_ERROR_FILE_NOT_FOUND, NULL);
	step("missing file: cuLinkDestroy", cuLinkDestroy(link), CUDA_SUCCESS, NULL);

	free(ptx);
	printf("%s\n", failures ? "link FAILED" : "link ok");
	return failures ? 1 : 0;
}
