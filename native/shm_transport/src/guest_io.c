/* SPDX-License-Identifier: Apache-2.0 */
/* Guest side of a channel's traffic: requests out, completions in, chunks of the bulk area. */
#include "guest_internal.h"

VMGPU_EXPORT void *vmgpu_gchan_reserve(struct vmgpu_gchan *c, uint32_t len, uint64_t timeout_ns, int *err)
{
	return ring_reserve(&c->req, len, timeout_ns, &c->peer, err);
}

VMGPU_EXPORT int vmgpu_gchan_commit(struct vmgpu_gchan *c, uint16_t type)
{
	return ring_commit(&c->req, type);
}

VMGPU_EXPORT int vmgpu_gchan_send(struct vmgpu_gchan *c, uint16_t type, const void *buf, uint32_t len,
				  uint64_t timeout_ns)
{
	int e = 0;
	void *p = ring_reserve(&c->req, len, timeout_ns, &c->peer, &e);
	if (!p)
		return e;
	memcpy(p, buf, len);
	return ring_commit(&c->req, type);
}

VMGPU_EXPORT int vmgpu_gchan_recv(struct vmgpu_gchan *c, void *buf, uint32_t cap, uint16_t *type,
				  uint64_t timeout_ns)
{
	return ring_recv(&c->cpl, buf, cap, type, timeout_ns, &c->peer);
}

VMGPU_EXPORT uint32_t vmgpu_gchan_max_payload(const struct vmgpu_gchan *c, int ring)
{
	return (ring ? c->cpl.max_rec : c->req.max_rec) - VMGPU_REC_HDR;
}

VMGPU_EXPORT uint64_t vmgpu_gchan_bulk_size(const struct vmgpu_gchan *c)
{
	return c->g->l.bulk_size;
}

VMGPU_EXPORT uint64_t vmgpu_gchan_bulk_released(const struct vmgpu_gchan *c)
{
	return atomic_load_explicit(&c->bulk->released, memory_order_acquire);
}

VMGPU_EXPORT uint64_t vmgpu_gchan_bulk_wait_release(struct vmgpu_gchan *c, uint64_t seen, uint64_t timeout_ns)
{
	uint64_t rel = atomic_load_explicit(&c->bulk->released, memory_order_acquire);
	if (rel != seen || timeout_ns == 0)
		return rel;
	/* as an allocation waits: say so, then look once more, so a release between the two is seen */
	uint32_t s = atomic_load_explicit(&c->bulk->release_seq, memory_order_acquire);
	atomic_store_explicit(&c->bulk->guest_waiting, 1, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	rel = atomic_load_explicit(&c->bulk->released, memory_order_acquire);
	if (rel == seen) {
		uint64_t backoff = 0;
		shm_wait_word(c->g->l.wait_mode, &c->bulk->release_seq, s, timeout_ns, &backoff, &c->g->wo, 0);
		rel = atomic_load_explicit(&c->bulk->released, memory_order_acquire);
	}
	atomic_store_explicit(&c->bulk->guest_waiting, 0, memory_order_relaxed);
	return rel;
}

VMGPU_EXPORT int vmgpu_gchan_bulk_alloc(struct vmgpu_gchan *c, uint64_t len, uint64_t timeout_ns, uint64_t *pos,
					void **ptr)
{
	return vmgpu_gchan_bulk_alloc_dir(c, len, VMGPU_BULK_BOTH, timeout_ns, pos, ptr);
}

VMGPU_EXPORT int vmgpu_gchan_bulk_alloc_dir(struct vmgpu_gchan *c, uint64_t len, uint32_t dir, uint64_t timeout_ns,
					    uint64_t *pos, void **ptr)
{
	if (dir < VMGPU_BULK_TO_HOST || dir > VMGPU_BULK_BOTH)
		return vmgpu_seterr(EINVAL, "bulk direction %u is not one of VMGPU_BULK_*", dir);
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
			shm_wait_word(c->g->l.wait_mode, &c->bulk->release_seq, s, slice, &backoff, &c->g->wo, 0);
		}
		atomic_store_explicit(&c->bulk->guest_waiting, 0, memory_order_relaxed);
	}
	if (c->g->features & VMGPU_FEAT_REMOTE) {
		/* the bridge learns of the allocation before any request that names it */
		struct vmgpu_bulk_note note = {.pos = p, .len = len, .dir = dir};
		int e = vmgpu_gchan_send(c, VMGPU_REC_BULK_NOTE, &note, sizeof note, timeout_ns);
		if (e < 0)
			return e;
	}
	c->bulk_pos = end;
	atomic_store_explicit(&c->bulk->allocated, end, memory_order_relaxed);
	*pos = p;
	*ptr = c->bulk_data + (p & (bsz - 1));
	return 0;
}

