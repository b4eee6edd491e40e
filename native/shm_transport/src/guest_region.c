/* SPDX-License-Identifier: Apache-2.0 */
/* Guest side of the region: attach (copy, validate, then use the header), addresses, the agent's reaper. */
#define _GNU_SOURCE
#include "guest_internal.h"

#include <stdlib.h>

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

VMGPU_EXPORT int vmgpu_guest_remote(const struct vmgpu_guest *g)
{
	return (g->features & VMGPU_FEAT_REMOTE) != 0;
}
