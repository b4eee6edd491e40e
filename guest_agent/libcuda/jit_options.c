/* SPDX-License-Identifier: Apache-2.0 */
/*
 * JIT options, the guest half (host half: host_forwarder/native/jit_options.c; the wire:
 * native/cuda_api/include/vg_link.h), for the linker (link.c) and module and library loads
 * (module.c).  Log buffers and the slots the driver writes stay here: the host is sent sizes only,
 * and its answer is copied into them.
 */
#include <string.h>

#include "connection.h"
#include "jit_options.h"

CUresult vg_jit_pack(const char *who, unsigned n, const CUjit_option *o, void **v, struct vg_jit_opt *out,
		     unsigned *index, unsigned *nout, int per_input)
{
	static int once, once_bad;
	*nout = 0;
	if (n == 0)
		return CUDA_SUCCESS;
	/* every refusal is said (once): a module a framework's loader cannot load shows up much later */
	if (!o || !v || n > VG_LINK_MAX_OPTIONS) {
		if (!__atomic_exchange_n(&once_bad, 1, __ATOMIC_RELAXED))
			vg_log("%s: %u JIT options%s; CUDA_ERROR_INVALID_VALUE", who, n,
			       n > VG_LINK_MAX_OPTIONS ? " (more than vmgpu takes)" : " without their lists");
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (unsigned i = 0; i < n; i++) {
		if ((unsigned)o[i] >= CU_JIT_NUM_OPTIONS) {
			if (!__atomic_exchange_n(&once_bad, 1, __ATOMIC_RELAXED))
				vg_log("%s: JIT option %d is not known; CUDA_ERROR_INVALID_VALUE", who, (int)o[i]);
			return CUDA_ERROR_INVALID_VALUE;
		}
		enum vg_jit_kind k = vg_jit_option_kind(o[i]);
		if (k == VG_JIT_REFUSED || (per_input && k != VG_JIT_VALUE && k != VG_JIT_NO_VALUE)) {
			if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
				vg_log("%s: JIT option %d is not served (a list of host pointers, or a log of one "
				       "input); CUDA_ERROR_NOT_SUPPORTED", who, (int)o[i]);
			return CUDA_ERROR_NOT_SUPPORTED;
		}
		uint64_t value = (uint32_t)(uintptr_t)v[i];
		if (k == VG_JIT_LOG_BUFFER || k == VG_JIT_OUT_FLOAT || k == VG_JIT_NO_VALUE)
			value = 0; /* the host lends its own buffers; the rest carry nothing in */
		else if (k == VG_JIT_OUT_LOG_SIZE && value > VG_LINK_LOG_MAX)
			value = VG_LINK_LOG_MAX; /* the log comes back cut to what the host lends */
		index[*nout] = i;
		out[(*nout)++] = (struct vg_jit_opt){(uint32_t)o[i], 0, value};
	}
	return CUDA_SUCCESS;
}

CUresult vg_jit_take(struct vg_jit *j, const char *who, unsigned n, CUjit_option *o, void **v)
{
	memset(j, 0, sizeof *j);
	CUresult r = vg_jit_pack(who, n, o, v, j->opt, j->caller_index, &j->nopt, 0);
	if (r != CUDA_SUCCESS)
		return r;
	j->caller_values = v;
	/* the program's log buffers, paired with their sizes: a buffer without one is written nothing */
	unsigned have_buffer[2] = {0, 0};
	for (unsigned i = 0; i < j->nopt; i++) {
		int s = vg_jit_log_slot(j->opt[i].option);
		if (vg_jit_option_kind(j->opt[i].option) == VG_JIT_LOG_BUFFER) {
			j->log[s] = v[j->caller_index[i]];
			have_buffer[s] = j->log[s] != NULL;
		} else if (vg_jit_option_kind(j->opt[i].option) == VG_JIT_OUT_LOG_SIZE) {
			j->log_size[s] = (uint32_t)(uintptr_t)v[j->caller_index[i]];
		}
	}
	unsigned kept = 0;
	for (unsigned i = 0; i < j->nopt; i++) {
		int s = vg_jit_log_slot(j->opt[i].option);
		if (vg_jit_option_kind(j->opt[i].option) == VG_JIT_LOG_BUFFER && (!j->log[s] || !j->log_size[s]))
			continue; /* nowhere to write: the host is not asked for it */
		if (vg_jit_option_kind(j->opt[i].option) == VG_JIT_OUT_LOG_SIZE && !have_buffer[s])
			j->log_size[s] = 0;
		j->opt[kept] = j->opt[i];
		j->caller_index[kept++] = j->caller_index[i];
	}
	j->nopt = kept;
	return CUDA_SUCCESS;
}

CUresult vg_jit_answer(const struct vg_jit *j, struct vg_call *c)
{
	if (vg_get_u64(c) != j->nopt)
		return VG_ERROR_LOST;
	for (unsigned i = 0; i < j->nopt; i++) {
		uint64_t value = vg_get_u64(c);
		enum vg_jit_kind k = vg_jit_option_kind(j->opt[i].option);
		if (k == VG_JIT_OUT_LOG_SIZE && value > j->opt[i].value)
			value = j->opt[i].value;
		if (k == VG_JIT_OUT_LOG_SIZE || k == VG_JIT_OUT_U32 || k == VG_JIT_OUT_FLOAT)
			j->caller_values[j->caller_index[i]] = (void *)(uintptr_t)(uint32_t)value;
	}
	for (int s = 0; s < 2; s++) {
		uint64_t n = vg_get_u64(c);
		const char *text = vg_get_ref(c, n);
		if (text && j->log[s] && j->log_size[s]) { /* an empty log is an empty string */
			size_t take = n < j->log_size[s] ? n : j->log_size[s];
			memcpy(j->log[s], text, take);
			j->log[s][take ? take - 1 : 0] = '\0';
		}
	}
	return c->bad ? VG_ERROR_LOST : CUDA_SUCCESS;
}
