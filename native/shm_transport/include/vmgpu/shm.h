/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libvmgpushm: the shared-memory transport between a guest and its host
 * forwarder.  The region layout is defined in vmgpu/shm_abi.h; this is the API
 * both sides use over it.  Knows nothing of CUDA.
 *
 * Conventions
 *  - Functions return 0 (or a non-negative count) on success and a negative
 *    errno on failure.  vmgpu_shm_errmsg() gives the last failure's sentence for
 *    the calling thread.
 *  - Errors that matter to callers:
 *      -EAGAIN      nothing to receive / no space, within the time allowed
 *      -ETIMEDOUT   a timed wait ran out
 *      -EPROTO      the other side broke the protocol (the channel is broken)
 *      -EPIPE       the other side is gone (heartbeat stopped); sticky
 *      -EMSGSIZE    a record larger than the ring allows
 *      -EPROTONOSUPPORT  the region speaks a major ABI version we do not
 *  - The host side never trusts the region: it computes the geometry itself,
 *    copies every record out before use, and checks every offset and length.
 *  - One thread at a time per channel and side (a ring is single producer,
 *    single consumer).
 */
#ifndef VMGPU_SHM_H
#define VMGPU_SHM_H

#include "vmgpu/shm_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- geometry ---------------------------------------------------------- */

struct vmgpu_shm_params {
	uint32_t nchannels;       /* channels (guest processes at once) */
	uint32_t req_ring_size;   /* bytes, power of two, >= 4 KiB */
	uint32_t cpl_ring_size;   /* bytes, power of two, >= 4 KiB */
	uint32_t wait_mode;       /* enum vmgpu_wait_mode */
	uint64_t bulk_size;       /* bytes per channel, multiple of 4 KiB, >= 64 KiB */
	uint64_t heap_block_size; /* bytes, power of two, >= 4 KiB */
};

/* Where everything is; a pure function of the region size and the params. */
struct vmgpu_layout {
	uint64_t region_size;
	uint32_t nchannels;
	uint32_t req_ring_size, cpl_ring_size;
	uint32_t wait_mode;
	uint64_t bulk_size;
	uint64_t chan_table_off, heap_map_off, chan_area_off, chan_stride;
	uint64_t req_ring_off, cpl_ring_off, bulk_off; /* within a channel block */
	uint64_t heap_off, heap_size, heap_block_size;
	uint32_t heap_blocks;
};

void vmgpu_shm_params_default(struct vmgpu_shm_params *p);
int vmgpu_layout_compute(uint64_t region_size, const struct vmgpu_shm_params *p, struct vmgpu_layout *out);
/* Smallest region size that holds these params with at least min_heap bytes of heap. */
uint64_t vmgpu_region_min_size(const struct vmgpu_shm_params *p, uint64_t min_heap);
/* Write a fresh header and zero every control structure (host side, before a guest runs). */
int vmgpu_region_format(void *base, uint64_t size, const struct vmgpu_shm_params *p, const char *name);

const char *vmgpu_shm_errmsg(void);
uint64_t vmgpu_now_ns(void); /* CLOCK_MONOTONIC */

/* ---- wait hooks -------------------------------------------------------- */

/* Called by a producer when it finds the consumer asleep, in VMGPU_WAIT_POLL
 * mode (futex mode wakes by itself).  This is where an ivshmem doorbell plugs
 * in.  `ring` is 0 for a request ring, 1 for a completion ring, 2 for bulk. */
typedef void (*vmgpu_doorbell_fn)(void *ctx, uint32_t chan, int ring);

struct vmgpu_wait_opts {
	uint64_t spin_ns;          /* busy-poll this long before blocking (default 50 us) */
	uint64_t sleep_max_ns;     /* poll mode: back-off ceiling (default 200 us) */
	uint64_t peer_timeout_ns;  /* the other side is gone after this long without a heartbeat (default 5 s) */
	vmgpu_doorbell_fn doorbell;
	void *doorbell_ctx;
};
void vmgpu_wait_opts_default(struct vmgpu_wait_opts *o);

/* ---- host side --------------------------------------------------------- */

struct vmgpu_host;
struct vmgpu_hchan;

/* Attach to a region.  The geometry comes from `p`, never from the region; the
 * region's header must carry the magic, our major version and the same
 * geometry, else -EPROTONOSUPPORT / -EINVAL with a sentence saying which. */
int vmgpu_host_attach(void *base, uint64_t size, const struct vmgpu_shm_params *p,
		      const struct vmgpu_wait_opts *o, struct vmgpu_host **out);
void vmgpu_host_detach(struct vmgpu_host *h);
const struct vmgpu_layout *vmgpu_host_layout(const struct vmgpu_host *h);
void vmgpu_host_beat(struct vmgpu_host *h);              /* publish the host heartbeat */
/* Re-publish everything the host owns in the header (magic, version, geometry,
 * features, limits, epoch, name, state, pid) from the host's private copy, so a
 * guest that scribbled on it does not lock out the guests that attach next.
 * Compares, then writes only what differs (a few hundred bytes read): call it
 * every supervisor tick.  Returns how many 8-byte words it had to rewrite. */
