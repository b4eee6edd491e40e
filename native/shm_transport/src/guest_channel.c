/* SPDX-License-Identifier: Apache-2.0 */
/* Guest side of a channel's life: claim (the host's acknowledgement awaited), close, abandon. */
#define _GNU_SOURCE
#include "guest_internal.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
	nanosleep(&ts, NULL);
}

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
	c->peer.alive = gchan_peer_alive;
	c->peer.ctx = c;

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
		int e = gchan_start_beat(c, 100000000ull);
		if (e == 0 && atomic_load(&c->beat_ready) != 1) {
			gchan_stop_beat(c, true);
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
			gchan_stop_beat(c, true);
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
	gchan_stop_beat(c, true); /* first the liveness: the host frees a channel only when its owner is gone */
	struct vmgpu_chan_desc *d = gchan_desc(c);
	uint64_t v = CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen);
	atomic_compare_exchange_strong(&d->ctl, &v, CTL_MAKE(VMGPU_CHAN_CLOSING, c->gen));
	free(c);
}

VMGPU_EXPORT void vmgpu_gchan_abandon(struct vmgpu_gchan *c)
{
	if (!c)
		return;
	gchan_stop_beat(c, false); /* as in a crash: the kernel marks the owner word died */
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

