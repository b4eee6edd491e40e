/* SPDX-License-Identifier: Apache-2.0 */
/* The records of what a guest process holds that its quota follows (allocations.h). */
#include <stdlib.h>

#include "allocations.h"
#include "channel.h"
#include "ipc.h"
#include "quota.h"

struct vh_alloc *vh_alloc_track(struct vh_chan *ch, CUdeviceptr base, uint64_t size, int dev, int kind)
{
	if (ch->nallocs == ch->capallocs) {
		size_t cap = ch->capallocs ? ch->capallocs * 2 : 64;
		struct vh_alloc *a = realloc(ch->allocs, cap * sizeof *a);
		if (!a)
			return NULL;
		ch->allocs = a;
		ch->capallocs = cap;
	}
	struct vh_alloc *a = &ch->allocs[ch->nallocs++];
	*a = (struct vh_alloc){.base = base, .size = size, .dev = dev, .kind = kind};
	return a;
}

struct vh_alloc *vh_alloc_find(struct vh_chan *ch, uint64_t base, unsigned kinds)
{
	for (size_t i = 0; i < ch->nallocs; i++)
		if (ch->allocs[i].base == base && (kinds >> ch->allocs[i].kind & 1))
			return &ch->allocs[i];
	return NULL;
}

struct vh_alloc *vh_alloc_find_vmm(struct vh_chan *ch, uint64_t guest, unsigned kinds)
{
	for (size_t i = 0; guest && i < ch->nallocs; i++)
		if (ch->allocs[i].guest == guest && (kinds >> ch->allocs[i].kind & 1))
			return &ch->allocs[i];
	return NULL;
}

int vh_alloc_in_reserved(struct vh_chan *ch, uint64_t p, uint64_t n)
{
	for (size_t i = 0; i < ch->nallocs; i++) {
		const struct vh_alloc *a = &ch->allocs[i];
		if (a->kind == VH_VA && p >= a->base && n <= a->size && p - a->base <= a->size - n)
			return 1;
	}
	return 0;
}

void vh_alloc_untrack(struct vh_chan *ch, struct vh_alloc *a)
{
	if (a->exported) /* freed, kept or undone: the block is no longer this process's to share */
		vh_ipc_unexport(ch, a->base);
	*a = ch->allocs[--ch->nallocs];
}

/* A record whose memory the driver has taken back: forget it, and the quota follows. */
void vh_alloc_release(struct vh_chan *ch, struct vh_alloc *a)
{
	int dev = a->dev;
	uint64_t charge = a->size;
	vh_alloc_untrack(ch, a);
	vh_quota_given_back(ch, dev, charge);
}
