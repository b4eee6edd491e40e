/* Heartbeats: a silent owner whose process is still there (frozen: its owner
 * word says alive, its heartbeat stopped) is declared lost and reclaimed; an
 * owner with a heartbeat thread stays served while idle; a guest waiting on a host that
 * stopped gets -EPIPE instead of hanging. */
#include "common.h"

int main(void)
{
	watchdog(60);
	struct test_region r;
	test_region_create(&r, 32 << 20, NULL);
	struct echo_host e;
	echo_host_start(&e, &r, 300 * MS);
	struct vmgpu_wait_opts go = test_wait_opts(300 * MS);
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, &go, &g), 0);

	/* idle with a heartbeat thread: still served after several timeouts */
	struct vmgpu_gchan *a, *b;
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &a), 0);
	CHECK_EQ(vmgpu_gchan_autobeat(a, 20 * MS), 0);
	/* frozen (its liveness thread beats once an hour): lost after the timeout */
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &b), 0);
	CHECK_EQ(vmgpu_gchan_autobeat(b, 3600 * SEC), 0);
	uint32_t bi = vmgpu_gchan_index(b);
	usleep(1200 * 1000);
	CHECK(e.lost >= 1);
	struct vmgpu_chan_info info;
	CHECK_EQ(vmgpu_region_chan_info(r.base, r.size, vmgpu_guest_layout(g), bi, &info), 0);
	CHECK(info.state == VMGPU_CHAN_FREE || info.generation != vmgpu_gchan_generation(b));
	/* the lost owner finds out at its next call rather than hanging */
	uint8_t buf[16] = {0};
	uint16_t t;
	int rc = vmgpu_gchan_send(b, 1, buf, 8, SEC);
	if (rc == 0)
		rc = vmgpu_gchan_recv(b, buf, sizeof buf, &t, SEC);
	CHECK_EQ(rc, -EPIPE);
	vmgpu_gchan_abandon(b);
	/* the beating one is still served */
	CHECK_EQ(vmgpu_gchan_send(a, 1, buf, 8, SEC), 0);
	CHECK_EQ(vmgpu_gchan_recv(a, buf, sizeof buf, &t, SEC), 8);

	/* the host hangs (no heartbeat, no service): the guest's wait ends in -EPIPE */
	e.no_beat = 1;
	e.stop = 1;
	pthread_join(e.t, NULL);
	uint64_t t0 = vmgpu_now_ns();
	CHECK_EQ(vmgpu_gchan_send(a, 1, buf, 8, SEC), 0);
	CHECK_EQ(vmgpu_gchan_recv(a, buf, sizeof buf, &t, 10 * SEC), -EPIPE);
	uint64_t waited = vmgpu_now_ns() - t0;
	CHECK(waited < 2 * SEC);
	CHECK(strstr(vmgpu_shm_errmsg(), "heartbeat"));
	CHECK_EQ(vmgpu_guest_host_alive(g), 0);
	vmgpu_gchan_abandon(a);
	vmgpu_guest_detach(g);
	vmgpu_host_detach(e.h);
	puts("t_liveness: ok");
	return 0;
}
