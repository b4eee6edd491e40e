/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host side of the region.  The guest is hostile: the geometry is our own,
 * records are copied out before use, guest-written indices are checked, and
 * channel states in the region are hints we confirm, never commands we obey.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

struct vmgpu_hchan {
	struct vmgpu_host *h;
	uint32_t idx;
	uint32_t gen;          /* generation being served, 0 if none */
	_Atomic bool serving; /* read by served_to() from other channels' threads */
	bool refused;
	bool armed;            /* the accepted owner speaks 1.1: its owner word is the liveness verdict */
	_Atomic uint32_t owner_pid;   /* owner_pid as copied when the owner was accepted (for the per-owner limit) */
	struct ring req, cpl;
	struct vmgpu_bulk_ctl *bulk;
	uint8_t *bulk_data;
	uint64_t bulk_released;
	/* liveness, private */
	uint64_t seen_ctl, seen_beat, seen_change_ns, seen_poll_ns;
};

/* What the host owns in the header: everything up to the host's liveness
 * line (geometry, version, features, limits, epoch, name), and the host pid. */
#define HOST_OWNED_BYTES offsetof(struct vmgpu_region_header, host_heartbeat)

struct vmgpu_host {
	uint8_t *base;
	uint64_t size;
	struct vmgpu_layout l;
	struct vmgpu_wait_opts wo;
	struct vmgpu_hchan *chans;
	struct vmgpu_region_header pub; /* the header as this host publishes it (host-owned part) */
	uint32_t state;                 /* region_state as this host publishes it */
};

static struct vmgpu_region_header *hdr_of(struct vmgpu_host *h)
{
	return (struct vmgpu_region_header *)h->base;
}

static void hchan_reset_private(struct vmgpu_hchan *c)
{
	struct vmgpu_host *h = c->h;
	uint8_t *blk = chan_block(h->base, &h->l, c->idx);
	struct vmgpu_chan_ctl *ctl = (struct vmgpu_chan_ctl *)blk;
	/* host consumes requests and produces completions */
	ring_init(&c->req, blk + h->l.req_ring_off, &ctl->req, h->l.req_ring_size, &h->wo, h->l.wait_mode, c->idx,
		  0);
	ring_init(&c->cpl, blk + h->l.cpl_ring_off, &ctl->cpl, h->l.cpl_ring_size, &h->wo, h->l.wait_mode, c->idx,
		  1);
	/* Continue where the shared indices stand: zero after a reclaim, the
	 * previous host's positions when a restarted host re-adopts a channel.
	 * They are guest-writable, but every use is masked, and a producer's
	 * cached head starts "full" so the first reserve re-reads and checks it. */
	c->req.pos = c->req.other = atomic_load_explicit(&ctl->req.head, memory_order_acquire);
	c->cpl.pos = atomic_load_explicit(&ctl->cpl.tail, memory_order_acquire);
	c->cpl.other = c->cpl.pos - c->cpl.size;
	if ((c->req.pos | c->cpl.pos) & (VMGPU_REC_ALIGN - 1))
		c->req.broken = c->cpl.broken = true; /* no honest side writes a misaligned index */
	c->bulk = &ctl->bulk;
	c->bulk_data = blk + h->l.bulk_off;
	c->bulk_released = atomic_load_explicit(&ctl->bulk.released, memory_order_acquire);
	c->serving = false;
	c->refused = false;
	c->armed = false;
	c->owner_pid = 0;
	c->gen = 0;
}

