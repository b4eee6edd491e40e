/* kill -9 of a guest process, whatever it is doing (streaming requests, waiting
 * for bulk space mid-copy, waiting for a reply mid-call), is reported LOST by
 * vmgpu_hchan_poll within a second, with the heartbeat timeout at its default
 * (5 s): the owner word, written by the dying process's kernel, says so.  A host
 * view left stale while the owner was alive (a supervisor whose worker served the
 * channel) does not take the dead owner for alive.  The channel is then
 * reclaimed, heap and all. */
#include "common.h"

enum { STREAM = 0, BULK = 1, CALL = 2, NMODES };
static const char *mode_name[NMODES] = {"streaming requests", "waiting for bulk space", "waiting for a reply"};

static void child(struct test_region *r, int mode)
{
	void *mine = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	CHECK(mine != MAP_FAILED);
	struct vmgpu_guest *g;
	struct vmgpu_gchan *c;
	CHECK_EQ(vmgpu_guest_attach(mine, r->size, NULL, &g), 0);
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &c), 0);
	CHECK_EQ(vmgpu_gchan_autobeat(c, 200 * MS), 0); /* as the guest library does */
	uint64_t off;
	CHECK_EQ(vmgpu_guest_heap_alloc(c, 1 << 20, &off), 0);
	uint8_t buf[256] = {1};
	uint16_t t;
	for (;;) {
		switch (mode) {
		case STREAM:
			vmgpu_gchan_send(c, 1, buf, sizeof buf, SEC);
			break;
		case BULK: { /* the host never releases: the second allocation waits */
			uint64_t pos;
			void *p;
			vmgpu_gchan_bulk_alloc(c, vmgpu_gchan_bulk_size(c), 3600 * SEC, &pos, &p);
			break;
		}
		case CALL: /* the host never answers */
			vmgpu_gchan_send(c, 1, buf, 8, SEC);
			vmgpu_gchan_recv(c, buf, sizeof buf, &t, 3600 * SEC);
			break;
		}
	}
}

static pid_t spawn_child(struct test_region *r, int mode)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char fd[16], sz[32], m[8];
		snprintf(fd, sizeof fd, "%d", r->fd);
		snprintf(sz, sizeof sz, "%llu", (unsigned long long)r->size);
		snprintf(m, sizeof m, "%d", mode);
		execl("/proc/self/exe", "t_owner_death", "child", fd, sz, m, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Poll (and drain) channel 0 until the child is served and well into its operation. */
static void until_busy(struct vmgpu_host *h, pid_t pid)
{
	struct vmgpu_hchan *c = vmgpu_host_chan(h, 0);
	uint8_t buf[4096];
	uint16_t t;
	uint64_t t0 = vmgpu_now_ns(), served = 0;
	while (!served || vmgpu_now_ns() - served < 200 * MS) {
		CHECK(vmgpu_now_ns() - t0 < 20 * SEC);
		vmgpu_host_beat(h);
		int ev = vmgpu_hchan_poll(c, vmgpu_now_ns());
		CHECK(ev != VMGPU_HC_LOST && ev != VMGPU_HC_CLOSED);
		if (!served && (ev == VMGPU_HC_OPENED || ev == VMGPU_HC_SERVING))
			served = vmgpu_now_ns();
		while (served && vmgpu_hchan_recv(c, buf, sizeof buf, &t, 0) >= 0)
			;
		int st;
		CHECK(waitpid(pid, &st, WNOHANG) == 0);
		usleep(1000);
	}
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "child") == 0) {
		struct test_region cr = {.fd = atoi(argv[2]), .size = strtoull(argv[3], NULL, 0)};
		child(&cr, atoi(argv[4]));
	}
	watchdog(120);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 1;
	p.req_ring_size = 16 << 10;
	p.bulk_size = 64 << 10;
	test_region_create(&r, 16 << 20, &p);
	struct vmgpu_host *h;
	struct vmgpu_wait_opts o = test_wait_opts(0); /* the default 5 s heartbeat timeout */
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &h), 0);
	struct vmgpu_hchan *c = vmgpu_host_chan(h, 0);
	uint64_t worst = 0;

	for (int round = 0; round < 2 * NMODES; round++) {
		int mode = round % NMODES, stale = round >= NMODES;
		pid_t pid = spawn_child(&r, mode);
		until_busy(h, pid);
		if (stale) {
			/* the view goes stale (a worker would serve the channel now) while the owner
			 * lives and beats; then the owner dies, and the stale view looks again */
			usleep(1500 * 1000);
		}
		uint64_t t0 = vmgpu_now_ns();
		kill(pid, SIGKILL);
		int ev, st;
		uint64_t now;
		do {
			vmgpu_host_beat(h);
			now = vmgpu_now_ns();
			ev = vmgpu_hchan_poll(c, now);
			if (ev != VMGPU_HC_LOST)
				usleep(1000);
		} while (ev != VMGPU_HC_LOST && now - t0 < 10 * SEC);
		CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		uint64_t took = now - t0;
		printf("t_owner_death: %s%s: LOST %.1f ms after kill -9\n", mode_name[mode],
		       stale ? " (stale view)" : "", (double)took / 1e6);
		CHECK_EQ(ev, VMGPU_HC_LOST);
		CHECK(took < SEC);
		if (took > worst)
			worst = took;
		CHECK_EQ(vmgpu_hchan_reclaim(c), 0);
		struct vmgpu_chan_info info;
		CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_host_layout(h), 0, &info), 0);
		CHECK_EQ(info.state, VMGPU_CHAN_FREE);
		CHECK_EQ(info.heap_blocks, 0);
	}
	vmgpu_host_detach(h);
	printf("t_owner_death: worst %.1f ms\n", (double)worst / 1e6);
	puts("t_owner_death: ok");
	return 0;
}
