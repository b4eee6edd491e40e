/* SPDX-License-Identifier: Apache-2.0 */
/* Region geometry, formatting, and the checks both sides make when attaching. */
#define _GNU_SOURCE
#include "internal.h"

#include <stdio.h>

static bool is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

VMGPU_EXPORT void vmgpu_shm_params_default(struct vmgpu_shm_params *p)
{
	p->nchannels = 16;
	p->req_ring_size = 256 << 10;
	p->cpl_ring_size = 64 << 10;
	p->wait_mode = VMGPU_WAIT_FUTEX;
	p->bulk_size = 4 << 20;
	p->heap_block_size = 64 << 10;
}

static int check_params(const struct vmgpu_shm_params *p)
{
	if (p->nchannels < 1 || p->nchannels > VMGPU_MAX_CHANNELS)
		return vmgpu_seterr(EINVAL, "nchannels %u is outside 1..%u", p->nchannels, VMGPU_MAX_CHANNELS);
	if (!is_pow2(p->req_ring_size) || p->req_ring_size < VMGPU_PAGE || p->req_ring_size > (1u << 28))
		return vmgpu_seterr(EINVAL, "request ring size %u must be a power of two in 4 KiB..256 MiB",
				    p->req_ring_size);
	if (!is_pow2(p->cpl_ring_size) || p->cpl_ring_size < VMGPU_PAGE || p->cpl_ring_size > (1u << 28))
		return vmgpu_seterr(EINVAL, "completion ring size %u must be a power of two in 4 KiB..256 MiB",
				    p->cpl_ring_size);
	if (!is_pow2(p->bulk_size) || p->bulk_size < VMGPU_PAGE || p->bulk_size > (1ull << 32))
		return vmgpu_seterr(EINVAL, "bulk size %llu must be a power of two in 4 KiB..4 GiB",
				    (unsigned long long)p->bulk_size);
	if (!is_pow2(p->heap_block_size) || p->heap_block_size < VMGPU_PAGE || p->heap_block_size > (1ull << 30))
		return vmgpu_seterr(EINVAL, "heap block size %llu must be a power of two in 4 KiB..1 GiB",
				    (unsigned long long)p->heap_block_size);
	if (p->wait_mode != VMGPU_WAIT_FUTEX && p->wait_mode != VMGPU_WAIT_POLL)
		return vmgpu_seterr(EINVAL, "wait mode %u is neither futex (1) nor poll (2)", p->wait_mode);
	return 0;
}

/* Everything but the heap; then the heap takes what is left. */
static void fixed_part(const struct vmgpu_shm_params *p, struct vmgpu_layout *l)
{
	memset(l, 0, sizeof *l);
	l->nchannels = p->nchannels;
	l->req_ring_size = p->req_ring_size;
	l->cpl_ring_size = p->cpl_ring_size;
	l->wait_mode = p->wait_mode;
	l->bulk_size = p->bulk_size;
	l->heap_block_size = p->heap_block_size;
	l->chan_table_off = VMGPU_PAGE;
	l->req_ring_off = VMGPU_PAGE;
	l->cpl_ring_off = l->req_ring_off + p->req_ring_size;
	l->bulk_off = l->cpl_ring_off + p->cpl_ring_size;
	l->chan_stride = l->bulk_off + p->bulk_size;
	l->heap_map_off = l->chan_table_off + ALIGN_UP((uint64_t)p->nchannels * sizeof(struct vmgpu_chan_desc),
						       (uint64_t)VMGPU_PAGE);
}

static void place_heap(struct vmgpu_layout *l, uint32_t blocks)
{
	l->heap_blocks = blocks;
	l->chan_area_off = l->heap_map_off + ALIGN_UP((uint64_t)blocks * sizeof(struct vmgpu_heap_block),
						      (uint64_t)VMGPU_PAGE);
	l->heap_off = ALIGN_UP(l->chan_area_off + (uint64_t)l->nchannels * l->chan_stride, l->heap_block_size);
	l->heap_size = (uint64_t)blocks * l->heap_block_size;
}

VMGPU_EXPORT int vmgpu_layout_compute(uint64_t size, const struct vmgpu_shm_params *p, struct vmgpu_layout *l)
{
	int e = check_params(p);
	if (e)
		return e;
	fixed_part(p, l);
	l->region_size = size;
	place_heap(l, 0);
	if (l->heap_off > size)
		return vmgpu_seterr(ENOSPC, "region of %llu bytes is too small: %u channels need %llu bytes",
				    (unsigned long long)size, p->nchannels, (unsigned long long)l->heap_off);
	uint64_t est = (size - l->heap_off) / p->heap_block_size;
	if (est > UINT32_MAX)
		est = UINT32_MAX;
	uint32_t blocks = (uint32_t)est;
	for (;;) {
		place_heap(l, blocks);
		if (l->heap_off + l->heap_size <= size)
			break;
		blocks--; /* the heap map grew into the space; give back a block */
	}
	return 0;
}

