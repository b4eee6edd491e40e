/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA linker, the host half (guest half: guest_agent/libcuda/link.c; the wire:
 * native/cuda_api/include/vg_link.h).  A link arrives whole, as a package received like a module
 * image, with one request: the package is checked from end to end first (every count, length and
 * name against the bytes received; each option known, its value a number; each input of a type
 * served, a cubin or fatbin passing the module image check, PTX with its NUL), and only then, in
 * the process's own context, a link is created, given every input, completed, its cubin copied to
 * where the guest said (its bulk area or heap), and destroyed.  The driver writes its logs into
 * buffers of the worker's own, of the sizes the guest asked for (at most VG_LINK_LOG_MAX), and a
 * pointer the guest sent is never used.  Nothing of a link outlives the request.
 */
#include <stdlib.h>

#include "host_memory.h"
#include "images.h"
#include "protocol.h"
#include "vg_link.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

struct link_input {
	uint32_t type, noptions;
	const struct vg_jit_opt *opt;
	const char *name;
	const uint8_t *data;
	uint64_t size;
};

/* A package, checked: its options and inputs point into the bytes received. */
struct link_plan {
	uint32_t noptions, ninputs;
	const struct vg_jit_opt *opt;
	struct link_input *in;
	uint32_t log_size[2]; /* the info and error logs the guest asked for (0: none) */
};

static void refused(struct vh_chan *ch, CUresult r, const char *what, uint64_t which)
{
	static unsigned logged; /* a guest sending bad links does not flood the log */
	if (logged < 16) {
		logged++;
		vh_log("channel %u: link refused (CUresult %d): %s %llu", ch->index, (int)r, what,
		       (unsigned long long)which);
	}
}

/* n bytes of the package, 8-byte aligned: where they are, or NULL (the reader is then bad). */
static const uint8_t *take(struct vh_rd *rd, uint64_t n)
{
	if (rd->bad || n > rd->len - rd->pos || vh_pad8(n) > rd->len - rd->pos) {
		rd->bad = 1;
		return NULL;
	}
	const uint8_t *p = rd->p + rd->pos;
	rd->pos += vh_pad8(n);
	return p;
}

/* A list of options: each known and served, its value a number of its kind (a log buffer's and
 * the wall time's carry none: the worker lends its own buffers), each log buffer with its size
 * (at most VG_LINK_LOG_MAX), none twice; an input's own only values the driver reads. */
static CUresult options_ok(struct vh_chan *ch, const struct vg_jit_opt *o, uint32_t n, int per_input,
			   uint32_t log_size[2])
{
	int buffer[2] = {0, 0}, size[2] = {0, 0};
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
		if (r != CUDA_SUCCESS) {
			refused(ch, r, "JIT option", o[i].option);
			return r;
		}
		if (k == VG_JIT_OUT_LOG_SIZE)
			log_size[s] = (uint32_t)o[i].value;
	}
	for (int s = 0; s < 2; s++)
		if (buffer[s] && !size[s]) {
			refused(ch, CUDA_ERROR_INVALID_VALUE, "a log buffer without its size, log", s);
			return CUDA_ERROR_INVALID_VALUE;
		}
	return CUDA_SUCCESS;
}

/* An input's bytes as its type says: a cubin (ELF) or a fatbin passing the module image check,
 * PTX with its NUL within them. */
static CUresult input_ok(struct vh_chan *ch, const struct link_input *in, uint32_t i)
{
	char why[200];
	int ok;
	if (in->type == CU_JIT_INPUT_PTX)
		ok = memchr(in->data, 0, in->size) != NULL;
	else
		ok = vh_image_kind(in->data, in->size) == (in->type == CU_JIT_INPUT_CUBIN ? VH_IMAGE_ELF : VH_IMAGE_FATBIN) &&
		     !vh_image_check(in->data, in->size, why, sizeof why);
	if (!ok)
		refused(ch, CUDA_ERROR_INVALID_IMAGE, "the bytes do not check as their type says, input", i);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
}

