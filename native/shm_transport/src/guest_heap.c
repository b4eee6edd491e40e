/* SPDX-License-Identifier: Apache-2.0 */
/* The region's heap, guest side: blocks taken by compare-and-swap on their owner tag, first fit. */
#include "guest_internal.h"

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

