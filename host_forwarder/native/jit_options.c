/* SPDX-License-Identifier: Apache-2.0 */
/*
 * JIT options, the host half (guest half: guest_agent/libcuda/jit_options.c; the wire:
 * native/cuda_api/include/vg_link.h), for the linker (link.c) and module and library loads
 * (module.c).  Every option is a number the driver reads, or a log buffer or an output slot the
 * worker lends: a pointer the guest sent is never given to the driver, and none of the worker's is
 * answered.
 */
#include <stdlib.h>

#include "jit_options.h"
#include "vh_dispatch.h"

static CUresult refused(struct vh_chan *ch, CUresult r, const char *what, uint64_t which)
{
	static unsigned logged; /* a guest sending bad options does not flood the log */
	if (logged < 16) {
		logged++;
		vh_log("channel %u: JIT options refused (CUresult %d): %s %llu", ch->index, (int)r, what,
		       (unsigned long long)which);
	}
	return r;
}

CUresult vh_jit_check(struct vh_chan *ch, struct vh_jit *j, const struct vg_jit_opt *o, uint64_t n, int per_input)
{
	*j = (struct vh_jit){.opt = o};
	int buffer[2] = {0, 0}, size[2] = {0, 0};
	if (n > VG_LINK_MAX_OPTIONS)
		return refused(ch, CUDA_ERROR_INVALID_VALUE, "more than VG_LINK_MAX_OPTIONS:", n);
	for (uint32_t i = 0; i < n; i++) {
		enum vg_jit_kind k = vg_jit_option_kind(o[i].option);
		CUresult r = CUDA_SUCCESS;
		int s = vg_jit_log_slot(o[i].option);
		if (o[i].option >= CU_JIT_NUM_OPTIONS || o[i].pad)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (k == VG_JIT_REFUSED || (per_input && k != VG_JIT_VALUE && k != VG_JIT_NO_VALUE))
			r = CUDA_ERROR_NOT_SUPPORTED;
		else if ((k == VG_JIT_VALUE || k == VG_JIT_OUT_U32) && o[i].value > UINT32_MAX)
			r = CUDA_ERROR_INVALID_VALUE;
		else if ((k == VG_JIT_NO_VALUE || k == VG_JIT_LOG_BUFFER || k == VG_JIT_OUT_FLOAT) && o[i].value)
			r = CUDA_ERROR_INVALID_VALUE; /* a pointer, or what the driver only writes */
		else if (k == VG_JIT_LOG_BUFFER && buffer[s]++)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (k == VG_JIT_OUT_LOG_SIZE && (size[s]++ || o[i].value > VG_LINK_LOG_MAX))
			r = CUDA_ERROR_INVALID_VALUE;
		if (r != CUDA_SUCCESS)
			return refused(ch, r, "JIT option", o[i].option);
		if (k == VG_JIT_OUT_LOG_SIZE)
			j->log_size[s] = (uint32_t)o[i].value;
	}
	for (int s = 0; s < 2; s++)
		if (buffer[s] && !size[s])
			return refused(ch, CUDA_ERROR_INVALID_VALUE, "a log buffer without its size, log", s);
	j->n = (uint32_t)n;
	return CUDA_SUCCESS;
}

CUresult vh_jit_lend(struct vh_jit *j)
{
	for (uint32_t i = 0; i < j->n; i++) {
		const struct vg_jit_opt *o = &j->opt[i];
		int s = vg_jit_log_slot(o->option);
		j->option[i] = (CUjit_option)o->option;
		j->value[i] = (void *)(uintptr_t)o->value;
		if (vg_jit_option_kind(o->option) != VG_JIT_LOG_BUFFER)
			continue;
		if (!j->log[s] && !(j->log[s] = calloc(1, j->log_size[s] + 1)))
			return CUDA_ERROR_OUT_OF_MEMORY;
		j->value[i] = j->log[s];
	}
	return CUDA_SUCCESS;
}

/* What the driver wrote into an option's slot, as the guest may be told it. */
static uint64_t option_answer(const struct vg_jit_opt *o, void *slot)
{
	uint64_t v = (uint64_t)(uintptr_t)slot;
	switch (vg_jit_option_kind(o->option)) {
	case VG_JIT_OUT_LOG_SIZE: return (uint32_t)v < o->value ? (uint32_t)v : o->value;
	case VG_JIT_OUT_U32:
	case VG_JIT_OUT_FLOAT: return (uint32_t)v;
	default: return o->value; /* never a pointer of the worker's */
	}
}

/* A log into the reply, in at most room bytes (a multiple of 8): its length, then its text up to
 * its NUL (within the size asked for) and a NUL; length 0 if it is empty or was not asked for. */
static void put_log(struct vh_wr *wr, const char *log, uint32_t size, uint64_t room)
{
	uint64_t n = log ? strnlen(log, size) : 0;
	if (n + 9 > room)
		n = room > 9 ? room - 9 : 0;
	uint64_t len = n ? n + 1 : 0;
	vh_put(wr, &len, 8);
	if (!len || wr->bad)
		return;
	memcpy(wr->p + wr->len, log, n); /* room was within the reply */
	memset(wr->p + wr->len + n, 0, vh_pad8(len) - n);
	wr->len += vh_pad8(len);
}

void vh_jit_answer(const struct vh_jit *j, int ran, struct vh_wr *wr)
{
	uint64_t n = j->n;
	vh_put(wr, &n, 8);
	for (uint32_t i = 0; i < j->n; i++) {
		uint64_t v = option_answer(&j->opt[i], ran ? j->value[i] : NULL);
		vh_put(wr, &v, 8);
	}
	/* both logs fit a reply of the usual completion ring; a smaller ring cuts them */
	for (int s = 0; s < 2; s++)
		put_log(wr, j->log[s], j->log_size[s], (s ? wr->cap - wr->len : (wr->cap - wr->len) / 2) & ~7ull);
}

void vh_jit_free(struct vh_jit *j)
{
	free(j->log[0]);
	free(j->log[1]);
	j->log[0] = j->log[1] = NULL;
}