VMGPU_EXPORT int vmgpu_host_attach(void *base, uint64_t size, const struct vmgpu_shm_params *p,
				   const struct vmgpu_wait_opts *o, struct vmgpu_host **out)
{
	struct vmgpu_layout l;
	int e = vmgpu_layout_compute(size, p, &l);
	if (e)
		return e;
	e = layout_check_header(base, size, &l);
	if (e)
		return e;
	struct vmgpu_host *h = calloc(1, sizeof *h);
	if (!h)
		return vmgpu_seterr(ENOMEM, "out of memory");
	h->chans = calloc(l.nchannels, sizeof *h->chans);
	if (!h->chans) {
		free(h);
		return vmgpu_seterr(ENOMEM, "out of memory");
	}
	h->base = base;
	h->size = size;
	h->l = l;
	if (o)
		h->wo = *o;
	else
		vmgpu_wait_opts_default(&h->wo);
	uint64_t now = vmgpu_now_ns();
	for (uint32_t i = 0; i < l.nchannels; i++) {
		struct vmgpu_hchan *c = &h->chans[i];
		c->h = h;
		c->idx = i;
		hchan_reset_private(c);
		c->seen_change_ns = c->seen_poll_ns = now;
	}
	uint64_t epoch = 0;
	if (getrandom(&epoch, sizeof epoch, 0) != sizeof epoch)
		epoch = now;
	/* the header as we publish it from now on: our geometry, the region's name */
	char name[sizeof h->pub.name];
	const struct vmgpu_region_header *rh = base;
	for (size_t k = 0; k < sizeof name; k++)
		name[k] = SHM_LOAD(rh->name[k]);
	name[sizeof name - 1] = 0;
	region_header_fill(&h->pub, &l, name);
	h->pub.host_epoch = epoch;
	h->pub.host_pid = (uint32_t)getpid();
	h->state = VMGPU_REGION_READY;
	vmgpu_host_republish(h);
	vmgpu_host_beat(h);
	*out = h;
	return 0;
}

/* Compare the host-owned part of the header with our copy, 8 bytes at a time,
 * and write back what differs.  Returns how many 8-byte words were rewritten. */
VMGPU_EXPORT int vmgpu_host_republish(struct vmgpu_host *h)
{
	_Static_assert(HOST_OWNED_BYTES % 8 == 0, "host-owned header part is whole words");
	_Static_assert(offsetof(struct vmgpu_region_header, region_state) % 8 == 4, "region_state shares a word");
	uint64_t *shared = (uint64_t *)(void *)h->base;
	uint64_t want[HOST_OWNED_BYTES / 8];
	memcpy(want, &h->pub, sizeof want);
	/* region_state is ours too: fold it into the word it shares with heap_blocks */
	size_t sw = offsetof(struct vmgpu_region_header, region_state) / 8;
	want[sw] = (want[sw] & 0xffffffffull) | ((uint64_t)h->state << 32);
	int n = 0;
	for (size_t i = 0; i < HOST_OWNED_BYTES / 8; i++) {
		if (__atomic_load_n(&shared[i], __ATOMIC_RELAXED) != want[i]) {
			__atomic_store_n(&shared[i], want[i], __ATOMIC_RELEASE);
			n++;
		}
	}
	struct vmgpu_region_header *hdr = hdr_of(h);
	if (SHM_LOAD(hdr->host_pid) != h->pub.host_pid) {
		SHM_STORE(hdr->host_pid, h->pub.host_pid);
		n++;
	}
	return n;
}

VMGPU_EXPORT int vmgpu_host_set_chans_per_owner(struct vmgpu_host *h, uint32_t n)
{
	if (n < 1 || n > h->l.nchannels)
		return vmgpu_seterr(EINVAL, "channels per process %u is outside 1..%u (the region's channels)", n,
				    h->l.nchannels);
	h->pub.chans_per_owner = n;
	vmgpu_host_republish(h);
	return 0;
}

VMGPU_EXPORT void vmgpu_host_set_remote(struct vmgpu_host *h)
{
	h->pub.features |= VMGPU_FEAT_REMOTE;
	vmgpu_host_republish(h);
}

VMGPU_EXPORT void vmgpu_host_detach(struct vmgpu_host *h)
{
	if (!h)
		return;
	free(h->chans);
	free(h);
}

VMGPU_EXPORT const struct vmgpu_layout *vmgpu_host_layout(const struct vmgpu_host *h)
{
	return &h->l;
}

VMGPU_EXPORT void vmgpu_host_beat(struct vmgpu_host *h)
{
	atomic_fetch_add_explicit(&hdr_of(h)->host_heartbeat, 1, memory_order_release);
}

VMGPU_EXPORT void vmgpu_host_close(struct vmgpu_host *h)
{
	h->state = VMGPU_REGION_CLOSED;
	atomic_store_explicit(&hdr_of(h)->region_state, VMGPU_REGION_CLOSED, memory_order_release);
}

