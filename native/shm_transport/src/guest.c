/* SPDX-License-Identifier: Apache-2.0 */
/* Guest side of the region: attach, claim a channel, send, receive, bulk, heap. */
#define _GNU_SOURCE
#include "internal.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Static_assert(VMGPU_OWNER_DIED == FUTEX_OWNER_DIED && VMGPU_OWNER_TID_MASK == FUTEX_TID_MASK,
	       "the owner word is the kernel's robust futex word");

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
	struct peer_check pc;
	VMGPU_ATOMIC(uint64_t) odd_since_ns; /* when the descriptor was first seen not ours, 0 if it is */
	/* the liveness thread: beats, and holds the owner word in its robust list */
	pthread_t beat_thread;
	VMGPU_ATOMIC(uint32_t) beat_stop;  /* futex word: 1 = stop */
	VMGPU_ATOMIC(uint32_t) beat_ready; /* futex word: 1 = running (word armed if arm), 2 = failed */
	VMGPU_ATOMIC(bool) beat_closing;   /* the owner closes: mark the word closed, not died */
	VMGPU_ATOMIC(uint64_t) beat_interval_ns;
	bool beating;
	bool arm;                          /* arm the owner word (the host reads it) */
	struct robust_list_head rhead;     /* this thread's robust list: one entry, the owner word */
	struct robust_list rentry;
};

static struct vmgpu_region_header *ghdr(struct vmgpu_guest *g)
{
	return (struct vmgpu_region_header *)g->base;
}

VMGPU_EXPORT int vmgpu_guest_attach(void *base, uint64_t size, const struct vmgpu_wait_opts *o,
				    struct vmgpu_guest **out)
{
	if (size < sizeof(struct vmgpu_region_header))
		return vmgpu_seterr(EINVAL, "mapping of %llu bytes is smaller than a region header",
				    (unsigned long long)size);
	/* copy, then validate, then use: other processes may write the header meanwhile */
	struct vmgpu_region_header hc;
	const uint64_t *src = base;
	for (size_t i = 0; i < sizeof hc / 8; i++) {
		uint64_t w = __atomic_load_n(&src[i], __ATOMIC_ACQUIRE);
		memcpy((uint8_t *)&hc + 8 * i, &w, 8);
	}
	const struct vmgpu_region_header *h = &hc;
	if (h->magic != VMGPU_SHM_MAGIC)
		return vmgpu_seterr(EINVAL, "not a vmgpu region (magic %016llx); has the host formatted it?",
				    (unsigned long long)h->magic);
	if (h->version_major != VMGPU_SHM_VERSION_MAJOR)
		return vmgpu_seterr(EPROTONOSUPPORT,
				    "region speaks ABI %u.%u but this guest library speaks %u.%u; install the "
				    "guest library that matches the host",
				    h->version_major, h->version_minor, VMGPU_SHM_VERSION_MAJOR,
				    VMGPU_SHM_VERSION_MINOR);
	uint32_t st = atomic_load_explicit(&((struct vmgpu_region_header *)base)->region_state, memory_order_acquire);
	if (st != VMGPU_REGION_READY)
		return vmgpu_seterr(EAGAIN, "region is not ready (state %u)", st);
	if (h->region_size > size)
		return vmgpu_seterr(EINVAL, "region says %llu bytes but only %llu are mapped",
				    (unsigned long long)h->region_size, (unsigned long long)size);
	struct vmgpu_shm_params p = {
		.nchannels = h->nchannels,
		.req_ring_size = h->req_ring_size,
		.cpl_ring_size = h->cpl_ring_size,
		.wait_mode = h->wait_mode,
		.bulk_size = h->bulk_size,
		.heap_block_size = h->heap_block_size,
	};
	struct vmgpu_layout l;
	int e = vmgpu_layout_compute(h->region_size, &p, &l);
	if (e)
		return e;
	e = layout_check_header(h, h->region_size, &l);
	if (e)
		return e;
	struct vmgpu_guest *g = calloc(1, sizeof *g);
	if (!g)
		return vmgpu_seterr(ENOMEM, "out of memory");
	g->base = base;
	g->size = h->region_size;
	g->l = l;
	/* a 1.0 host publishes no features and no limit */
	g->features = h->version_minor >= 1 ? h->features : 0;
	g->chans_per_owner = h->version_minor >= 1 && h->chans_per_owner ? h->chans_per_owner : l.nchannels;
	if (o)
		g->wo = *o;
	else
		vmgpu_wait_opts_default(&g->wo);
	g->host_beat = atomic_load_explicit(&((struct vmgpu_region_header *)base)->host_heartbeat, memory_order_relaxed);
	g->host_beat_ns = vmgpu_now_ns();
	*out = g;
	return 0;
}

