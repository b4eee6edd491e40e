/* SPDX-License-Identifier: Apache-2.0 */
/* Per-channel handle table: the guest only ever sees table values, never a host pointer. */
#include <stdio.h>
#include <stdlib.h>

#include "vh_dispatch.h"

#define VH_MAX_HANDLES (1u << 20)

static uint64_t encode(uint32_t idx, const struct vh_handle *e)
{
	return ((uint64_t)e->gen << 32) | ((uint64_t)(idx + 1) << 8) | e->kind;
}

struct vh_handle *vh_handle_entry(struct vh_chan *ch, uint64_t v, int kind)
{
	uint32_t k = v & 0xFF;
	uint64_t slot = (v >> 8) & 0xFFFFFF;
	if (slot == 0 || slot > ch->nh)
		return NULL;
	struct vh_handle *e = &ch->h[slot - 1];
	if (!e->ptr || e->gen != (uint32_t)(v >> 32) || e->kind != k)
		return NULL;
	/* a CUkernel is accepted wherever a CUfunction is (as the driver does for launches) */
	if (k != (uint32_t)kind && !(kind == VG_KIND_FUNCTION && k == VG_KIND_KERNEL))
		return NULL;
	return e;
}

int vh_handle_in(struct vh_chan *ch, int kind, void **v)
{
	uint64_t raw = (uint64_t)(uintptr_t)*v;
	if (raw == 0)
		return 0;
	if (kind == VG_KIND_STREAM && (raw == (uint64_t)(uintptr_t)CU_STREAM_LEGACY ||
				       raw == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD))
		return 0;
	struct vh_handle *e = vh_handle_entry(ch, raw, kind);
	if (!e)
		return -1;
	*v = e->ptr;
	return 0;
}

int vh_handle_new(struct vh_chan *ch, int kind, void **v, void *parent)
{
	void *ptr = *v;
	uint32_t free_idx = UINT32_MAX;
	/* the driver hands out the same object for the same name: keep one entry */
	for (uint32_t i = 0; i < ch->nh; i++) {
		struct vh_handle *e = &ch->h[i];
		if (e->ptr == ptr && e->kind == kind) {
			*v = (void *)(uintptr_t)encode(i, e);
			return 0;
		}
		if (!e->ptr && free_idx == UINT32_MAX && i >= ch->free_hint)
			free_idx = i;
	}
	if (free_idx == UINT32_MAX) {
		if (ch->nh == ch->caph) {
			uint32_t cap = ch->caph ? ch->caph * 2 : 256;
			if (cap > VH_MAX_HANDLES)
				return -1;
			struct vh_handle *h = realloc(ch->h, cap * sizeof *h);
			if (!h)
				return -1;
			memset(h + ch->caph, 0, (cap - ch->caph) * sizeof *h);
			ch->h = h;
			ch->caph = cap;
		}
		free_idx = ch->nh++;
	}
	struct vh_handle *e = &ch->h[free_idx];
	uint32_t gen = e->gen + 1;
	memset(e, 0, sizeof *e);
	e->ptr = ptr;
	e->parent = parent;
	e->kind = (uint8_t)kind;
	e->gen = gen ? gen : 1;
	*v = (void *)(uintptr_t)encode(free_idx, e);
	return 0;
}

static void clear(struct vh_handle *e)
{
	free(e->params);
	uint32_t gen = e->gen;
	memset(e, 0, sizeof *e);
	e->gen = gen;
}

