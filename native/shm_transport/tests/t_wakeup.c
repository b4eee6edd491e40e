/* No lost wake-ups: a ping-pong where both sides always go to sleep (no
 * spinning), many times over, in futex and in poll mode.  A lost wake-up
 * stalls one exchange until the 100 ms slice ends; we count such stalls.  In
 * poll mode the last exchanges follow a pause that makes the host's request
 * ring idle (looked at every 1 ms): they too must not stall. */
#include "common.h"

struct side {
	struct vmgpu_hchan *hc;
	long n;
	_Atomic long done;
};

static void *host_side(void *arg)
{
	struct side *s = arg;
	uint64_t v;
	uint16_t t;
	for (long i = 0; i < s->n; i++) {
		int r = vmgpu_hchan_recv(s->hc, &v, sizeof v, &t, 10 * SEC);
		if (r != sizeof v || v != (uint64_t)i)
			exit(2);
		if (vmgpu_hchan_send(s->hc, 2, &v, sizeof v, 10 * SEC) != 0)
			exit(3);
	}
	s->done = 1;
	return NULL;
}

static void run(uint32_t mode, long n)
{
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 1;
	p.wait_mode = mode;
	p.bulk_size = 64 << 10;
	test_region_create(&r, 16 << 20, &p);
	struct vmgpu_wait_opts o = test_wait_opts(60 * SEC);
	o.spin_ns = 0; /* always take the sleeping path */
	o.sleep_max_ns = 2000;
	struct vmgpu_host *h;
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &h), 0);
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, &o, &g), 0);
	struct vmgpu_hchan *hc = vmgpu_host_chan(h, 0);
	/* claim: accept from this thread after the guest has written its claim */
	struct vmgpu_gchan *c;
	pthread_t acc;
	struct side s = {hc, n, 0};
	void *acceptor(void *);
	pthread_create(&acc, NULL, acceptor, hc);
	test_claim(g, &c);
	pthread_join(acc, NULL);
	pthread_t t;
	pthread_create(&t, NULL, host_side, &s);
	uint64_t v;
	uint16_t ty;
	long stalls = 0;
	for (long i = 0; i < n; i++) {
		if (i % 1024 == 0)
			vmgpu_host_beat(h);
		if (mode == VMGPU_WAIT_POLL && i == n - 4)
			usleep(150 * 1000); /* the host's request ring idle past 100 ms: it looks every 1 ms */
		uint64_t t0 = vmgpu_now_ns();
		CHECK_EQ(vmgpu_gchan_send(c, 1, &i, sizeof i, 10 * SEC), 0);
		CHECK_EQ(vmgpu_gchan_recv(c, &v, sizeof v, &ty, 10 * SEC), sizeof v);
		CHECK_EQ(v, i);
		if (vmgpu_now_ns() - t0 > 90 * MS)
			stalls++;
	}
	pthread_join(t, NULL);
	CHECK(s.done);
	printf("t_wakeup: %s mode: %ld exchanges, %ld stalls\n", mode == VMGPU_WAIT_FUTEX ? "futex" : "poll", n,
	       stalls);
	CHECK_EQ(stalls, 0);
	vmgpu_gchan_close(c);
	vmgpu_host_detach(h);
	vmgpu_guest_detach(g);
	munmap(r.base, r.size);
	close(r.fd);
}

void *acceptor(void *x)
{
	while (vmgpu_hchan_poll(x, vmgpu_now_ns()) != VMGPU_HC_OPENED)
		usleep(100);
	return NULL;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	watchdog(300);
	run(VMGPU_WAIT_FUTEX, n);
	run(VMGPU_WAIT_POLL, n / 10);
	puts("t_wakeup: ok");
	return 0;
}
