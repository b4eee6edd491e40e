/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest side of the region, private to its files: guest_region.c (attach,
 * addresses, the agent's reaper), guest_channel.c (claim and close),
 * guest_liveness.c (the host's liveness as the guest sees it; the channel's
 * liveness thread), guest_io.c (requests, completions, bulk), guest_heap.c.
 */
#ifndef VMGPU_SHM_GUEST_INTERNAL_H
#define VMGPU_SHM_GUEST_INTERNAL_H

#include "internal.h"

#include <linux/futex.h>
#include <pthread.h>

/* A region state other than READY is believed after this long (a guest that
 * scribbled on the header must not cut its siblings off before the host
 * re-publishes it). */
#define NOT_READY_GRACE_NS (250ull * 1000000ull)

struct vmgpu_guest {
	uint8_t *base;
	uint64_t size;
	struct vmgpu_layout l;
	struct vmgpu_wait_opts wo;
	VMGPU_ATOMIC(uint64_t) host_beat;
	VMGPU_ATOMIC(uint64_t) host_beat_ns;
	VMGPU_ATOMIC(uint64_t) not_ready_ns; /* when the region was first seen not READY, 0 if it is */
	VMGPU_ATOMIC(uint32_t) heap_hint;
	uint64_t features;                   /* as the host published them at attach */
	uint32_t chans_per_owner;
};

struct vmgpu_gchan {
	struct vmgpu_guest *g;
	uint32_t idx, gen;
	struct ring req, cpl;
	struct vmgpu_bulk_ctl *bulk;
	uint8_t *bulk_data;
	uint64_t bulk_pos, bulk_released;
	struct peer_check peer; /* is the host alive, and this channel still ours? */
	VMGPU_ATOMIC(uint64_t) odd_since_ns; /* when the descriptor was first seen not ours, 0 if it is */
	/* the liveness thread: beats, and holds the owner word in its robust list */
	pthread_t beat_thread;
	VMGPU_ATOMIC(uint32_t) beat_stop;  /* futex word: 1 = stop */
	VMGPU_ATOMIC(uint32_t) beat_ready; /* futex word: 1 = running (word armed if arm), 2 = failed */
	VMGPU_ATOMIC(bool) beat_closing;   /* the owner closes: mark the word closed, not died */
	VMGPU_ATOMIC(uint64_t) beat_interval_ns;
	bool beating;
	bool arm;                          /* arm the owner word (the host reads it) */
	struct robust_list_head robust_head; /* the liveness thread's robust list: one entry, the owner word */
	struct robust_list robust_entry;
};

static inline struct vmgpu_chan_desc *gchan_desc(struct vmgpu_gchan *c)
{
	return chan_desc(c->g->base, &c->g->l, c->idx);
}

/* The host is alive and still considers this channel ours (a peer_check). */
bool gchan_peer_alive(void *ctx);

/* Start the channel's liveness thread (it beats every interval_ns, and arms the owner word
 * where the host reads it); stop it, as a close (closing) or as a death. */
int gchan_start_beat(struct vmgpu_gchan *c, uint64_t interval_ns);
void gchan_stop_beat(struct vmgpu_gchan *c, bool closing);

#endif