int vmgpu_host_republish(struct vmgpu_host *h);
/* How many channels the host serves at once to one owner_pid value (default
 * VMGPU_CHANS_PER_OWNER_DEFAULT, at most nchannels); published in the header.
 * A claim over the limit is refused (the guest gets -EMFILE).  The pid is what
 * the guest wrote: the limit bounds honest processes and careless ones; a
 * process that lies about its pid is bounded only by nchannels. */
int vmgpu_host_set_chans_per_owner(struct vmgpu_host *h, uint32_t n);
/* Publish VMGPU_FEAT_REMOTE (a network bridge's region); before any guest attaches. */
void vmgpu_host_set_remote(struct vmgpu_host *h);
void vmgpu_host_close(struct vmgpu_host *h);             /* mark the region CLOSED */
struct vmgpu_hchan *vmgpu_host_chan(struct vmgpu_host *h, uint32_t idx);

enum vmgpu_hchan_event {
	VMGPU_HC_IDLE = 0,    /* free, or being claimed */
	VMGPU_HC_OPENED = 1,  /* a new owner was accepted: serve it */
	VMGPU_HC_SERVING = 2, /* the owner we serve is alive */
	VMGPU_HC_CLOSED = 3,  /* the owner released the channel: reclaim it */
	VMGPU_HC_LOST = 4,    /* the owner is gone or broke the protocol: reclaim it */
	VMGPU_HC_REFUSED = 5, /* the owner speaks another ABI major, or is over the per-owner limit: it was told so */
};
/* Look at the channel descriptor, the owner's word and heartbeat; never blocks.
 * Verdicts are sound whatever this view saw before (a forked copy may be stale):
 *  - a 1.1 owner is LOST as soon as its owner word says its liveness thread
 *    ended (process killed or crashed: the owner's kernel writes the word);
 *  - any owner is LOST after peer_timeout without a heartbeat (a frozen guest);
 *    a heartbeat change seen across a gap longer than that is not taken as
 *    proof of life;
 *  - a state written into the descriptor of a 1.1 owner we serve whose word
 *    says it is alive (CLOSING, FREE, DEAD, garbage) is not obeyed: the
 *    channel is put back to ACTIVE and the poll says SERVING;
 *  - CLOSED only when the owner closed it (its word says its liveness ended). */
int vmgpu_hchan_poll(struct vmgpu_hchan *c, uint64_t now_ns);
/* Reset the rings and bulk area, free the owner's heap blocks, and make the
 * channel FREE again (its generation changes at the next claim). */
int vmgpu_hchan_reclaim(struct vmgpu_hchan *c);
uint32_t vmgpu_hchan_index(const struct vmgpu_hchan *c);
uint32_t vmgpu_hchan_generation(const struct vmgpu_hchan *c);

/* Receive one request into buf (copied out of the region).  Waits up to
 * timeout_ns (0 = do not wait).  Returns the payload length. */
int vmgpu_hchan_recv(struct vmgpu_hchan *c, void *buf, uint32_t cap, uint16_t *type, uint64_t timeout_ns);
/* Send one completion. */
int vmgpu_hchan_send(struct vmgpu_hchan *c, uint16_t type, const void *buf, uint32_t len, uint64_t timeout_ns);
/* A checked pointer into this channel's bulk area, or NULL if [pos, pos+len) is not inside it. */
void *vmgpu_hchan_bulk(struct vmgpu_hchan *c, uint64_t pos, uint64_t len);
/* Release bulk bytes up to `end` (a free-running position); wakes a waiting guest. */
void vmgpu_hchan_bulk_release(struct vmgpu_hchan *c, uint64_t end);
/* A checked pointer into the heap, or NULL if [off, off+len) is not inside it. */
void *vmgpu_host_heap(struct vmgpu_host *h, uint64_t off, uint64_t len);

/* A copied, display-safe snapshot of a channel (for tools). */
struct vmgpu_chan_info {
	uint32_t index, state, generation, owner_pid, guest_version, host_status;
	uint64_t heartbeat, owner_nonce;
	char owner_comm[17];
	uint32_t req_used, cpl_used; /* bytes in the rings, as published */
	uint64_t bulk_used;
	uint32_t heap_blocks;        /* heap blocks tagged with this channel */
	uint32_t owner_word;         /* 1.1: the owner's robust futex word (VMGPU_OWNER_*) */
};
int vmgpu_region_chan_info(const void *base, uint64_t size, const struct vmgpu_layout *l, uint32_t idx,
			   struct vmgpu_chan_info *out);

/* ---- guest side -------------------------------------------------------- */

struct vmgpu_guest;
struct vmgpu_gchan;

/* Attach to a region the host formatted: checks magic, version and geometry. */
int vmgpu_guest_attach(void *base, uint64_t size, const struct vmgpu_wait_opts *o, struct vmgpu_guest **out);
void vmgpu_guest_detach(struct vmgpu_guest *g);
const struct vmgpu_layout *vmgpu_guest_layout(const struct vmgpu_guest *g);
/* Close every ACTIVE channel whose owner pid alive() reports gone (the guest agent's
 * reaper; the host then reclaims at once).  Returns how many were closed. */
