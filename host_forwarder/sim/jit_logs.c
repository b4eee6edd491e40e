/* SPDX-License-Identifier: Apache-2.0 */
/*
 * JIT options' logs, simulated, for the linker (link.c) and module and library loads (modules.c):
 * the caller's log buffers and slots as a driver writes them.  Each log says SIMULATED; a size
 * written back is what was filled, NUL included (0 for an empty log); the wall time is 0.
 */
#include <stdarg.h>
#include <stdio.h>

#include "sim.h"

/* Slot i of the options that is `option`, or -1. */
static int slot(const struct sim_jit *j, CUjit_option option)
{
	for (unsigned i = 0; i < j->n; i++)
		if (j->opt[i] == option)
			return (int)i;
	return -1;
}

CUresult sim_jit_begin(struct sim_jit *j, unsigned n, CUjit_option *o, void **v)
{
	memset(j, 0, sizeof *j);
	if ((n && (!o || !v)) || n > SIM_MAX_JIT_OPTIONS)
		return CUDA_ERROR_INVALID_VALUE;
	j->n = n;
	if (n)
		memcpy(j->opt, o, n * sizeof *o);
	j->values = v;
	/* the logs start empty: nothing filled */
	for (int e = 0; e < 2; e++) {
		int b = slot(j, e ? CU_JIT_ERROR_LOG_BUFFER : CU_JIT_INFO_LOG_BUFFER);
		int z = slot(j, e ? CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES : CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
		if (b < 0 || z < 0 || !v[b])
			continue;
		j->log_cap[e] = (uint32_t)(uintptr_t)v[z];
		if (j->log_cap[e])
			*(char *)v[b] = '\0';
		v[z] = NULL;
	}
	int w = slot(j, CU_JIT_WALL_TIME);
	if (w >= 0) {
		float zero = 0;
		v[w] = NULL;
		memcpy(&v[w], &zero, sizeof zero);
	}
	return CUDA_SUCCESS;
}

void sim_jit_say(struct sim_jit *j, int error, const char *fmt, ...)
{
	int b = slot(j, error ? CU_JIT_ERROR_LOG_BUFFER : CU_JIT_INFO_LOG_BUFFER);
	int z = slot(j, error ? CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES : CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
	size_t cap = j->log_cap[error];
	if (b < 0 || z < 0 || !j->values[b] || !cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(j->values[b], cap, fmt, ap);
	va_end(ap);
	size_t filled = n < 0 ? 0 : (size_t)n + 1 < cap ? (size_t)n + 1 : cap;
	j->values[z] = (void *)(uintptr_t)filled;
}