/* The package of size bytes checked whole into plan (its inputs allocated). */
static CUresult plan_link(struct vh_chan *ch, const uint8_t *pkg, uint64_t size, struct link_plan *plan)
{
	struct vh_rd rd = {pkg, (uint32_t)size, 0, 0}; /* size <= VG_MAX_BLOB */
	struct vg_link_header h;
	vh_get(&rd, &h, sizeof h);
	if (rd.bad || h.magic != VG_LINK_MAGIC || h.pad || h.noptions > VG_LINK_MAX_OPTIONS ||
	    h.ninputs > VG_LINK_MAX_INPUTS) {
		refused(ch, CUDA_ERROR_INVALID_VALUE, "a header of inputs", h.ninputs);
		return CUDA_ERROR_INVALID_VALUE;
	}
	plan->noptions = h.noptions;
	plan->opt = (const struct vg_jit_opt *)take(&rd, (uint64_t)h.noptions * sizeof *plan->opt);
	CUresult r = rd.bad ? CUDA_ERROR_INVALID_VALUE : options_ok(ch, plan->opt, h.noptions, 0, plan->log_size);
	if (r != CUDA_SUCCESS)
		return r;
	plan->in = calloc(h.ninputs ? h.ninputs : 1, sizeof *plan->in);
	if (!plan->in)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t total = 0;
	for (uint32_t i = 0; i < h.ninputs; i++) {
		struct link_input *in = &plan->in[plan->ninputs++];
		struct vg_link_input w;
		uint32_t unused[2];
		vh_get(&rd, &w, sizeof w);
		in->type = w.type;
		in->noptions = w.noptions;
		if (rd.bad || w.type >= CU_JIT_NUM_INPUT_TYPES || w.noptions > VG_LINK_MAX_OPTIONS || w.name_len == 0 ||
		    w.name_len > VG_LINK_MAX_NAME || w.size == 0 || w.size > VG_LINK_MAX_BYTES - total) {
			refused(ch, CUDA_ERROR_INVALID_VALUE, "an input's type, count or length, input", i);
			return CUDA_ERROR_INVALID_VALUE;
		}
		if (!vg_link_input_served(w.type)) {
			refused(ch, CUDA_ERROR_NOT_SUPPORTED, "an input type not served (object, library, NVVM)", w.type);
			return CUDA_ERROR_NOT_SUPPORTED;
		}
		total += w.size;
		in->opt = (const struct vg_jit_opt *)take(&rd, (uint64_t)w.noptions * sizeof *in->opt);
		in->name = (const char *)take(&rd, w.name_len);
		in->data = take(&rd, w.size);
		if (rd.bad || in->name[w.name_len - 1] != '\0') {
			refused(ch, CUDA_ERROR_INVALID_VALUE, "past the bytes received, or a name without its NUL, input",
				i);
			return CUDA_ERROR_INVALID_VALUE;
		}
		in->size = w.size;
		if ((r = options_ok(ch, in->opt, w.noptions, 1, unused)) != CUDA_SUCCESS ||
		    (r = input_ok(ch, in, i)) != CUDA_SUCCESS)
			return r;
	}
	if (rd.pos != rd.len) {
		refused(ch, CUDA_ERROR_INVALID_VALUE, "bytes after the last input:", rd.len - rd.pos);
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* A list of options as the driver takes them: values as its void * slots, a log buffer as the
 * worker's own (logs[slot]). */
static void options_out(const struct vg_jit_opt *o, uint32_t n, char *logs[2], CUjit_option *opt, void **val)
{
	for (uint32_t i = 0; i < n; i++) {
		opt[i] = (CUjit_option)o[i].option;
		val[i] = vg_jit_option_kind(o[i].option) == VG_JIT_LOG_BUFFER ? logs[vg_jit_log_slot(o[i].option)]
									   : (void *)(uintptr_t)o[i].value;
	}
}

/* An input as the driver is given it: a cubin or fatbin in a copy of its own with zeros after it
 * (the driver follows offsets inside it), PTX where it lies (its NUL checked).  The copies are
 * kept in *copy until the link is destroyed. */
static CUresult add_input(struct vh_chan *ch, CUlinkState state, const struct link_input *in, uint8_t **copy)
{
	CUjit_option opt[VG_LINK_MAX_OPTIONS];
	void *val[VG_LINK_MAX_OPTIONS];
	options_out(in->opt, in->noptions, NULL, opt, val);
	const void *data = in->data;
	if (in->type != CU_JIT_INPUT_PTX) {
		if (!(*copy = malloc(in->size + VH_IMAGE_GUARD)))
			return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(*copy, in->data, in->size);
		memset(*copy + in->size, 0, VH_IMAGE_GUARD);
		data = *copy;
	}
	return ch->backend->cuLinkAddData_v2(state, (CUjitInputType)in->type, (void *)data, in->size, in->name,
					     in->noptions, opt, val);
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
 * its NUL (within the size asked for) and a NUL; length 0 if it is empty. */
static void put_log(struct vh_wr *wr, const char *log, uint32_t size, uint64_t room)
{
	uint64_t n = strnlen(log, size);
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

/* Run a checked link in the process's context; the cubin into dst if it fits cap; the answer into wr. */
static CUresult run_link(struct vh_chan *ch, const struct link_plan *plan, uint8_t *dst, uint64_t cap,
			 struct vh_wr *wr)
{
	const struct vh_backend *B = ch->backend;
	CUjit_option opt[VG_LINK_MAX_OPTIONS];
	void *val[VG_LINK_MAX_OPTIONS];
	char *logs[2] = {calloc(1, plan->log_size[0] + 1), calloc(1, plan->log_size[1] + 1)};
	uint8_t **copies = calloc(plan->ninputs ? plan->ninputs : 1, sizeof *copies);
	CUlinkState state = NULL;
	void *cubin = NULL;
	size_t cubin_size = 0;
	CUresult r = logs[0] && logs[1] && copies ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		options_out(plan->opt, plan->noptions, logs, opt, val);
		r = B->cuLinkCreate_v2(plan->noptions, opt, val, &state);
	}
	for (uint32_t i = 0; i < plan->ninputs && r == CUDA_SUCCESS; i++)
		r = add_input(ch, state, &plan->in[i], &copies[i]);
	if (r == CUDA_SUCCESS)
		r = B->cuLinkComplete(state, &cubin, &cubin_size);
	if (r == CUDA_SUCCESS && cubin_size > VG_LINK_MAX_OUTPUT)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS && cubin_size <= cap)
		memcpy(dst, cubin, cubin_size);
	uint64_t result = (uint64_t)r, size = r == CUDA_SUCCESS ? cubin_size : 0, n = plan->noptions;
	vh_put(wr, &result, 8);
	vh_put(wr, &size, 8);
	vh_put(wr, &n, 8);
	for (uint32_t i = 0; i < plan->noptions; i++) {
		uint64_t v = option_answer(&plan->opt[i], state ? val[i] : NULL);
		vh_put(wr, &v, 8);
	}
	/* both logs fit a reply of the usual completion ring; a smaller ring cuts them */
	for (int s = 0; s < 2; s++)
		put_log(wr, logs[s], plan->log_size[s], (s ? wr->cap - wr->len : (wr->cap - wr->len) / 2) & ~7ull);
	if (state)
		B->cuLinkDestroy(state);
	for (uint32_t i = 0; copies && i < plan->ninputs; i++)
		free(copies[i]);
	free(copies);
	free(logs[0]);
	free(logs[1]);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* cuLinkComplete: the package received, checked, linked; the request says where the cubin goes. */
CUresult handwritten_cuLinkComplete(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t kind = vh_get_u64(rd), where = vh_get_u64(rd), cap = vh_get_u64(rd), size;
	const uint8_t *pkg = vh_module_blob(ch, &size);
	uint8_t *dst = rd->bad || cap > VG_LINK_MAX_OUTPUT ? NULL : vh_host_buf(ch, kind, where, cap);
	struct link_plan plan = {0};
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (!dst)
		refused(ch, r, "an output buffer outside the bulk area and the heap, of bytes", cap);
	else if (!pkg)
		refused(ch, r, "no package received whole, of bytes", size);
	else if ((r = plan_link(ch, pkg, size, &plan)) == CUDA_SUCCESS)
		r = run_link(ch, &plan, dst, cap, wr);
	free(plan.in);
	if (dst)
		vh_host_buf_done(ch, kind, where, cap);
	vh_module_image_forget(ch); /* the package is used once */
	return r;
}