VMGPU_EXPORT void vmgpu_guest_detach(struct vmgpu_guest *g)
{
	free(g);
}

VMGPU_EXPORT const struct vmgpu_layout *vmgpu_guest_layout(const struct vmgpu_guest *g)
{
	return &g->l;
}

VMGPU_EXPORT int vmgpu_guest_host_alive(struct vmgpu_guest *g)
{
	struct vmgpu_region_header *h = ghdr(g);
	uint64_t now = vmgpu_now_ns();
	if (atomic_load_explicit(&h->region_state, memory_order_acquire) != VMGPU_REGION_READY) {
		uint64_t since = atomic_load_explicit(&g->not_ready_ns, memory_order_relaxed);
		if (!since)
			atomic_store_explicit(&g->not_ready_ns, since = now, memory_order_relaxed);
		if (now - since >= NOT_READY_GRACE_NS)
			return 0;
	} else {
		atomic_store_explicit(&g->not_ready_ns, 0, memory_order_relaxed);
	}
	uint64_t beat = atomic_load_explicit(&h->host_heartbeat, memory_order_acquire);
	if (beat != atomic_load_explicit(&g->host_beat, memory_order_relaxed)) {
		atomic_store_explicit(&g->host_beat, beat, memory_order_relaxed);
		atomic_store_explicit(&g->host_beat_ns, now, memory_order_relaxed);
		return 1;
	}
	return now - atomic_load_explicit(&g->host_beat_ns, memory_order_relaxed) < g->wo.peer_timeout_ns;
}

static struct vmgpu_chan_desc *gdesc(struct vmgpu_gchan *c)
{
	return chan_desc(c->g->base, &c->g->l, c->idx);
}

/* The host is alive and still considers this channel ours.  DEAD with our
 * generation is the host's fence: believed at once.  Any other state is either
 * the host's reclaim (FREE follows DEAD) or a sibling's scribble, which the host
 * undoes within a tick: believed when it lasts. */
static bool gchan_peer_alive(void *ctx)
{
	struct vmgpu_gchan *c = ctx;
	uint64_t ctl = atomic_load_explicit(&gdesc(c)->ctl, memory_order_acquire);
	if (ctl != CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen)) {
		if (ctl == CTL_MAKE(VMGPU_CHAN_DEAD, c->gen))
			return false;
		uint64_t now = vmgpu_now_ns(), since = atomic_load_explicit(&c->odd_since_ns, memory_order_relaxed);
		if (!since)
			atomic_store_explicit(&c->odd_since_ns, since = now, memory_order_relaxed);
		if (now - since >= NOT_READY_GRACE_NS)
			return false;
	} else {
		atomic_store_explicit(&c->odd_since_ns, 0, memory_order_relaxed);
	}
	return vmgpu_guest_host_alive(c->g);
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
	nanosleep(&ts, NULL);
}

static long futex_op(VMGPU_ATOMIC(uint32_t) *w, int op, uint32_t val, uint64_t timeout_ns)
{
	struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull), .tv_nsec = (long)(timeout_ns % 1000000000ull)};
	return syscall(SYS_futex, (uint32_t *)w, op, val, timeout_ns ? &ts : NULL, NULL, 0);
}

/* The channel's liveness thread.  It makes the owner word the one entry of its
 * own robust futex list (the kernel's list is per thread; this thread holds no
 * robust mutex of glibc's) and stores its thread id there: when the thread ends,
 * however the process ends, the kernel sets VMGPU_OWNER_DIED in the word.  Then
 * it beats the heartbeat until told to stop, while the channel is still ours. */