VMGPU_EXPORT uint64_t vmgpu_region_min_size(const struct vmgpu_shm_params *p, uint64_t min_heap)
{
	struct vmgpu_layout l;
	if (check_params(p))
		return 0;
	fixed_part(p, &l);
	uint64_t blocks = (min_heap + p->heap_block_size - 1) / p->heap_block_size;
	place_heap(&l, (uint32_t)blocks);
	return ALIGN_UP(l.heap_off + l.heap_size, (uint64_t)(2u << 20)); /* whole 2 MiB pages */
}

/* The header a host publishes for this layout (all of it zero but the fields). */
void region_header_fill(struct vmgpu_region_header *h, const struct vmgpu_layout *l, const char *name)
{
	memset(h, 0, sizeof *h);
	h->magic = VMGPU_SHM_MAGIC;
	h->version_major = VMGPU_SHM_VERSION_MAJOR;
	h->version_minor = VMGPU_SHM_VERSION_MINOR;
	h->header_size = sizeof *h;
	h->region_size = l->region_size;
	h->features = VMGPU_FEATURES;
	h->wait_mode = l->wait_mode;
	h->nchannels = l->nchannels;
	h->chan_table_off = l->chan_table_off;
	h->chan_area_off = l->chan_area_off;
	h->chan_stride = l->chan_stride;
	h->req_ring_size = l->req_ring_size;
	h->cpl_ring_size = l->cpl_ring_size;
	h->bulk_size = l->bulk_size;
	h->heap_off = l->heap_off;
	h->heap_size = l->heap_size;
	h->heap_block_size = l->heap_block_size;
	h->heap_map_off = l->heap_map_off;
	h->heap_blocks = l->heap_blocks;
	h->chans_per_owner = VMGPU_CHANS_PER_OWNER_DEFAULT < l->nchannels ? VMGPU_CHANS_PER_OWNER_DEFAULT : l->nchannels;
	if (name)
		strncpy(h->name, name, sizeof h->name - 1);
}

/* Zero one channel's control page and rings (not the bulk data). */
static void ring_ctl_zero(struct vmgpu_ring_ctl *c)
{
	atomic_store_explicit(&c->head, 0, memory_order_relaxed);
	atomic_store_explicit(&c->cons_waiting, 0, memory_order_relaxed);
	atomic_store_explicit(&c->space_seq, 0, memory_order_relaxed);
	atomic_store_explicit(&c->tail, 0, memory_order_relaxed);
	atomic_store_explicit(&c->prod_waiting, 0, memory_order_relaxed);
	atomic_store_explicit(&c->data_seq, 0, memory_order_relaxed);
}

void chan_zero(uint8_t *base, const struct vmgpu_layout *l, uint32_t i)
{
	uint8_t *b = chan_block(base, l, i);
	struct vmgpu_chan_ctl *ctl = (struct vmgpu_chan_ctl *)b;
	/* control words may be read by observers at any time: store them atomically */
	ring_ctl_zero(&ctl->req);
	ring_ctl_zero(&ctl->cpl);
	atomic_store_explicit(&ctl->bulk.released, 0, memory_order_relaxed);
	atomic_store_explicit(&ctl->bulk.release_seq, 0, memory_order_relaxed);
	atomic_store_explicit(&ctl->bulk.allocated, 0, memory_order_relaxed);
	atomic_store_explicit(&ctl->bulk.guest_waiting, 0, memory_order_relaxed);
	/* ring data is only touched by a channel's producer and consumer */
	memset(b + l->req_ring_off, 0, l->bulk_off - l->req_ring_off);
	atomic_thread_fence(memory_order_release);
}

VMGPU_EXPORT int vmgpu_region_format(void *base, uint64_t size, const struct vmgpu_shm_params *p, const char *name)
{
	struct vmgpu_layout l;
	int e = vmgpu_layout_compute(size, p, &l);
	if (e)
		return e;
	uint8_t *b = base;
	struct vmgpu_region_header *h = base;
	atomic_store_explicit(&h->region_state, VMGPU_REGION_INIT, memory_order_release);
	memset(b + l.chan_table_off, 0, l.chan_area_off - l.chan_table_off); /* table + heap map */
	for (uint32_t i = 0; i < l.nchannels; i++)
		chan_zero(b, &l, i);
	struct vmgpu_region_header fresh;
	region_header_fill(&fresh, &l, name);
	fresh.region_state = VMGPU_REGION_INIT;
	memcpy(b, &fresh, sizeof fresh);
	atomic_store_explicit(&h->region_state, VMGPU_REGION_READY, memory_order_release);
	return 0;
}

