/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The linker, simulated: a link of exactly one input yields that input's bytes as its "cubin"
 * (PTX text, which modules.c reads as a module, or the cubin or fatbin given).  A link of more
 * inputs is CUDA_ERROR_NOT_SUPPORTED at cuLinkComplete, and PTX without a ".version" directive is
 * CUDA_ERROR_INVALID_PTX at its cuLinkAddData, as a driver's compiler refuses text that is not
 * PTX; each says why in the error log.  The logs say SIMULATED; the sizes written back are what
 * was filled, NUL included (0 for an empty log); the wall time is 0.  The forwarder checked every input first.
 */
#include <stdarg.h>
#include <stdio.h>

#include "sim.h"

#define LINK_MAGIC 0x4c494e4bu

struct sim_link {
	uint32_t magic;
	unsigned n;                          /* the options the link was made with */
	CUjit_option opt[CU_JIT_NUM_OPTIONS * 2];
	void **values;                       /* the caller's slots: sizes and the wall time go there */
	size_t log_cap[2];                   /* the info and error log buffers' sizes */
	int ninputs;
	uint8_t *bytes;                      /* the first input */
	size_t size;
};

static struct sim_link *link_of(CUlinkState s)
{
	struct sim_link *l = (struct sim_link *)s;
	return sim_is_obj(l, LINK_MAGIC) ? l : NULL;
}

/* Slot i of the link's options that is `option`, or -1. */
static int slot(const struct sim_link *l, CUjit_option option)
{
	for (unsigned i = 0; i < l->n; i++)
		if (l->opt[i] == option)
			return (int)i;
	return -1;
}

/* A line into the info or error log, if the link has one, and the size filled written back. */
static void say(struct sim_link *l, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(struct sim_link *l, int error, const char *fmt, ...)
{
	int b = slot(l, error ? CU_JIT_ERROR_LOG_BUFFER : CU_JIT_INFO_LOG_BUFFER);
	int z = slot(l, error ? CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES : CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
	size_t cap = l->log_cap[error];
	if (b < 0 || z < 0 || !l->values[b] || !cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(l->values[b], cap, fmt, ap);
	va_end(ap);
	size_t filled = n < 0 ? 0 : (size_t)n + 1 < cap ? (size_t)n + 1 : cap;
	l->values[z] = (void *)(uintptr_t)filled;
}

EXPORT CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *o, void **v, CUlinkState *out)
{
	if (!out || (n && (!o || !v)) || n > CU_JIT_NUM_OPTIONS * 2) return CUDA_ERROR_INVALID_VALUE;
	struct sim_link *l = calloc(1, sizeof *l);
	if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
	l->magic = LINK_MAGIC;
	l->n = n;
	if (n) memcpy(l->opt, o, n * sizeof *o);
	l->values = v;
	/* the logs start empty: nothing filled */
	for (int e = 0; e < 2; e++) {
		int b = slot(l, e ? CU_JIT_ERROR_LOG_BUFFER : CU_JIT_INFO_LOG_BUFFER);
		int z = slot(l, e ? CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES : CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
		if (b < 0 || z < 0 || !v[b])
			continue;
		l->log_cap[e] = (uint32_t)(uintptr_t)v[z];
		if (l->log_cap[e])
			*(char *)v[b] = '\0';
		v[z] = NULL;
	}
	int w = slot(l, CU_JIT_WALL_TIME);
	if (w >= 0) {
		float zero = 0;
		l->values[w] = NULL;
		memcpy(&l->values[w], &zero, sizeof zero);
	}
	*out = (CUlinkState)l;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLinkAddData_v2(CUlinkState s, CUjitInputType type, void *data, size_t size, const char *name,
				 unsigned int n, CUjit_option *o, void **v)
{
	(void)n; (void)o; (void)v;
	struct sim_link *l = link_of(s);
	if (!l) return CUDA_ERROR_INVALID_HANDLE;
	if (!data || !size) return CUDA_ERROR_INVALID_VALUE;
	const char *who = name && *name ? name : "(unnamed)";
	if (type == CU_JIT_INPUT_PTX && !strstr(data, ".version")) {
		say(l, 1, "SIMULATED linker: input %s is not PTX (no .version directive)", who);
		return CUDA_ERROR_INVALID_PTX;
	}
	if (++l->ninputs == 1) {
		if (!(l->bytes = malloc(size))) return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(l->bytes, data, size);
		l->size = size;
	}
	say(l, 0, "SIMULATED linker: %d input(s), the last %s of %zu bytes", l->ninputs, who, size);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLinkComplete(CUlinkState s, void **cubin, size_t *size)
{
	struct sim_link *l = link_of(s);
	if (!l) return CUDA_ERROR_INVALID_HANDLE;
	if (!cubin || !size) return CUDA_ERROR_INVALID_VALUE;
	if (l->ninputs != 1) {
		say(l, 1, "SIMULATED linker: links exactly one input; this link has %d", l->ninputs);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	say(l, 0, "SIMULATED linker: 1 input linked, %zu bytes", l->size);
	*cubin = l->bytes;
	*size = l->size;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLinkDestroy(CUlinkState s)
{
	struct sim_link *l = link_of(s);
	if (!l) return CUDA_ERROR_INVALID_HANDLE;
	l->magic = 0;
	free(l->bytes);
	free(l);
	return CUDA_SUCCESS;
}