static void *beat_main(void *arg)
{
	struct vmgpu_gchan *c = arg;
	struct vmgpu_chan_desc *d = gdesc(c);
	uint32_t ready = 1;
	if (c->arm) {
		c->rentry.next = &c->rhead.list;
		c->rhead.list.next = &c->rentry;
		c->rhead.futex_offset = (long)((uint8_t *)&d->owner_word - (uint8_t *)&c->rentry);
		c->rhead.list_op_pending = NULL;
		if (syscall(SYS_set_robust_list, &c->rhead, sizeof c->rhead) != 0)
			ready = 2;
		else
			atomic_store_explicit(&d->owner_word, (uint32_t)syscall(SYS_gettid) & VMGPU_OWNER_TID_MASK,
					      memory_order_release);
	}
	atomic_store_explicit(&c->beat_ready, ready, memory_order_release);
	futex_op(&c->beat_ready, FUTEX_WAKE_PRIVATE, 1, 0);
	if (ready != 1)
		return NULL;
	while (!atomic_load_explicit(&c->beat_stop, memory_order_acquire)) {
		uint64_t v = atomic_load_explicit(&d->ctl, memory_order_acquire);
		if (CTL_GEN(v) == c->gen && (CTL_STATE(v) == VMGPU_CHAN_ACTIVE || CTL_STATE(v) == VMGPU_CHAN_CLAIMING))
			atomic_fetch_add_explicit(&d->heartbeat, 1, memory_order_relaxed);
		futex_op(&c->beat_stop, FUTEX_WAIT_PRIVATE, 0,
			 atomic_load_explicit(&c->beat_interval_ns, memory_order_relaxed));
	}
	if (c->arm && atomic_load(&c->beat_closing)) {
		/* a close, not a death: say so in the word (then the kernel leaves it alone) */
		uint32_t tid = (uint32_t)syscall(SYS_gettid) & VMGPU_OWNER_TID_MASK;
		atomic_compare_exchange_strong(&d->owner_word, &tid, VMGPU_OWNER_DIED | VMGPU_OWNER_CLOSED);
	}
	return NULL; /* else the kernel marks the owner word died as this thread ends */
}

static int start_beat(struct vmgpu_gchan *c, uint64_t interval_ns)
{
	atomic_store(&c->beat_interval_ns, interval_ns);
	atomic_store(&c->beat_stop, 0);
	atomic_store(&c->beat_ready, 0);
	int e = pthread_create(&c->beat_thread, NULL, beat_main, c);
	if (e)
		return vmgpu_seterr(e, "cannot start the liveness thread of channel %u", c->idx);
	c->beating = true;
	while (atomic_load_explicit(&c->beat_ready, memory_order_acquire) == 0)
		futex_op(&c->beat_ready, FUTEX_WAIT_PRIVATE, 0, 0);
	return 0;
}

static void stop_beat(struct vmgpu_gchan *c, bool closing)
{
	if (!c->beating)
		return;
	atomic_store(&c->beat_closing, closing);
	atomic_store_explicit(&c->beat_stop, 1, memory_order_release);
	futex_op(&c->beat_stop, FUTEX_WAKE_PRIVATE, 1, 0);
	pthread_join(c->beat_thread, NULL); /* its robust list was walked before the join returns */
	c->beating = false;
}

/* Channels of the region that this process (by pid) holds or is claiming. */
static uint32_t held_by_me(struct vmgpu_guest *g)
{
	uint32_t n = 0, me = (uint32_t)getpid();
	for (uint32_t i = 0; i < g->l.nchannels; i++) {
		struct vmgpu_chan_desc *d = chan_desc(g->base, &g->l, i);
		uint32_t st = CTL_STATE(atomic_load_explicit(&d->ctl, memory_order_acquire));
		n += (st == VMGPU_CHAN_CLAIMING || st == VMGPU_CHAN_ACTIVE) && SHM_LOAD(d->owner_pid) == me;
	}
	return n;
}