VMGPU_EXPORT struct vmgpu_hchan *vmgpu_host_chan(struct vmgpu_host *h, uint32_t idx)
{
	return idx < h->l.nchannels ? &h->chans[idx] : NULL;
}

VMGPU_EXPORT uint32_t vmgpu_hchan_index(const struct vmgpu_hchan *c)
{
	return c->idx;
}

VMGPU_EXPORT uint32_t vmgpu_hchan_generation(const struct vmgpu_hchan *c)
{
	return c->gen;
}

static struct vmgpu_chan_desc *desc_of(struct vmgpu_hchan *c)
{
	return chan_desc(c->h->base, &c->h->l, c->idx);
}

/* Has the owner shown a sign of life (heartbeat, descriptor change) recently?
 * A change seen across a gap longer than the timeout (a view left stale while
 * another process served the channel) proves nothing about now: the owner then
 * gets half a timeout to show another one. */
static bool owner_alive(struct vmgpu_hchan *c, uint64_t ctl, uint64_t now)
{
	uint64_t to = c->h->wo.peer_timeout_ns;
	uint64_t beat = atomic_load_explicit(&desc_of(c)->heartbeat, memory_order_relaxed);
	bool stale = now - c->seen_poll_ns > to;
	c->seen_poll_ns = now;
	if (beat != c->seen_beat || ctl != c->seen_ctl) {
		c->seen_beat = beat;
		c->seen_ctl = ctl;
		if (!stale) {
			c->seen_change_ns = now;
			return true;
		}
		uint64_t half = now > to / 2 ? now - to / 2 : 0;
		if ((int64_t)(half - c->seen_change_ns) > 0)
			c->seen_change_ns = half;
	}
	return now - c->seen_change_ns < to;
}

/* The owner word of a 1.1 owner: the owner's kernel sets VMGPU_OWNER_DIED when
 * its liveness thread ends.  True while it holds a thread id without that bit. */
static bool owner_word_alive(struct vmgpu_hchan *c)
{
	uint32_t w = atomic_load_explicit(&desc_of(c)->owner_word, memory_order_acquire);
	return !(w & VMGPU_OWNER_DIED) && (w & VMGPU_OWNER_TID_MASK) != 0;
}

static bool owner_word_died(struct vmgpu_hchan *c)
{
	return atomic_load_explicit(&desc_of(c)->owner_word, memory_order_acquire) & VMGPU_OWNER_DIED;
}

/* The owner ended its liveness to close the channel (not a death). */
static bool owner_word_closed(struct vmgpu_hchan *c)
{
	uint32_t w = atomic_load_explicit(&desc_of(c)->owner_word, memory_order_acquire);
	return (w & (VMGPU_OWNER_DIED | VMGPU_OWNER_CLOSED)) == (VMGPU_OWNER_DIED | VMGPU_OWNER_CLOSED);
}

static void accept_owner(struct vmgpu_hchan *c, uint32_t gen, uint32_t status)
{
	struct vmgpu_chan_desc *d = desc_of(c);
	atomic_store_explicit(&d->host_status, status, memory_order_relaxed);
	atomic_store_explicit(&d->host_ack_gen, gen, memory_order_release);
}

/* Someone wrote another state into the descriptor of an owner we serve whose
 * owner word says it is alive (an honest owner stops its liveness before it
 * closes): not the owner's doing.  Put the channel back as it was. */
static bool restore_forged(struct vmgpu_hchan *c, uint64_t ctl)
{
	if (!c->serving || !c->armed || !owner_word_alive(c))
		return false;
	atomic_compare_exchange_strong(&desc_of(c)->ctl, &ctl, CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen));
	return true;
}

/* Channels served now to owners that said they are process `pid`. */
static uint32_t served_to(struct vmgpu_host *h, uint32_t pid)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < h->l.nchannels; i++)
		n += h->chans[i].serving && h->chans[i].owner_pid == pid;
	return n;
}

