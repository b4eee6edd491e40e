/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program's JIT options as they cross (native/cuda_api/include/vg_link.h), for the linker (link.c)
 * and for module and library loads (module.c): checked as the driver checks them, each value sent as
 * a number (never a pointer), the program's log buffers and option slots kept here; from the host's
 * answer the logs are copied into those buffers and the values the driver writes into those slots.
 */
#ifndef VG_JIT_OPTIONS_H
#define VG_JIT_OPTIONS_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "call.h"
#include "vg_link.h"

/* A link's or a load's own options, as they cross and where the answer goes. */
struct vg_jit {
	unsigned nopt;
	struct vg_jit_opt opt[VG_LINK_MAX_OPTIONS]; /* as they cross */
	unsigned caller_index[VG_LINK_MAX_OPTIONS]; /* where each came from in the program's arrays */
	void **caller_values;                      /* the program's optionValues: outputs go there */
	char *log[2];                              /* the program's info and error log buffers */
	uint64_t log_size[2];                      /* and their sizes */
};

/* n options o with values v as they cross, into out (index: where each came from in o), for a
 * call `who` names: n > 0 without both arrays, or an option past the driver's, is
 * CUDA_ERROR_INVALID_VALUE; one vmgpu does not serve is CUDA_ERROR_NOT_SUPPORTED (logged once); an
 * input's own options (per_input) may only be values the driver reads. */
CUresult vg_jit_pack(const char *who, unsigned n, const CUjit_option *o, void **v, struct vg_jit_opt *out,
		     unsigned *index, unsigned *nout, int per_input);

/* A link's or a load's own options into j: packed, the program's log buffers paired with their sizes
 * (a NULL buffer, or one without a size, does not cross: nothing is written to it). */
CUresult vg_jit_take(struct vg_jit *j, const char *who, unsigned n, CUjit_option *o, void **v);

/* The JIT answer (vg_link.h) read from c's reply: each log copied into the program's buffer (cut to
 * its size, NUL-terminated), the sizes filled, the wall time and the threads per block written into
 * the program's slots.  VG_ERROR_LOST if the reply is not an answer to these options. */
CUresult vg_jit_answer(const struct vg_jit *j, struct vg_call *c);

#endif
