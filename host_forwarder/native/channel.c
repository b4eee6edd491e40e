/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A channel's own buffers, and the end of a guest process: every object it made destroyed and
 * every table freed (its contexts, and with them its memory, go next: context.c).
 */
#include <stdlib.h>

#include "channel.h"
#include "ipc.h"
#include "protocol.h"
#include "vg_kinds.h"

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

void vh_chan_release_all(struct vh_chan *ch)
{
	const struct vh_backend *B = ch->backend;
	for (int d = 0; d < VG_MAX_DEVICES; d++)
		if (ch->ctx[d]) {
			B->cuCtxSetCurrent(ch->ctx[d]);
			break;
		}
	vh_ipc_release_all(ch); /* its handles open nothing new; what it opened is closed */
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
	vh_handles_clear(ch);
	/* memory goes with the contexts, which the worker destroys next (context.c) */
	B->cuCtxSetCurrent(NULL);
	ch->cur_dev = -1;
	free(ch->allocs);
	free(ch->texobjs); /* (the objects went with the contexts) */
	ch->texobjs = NULL;
	ch->ntexobjs = ch->captexobjs = 0;
	free(ch->spans);
	free(ch->fn_tags);
	ch->spans = NULL;
	ch->fn_tags = NULL;
	ch->nspans = ch->capspans = 0;
	ch->nfn_tags = 0;
	vh_module_image_forget(ch);
	vh_kept_forget(ch); /* kept blocks go with the contexts too */
	free(ch->scratch);
	ch->allocs = NULL;
	ch->scratch = NULL;
	ch->nallocs = ch->capallocs = 0;
}
