/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The channel's handle table (handles.h): the guest only ever sees table values, never a host
 * pointer.  And the other names a guest gives for host objects: streams, devices, contexts,
 * memory locations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addresses.h"
#include "channel.h"
#include "handles.h"
#include "partition.h"
#include "vg_kinds.h"
#include "vg_ops.h"

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
	if (kind == VG_KIND_STREAM && (raw == 0 || raw == (uint64_t)(uintptr_t)CU_STREAM_LEGACY ||
				       raw == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD)) {
		ch->work_stream = *v; /* a default stream (sched_depth.c): the current GPU's gate (serve.c) */
		ch->work_stream_id = raw;
		if (ch->stream_gate && ch->stream_gate(ch, -1))
			return -1;
		vh_part_default(ch, ch->part_work); /* (its context: the span its work goes to) */
		return 0;
	}
	if (raw == 0)
		return 0;
	struct vh_handle *e = vh_handle_entry(ch, raw, kind);
	if (!e)
		return -1;
	*v = e->ptr;
	if (kind == VG_KIND_GRAPH_EXEC)
		ch->work_exec = e->ptr; /* a launch passes the gates of the GPUs it reaches (serve.c) */
	if (kind == VG_KIND_STREAM) {
		/* where its work goes: itself, or its twin on the SMs its GPU's scheduler gives now
		 * (partition.c); the stream itself is what is destroyed */
		if (ch->cur_op != VG_OP_cuStreamDestroy_v2)
			*v = vh_part_stream(ch, e, ch->part_work);
		else
			vh_part_stream_ends(ch, e); /* (a blocking one's order with the legacy stream) */
		ch->work_stream = *v; /* where a call's work goes: its marker follows it (sched_depth.c) */
		ch->work_stream_id = raw;
		/* the work goes to the GPU the stream was made on (a copy may be issued to a stream of
		 * another device), so that GPU's scheduler lets it through (serve.c) */
		if (ch->stream_gate && ch->stream_gate(ch, e->dev))
			return -1;
	}
	return 0;
}

int vh_handle_find(struct vh_chan *ch, int kind, void **v)
{
	for (uint32_t i = 0; *v && i < ch->nh; i++) {
		struct vh_handle *e = &ch->h[i];
		if (e->ptr == *v && e->kind == kind) {
			*v = (void *)(uintptr_t)encode(i, e);
			return 0;
		}
	}
	return -1;
}

int vh_handle_new(struct vh_chan *ch, int kind, void **v, void *parent)
{
	void *ptr = *v;
	uint32_t free_idx = UINT32_MAX;
	/* a module's function is of the module's context, whichever is current now (a graph's kernel
	 * node runs it there: graph_nodes.c) */
	int dev = ch->cur_dev;
	/* the driver hands out the same object for the same name: keep one entry */
	for (uint32_t i = 0; i < ch->nh; i++) {
		struct vh_handle *e = &ch->h[i];
		if (e->ptr == ptr && e->kind == kind) {
			*v = (void *)(uintptr_t)encode(i, e);
			return 0;
		}
		if (kind == VG_KIND_FUNCTION && parent && e->ptr == parent && e->kind == VG_KIND_MODULE)
			dev = e->dev;
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
	e->dev = (int8_t)dev;
	e->gen = gen ? gen : 1;
	*v = (void *)(uintptr_t)encode(free_idx, e);
	if (kind == VG_KIND_STREAM)
		vh_part_stream_made(ch, e); /* (a blocking one: its order with the legacy stream kept) */
	return 0;
}

static void clear(struct vh_chan *ch, struct vh_handle *e)
{
	vh_part_forget(ch, e); /* (a stream's twin) */
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
			clear(ch, e);
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

void vh_handles_clear(struct vh_chan *ch)
{
	for (uint32_t i = 0; i < ch->nh; i++)
		clear(ch, &ch->h[i]);
	free(ch->h);
	ch->h = NULL;
	ch->nh = ch->caph = 0;
}

CUstream vh_stream_in(struct vh_chan *ch, uint32_t flags, uint64_t raw, int *bad)
{
	void *s = (void *)(uintptr_t)raw;
	if (vh_handle_in(ch, VG_KIND_STREAM, &s)) {
		*bad = 1;
		return NULL;
	}
	if (!s && (flags & VG_F_PTDS))
		s = CU_STREAM_PER_THREAD;
	return s;
}

/* A description of where memory lives: on one of this guest's GPUs, by its host number. */
int vh_location_in(struct vh_chan *ch, CUmemLocation *loc)
{
	if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return -1;
	CUdevice d = loc->id;
	if (vh_device_in(ch, &d))
		return -1;
	loc->id = d;
	return 0;
}
