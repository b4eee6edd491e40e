/*
 * The JIT options of module and library loads from a plain driver-API program (links -lcuda; knows
 * nothing of vmgpu): PTX loaded by cuModuleLoadDataEx with both logs, their sizes, the wall time, a
 * verbose log and an optimisation level; text that is not PTX refused with an error log, then with
 * a log buffer of 16 bytes, which the log may not pass; PTX loaded by cuLibraryLoadData with JIT
 * options and CU_LIBRARY_BINARY_IS_PRESERVED (as cudart gives it), and by cuLibraryLoadFromFile, to
 * which that option is CUDA_ERROR_INVALID_VALUE; a library of text that is not PTX, whose error log
 * comes with its load (the H100's driver loads it and refuses its kernels); options counted but not
 * given.  It prints one line per step, the same natively and through vmgpu (no log text, sizes or
 * times).
 *
 *   jit_load PTX_FILE
 */
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#include "transcript.h"

#define LOG 8192

/* A load's options: both logs (info, error) of `cap` bytes, a verbose log, the wall time and an
 * optimisation level. */
struct jit {
	CUjit_option opt[7];
	void *val[7];
};

static void jit_init(struct jit *j, char *info, char *error, unsigned cap)
{
	CUjit_option opt[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
			      CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE, CU_JIT_WALL_TIME,
			      CU_JIT_OPTIMIZATION_LEVEL};
	void *val[] = {info, (void *)(uintptr_t)cap, error, (void *)(uintptr_t)cap, (void *)(uintptr_t)1, NULL,
		       (void *)(uintptr_t)3};
	memcpy(j->opt, opt, sizeof opt);
	memcpy(j->val, val, sizeof val);
}

static uintptr_t info_size(const struct jit *j) { return (uintptr_t)j->val[1]; }
static uintptr_t error_size(const struct jit *j) { return (uintptr_t)j->val[3]; }

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: jit_load PTX_FILE\n");
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
	static char info[LOG], error[LOG];
	static char junk[] = "this is not PTX at all\n";
	struct jit j;

	/* PTX with every log option: loaded, the logs within their buffers */
	CUmodule mod;
	CUfunction fn;
	jit_init(&j, info, error, LOG);
	CUresult r = cuModuleLoadDataEx(&mod, ptx, 7, j.opt, j.val);
	step("module: cuModuleLoadDataEx", r, CUDA_SUCCESS, NULL);
	check("module: logs within buffers", info_size(&j) <= LOG && error_size(&j) <= LOG && strlen(info) < LOG &&
						     strlen(error) < LOG);
	if (r == CUDA_SUCCESS) {
		step("module: cuModuleGetFunction", cuModuleGetFunction(&fn, mod, "vadd"), CUDA_SUCCESS, NULL);
		step("module: cuModuleUnload", cuModuleUnload(mod), CUDA_SUCCESS, NULL);
	}

	/* text that is not PTX: refused, and the error log says something within its buffer */
	memset(error, 0, sizeof error);
	jit_init(&j, info, error, LOG);
	r = cuModuleLoadDataEx(&mod, junk, 7, j.opt, j.val);
	check("bad ptx: refused", r != CUDA_SUCCESS);
	check("bad ptx: error log written", error[0] != '\0' && strlen(error) < LOG && error_size(&j) > 0 &&
						    error_size(&j) <= LOG);

	/* the same with logs of 16 bytes in buffers of 32: nothing written past the 16 */
	char small_info[32], small_error[32];
	memset(small_info, 'Z', sizeof small_info);
	memset(small_error, 'Z', sizeof small_error);
	jit_init(&j, small_info, small_error, 16);
	r = cuModuleLoadDataEx(&mod, junk, 7, j.opt, j.val);
	check("small log: refused", r != CUDA_SUCCESS);
	int past = 0;
	for (int i = 16; i < 32; i++)
		past += small_info[i] != 'Z' || small_error[i] != 'Z';
	check("small log: cut within 16", memchr(small_error, 0, 16) != NULL && error_size(&j) <= 16 && !past);

	/* options counted but not given */
	step("no arrays: LoadDataEx", cuModuleLoadDataEx(&mod, ptx, 2, NULL, NULL), CUDA_ERROR_INVALID_VALUE, NULL);

	/* a library with JIT options and the option cudart gives; from its file, where that option is
	 * refused, and without it */
	CUlibrary lib;
	CUkernel kernel;
	CUlibraryOption preserved[] = {CU_LIBRARY_BINARY_IS_PRESERVED};
	void *yes[] = {(void *)(uintptr_t)1};
	jit_init(&j, info, error, LOG);
	r = cuLibraryLoadData(&lib, ptx, j.opt, j.val, 7, preserved, yes, 1);
	step("library: cuLibraryLoadData", r, CUDA_SUCCESS, NULL);
	check("library: logs within buffers", info_size(&j) <= LOG && error_size(&j) <= LOG);
	if (r == CUDA_SUCCESS) {
		step("library: cuLibraryGetKernel", cuLibraryGetKernel(&kernel, lib, "vadd"), CUDA_SUCCESS, NULL);
		step("library: cuLibraryUnload", cuLibraryUnload(lib), CUDA_SUCCESS, NULL);
	}
	memset(error, 0, sizeof error);
	jit_init(&j, info, error, LOG);
	r = cuLibraryLoadData(&lib, junk, j.opt, j.val, 7, NULL, NULL, 0);
	check("library bad ptx: error log", error[0] != '\0' && strlen(error) < LOG && error_size(&j) > 0 &&
						    error_size(&j) <= LOG);
	check("library bad ptx: no kernel", r != CUDA_SUCCESS || cuLibraryGetKernel(&kernel, lib, "vadd") != CUDA_SUCCESS);
	if (r == CUDA_SUCCESS)
		cuLibraryUnload(lib);
	step("library file, preserved", cuLibraryLoadFromFile(&lib, argv[1], NULL, NULL, 0, preserved, yes, 1),
	     CUDA_ERROR_INVALID_VALUE, NULL);
	jit_init(&j, info, error, LOG);
	r = cuLibraryLoadFromFile(&lib, argv[1], j.opt, j.val, 7, NULL, NULL, 0);
	step("library file", r, CUDA_SUCCESS, NULL);
	if (r == CUDA_SUCCESS)
		step("library file: unload", cuLibraryUnload(lib), CUDA_SUCCESS, NULL);

	free(ptx);
	printf("%s\n", failures ? "jit_load FAILED" : "jit_load ok");
	return failures ? 1 : 0;
}
