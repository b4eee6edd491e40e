/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which guest GPUs each graph and executable graph of the process reaches (graph_devs.h): a
 * small table by host object, kept by the serving thread only.  An object the table does not
 * know reaches no GPU but the one its launch's stream is on.  Sets only grow: a node removed or
 * retargeted leaves its GPU in the set, which costs a launch a turn it may not need, never one it
 * does.
 */
#include <stdlib.h>

#include "channel.h"
#include "graph_devs.h"

struct entry {
	const void *g;
	vh_devs devs;
};
static struct entry *table;
static uint32_t n, cap;
vh_devs vh_capture_devs;

static struct entry *find(const void *g)
{
	for (uint32_t i = 0; g && i < n; i++)
		if (table[i].g == g)
			return &table[i];
	return NULL;
}

vh_devs vh_graph_devs(const void *g)
{
	struct entry *e = find(g);
	return e ? e->devs : 0;
}

vh_devs vh_graph_devs_copied(const void *g)
{
	return vh_graph_devs(g) | vh_capture_devs; /* (none while no capture is open) */
}

void vh_graph_devs_add(const void *g, vh_devs devs)
{
	if (!g || !devs)
		return;
	struct entry *e = find(g);
	if (e) {
		e->devs |= devs;
		return;
	}
	if (n == cap) {
		uint32_t c = cap ? cap * 2 : 64;
		struct entry *t = realloc(table, c * sizeof *t);
		if (!t)
			return; /* (unknown: a launch passes its stream's GPU only) */
		table = t;
		cap = c;
	}
	table[n++] = (struct entry){g, devs};
}

void vh_graph_devs_forget(const void *g)
{
	struct entry *e = find(g);
	if (e)
		*e = table[--n];
}

int vh_ctx_dev(struct vh_chan *ch, CUcontext c)
{
	if (!c)
		return ch->cur_dev;
	for (int d = 0; d < ch->fwd->ndev; d++)
		if (ch->ctx[d] == c)
			return d;
	return -1;
}
