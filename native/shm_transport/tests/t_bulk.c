/* The bulk area: contiguous chunks that never wrap, flow control through the
 * host's in-order release, and the host's range checks. */
#include "common.h"

struct chunk_msg {
	uint64_t pos, len, sum;
};

static struct vmgpu_host *H;
static _Atomic int stop;

static void *bulk_host(void *arg)
{
	struct vmgpu_hchan *hc = arg;
	struct chunk_msg m;
	uint16_t t;
	while (!stop) {
		vmgpu_host_beat(H);
		int n = vmgpu_hchan_recv(hc, &m, sizeof m, &t, 20 * MS);
		if (n == -ETIMEDOUT)
			continue;
		if (n != (int)sizeof m)
			break;
		uint8_t *p = vmgpu_hchan_bulk(hc, m.pos, m.len);
		uint64_t ok = p && fnv1a(p, m.len) == m.sum;
		vmgpu_hchan_bulk_release(hc, m.pos + m.len);
		vmgpu_hchan_send(hc, 2, &ok, sizeof ok, SEC);
	}
	return NULL;
}

struct release_later {
	struct vmgpu_hchan *hc;
	uint64_t end;
};

/* The host releases up to end once the guest is likely waiting. */
static void *release_later(void *arg)
{
	struct release_later *r = arg;
	usleep(20000);
	vmgpu_hchan_bulk_release(r->hc, r->end);
	return NULL;
}

static void *acc_main(void *x)
{
	while (vmgpu_hchan_poll(x, vmgpu_now_ns()) != VMGPU_HC_OPENED)
		usleep(100);
	return NULL;
}

int main(void)
{
	watchdog(60);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 1;
	p.bulk_size = 256 << 10;
	test_region_create(&r, 16 << 20, &p);
	struct vmgpu_wait_opts o = test_wait_opts(0);
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &H), 0);
	struct vmgpu_hchan *hc = vmgpu_host_chan(H, 0);
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(test_region_map_again(&r), r.size, NULL, &g), 0);

	/* the claim needs the host to accept: an acceptor thread polls meanwhile */
	pthread_t t;
	struct vmgpu_gchan *c = NULL;
	pthread_create(&t, NULL, acc_main, hc);
	test_claim(g, &c);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, bulk_host, hc);

	uint64_t bsz = vmgpu_gchan_bulk_size(c), seed = 7;
	CHECK_EQ(bsz, 256 << 10);
	uint64_t pos;
	void *ptr;
	CHECK_EQ(vmgpu_gchan_bulk_alloc(c, bsz + 1, 0, &pos, &ptr), -EMSGSIZE);
	/* many chunks of random sizes: each one contiguous and intact at the host */
	uint64_t last_end = 0;
	for (int i = 0; i < 5000; i++) {
		uint64_t len = 1 + xorshift(&seed) % (bsz / 3);
		CHECK_EQ(vmgpu_gchan_bulk_alloc(c, len, 5 * SEC, &pos, &ptr), 0);
		CHECK(pos >= last_end);
		CHECK((pos & (bsz - 1)) + len <= bsz);
		for (uint64_t k = 0; k < len; k++)
			((uint8_t *)ptr)[k] = (uint8_t)xorshift(&seed);
		struct chunk_msg m = {pos, len, fnv1a(ptr, len)};
		last_end = pos + len;
		CHECK_EQ(vmgpu_gchan_send(c, 1, &m, sizeof m, SEC), 0);
		if (i % 4 == 3 || i == 4999) { /* let up to 4 chunks be in flight */
			for (int k = 0; k < 4 && k <= i; k++) {
				uint64_t ok = 0;
				uint16_t ty;
				CHECK_EQ(vmgpu_gchan_recv(c, &ok, sizeof ok, &ty, 5 * SEC), sizeof ok);
				CHECK_EQ(ok, 1);
			}
		}
	}
	/* host range checks */
	CHECK(vmgpu_hchan_bulk(hc, bsz - 10, 11) == NULL);
	CHECK(vmgpu_hchan_bulk(hc, 0, bsz + 1) == NULL);
	CHECK(vmgpu_hchan_bulk(hc, 5 * bsz, bsz) != NULL);
	CHECK(vmgpu_hchan_bulk(hc, UINT64_MAX, 1) != NULL); /* position is free running: masked */
	CHECK(vmgpu_hchan_bulk(hc, UINT64_MAX, 2) == NULL);
	stop = 1;
	pthread_join(t, NULL);
	/* with no host releasing, the area fills and a bounded wait gives up */
	uint64_t total = 0, first = UINT64_MAX;
	while (vmgpu_gchan_bulk_alloc(c, 64 << 10, 0, &pos, &ptr) == 0) {
		total += 64 << 10;
		if (first == UINT64_MAX)
			first = pos;
	}
	CHECK(total <= bsz);
	vmgpu_host_beat(H);
	CHECK_EQ(vmgpu_gchan_bulk_alloc(c, 64 << 10, 10 * MS, &pos, &ptr), -EAGAIN);
	/* a waiter for releases (a bridge passing them on): none comes, the position it saw is
	 * answered at the timeout; one comes from another thread, and wakes it with the new one */
	uint64_t seen = vmgpu_gchan_bulk_released(c);
	CHECK_EQ(vmgpu_gchan_bulk_wait_release(c, seen, 10 * MS), seen);
	CHECK_EQ(vmgpu_gchan_bulk_wait_release(c, seen - 1, 0), seen);
	pthread_create(&t, NULL, release_later, &(struct release_later){hc, first + (64 << 10)});
	CHECK_EQ(vmgpu_gchan_bulk_wait_release(c, seen, 5 * SEC), first + (64 << 10));
	pthread_join(t, NULL);
	CHECK_EQ(vmgpu_gchan_bulk_alloc(c, 64 << 10, 0, &pos, &ptr), 0); /* the released space is free again */
	vmgpu_gchan_close(c);
	vmgpu_guest_detach(g);
	vmgpu_host_detach(H);
	puts("t_bulk: ok");
	return 0;
}
