/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The linker, simulated: a link of exactly one input yields that input's bytes as its "cubin"
 * (PTX text, which modules.c reads as a module, or the cubin or fatbin given).  A link of more
 * inputs is CUDA_ERROR_NOT_SUPPORTED at cuLinkComplete, and PTX without a ".version" directive is
 * CUDA_ERROR_INVALID_PTX at its cuLinkAddData, as a driver's compiler refuses text that is not
 * PTX; each says why in the error log.  The logs say SIMULATED; the sizes written back are what
 * was filled, NUL included (0 for an empty log); the wall time is 0 (jit_logs.c).  The forwarder
 * checked every input first.
 */
#include "sim.h"

#define LINK_MAGIC 0x4c494e4bu

struct sim_link {
	uint32_t magic;
	struct sim_jit jit; /* the options the link was made with: its logs, the wall time */
	int ninputs;
	uint8_t *bytes;     /* the first input */
	size_t size;
};

static struct sim_link *link_of(CUlinkState s)
{
	struct sim_link *l = (struct sim_link *)s;
	return sim_is_obj(l, LINK_MAGIC) ? l : NULL;
}

EXPORT CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *o, void **v, CUlinkState *out)
{
	if (!out) return CUDA_ERROR_INVALID_VALUE;
	struct sim_link *l = calloc(1, sizeof *l);
	if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = sim_jit_begin(&l->jit, n, o, v);
	if (r != CUDA_SUCCESS) {
		free(l);
		return r;
	}
	l->magic = LINK_MAGIC;
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
		sim_jit_say(&l->jit, 1, "SIMULATED linker: input %s is not PTX (no .version directive)", who);
		return CUDA_ERROR_INVALID_PTX;
	}
	if (++l->ninputs == 1) {
		if (!(l->bytes = malloc(size))) return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(l->bytes, data, size);
		l->size = size;
	}
	sim_jit_say(&l->jit, 0, "SIMULATED linker: %d input(s), the last %s of %zu bytes", l->ninputs, who, size);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLinkComplete(CUlinkState s, void **cubin, size_t *size)
{
	struct sim_link *l = link_of(s);
	if (!l) return CUDA_ERROR_INVALID_HANDLE;
	if (!cubin || !size) return CUDA_ERROR_INVALID_VALUE;
	if (l->ninputs != 1) {
		sim_jit_say(&l->jit, 1, "SIMULATED linker: links exactly one input; this link has %d", l->ninputs);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	sim_jit_say(&l->jit, 0, "SIMULATED linker: 1 input linked, %zu bytes", l->size);
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