int vmgpu_guest_reap(struct vmgpu_guest *g, int (*alive)(uint32_t pid, void *ctx), void *ctx);
/* Is the host alive (heartbeat moved within peer_timeout)?  1 yes, 0 no. */
int vmgpu_guest_host_alive(struct vmgpu_guest *g);

/* Claim a free channel for this process and wait up to ack_timeout_ns for the
 * host to accept it.  -EBUSY: no free channel; -ETIMEDOUT: no host answered;
 * -EPROTONOSUPPORT: the host refused our version; -EMFILE: this process holds
 * the most channels the host serves to one process.  Where the host reads owner
 * words (VMGPU_FEAT_OWNER_WORD), the claim starts the channel's liveness thread
 * (it beats every 100 ms; see vmgpu_gchan_autobeat), whose end the host sees at
 * once, however the process ends. */
int vmgpu_guest_claim(struct vmgpu_guest *g, uint64_t ack_timeout_ns, struct vmgpu_gchan **out);
/* Release the channel: stop its liveness, then CLOSING; the host reclaims it.  Frees `c`. */
void vmgpu_gchan_close(struct vmgpu_gchan *c);
/* Forget the channel without telling the host (what a crash looks like: its
 * liveness thread ends, so the host finds the owner gone). */
void vmgpu_gchan_abandon(struct vmgpu_gchan *c);
uint32_t vmgpu_gchan_index(const struct vmgpu_gchan *c);
uint32_t vmgpu_gchan_generation(const struct vmgpu_gchan *c);
void vmgpu_gchan_beat(struct vmgpu_gchan *c);
/* Beat from a background thread every interval_ns until close/abandon (the
 * liveness thread the claim started, if any, takes the new interval). */
int vmgpu_gchan_autobeat(struct vmgpu_gchan *c, uint64_t interval_ns);

/* Zero-copy send: reserve room for len payload bytes, fill it, commit. */
void *vmgpu_gchan_reserve(struct vmgpu_gchan *c, uint32_t len, uint64_t timeout_ns, int *err);
int vmgpu_gchan_commit(struct vmgpu_gchan *c, uint16_t type);
int vmgpu_gchan_send(struct vmgpu_gchan *c, uint16_t type, const void *buf, uint32_t len, uint64_t timeout_ns);
int vmgpu_gchan_recv(struct vmgpu_gchan *c, void *buf, uint32_t cap, uint16_t *type, uint64_t timeout_ns);
/* Largest payload one record can carry on the request / completion ring. */
uint32_t vmgpu_gchan_max_payload(const struct vmgpu_gchan *c, int ring);

/* Take len bytes of the bulk area (contiguous); returns its free-running
 * position and a pointer.  Waits for the host to release space. */
int vmgpu_gchan_bulk_alloc(struct vmgpu_gchan *c, uint64_t len, uint64_t timeout_ns, uint64_t *pos, void **ptr);
/* The same, saying who writes the bytes (VMGPU_BULK_TO_HOST: the guest, before the request
 * naming them; FROM_HOST: the host); in a VMGPU_FEAT_REMOTE region the allocation is noted in
 * the request ring (the plain call notes VMGPU_BULK_BOTH). */
int vmgpu_gchan_bulk_alloc_dir(struct vmgpu_gchan *c, uint64_t len, uint32_t dir, uint64_t timeout_ns, uint64_t *pos,
			       void **ptr);
/* The position up to which the host released this channel's bulk area. */
uint64_t vmgpu_gchan_bulk_released(const struct vmgpu_gchan *c);
/* That position once it is no longer `seen`, waiting at most timeout_ns for the host to release
 * more (the host wakes a waiter as it releases); the position as it is, at the timeout.  One
 * waiter per channel: a bridge's thread that passes releases on (an allocation of the same
 * channel must not wait meanwhile: give it timeout 0). */
uint64_t vmgpu_gchan_bulk_wait_release(struct vmgpu_gchan *c, uint64_t seen, uint64_t timeout_ns);
/* Nonzero when the region's host is a network bridge (VMGPU_FEAT_REMOTE). */
int vmgpu_guest_remote(const struct vmgpu_guest *g);
uint64_t vmgpu_gchan_bulk_size(const struct vmgpu_gchan *c);

/* Heap: host-visible buffers by region offset, owned by the channel c. */
int vmgpu_guest_heap_alloc(struct vmgpu_gchan *c, uint64_t size, uint64_t *off);
int vmgpu_guest_heap_free(struct vmgpu_gchan *c, uint64_t off);
void *vmgpu_guest_ptr(struct vmgpu_guest *g, uint64_t off);
uint64_t vmgpu_guest_offset(struct vmgpu_guest *g, const void *p); /* UINT64_MAX if outside */

#ifdef __cplusplus
}
#endif
#endif /* VMGPU_SHM_H */
