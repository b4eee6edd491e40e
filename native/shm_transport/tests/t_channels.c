/* Channel claim, exhaustion, release, reclaim and reuse with a new generation;
 * a claim nobody answers; a guest of another major version is refused. */
#include "common.h"

static int alive_all(uint32_t pid, void *ctx)
{
	(void)pid, (void)ctx;
	return 1;
}

static int alive_none(uint32_t pid, void *ctx)
{
	(void)pid, (void)ctx;
	return 0;
}

int main(void)
{
	watchdog(60);
	struct test_region r;
	test_region_create(&r, 32 << 20, NULL); /* 4 channels */
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);

	/* no host: the claim times out with a sentence, and the channel is free again */
	struct vmgpu_gchan *c[5];
	CHECK_EQ(vmgpu_guest_claim(g, 50 * MS, &c[0]), -ETIMEDOUT);
	CHECK(strstr(vmgpu_shm_errmsg(), "forwarder"));
	struct vmgpu_chan_info info;
	for (uint32_t i = 0; i < 4; i++) {
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_guest_layout(g), i, &info), 0);
		CHECK_EQ(info.state, VMGPU_CHAN_FREE);
	}

	struct echo_host e;
	echo_host_start(&e, &r, 0);
	uint32_t gens[4];
	for (int i = 0; i < 4; i++) {
		test_claim(g, &c[i]);
		gens[vmgpu_gchan_index(c[i])] = vmgpu_gchan_generation(c[i]);
		for (int j = 0; j < i; j++)
			CHECK(vmgpu_gchan_index(c[i]) != vmgpu_gchan_index(c[j]));
	}
	/* this process holds the most channels one process may (4): refused with a sentence */
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &c[4]), -EMFILE);
	CHECK(strstr(vmgpu_shm_errmsg(), "close one first"));
	/* another process finds every channel in use */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct vmgpu_gchan *x;
		int rc = vmgpu_guest_claim(g, 5 * SEC, &x);
		_exit(rc == -EBUSY && strstr(vmgpu_shm_errmsg(), "in use") ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_guest_layout(g), vmgpu_gchan_index(c[2]), &info), 0);
	CHECK_EQ(info.state, VMGPU_CHAN_ACTIVE);
	CHECK_EQ(info.owner_pid, getpid());
	CHECK_EQ(info.guest_version >> 16, VMGPU_SHM_VERSION_MAJOR);
	CHECK(info.owner_nonce != 0);

	/* release one; the host reclaims it; the next claim gets it with a new generation */
	uint32_t idx = vmgpu_gchan_index(c[2]);
	int reclaimed0 = e.reclaimed; /* before the close: the host may reclaim at once */
	vmgpu_gchan_close(c[2]);
	for (int i = 0; i < 5000 && e.reclaimed == reclaimed0; i++)
		usleep(1000);
	CHECK_EQ(e.reclaimed, reclaimed0 + 1);
	test_claim(g, &c[2]);
	CHECK_EQ(vmgpu_gchan_index(c[2]), idx);
	CHECK(vmgpu_gchan_generation(c[2]) != gens[idx]);
	/* the reused channel works */
	uint8_t buf[64] = "hello", in[64];
	uint16_t t;
	CHECK_EQ(vmgpu_gchan_send(c[2], 5, buf, 6, SEC), 0);
	CHECK_EQ(vmgpu_gchan_recv(c[2], in, sizeof in, &t, 5 * SEC), 6);
	CHECK(strcmp((char *)in, "hello") == 0 && t == 6);
	/* a guest that writes an impossible record: the host cuts it off (-EPIPE) and reclaims the channel */
	{
		const struct vmgpu_layout *gl = vmgpu_guest_layout(g);
		uint8_t *blk = test_chan_block(r.base, gl, vmgpu_gchan_index(c[1]));
		struct vmgpu_ring_ctl *rc = &((struct vmgpu_chan_ctl *)blk)->req;
		uint32_t head = atomic_load(&rc->head);
		struct vmgpu_rec_hdr *bad = (struct vmgpu_rec_hdr *)(blk + gl->req_ring_off + (head & (gl->req_ring_size - 1)));
		int rec0 = e.reclaimed;
		bad->type = 1;
		atomic_store(&bad->len, gl->req_ring_size * 2); /* longer than the ring */
		for (int i = 0; i < 5000 && e.reclaimed == rec0; i++)
			usleep(1000);
		CHECK_EQ(e.reclaimed, rec0 + 1);
		CHECK_EQ(vmgpu_gchan_recv(c[1], in, sizeof in, &t, SEC), -EPIPE);
		vmgpu_gchan_abandon(c[1]);
		c[1] = NULL;
	}
	/* the guest agent's reaper closes the channels of owners it finds dead; live owners
	 * are left alone, and a reaper that is wrong (here: it takes every owner for dead)
	 * frees nothing while the owners' words say they are alive */
	{
		int rec0 = e.reclaimed;
		uint32_t idx3 = vmgpu_gchan_index(c[3]);
		CHECK_EQ(vmgpu_guest_reap(g, alive_all, NULL), 0);
		CHECK_EQ(vmgpu_guest_reap(g, alive_none, NULL), 3); /* c[0], c[2], c[3]; c[1] is gone */
		usleep(100 * 1000);
		CHECK_EQ(e.reclaimed, rec0);
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_guest_layout(g), idx3, &info), 0);
		CHECK_EQ(info.state, VMGPU_CHAN_ACTIVE);
		CHECK_EQ(vmgpu_gchan_send(c[3], 5, buf, 6, SEC), 0);
		CHECK_EQ(vmgpu_gchan_recv(c[3], in, sizeof in, &t, 5 * SEC), 6);
		/* honest closes are reclaimed */
		for (int i = 0; i < 4; i++)
			vmgpu_gchan_close(c[i]);
		for (int i = 0; i < 5000 && e.reclaimed < rec0 + 3; i++)
			usleep(1000);
		CHECK_EQ(e.reclaimed, rec0 + 3);
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_guest_layout(g), idx3, &info), 0);
		CHECK_EQ(info.state, VMGPU_CHAN_FREE);
	}

	/* a guest speaking another major version: write a claim by hand */
	for (int i = 0; i < 5000 && e.reclaimed < reclaimed0 + 5; i++)
		usleep(1000);
	const struct vmgpu_layout *l = vmgpu_guest_layout(g);
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)((uint8_t *)r.base + l->chan_table_off);
	uint64_t v = atomic_load(&d->ctl);
	CHECK_EQ((uint32_t)v, VMGPU_CHAN_FREE);
	uint32_t ng = (uint32_t)(v >> 32) + 1;
	d->guest_version = (VMGPU_SHM_VERSION_MAJOR + 1) << 16;
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_ACTIVE | ((uint64_t)ng << 32));
	for (int i = 0; i < 5000 && atomic_load(&d->host_ack_gen) != ng; i++)
		usleep(1000);
	CHECK_EQ(atomic_load(&d->host_ack_gen), ng);
	CHECK_EQ(atomic_load(&d->host_status), VMGPU_HOST_REFUSED_VERSION);
	CHECK(e.refused >= 1);
	echo_host_stop(&e);
	vmgpu_guest_detach(g);
	puts("t_channels: ok");
	return 0;
}