#define CHECK_FIELD(field, want)                                                                         \
	do {                                                                                             \
		if ((uint64_t)(hdr->field) != (uint64_t)(want))                                          \
			return vmgpu_seterr(EINVAL,                                                      \
					    "region header field %s is %llu, expected %llu: the region was " \
					    "formatted with other parameters; reformat it",               \
					    #field, (unsigned long long)(hdr->field),                    \
					    (unsigned long long)(want));                                 \
	} while (0)

int layout_check_header(const struct vmgpu_region_header *hdr, uint64_t size, const struct vmgpu_layout *l)
{
	if (hdr->magic != VMGPU_SHM_MAGIC)
		return vmgpu_seterr(EINVAL, "not a vmgpu region (magic %016llx, expected %016llx)",
				    (unsigned long long)hdr->magic, (unsigned long long)VMGPU_SHM_MAGIC);
	if (hdr->version_major != VMGPU_SHM_VERSION_MAJOR)
		return vmgpu_seterr(EPROTONOSUPPORT,
				    "region speaks ABI %u.%u but this side speaks %u.%u; upgrade the older side",
				    hdr->version_major, hdr->version_minor, VMGPU_SHM_VERSION_MAJOR,
				    VMGPU_SHM_VERSION_MINOR);
	CHECK_FIELD(header_size, sizeof(struct vmgpu_region_header));
	CHECK_FIELD(region_size, size);
	CHECK_FIELD(wait_mode, l->wait_mode);
	CHECK_FIELD(nchannels, l->nchannels);
	CHECK_FIELD(chan_table_off, l->chan_table_off);
	CHECK_FIELD(chan_area_off, l->chan_area_off);
	CHECK_FIELD(chan_stride, l->chan_stride);
	CHECK_FIELD(req_ring_size, l->req_ring_size);
	CHECK_FIELD(cpl_ring_size, l->cpl_ring_size);
	CHECK_FIELD(bulk_size, l->bulk_size);
	CHECK_FIELD(heap_off, l->heap_off);
	CHECK_FIELD(heap_size, l->heap_size);
	CHECK_FIELD(heap_block_size, l->heap_block_size);
	CHECK_FIELD(heap_map_off, l->heap_map_off);
	CHECK_FIELD(heap_blocks, l->heap_blocks);
	return 0;
}

VMGPU_EXPORT int vmgpu_region_chan_info(const void *base, uint64_t size, const struct vmgpu_layout *l, uint32_t idx,
					struct vmgpu_chan_info *out)
{
	if (idx >= l->nchannels || l->region_size > size)
		return vmgpu_seterr(EINVAL, "channel %u does not exist", idx);
	uint8_t *b = (uint8_t *)base;
	struct vmgpu_chan_desc *d = chan_desc(b, l, idx);
	struct vmgpu_chan_ctl *ctl = (struct vmgpu_chan_ctl *)chan_block(b, l, idx);
	memset(out, 0, sizeof *out);
	uint64_t v = atomic_load_explicit(&d->ctl, memory_order_acquire);
	out->index = idx;
	out->state = CTL_STATE(v);
	out->generation = CTL_GEN(v);
	out->heartbeat = atomic_load_explicit(&d->heartbeat, memory_order_relaxed);
	out->owner_nonce = SHM_LOAD(d->owner_nonce);
	out->owner_pid = SHM_LOAD(d->owner_pid);
	out->guest_version = SHM_LOAD(d->guest_version);
	out->host_status = atomic_load_explicit(&d->host_status, memory_order_relaxed);
	for (int k = 0; k < 16; k++)
		out->owner_comm[k] = SHM_LOAD(d->owner_comm[k]);
	out->owner_comm[16] = 0;
	out->owner_word = atomic_load_explicit(&d->owner_word, memory_order_relaxed);
	uint32_t u = atomic_load_explicit(&ctl->req.tail, memory_order_relaxed) -
		     atomic_load_explicit(&ctl->req.head, memory_order_relaxed);
	out->req_used = u > l->req_ring_size ? l->req_ring_size : u;
	u = atomic_load_explicit(&ctl->cpl.tail, memory_order_relaxed) -
	    atomic_load_explicit(&ctl->cpl.head, memory_order_relaxed);
	out->cpl_used = u > l->cpl_ring_size ? l->cpl_ring_size : u;
	uint64_t bu = atomic_load_explicit(&ctl->bulk.allocated, memory_order_relaxed) -
		      atomic_load_explicit(&ctl->bulk.released, memory_order_relaxed);
	out->bulk_used = bu > l->bulk_size ? l->bulk_size : bu;
	struct vmgpu_heap_block *hm = heap_map(b, l);
	for (uint32_t i = 0; i < l->heap_blocks; i++) {
		uint32_t o = atomic_load_explicit(&hm[i].owner, memory_order_relaxed);
		if (o && VMGPU_HEAP_TAG_CHAN(o) == idx)
			out->heap_blocks++;
	}
	return 0;
}