VMGPU_EXPORT int vmgpu_guest_claim(struct vmgpu_guest *g, uint64_t ack_timeout_ns, struct vmgpu_gchan **out)
{
	const struct vmgpu_layout *l = &g->l;
	if (held_by_me(g) >= g->chans_per_owner)
		return vmgpu_seterr(EMFILE,
				    "this process already holds %u channels of the region, the most the host "
				    "serves to one process; close one first",
				    g->chans_per_owner);
	uint32_t n = l->nchannels, start = (uint32_t)getpid() % n;
	struct vmgpu_chan_desc *d = NULL;
	uint32_t idx = 0, gen = 0;
	for (uint32_t k = 0; k < n && !d; k++) {
		uint32_t i = (start + k) % n;
		struct vmgpu_chan_desc *cd = chan_desc(g->base, l, i);
		uint64_t v = atomic_load_explicit(&cd->ctl, memory_order_acquire);
		if (CTL_STATE(v) != VMGPU_CHAN_FREE)
			continue;
		uint32_t ng = CTL_GEN(v) + 1;
		if (ng == 0)
			ng = 1; /* generation 0 means "never claimed" */
		if (atomic_compare_exchange_strong(&cd->ctl, &v, CTL_MAKE(VMGPU_CHAN_CLAIMING, ng))) {
			d = cd;
			idx = i;
			gen = ng;
		}
	}
	if (!d)
		return vmgpu_seterr(EBUSY, "all %u channels of the region are in use", n);

	struct vmgpu_gchan *c = calloc(1, sizeof *c);
	if (!c) {
		atomic_store_explicit(&d->ctl, CTL_MAKE(VMGPU_CHAN_CLOSING, gen), memory_order_release);
		return vmgpu_seterr(ENOMEM, "out of memory");
	}
	c->g = g;
	c->idx = idx;
	c->gen = gen;
	c->arm = g->features & VMGPU_FEAT_OWNER_WORD;
	/* The claim makes the channel ours alone until it is ACTIVE: start it clean, whatever a
	 * sibling may have scribbled into it while it was free (ring indices, an acknowledgement
	 * the host never gave), so that a fresh process is not cut off by another's garbage. */
	chan_zero(g->base, l, idx);
	atomic_store_explicit(&d->host_status, VMGPU_HOST_PENDING, memory_order_relaxed);
	atomic_store_explicit(&d->host_ack_gen, 0, memory_order_release);
	uint8_t *blk = chan_block(g->base, l, idx);
	struct vmgpu_chan_ctl *ctl = (struct vmgpu_chan_ctl *)blk;
	ring_init(&c->req, blk + l->req_ring_off, &ctl->req, l->req_ring_size, &g->wo, l->wait_mode, idx, 0);
	ring_init(&c->cpl, blk + l->cpl_ring_off, &ctl->cpl, l->cpl_ring_size, &g->wo, l->wait_mode, idx, 1);
	c->bulk = &ctl->bulk;
	c->bulk_data = blk + l->bulk_off;
	c->pc.alive = gchan_peer_alive;
	c->pc.ctx = c;

	uint64_t nonce = 0;
	if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce)
		nonce = vmgpu_now_ns() ^ ((uint64_t)getpid() << 32);
	SHM_STORE(d->owner_nonce, nonce);
	SHM_STORE(d->owner_pid, (uint32_t)getpid());
	SHM_STORE(d->guest_version, (uint32_t)((VMGPU_SHM_VERSION_MAJOR << 16) | VMGPU_SHM_VERSION_MINOR));
	atomic_store_explicit(&d->owner_word, 0, memory_order_relaxed);
	char comm[17] = {0};
	prctl(PR_GET_NAME, comm);
	for (int k = 0; k < 16; k++)
		SHM_STORE(d->owner_comm[k], comm[k]);
	atomic_fetch_add_explicit(&d->heartbeat, 1, memory_order_relaxed);
	/* where the host reads owner words, the liveness thread arms ours before the
	 * channel becomes ACTIVE: from then on, however this process ends, the host knows */
	if (c->arm) {
		int e = start_beat(c, 100000000ull);
		if (e == 0 && atomic_load(&c->beat_ready) != 1) {
			stop_beat(c, true);
			e = vmgpu_seterr(ENOSYS, "this kernel refused a robust futex list (set_robust_list)");
		}
		if (e) {
			atomic_store_explicit(&d->ctl, CTL_MAKE(VMGPU_CHAN_CLOSING, gen), memory_order_release);
			free(c);
			return e;
		}
	}
	atomic_store_explicit(&d->ctl, CTL_MAKE(VMGPU_CHAN_ACTIVE, gen), memory_order_release);

	/* wait for the host to accept (or refuse) this generation */
	uint64_t t0 = vmgpu_now_ns(), backoff = 1000;
	for (;;) {
		uint32_t st = VMGPU_HOST_PENDING;
		if (atomic_load_explicit(&d->host_ack_gen, memory_order_acquire) == gen &&
		    (st = atomic_load_explicit(&d->host_status, memory_order_relaxed)) != VMGPU_HOST_PENDING) {
			if (st == VMGPU_HOST_ACCEPTED)
				break;
			vmgpu_gchan_close(c);
			if (st == VMGPU_HOST_REFUSED_VERSION)
				return vmgpu_seterr(EPROTONOSUPPORT,
						    "the host refused ABI %u.%u of this guest library; install the "
						    "guest library that matches the host",
						    VMGPU_SHM_VERSION_MAJOR, VMGPU_SHM_VERSION_MINOR);
			if (st == VMGPU_HOST_REFUSED_LIMIT)
				return vmgpu_seterr(EMFILE,
						    "the host refused channel %u: this process already holds %u "
						    "channels, the most the host serves to one process; close one first",
						    idx, g->chans_per_owner);
			return vmgpu_seterr(ECONNREFUSED, "the host refused channel %u (status %u)", idx, st);
		}
		uint64_t spent = vmgpu_now_ns() - t0;
		if (spent >= ack_timeout_ns) {
			stop_beat(c, true);
			uint64_t v = CTL_MAKE(VMGPU_CHAN_ACTIVE, gen);
			/* nobody saw it: give it back as it was */
			if (atomic_compare_exchange_strong(&d->ctl, &v, CTL_MAKE(VMGPU_CHAN_FREE, gen)))
				atomic_store_explicit(&d->owner_word, 0, memory_order_relaxed);
			free(c);
			return vmgpu_seterr(ETIMEDOUT,
					    "no host forwarder answered on channel %u within %.1f s; is the "
					    "forwarder for this region running?",
					    idx, (double)ack_timeout_ns / 1e9);
		}
		atomic_fetch_add_explicit(&d->heartbeat, 1, memory_order_relaxed);
		sleep_ns(backoff);
		if (backoff < 1000000)
			backoff *= 2;
	}
	*out = c;
	return 0;
}

