/* SPDX-License-Identifier: Apache-2.0 */
/*
 * JIT options from the guest (the wire: native/cuda_api/include/vg_link.h), for the linker (link.c)
 * and module and library loads (module.c): a list checked whole before the driver sees it, given to
 * the driver with log buffers of the worker's own, and what the driver wrote answered without a
 * pointer of the worker's (jit_options.c).
 */
#ifndef VH_JIT_OPTIONS_H
#define VH_JIT_OPTIONS_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#include "vg_link.h"

struct vh_chan;
struct vh_wr;

/* A list of options: checked (vh_jit_check), lent the worker's log buffers (vh_jit_lend), given to
 * the driver as option and value, answered (vh_jit_answer), freed (vh_jit_free). */
struct vh_jit {
	const struct vg_jit_opt *opt; /* as received, in the request or the package */
	uint32_t n;
	uint32_t log_size[2];                     /* the info and error logs asked for (0: none) */
	char *log[2];                             /* the worker's own, log_size + 1 bytes, or NULL */
	CUjit_option option[VG_LINK_MAX_OPTIONS]; /* as the driver takes them */
	void *value[VG_LINK_MAX_OPTIONS];
};

/* n options o, checked whole into j: at most VG_LINK_MAX_OPTIONS, each known and served, its value a
 * number of its kind (a log buffer's and the wall time's carry none), each log buffer with its size
 * (at most VG_LINK_LOG_MAX), none twice; an input's own (per_input) only values the driver reads.
 * CUDA_ERROR_INVALID_VALUE or CUDA_ERROR_NOT_SUPPORTED otherwise, logged (a few times). */
CUresult vh_jit_check(struct vh_chan *ch, struct vh_jit *j, const struct vg_jit_opt *o, uint64_t n, int per_input);
/* j's options as the driver takes them, each log buffer one of the worker's own (zeroed). */
CUresult vh_jit_lend(struct vh_jit *j);
/* The JIT answer into wr (vg_link.h): each option's value as the driver left it (ran: the driver was
 * given them; else as it came), never a pointer; then each log, cut to the room the reply has left. */
void vh_jit_answer(const struct vh_jit *j, int ran, struct vh_wr *wr);
void vh_jit_free(struct vh_jit *j);

#endif