VMGPU_EXPORT int vmgpu_hchan_poll(struct vmgpu_hchan *c, uint64_t now)
{
	struct vmgpu_chan_desc *d = desc_of(c);
	uint64_t ctl = atomic_load_explicit(&d->ctl, memory_order_acquire);
	uint32_t state = CTL_STATE(ctl), gen = CTL_GEN(ctl);
	bool alive = owner_alive(c, ctl, now);

	if (c->req.broken || c->cpl.broken)
		return VMGPU_HC_LOST; /* the owner is cut off: reclaim fences it out (DEAD) */
	switch (state) {
	case VMGPU_CHAN_FREE:
		if (restore_forged(c, ctl))
			return VMGPU_HC_SERVING;
		if (c->serving) /* the owner freed it behind our back: treat as closed */
			return VMGPU_HC_CLOSED;
		return VMGPU_HC_IDLE;
	case VMGPU_CHAN_CLAIMING:
		if (restore_forged(c, ctl))
			return VMGPU_HC_SERVING;
		if (owner_word_died(c))
			return VMGPU_HC_LOST; /* the claimer died after arming its word */
		return alive ? VMGPU_HC_IDLE : VMGPU_HC_LOST;
	case VMGPU_CHAN_ACTIVE:
		if (!c->serving || gen != c->gen) {
			if (c->serving) /* a new owner replaced the one we served: the old one is gone */
				return VMGPU_HC_LOST;
			if (c->refused && gen == c->gen)
				return alive && !(c->armed && !owner_word_alive(c)) ? VMGPU_HC_REFUSED : VMGPU_HC_LOST;
			hchan_reset_private(c);
			c->gen = gen;
			uint32_t gv = SHM_LOAD(d->guest_version);
			if ((gv >> 16) != VMGPU_SHM_VERSION_MAJOR) {
				c->refused = true;
				accept_owner(c, gen, VMGPU_HOST_REFUSED_VERSION);
				return VMGPU_HC_REFUSED;
			}
			/* a 1.1 owner armed its word before it made the channel ACTIVE */
			c->armed = (gv & 0xffffu) >= 1;
			if (c->armed && !owner_word_alive(c))
				return VMGPU_HC_LOST;
			uint32_t pid = SHM_LOAD(d->owner_pid);
			if (served_to(c->h, pid) >= c->h->pub.chans_per_owner) {
				c->refused = true;
				accept_owner(c, gen, VMGPU_HOST_REFUSED_LIMIT);
				return VMGPU_HC_REFUSED;
			}
			c->owner_pid = pid;
			c->serving = true;
			c->seen_change_ns = now;
			accept_owner(c, gen, VMGPU_HOST_ACCEPTED);
			return VMGPU_HC_OPENED;
		}
		if (c->armed && !owner_word_alive(c)) /* its liveness ended: closed, or the process died */
			return owner_word_closed(c) ? VMGPU_HC_CLOSED : VMGPU_HC_LOST;
		return alive ? VMGPU_HC_SERVING : VMGPU_HC_LOST;
	case VMGPU_CHAN_CLOSING:
		if (restore_forged(c, ctl))
			return VMGPU_HC_SERVING;
		return VMGPU_HC_CLOSED;
	default: /* DEAD, or garbage written by the guest */
		if (restore_forged(c, ctl))
			return VMGPU_HC_SERVING;
		return VMGPU_HC_LOST;
	}
}

VMGPU_EXPORT int vmgpu_hchan_reclaim(struct vmgpu_hchan *c)
{
	struct vmgpu_host *h = c->h;
	struct vmgpu_chan_desc *d = desc_of(c);
	uint64_t ctl = atomic_load_explicit(&d->ctl, memory_order_acquire);
	uint32_t gen = CTL_GEN(ctl);
	/* First fence the owner out (a stalled owner that wakes sees DEAD), then clean. */
	if (CTL_STATE(ctl) != VMGPU_CHAN_FREE &&
	    !atomic_compare_exchange_strong(&d->ctl, &ctl, CTL_MAKE(VMGPU_CHAN_DEAD, gen)))
		return vmgpu_seterr(EAGAIN, "channel %u changed while being reclaimed; try again", c->idx);
	chan_zero(h->base, &h->l, c->idx);
	struct vmgpu_heap_block *hm = heap_map(h->base, &h->l);
	for (uint32_t i = 0; i < h->l.heap_blocks; i++) {
		uint32_t o = atomic_load_explicit(&hm[i].owner, memory_order_relaxed);
		if (o && VMGPU_HEAP_TAG_CHAN(o) == c->idx) {
			SHM_STORE(hm[i].run, 0);
			atomic_store_explicit(&hm[i].owner, 0, memory_order_release);
		}
	}
	SHM_STORE(d->owner_nonce, 0);
	SHM_STORE(d->owner_pid, 0);
	SHM_STORE(d->guest_version, 0);
	for (int k = 0; k < 16; k++)
		SHM_STORE(d->owner_comm[k], 0);
	atomic_store_explicit(&d->heartbeat, 0, memory_order_relaxed);
	atomic_store_explicit(&d->owner_word, 0, memory_order_relaxed);
	atomic_store_explicit(&d->host_status, VMGPU_HOST_PENDING, memory_order_relaxed);
	atomic_store_explicit(&d->host_ack_gen, 0, memory_order_relaxed);
	hchan_reset_private(c);
	c->seen_change_ns = c->seen_poll_ns = vmgpu_now_ns();
	/* Keep the generation: the next claim moves it on. */
	atomic_store_explicit(&d->ctl, CTL_MAKE(VMGPU_CHAN_FREE, gen), memory_order_release);
	return 0;
}