VMGPU_EXPORT void vmgpu_gchan_close(struct vmgpu_gchan *c)
{
	if (!c)
		return;
	stop_beat(c, true); /* first the liveness: the host frees a channel only when its owner is gone */
	struct vmgpu_chan_desc *d = gdesc(c);
	uint64_t v = CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen);
	atomic_compare_exchange_strong(&d->ctl, &v, CTL_MAKE(VMGPU_CHAN_CLOSING, c->gen));
	free(c);
}

VMGPU_EXPORT void vmgpu_gchan_abandon(struct vmgpu_gchan *c)
{
	if (!c)
		return;
	stop_beat(c, false); /* as in a crash: the kernel marks the owner word died */
	free(c);
}

VMGPU_EXPORT uint32_t vmgpu_gchan_index(const struct vmgpu_gchan *c)
{
	return c->idx;
}

VMGPU_EXPORT uint32_t vmgpu_gchan_generation(const struct vmgpu_gchan *c)
{
	return c->gen;
}

VMGPU_EXPORT void vmgpu_gchan_beat(struct vmgpu_gchan *c)
{
	atomic_fetch_add_explicit(&gdesc(c)->heartbeat, 1, memory_order_relaxed);
}

VMGPU_EXPORT int vmgpu_gchan_autobeat(struct vmgpu_gchan *c, uint64_t interval_ns)
{
	interval_ns = interval_ns ? interval_ns : 100000000ull;
	if (c->beating) { /* the claim's liveness thread takes the new interval */
		atomic_store(&c->beat_interval_ns, interval_ns);
		return 0;
	}
	return start_beat(c, interval_ns);
}

VMGPU_EXPORT void *vmgpu_gchan_reserve(struct vmgpu_gchan *c, uint32_t len, uint64_t timeout_ns, int *err)
{
	return ring_reserve(&c->req, len, timeout_ns, &c->pc, err);
}

VMGPU_EXPORT int vmgpu_gchan_commit(struct vmgpu_gchan *c, uint16_t type)
{
	return ring_commit(&c->req, type);
}

VMGPU_EXPORT int vmgpu_gchan_send(struct vmgpu_gchan *c, uint16_t type, const void *buf, uint32_t len,
				  uint64_t timeout_ns)
{
	int e = 0;
	void *p = ring_reserve(&c->req, len, timeout_ns, &c->pc, &e);
	if (!p)
		return e;
	memcpy(p, buf, len);
	return ring_commit(&c->req, type);
}

VMGPU_EXPORT int vmgpu_gchan_recv(struct vmgpu_gchan *c, void *buf, uint32_t cap, uint16_t *type,
				  uint64_t timeout_ns)
{
	return ring_recv(&c->cpl, buf, cap, type, timeout_ns, &c->pc);
}

