/* kill -9 of a producer mid-stream: every record the host took was whole and
 * correct, the host never blocks on the dead guest, it reclaims the channel
 * (heap included), and a new process reuses it under a new generation. */
#include "sink.h"

static void child(struct test_region *r, long n, int hold_heap)
{
	void *mine = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	CHECK(mine != MAP_FAILED);
	struct vmgpu_guest *g;
	struct vmgpu_gchan *c;
	struct vmgpu_wait_opts o = test_wait_opts(2 * SEC);
	CHECK_EQ(vmgpu_guest_attach(mine, r->size, &o, &g), 0);
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &c), 0);
	CHECK_EQ(vmgpu_gchan_autobeat(c, 20 * MS), 0);
	uint64_t off;
	if (hold_heap)
		CHECK_EQ(vmgpu_guest_heap_alloc(c, 1 << 20, &off), 0);
	int rc = produce(c, n, (uint64_t)getpid() * 77 + 1, 50, 1);
	if (rc)
		fprintf(stderr, "producer: %d (%s)\n", rc, vmgpu_shm_errmsg());
	vmgpu_gchan_close(c);
	_exit(rc ? 1 : 0);
}

/* Fork and exec ourselves: the parent runs a host thread, and a forked copy of
 * a threaded process may inherit a held lock (malloc's, a sanitizer's). */
static pid_t spawn_child(struct test_region *r, long n, int hold_heap)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char fd[16], sz[32], nn[32], hh[4];
		snprintf(fd, sizeof fd, "%d", r->fd);
		snprintf(sz, sizeof sz, "%llu", (unsigned long long)r->size);
		snprintf(nn, sizeof nn, "%ld", n);
		snprintf(hh, sizeof hh, "%d", hold_heap);
		execl("/proc/self/exe", "t_kill", "child", fd, sz, nn, hh, (char *)NULL);
		_exit(127);
	}
	return pid;
}

int main(int argc, char **argv)
{
	if (argc == 6 && strcmp(argv[1], "child") == 0) {
		struct test_region cr = {.fd = atoi(argv[2]), .size = strtoull(argv[3], NULL, 0)};
		child(&cr, atol(argv[4]), atoi(argv[5]));
	}
	watchdog(120);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 1; /* the next process must reuse the very channel */
	p.req_ring_size = 16 << 10;
	p.bulk_size = 256 << 10;
	test_region_create(&r, 16 << 20, &p);
	struct vmgpu_host *h;
	struct vmgpu_wait_opts o = test_wait_opts(300 * MS);
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &h), 0);
	struct sink_chan s = {.h = h, .idx = 0};
	pthread_create(&s.t, NULL, sink_main, &s);

	for (int round = 0; round < 5; round++) {
		pid_t pid = spawn_child(&r, 100000000, 1); /* would run for minutes */
		long before = s.received;
		uint64_t t0 = vmgpu_now_ns();
		while (s.received < before + 2000 + round * 3000 && vmgpu_now_ns() - t0 < 20 * SEC) {
			vmgpu_host_beat(h);
			usleep(1000);
		}
		CHECK(s.received > before);
		long rec0 = s.reclaimed; /* before the kill: the host may reclaim before waitpid returns */
		kill(pid, SIGKILL);
		int st;
		CHECK(waitpid(pid, &st, 0) == pid);
		CHECK(WIFSIGNALED(st));
		/* the host notices at once (the owner word) and reclaims, while still beating */
		t0 = vmgpu_now_ns();
		while (s.reclaimed == rec0 && vmgpu_now_ns() - t0 < 5 * SEC) {
			vmgpu_host_beat(h);
			usleep(1000);
		}
		CHECK_EQ(s.reclaimed, rec0 + 1);
		CHECK(vmgpu_now_ns() - t0 < 2 * SEC);
		struct vmgpu_chan_info info;
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_host_layout(h), 0, &info), 0);
		CHECK_EQ(info.state, VMGPU_CHAN_FREE);
		CHECK_EQ(info.heap_blocks, 0);
		CHECK_EQ(info.req_used, 0);
	}
	CHECK_EQ(s.bad, 0);
	/* a well-behaved process now runs to completion on the reused channel */
	long opened0 = s.opened, gens0 = s.generations_seen;
	pid_t pid = spawn_child(&r, 20000, 0);
	int st;
	while (waitpid(pid, &st, WNOHANG) == 0) {
		vmgpu_host_beat(h);
		usleep(1000);
	}
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(s.opened, opened0 + 1);
	CHECK_EQ(s.generations_seen, gens0 + 1);
	s.stop = 1;
	pthread_join(s.t, NULL);
	CHECK_EQ(s.bad, 0);
	vmgpu_host_detach(h);
	printf("t_kill: 5 producers killed mid-stream, %ld records all valid, channel reused %ld times\n", s.received,
	       s.opened);
	puts("t_kill: ok");
	return 0;
}
