/* The region heap: allocation by offset, exhaustion, free, no overlap under
 * concurrent allocators, and reclaim of a dead owner's blocks. */
#include "common.h"

struct worker {
	struct vmgpu_gchan *c;
	struct vmgpu_guest *g;
	int id;
	int fail;
};

static void *alloc_loop(void *arg)
{
	struct worker *w = arg;
	uint64_t seed = 1000 + w->id, offs[8];
	for (int round = 0; round < 2000; round++) {
		int n = 0;
		for (int k = 0; k < 8; k++) {
			uint64_t sz = 1 + xorshift(&seed) % (200 << 10);
			if (vmgpu_guest_heap_alloc(w->c, sz, &offs[n]) == 0) {
				/* stamp the whole allocation; a second owner would overwrite it */
				memset(vmgpu_guest_ptr(w->g, offs[n]), w->id, sz);
				uint8_t *p = vmgpu_guest_ptr(w->g, offs[n]);
				for (uint64_t b = 0; b < sz; b += 4096)
					if (p[b] != w->id)
						w->fail = 1;
				n++;
			}
		}
		for (int k = 0; k < n; k++)
			if (vmgpu_guest_heap_free(w->c, offs[k]) != 0)
				w->fail = 1;
	}
	return NULL;
}

int main(void)
{
	watchdog(120);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 4;
	p.bulk_size = 64 << 10;
	test_region_create(&r, 24 << 20, &p);
	struct echo_host e;
	echo_host_start(&e, &r, 0);
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);
	const struct vmgpu_layout *l = vmgpu_guest_layout(g);
	struct vmgpu_gchan *c[4];
	/* the owners stay alive by their heartbeats however slow this runs (TSan, a loaded
	 * machine): a silent owner would rightly be reclaimed, heap blocks and all */
	for (int i = 0; i < 4; i++) {
		test_claim(g, &c[i]);
	}

	uint64_t off, off2;
	CHECK_EQ(vmgpu_guest_heap_alloc(c[0], 1, &off), 0);
	CHECK(off >= l->heap_off && off < l->heap_off + l->heap_size && (off - l->heap_off) % l->heap_block_size == 0);
	/* the host sees the same bytes at the same offset, and checks ranges */
	strcpy(vmgpu_guest_ptr(g, off), "pinned");
	CHECK(strcmp(vmgpu_host_heap(e.h, off, 7), "pinned") == 0);
	CHECK(vmgpu_host_heap(e.h, l->heap_off - 1, 2) == NULL);
	CHECK(vmgpu_host_heap(e.h, l->heap_off + l->heap_size - 4, 8) == NULL);
	CHECK(vmgpu_host_heap(e.h, UINT64_MAX - 4, 8) == NULL);
	CHECK(vmgpu_host_heap(e.h, l->heap_off, UINT64_MAX) == NULL);
	/* wrong owner, bad offsets */
	CHECK_EQ(vmgpu_guest_heap_free(c[1], off), -EINVAL);
	CHECK_EQ(vmgpu_guest_heap_free(c[0], off + 1), -EINVAL);
	CHECK_EQ(vmgpu_guest_heap_free(c[0], 0), -EINVAL);
	CHECK_EQ(vmgpu_guest_heap_free(c[0], off), 0);
	CHECK_EQ(vmgpu_guest_heap_free(c[0], off), -EINVAL); /* double free */
	/* too big, then exhaustion */
	CHECK_EQ(vmgpu_guest_heap_alloc(c[0], l->heap_size + 1, &off), -ENOMEM);
	CHECK_EQ(vmgpu_guest_heap_alloc(c[0], l->heap_size, &off), 0);
	CHECK_EQ(vmgpu_guest_heap_alloc(c[1], 1, &off2), -ENOMEM);
	CHECK_EQ(vmgpu_guest_heap_free(c[0], off), 0);
	CHECK_EQ(vmgpu_guest_heap_alloc(c[1], 1, &off2), 0);
	CHECK_EQ(vmgpu_guest_heap_free(c[1], off2), 0);

	/* concurrent allocators never share a block */
	pthread_t t[4];
	struct worker w[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.c = c[i], .g = g, .id = i + 1};
		pthread_create(&t[i], NULL, alloc_loop, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ(w[i].fail, 0);
	}

	/* an owner that dies holding blocks: the host frees them on reclaim */
	uint32_t idx = vmgpu_gchan_index(c[3]);
	for (int k = 0; k < 5; k++)
		CHECK_EQ(vmgpu_guest_heap_alloc(c[3], 100 << 10, &off), 0);
	struct vmgpu_chan_info info;
	CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, l, idx, &info), 0);
	CHECK_EQ(info.heap_blocks, 10);
	vmgpu_gchan_close(c[3]);
	for (int i = 0; i < 2000; i++) {
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, l, idx, &info), 0);
		if (info.state == VMGPU_CHAN_FREE)
			break;
		usleep(1000);
	}
	CHECK_EQ(info.state, VMGPU_CHAN_FREE);
	CHECK_EQ(info.heap_blocks, 0);
	for (int i = 0; i < 3; i++)
		vmgpu_gchan_close(c[i]);
	echo_host_stop(&e);
	puts("t_heap: ok");
	return 0;
}