VMGPU_EXPORT uint32_t vmgpu_gchan_max_payload(const struct vmgpu_gchan *c, int ring)
{
	return (ring ? c->cpl.max_rec : c->req.max_rec) - VMGPU_REC_HDR;
}

VMGPU_EXPORT uint64_t vmgpu_gchan_bulk_size(const struct vmgpu_gchan *c)
{
	return c->g->l.bulk_size;
}

VMGPU_EXPORT int vmgpu_gchan_bulk_alloc(struct vmgpu_gchan *c, uint64_t len, uint64_t timeout_ns, uint64_t *pos,
					void **ptr)
{
	uint64_t bsz = c->g->l.bulk_size;
	len = ALIGN_UP(len ? len : 1, (uint64_t)VMGPU_CACHELINE);
	if (len > bsz)
		return vmgpu_seterr(EMSGSIZE, "bulk request of %llu bytes exceeds the bulk area (%llu)",
				    (unsigned long long)len, (unsigned long long)bsz);
	uint64_t p = c->bulk_pos;
	if ((p & (bsz - 1)) + len > bsz)
		p = ALIGN_UP(p, bsz); /* skip the tail: a chunk never wraps */
	uint64_t end = p + len;
	uint64_t t0 = 0, backoff = 0;
	while (end - c->bulk_released > bsz) {
		uint64_t rel = atomic_load_explicit(&c->bulk->released, memory_order_acquire);
		if ((int64_t)(rel - c->bulk_released) > 0 && (int64_t)(c->bulk_pos - rel) >= 0)
			c->bulk_released = rel;
		if (end - c->bulk_released <= bsz)
			break;
		uint64_t now = vmgpu_now_ns();
		if (!t0)
			t0 = now;
		uint64_t spent = now - t0;
		if (spent >= timeout_ns)
			return vmgpu_seterr(EAGAIN, "bulk area of channel %u is full", c->idx);
		if (!gchan_peer_alive(c))
			return vmgpu_seterr(EPIPE, "the host of channel %u stopped its heartbeat", c->idx);
		if (spent < c->g->wo.spin_ns) {
			cpu_relax();
			continue;
		}
		uint32_t s = atomic_load_explicit(&c->bulk->release_seq, memory_order_acquire);
		atomic_store_explicit(&c->bulk->guest_waiting, 1, memory_order_seq_cst);
		atomic_thread_fence(memory_order_seq_cst);
		rel = atomic_load_explicit(&c->bulk->released, memory_order_acquire);
		if (end - rel > bsz) {
			uint64_t slice = timeout_ns - spent;
			if (slice > 100000000ull)
				slice = 100000000ull;
			shm_wait_word(c->g->l.wait_mode, &c->bulk->release_seq, s, slice, &backoff, &c->g->wo);
		}
		atomic_store_explicit(&c->bulk->guest_waiting, 0, memory_order_relaxed);
	}
	c->bulk_pos = end;
	atomic_store_explicit(&c->bulk->allocated, end, memory_order_relaxed);
	*pos = p;
	*ptr = c->bulk_data + (p & (bsz - 1));
	return 0;
}

