/* Records of every size through both rings: order, contents, padding at wrap,
 * zero-copy reserve/commit, size limits, full-ring timeouts. */
#include "common.h"

int main(void)
{
	watchdog(60);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 2;
	p.req_ring_size = 4096; /* small rings wrap often */
	p.cpl_ring_size = 8192;
	p.bulk_size = 64 << 10;
	test_region_create(&r, 16 << 20, &p);
	struct echo_host e;
	echo_host_start(&e, &r, 0);

	struct vmgpu_guest *g;
	struct vmgpu_gchan *c;
	CHECK_EQ(vmgpu_guest_attach(test_region_map_again(&r), r.size, NULL, &g), 0);
	test_claim(g, &c);
	CHECK(vmgpu_gchan_generation(c) != 0);
	uint32_t maxp = vmgpu_gchan_max_payload(c, 0);
	CHECK_EQ(maxp, 4096 / 2 - 8);

	uint8_t out[4096], in[4096];
	uint64_t seed = 42;
	for (int i = 0; i < 20000; i++) {
		uint32_t len = (uint32_t)(xorshift(&seed) % (maxp + 1));
		for (uint32_t k = 0; k < len; k++)
			out[k] = (uint8_t)(i + k * 7);
		uint16_t type = (uint16_t)(1 + i % 1000);
		if (i % 3 == 0) { /* zero-copy path */
			int err = 0;
			void *slot = vmgpu_gchan_reserve(c, len, SEC, &err);
			CHECK(slot);
			memcpy(slot, out, len);
			CHECK_EQ(vmgpu_gchan_commit(c, type), 0);
		} else {
			CHECK_EQ(vmgpu_gchan_send(c, type, out, len, SEC), 0);
		}
		uint16_t rt = 0;
		int n = vmgpu_gchan_recv(c, in, sizeof in, &rt, 5 * SEC);
		CHECK_EQ(n, len);
		CHECK_EQ(rt, type + 1);
		CHECK(memcmp(in, out, len) == 0);
	}
	/* limits */
	CHECK_EQ(vmgpu_gchan_send(c, 1, out, maxp + 1, 0), -EMSGSIZE);
	CHECK_EQ(vmgpu_gchan_send(c, VMGPU_REC_PAD, out, 8, 0), -EINVAL);
	int err = 0;
	CHECK(vmgpu_gchan_reserve(c, 16, 0, &err));
	CHECK(vmgpu_gchan_reserve(c, 16, 0, &err) == NULL && err == -EINVAL); /* one reservation at a time */
	CHECK_EQ(vmgpu_gchan_commit(c, 7), 0);
	uint16_t rt;
	CHECK_EQ(vmgpu_gchan_recv(c, in, sizeof in, &rt, 5 * SEC), 16);

	/* nothing to receive: a timed wait ends with ETIMEDOUT, a zero wait with EAGAIN */
	CHECK_EQ(vmgpu_gchan_recv(c, in, sizeof in, &rt, 0), -EAGAIN);
	uint64_t t0 = vmgpu_now_ns();
	CHECK_EQ(vmgpu_gchan_recv(c, in, sizeof in, &rt, 20 * MS), -ETIMEDOUT);
	CHECK(vmgpu_now_ns() - t0 >= 20 * MS);

	/* a full ring: stop the host, fill, time out, then the host drains it */
	echo_host_stop(&e);
	struct vmgpu_host *h2;
	struct vmgpu_wait_opts o = test_wait_opts(0);
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &h2), 0);
	struct vmgpu_hchan *hc = vmgpu_host_chan(h2, vmgpu_gchan_index(c));
	CHECK_EQ(vmgpu_hchan_poll(hc, vmgpu_now_ns()), VMGPU_HC_OPENED); /* a restarted host re-adopts */
	int sent = 0;
	while (vmgpu_gchan_send(c, 3, out, 100, 0) == 0)
		sent++;
	CHECK(sent > 10 && sent < 4096 / 100);
	CHECK_EQ(vmgpu_gchan_send(c, 3, out, 100, 10 * MS), -EAGAIN);
	for (int i = 0; i < sent; i++)
		CHECK_EQ(vmgpu_hchan_recv(hc, in, sizeof in, &rt, SEC), 100);
	CHECK_EQ(vmgpu_hchan_recv(hc, in, sizeof in, &rt, 0), -EAGAIN);
	CHECK_EQ(vmgpu_gchan_send(c, 3, out, 100, SEC), 0);
	CHECK_EQ(vmgpu_hchan_recv(hc, in, sizeof in, &rt, SEC), 100);
	vmgpu_host_beat(h2);

	vmgpu_gchan_close(c);
	CHECK_EQ(vmgpu_hchan_poll(hc, vmgpu_now_ns()), VMGPU_HC_CLOSED);
	CHECK_EQ(vmgpu_hchan_reclaim(hc), 0);
	vmgpu_host_detach(h2);
	vmgpu_guest_detach(g);
	puts("t_ring: ok");
	return 0;
}
