/* One guest process writes CLOSING (or FREE, DEAD, garbage) into the descriptor
 * of a sibling's live channel: the host does not free it, puts it back, and
 * keeps serving the sibling, who notices nothing.  An honest close, and the
 * same scribble on a channel whose owner is gone, are reclaimed. */
#include "common.h"

static void roundtrip(struct vmgpu_gchan *c)
{
	uint8_t buf[64] = "still here", in[64];
	uint16_t t;
	CHECK_EQ(vmgpu_gchan_send(c, 5, buf, 11, SEC), 0);
	CHECK_EQ(vmgpu_gchan_recv(c, in, sizeof in, &t, 5 * SEC), 11);
	CHECK(strcmp((char *)in, "still here") == 0 && t == 6);
}

int main(void)
{
	watchdog(60);
	struct test_region r;
	test_region_create(&r, 32 << 20, NULL);
	struct echo_host e;
	echo_host_start(&e, &r, 0); /* the default 5 s heartbeat timeout */
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);
	struct vmgpu_gchan *victim;
	test_claim(g, &victim);
	uint64_t off;
	CHECK_EQ(vmgpu_guest_heap_alloc(victim, 1 << 20, &off), 0);
	roundtrip(victim);
	const struct vmgpu_layout *l = vmgpu_guest_layout(g);
	uint32_t idx = vmgpu_gchan_index(victim), gen = vmgpu_gchan_generation(victim);
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)((uint8_t *)r.base + l->chan_table_off) + idx;
	const uint64_t live = (uint64_t)VMGPU_CHAN_ACTIVE | (uint64_t)gen << 32;
	const uint64_t forged[] = {
		(uint64_t)VMGPU_CHAN_CLOSING | (uint64_t)gen << 32,
		(uint64_t)VMGPU_CHAN_FREE | (uint64_t)gen << 32,
		(uint64_t)VMGPU_CHAN_DEAD | (uint64_t)gen << 32,
		(uint64_t)VMGPU_CHAN_CLAIMING | (uint64_t)gen << 32,
		0x77ull | (uint64_t)gen << 32,
		(uint64_t)VMGPU_CHAN_CLOSING | (uint64_t)(gen + 7) << 32,
	};
	int rec0 = e.reclaimed;
	for (size_t k = 0; k < sizeof forged / sizeof forged[0]; k++) {
		atomic_store(&d->ctl, forged[k]); /* the sibling's scribble */
		for (int i = 0; i < 2000 && atomic_load(&d->ctl) != live; i++)
			usleep(1000);
		CHECK_EQ(atomic_load(&d->ctl), live); /* put back by the host */
		CHECK_EQ(e.reclaimed, rec0);         /* and not freed */
		roundtrip(victim);
	}
	struct vmgpu_chan_info info;
	CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, l, idx, &info), 0);
	CHECK_EQ(info.heap_blocks, (1u << 20) / l->heap_block_size); /* its heap is still its own */

	/* an honest close is reclaimed */
	vmgpu_gchan_close(victim);
	for (int i = 0; i < 2000 && e.reclaimed == rec0; i++)
		usleep(1000);
	CHECK_EQ(e.reclaimed, rec0 + 1);

	/* the same scribble on a channel whose owner is gone: reclaimed (its word says so) */
	struct vmgpu_gchan *gone;
	test_claim(g, &gone);
	idx = vmgpu_gchan_index(gone);
	gen = vmgpu_gchan_generation(gone);
	d = (struct vmgpu_chan_desc *)((uint8_t *)r.base + l->chan_table_off) + idx;
	vmgpu_gchan_abandon(gone); /* its liveness thread ends, as in a crash */
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_CLOSING | (uint64_t)gen << 32);
	for (int i = 0; i < 2000 && e.reclaimed == rec0 + 1; i++)
		usleep(1000);
	CHECK(e.reclaimed >= rec0 + 2);
	echo_host_stop(&e);
	vmgpu_guest_detach(g);
	puts("t_forged_close: ok");
	return 0;
}