VMGPU_EXPORT int vmgpu_hchan_recv(struct vmgpu_hchan *c, void *buf, uint32_t cap, uint16_t *type,
				  uint64_t timeout_ns)
{
	if (!c->serving)
		return vmgpu_seterr(ENOTCONN, "channel %u has no accepted owner", c->idx);
	int n = ring_recv(&c->req, buf, cap, type, timeout_ns, NULL);
	if (n >= 0)
		c->seen_change_ns = vmgpu_now_ns(); /* a request is a sign of life */
	return n;
}

static bool hchan_owner_alive_cb(void *ctx)
{
	struct vmgpu_hchan *c = ctx;
	struct vmgpu_chan_desc *d = desc_of(c);
	uint64_t ctl = atomic_load_explicit(&d->ctl, memory_order_acquire);
	if (c->armed && !owner_word_alive(c))
		return false;
	if (ctl != CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen) && !restore_forged(c, ctl))
		return false;
	return owner_alive(c, ctl, vmgpu_now_ns());
}

VMGPU_EXPORT int vmgpu_hchan_send(struct vmgpu_hchan *c, uint16_t type, const void *buf, uint32_t len,
				  uint64_t timeout_ns)
{
	if (!c->serving)
		return vmgpu_seterr(ENOTCONN, "channel %u has no accepted owner", c->idx);
	struct peer_check pc = {hchan_owner_alive_cb, c};
	int e = 0;
	void *p = ring_reserve(&c->cpl, len, timeout_ns, &pc, &e);
	if (!p)
		return e;
	memcpy(p, buf, len);
	return ring_commit(&c->cpl, type);
}

VMGPU_EXPORT void *vmgpu_hchan_bulk(struct vmgpu_hchan *c, uint64_t pos, uint64_t len)
{
	uint64_t bsz = c->h->l.bulk_size;
	uint64_t off = pos & (bsz - 1);
	if (len > bsz || off + len > bsz) {
		vmgpu_seterr(ERANGE, "bulk range of %llu bytes at %llu is outside channel %u's bulk area",
			     (unsigned long long)len, (unsigned long long)pos, c->idx);
		return NULL;
	}
	return c->bulk_data + off;
}

VMGPU_EXPORT void vmgpu_hchan_bulk_release(struct vmgpu_hchan *c, uint64_t end)
{
	/* only forward, and never by more than the whole area at once */
	if ((int64_t)(end - c->bulk_released) <= 0 || end - c->bulk_released > 2 * c->h->l.bulk_size)
		return;
	c->bulk_released = end;
	atomic_store_explicit(&c->bulk->released, end, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->bulk->guest_waiting, memory_order_relaxed))
		shm_wake_word(c->h->l.wait_mode, &c->bulk->release_seq, &c->h->wo, c->idx, 2);
}

VMGPU_EXPORT void *vmgpu_host_heap(struct vmgpu_host *h, uint64_t off, uint64_t len)
{
	if (off < h->l.heap_off || len > h->l.heap_size || off - h->l.heap_off > h->l.heap_size - len) {
		vmgpu_seterr(ERANGE, "range of %llu bytes at offset %llu is outside the heap",
			     (unsigned long long)len, (unsigned long long)off);
		return NULL;
	}
	return h->base + off;
}