void vh_handle_drop(struct vh_chan *ch, int kind, void *host_ptr)
{
	if (!host_ptr)
		return;
	for (uint32_t i = 0; i < ch->nh; i++) {
		struct vh_handle *e = &ch->h[i];
		if (!e->ptr)
			continue;
		/* the object itself, and what was derived from it (a module's functions) */
		if ((e->ptr == host_ptr && e->kind == kind) || e->parent == host_ptr) {
			void *child = e->ptr;
			int child_kind = e->kind;
			int is_self = e->ptr == host_ptr;
			if (child_kind == VG_KIND_MODULE || child_kind == VG_KIND_LIBRARY)
				vh_addr_forget_owner(ch, child); /* its globals are no longer memory to name */
			clear(e);
			if (i < ch->free_hint)
				ch->free_hint = i;
			if (!is_self)
				vh_handle_drop(ch, child_kind, child);
		}
	}
}

int vh_device_in(struct vh_chan *ch, CUdevice *d)
{
	if (*d < 0 || *d >= ch->fwd->ndev)
		return -1;
	*d = ch->fwd->dev[*d];
	return 0;
}

/* Guest contexts are the primary contexts, sent as ordinal + 1 (0 = none). */
int vh_context_in(struct vh_chan *ch, CUcontext *c)
{
	uint64_t v = (uint64_t)(uintptr_t)*c;
	if (v == 0)
		return 0;
	if (v > (uint64_t)ch->fwd->ndev)
		return -1;
	return vh_chan_context(ch, (int)(v - 1), c) == CUDA_SUCCESS ? 0 : -1;
}

void *vh_scratch(struct vh_chan *ch, uint64_t n, size_t elsz)
{
	if (elsz && n > (64u << 20) / elsz)
		return NULL;
	size_t need = n * elsz;
	if (need > ch->scratch_cap) {
		void *p = realloc(ch->scratch, need);
		if (!p)
			return NULL;
		ch->scratch = p;
		ch->scratch_cap = need;
	}
	return ch->scratch;
}

/* What a process that exits or dies leaves behind: free all of it. */
void vh_chan_release_all(struct vh_chan *ch)
{
	const struct vh_backend *B = ch->backend;
	for (int d = 0; d < VG_MAX_DEVICES; d++)
		if (ch->ctx[d]) {
			B->cuCtxSetCurrent(ch->ctx[d]);
			break;
		}
	/* objects first (a stream or event needs no particular current context), then memory */
	for (int pass = 0; pass < 3; pass++) {
		for (uint32_t i = 0; i < ch->nh; i++) {
			struct vh_handle *e = &ch->h[i];
			if (!e->ptr)
				continue;
			if (pass == 0 && e->kind == VG_KIND_GRAPH_EXEC)
				B->cuGraphExecDestroy(e->ptr);
			else if (pass == 1 && e->kind == VG_KIND_GRAPH)
				B->cuGraphDestroy(e->ptr);
			else if (pass == 0 && e->kind == VG_KIND_STREAM)
				B->cuStreamDestroy_v2(e->ptr);
			else if (pass == 0 && e->kind == VG_KIND_EVENT)
				B->cuEventDestroy_v2(e->ptr);
			else if (pass == 1 && e->kind == VG_KIND_MODULE && !e->parent)
				B->cuModuleUnload(e->ptr);
			else if (pass == 2 && e->kind == VG_KIND_LIBRARY)
				B->cuLibraryUnload(e->ptr);
		}
	}
	for (uint32_t i = 0; i < ch->nh; i++)
		clear(&ch->h[i]);
	/* memory goes with the contexts, which the worker destroys next (context.c) */
	B->cuCtxSetCurrent(NULL);
	ch->cur_dev = -1;
	free(ch->h);
	free(ch->allocs);
	free(ch->spans);
	free(ch->fn_tags);
	ch->spans = NULL;
	ch->fn_tags = NULL;
	ch->nspans = ch->capspans = 0;
	ch->nfn_tags = 0;
	vh_blob_drop(ch);
	free(ch->scratch);
	ch->h = NULL;
	ch->allocs = NULL;
	ch->scratch = NULL;
	ch->nh = ch->caph = 0;
	ch->nallocs = ch->capallocs = 0;
}

void vh_uuid_str(const uint8_t u[16], char *out, size_t len)
{
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}