VMGPU_EXPORT int vmgpu_guest_heap_alloc(struct vmgpu_gchan *c, uint64_t size, uint64_t *off)
{
	struct vmgpu_guest *g = c->g;
	const struct vmgpu_layout *l = &g->l;
	uint64_t nb64 = (size + l->heap_block_size - 1) / l->heap_block_size;
	if (nb64 == 0)
		nb64 = 1;
	if (nb64 > l->heap_blocks)
		return vmgpu_seterr(ENOMEM, "heap request of %llu bytes exceeds the heap (%llu bytes)",
				    (unsigned long long)size, (unsigned long long)l->heap_size);
	uint32_t nb = (uint32_t)nb64, total = l->heap_blocks;
	struct vmgpu_heap_block *hm = heap_map(g->base, l);
	uint32_t tag = VMGPU_HEAP_TAG(c->idx, c->gen);
	uint32_t hint = atomic_load_explicit(&g->heap_hint, memory_order_relaxed);
	if (hint >= total)
		hint = 0;
	/* first fit, starting at the hint, then from the start */
	for (int pass = 0; pass < 2; pass++) {
		uint32_t i = pass ? 0 : hint, lim = pass ? hint + nb : total;
		if (lim > total)
			lim = total;
		while (i + nb <= lim) {
			uint32_t j = i;
			while (j < i + nb && atomic_load_explicit(&hm[j].owner, memory_order_relaxed) == 0)
				j++;
			if (j < i + nb) {
				i = j + 1;
				continue;
			}
			uint32_t k;
			for (k = i; k < i + nb; k++) {
				uint32_t zero = 0;
				if (!atomic_compare_exchange_strong(&hm[k].owner, &zero, tag))
					break;
			}
			if (k < i + nb) { /* lost a race: give back what we took */
				for (uint32_t r = i; r < k; r++)
					atomic_store_explicit(&hm[r].owner, 0, memory_order_release);
				i = k + 1;
				continue;
			}
			SHM_STORE(hm[i].run, nb);
			atomic_store_explicit(&g->heap_hint, i + nb, memory_order_relaxed);
			*off = l->heap_off + (uint64_t)i * l->heap_block_size;
			return 0;
		}
	}
	return vmgpu_seterr(ENOMEM, "no %u free contiguous heap blocks of %llu KiB", nb,
			    (unsigned long long)(l->heap_block_size >> 10));
}

VMGPU_EXPORT int vmgpu_guest_heap_free(struct vmgpu_gchan *c, uint64_t off)
{
	struct vmgpu_guest *g = c->g;
	const struct vmgpu_layout *l = &g->l;
	if (off < l->heap_off || (off - l->heap_off) % l->heap_block_size ||
	    (off - l->heap_off) / l->heap_block_size >= l->heap_blocks)
		return vmgpu_seterr(EINVAL, "offset %llu is not a heap allocation", (unsigned long long)off);
	struct vmgpu_heap_block *hm = heap_map(g->base, l);
	uint32_t i = (uint32_t)((off - l->heap_off) / l->heap_block_size);
	uint32_t tag = VMGPU_HEAP_TAG(c->idx, c->gen);
	if (atomic_load_explicit(&hm[i].owner, memory_order_relaxed) != tag)
		return vmgpu_seterr(EINVAL, "heap block at offset %llu is not owned by this channel",
				    (unsigned long long)off);
	uint32_t nb = SHM_LOAD(hm[i].run);
	if (nb == 0 || nb > l->heap_blocks - i)
		return vmgpu_seterr(EINVAL, "heap allocation at offset %llu is damaged", (unsigned long long)off);
	SHM_STORE(hm[i].run, 0);
	for (uint32_t k = i; k < i + nb; k++)
		if (atomic_load_explicit(&hm[k].owner, memory_order_relaxed) == tag)
			atomic_store_explicit(&hm[k].owner, 0, memory_order_release);
	return 0;
}

VMGPU_EXPORT void *vmgpu_guest_ptr(struct vmgpu_guest *g, uint64_t off)
{
	return off < g->size ? g->base + off : NULL;
}

VMGPU_EXPORT uint64_t vmgpu_guest_offset(struct vmgpu_guest *g, const void *p)
{
	const uint8_t *q = p;
	return (q >= g->base && q < g->base + g->size) ? (uint64_t)(q - g->base) : UINT64_MAX;
}

/* The guest agent's reaper: a channel whose owner process is gone (alive() says so) is
 * closed as its owner would have, so the host reclaims it at once instead of after the
 * heartbeat timeout.  A claim still in progress is left alone.  Returns how many. */
VMGPU_EXPORT int vmgpu_guest_reap(struct vmgpu_guest *g, int (*alive)(uint32_t pid, void *ctx), void *ctx)
{
	int n = 0;
	for (uint32_t i = 0; i < g->l.nchannels; i++) {
		struct vmgpu_chan_desc *d = chan_desc(g->base, &g->l, i);
		uint64_t ctl = atomic_load_explicit(&d->ctl, memory_order_acquire);
		if (CTL_STATE(ctl) != VMGPU_CHAN_ACTIVE)
			continue;
		uint32_t pid = SHM_LOAD(d->owner_pid);
		if (pid == 0 || alive(pid, ctx))
			continue;
		/* only if nothing changed meanwhile (a new owner has a new generation) */
		if (atomic_compare_exchange_strong(&d->ctl, &ctl, CTL_MAKE(VMGPU_CHAN_CLOSING, CTL_GEN(ctl))))
			n++;
	}
	return n;
}
