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
#include "jit_options.h"
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
	struct vh_jit jit; /* the link's own options */
	uint32_t ninputs;
	struct link_input *in;
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
	const struct vg_jit_opt *opt = (const struct vg_jit_opt *)take(&rd, (uint64_t)h.noptions * sizeof *opt);
	CUresult r = rd.bad ? CUDA_ERROR_INVALID_VALUE : vh_jit_check(ch, &plan->jit, opt, h.noptions, 0);
	if (r != CUDA_SUCCESS)
		return r;
	plan->in = calloc(h.ninputs ? h.ninputs : 1, sizeof *plan->in);
	if (!plan->in)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t total = 0;
	for (uint32_t i = 0; i < h.ninputs; i++) {
		struct link_input *in = &plan->in[plan->ninputs++];
		struct vg_link_input w;
		struct vh_jit own;
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
		if ((r = vh_jit_check(ch, &own, in->opt, w.noptions, 1)) != CUDA_SUCCESS ||
		    (r = input_ok(ch, in, i)) != CUDA_SUCCESS)
			return r;
	}
	if (rd.pos != rd.len) {
		refused(ch, CUDA_ERROR_INVALID_VALUE, "bytes after the last input:", rd.len - rd.pos);
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* An input as the driver is given it: a cubin or fatbin in a copy of its own with zeros after it
 * (the driver follows offsets inside it), PTX where it lies (its NUL checked).  The copies are
 * kept in *copy until the link is destroyed. */
static CUresult add_input(struct vh_chan *ch, CUlinkState state, const struct link_input *in, uint8_t **copy)
{
	struct vh_jit own = {.opt = in->opt, .n = in->noptions}; /* checked with the package: values only */
	vh_jit_lend(&own);
	const void *data = in->data;
	if (in->type != CU_JIT_INPUT_PTX) {
		if (!(*copy = malloc(in->size + VH_IMAGE_GUARD)))
			return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(*copy, in->data, in->size);
		memset(*copy + in->size, 0, VH_IMAGE_GUARD);
		data = *copy;
	}
	return ch->backend->cuLinkAddData_v2(state, (CUjitInputType)in->type, (void *)data, in->size, in->name,
					     own.n, own.option, own.value);
}

/* Run a checked link in the process's context; the cubin into dst if it fits cap; the answer into wr. */
static CUresult run_link(struct vh_chan *ch, struct link_plan *plan, uint8_t *dst, uint64_t cap, struct vh_wr *wr)
{
	const struct vh_backend *B = ch->backend;
	uint8_t **copies = calloc(plan->ninputs ? plan->ninputs : 1, sizeof *copies);
	CUlinkState state = NULL;
	void *cubin = NULL;
	size_t cubin_size = 0;
	CUresult r = copies ? vh_jit_lend(&plan->jit) : CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS)
		r = B->cuLinkCreate_v2(plan->jit.n, plan->jit.option, plan->jit.value, &state);
	for (uint32_t i = 0; i < plan->ninputs && r == CUDA_SUCCESS; i++)
		r = add_input(ch, state, &plan->in[i], &copies[i]);
	if (r == CUDA_SUCCESS)
		r = B->cuLinkComplete(state, &cubin, &cubin_size);
	if (r == CUDA_SUCCESS && cubin_size > VG_LINK_MAX_OUTPUT)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS && cubin_size <= cap)
		memcpy(dst, cubin, cubin_size);
	uint64_t result = (uint64_t)r, size = r == CUDA_SUCCESS ? cubin_size : 0;
	vh_put(wr, &result, 8);
	vh_put(wr, &size, 8);
	vh_jit_answer(&plan->jit, state != NULL, wr);
	if (state)
		B->cuLinkDestroy(state);
	for (uint32_t i = 0; copies && i < plan->ninputs; i++)
		free(copies[i]);
	free(copies);
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
	vh_jit_free(&plan.jit);
	if (dst)
		vh_host_buf_done(ch, kind, where, cap);
	vh_module_image_forget(ch); /* the package is used once */
	return r;
}
