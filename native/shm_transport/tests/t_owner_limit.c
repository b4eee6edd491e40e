/* One guest process cannot take every channel: the host serves at most
 * chans_per_owner channels at once to one owner pid (the guest library refuses
 * the claim before it is made, and the host refuses claims written by hand
 * past the library), while other processes still get theirs.  The pid is what
 * the guest wrote: a process that lies about it is bounded only by the region's
 * channels, which this test shows too, so the bound is stated, not imagined. */
#include "common.h"
#include <sys/syscall.h>

/* A claim written by hand, as a hostile process of the guest would. */
static uint32_t hand_claim(void *base, const struct vmgpu_layout *l, uint32_t idx, uint32_t pid)
{
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)((uint8_t *)base + l->chan_table_off) + idx;
	uint64_t v = atomic_load(&d->ctl);
	CHECK_EQ((uint32_t)v, VMGPU_CHAN_FREE);
	uint32_t gen = (uint32_t)(v >> 32) + 1;
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_CLAIMING | (uint64_t)gen << 32);
	d->owner_pid = pid;
	d->guest_version = (VMGPU_SHM_VERSION_MAJOR << 16) | VMGPU_SHM_VERSION_MINOR;
	/* an armed word that stays alive: this thread's id */
	atomic_store(&d->owner_word, (uint32_t)syscall(SYS_gettid));
	atomic_fetch_add(&d->heartbeat, 1);
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_ACTIVE | (uint64_t)gen << 32);
	for (int i = 0; i < 5000 && atomic_load(&d->host_ack_gen) != gen; i++)
		usleep(1000);
	CHECK_EQ(atomic_load(&d->host_ack_gen), gen);
	return atomic_load(&d->host_status);
}

static uint32_t free_channel(void *base, const struct vmgpu_layout *l)
{
	for (uint32_t i = 0; i < l->nchannels; i++) {
		struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)((uint8_t *)base + l->chan_table_off) + i;
		if ((uint32_t)atomic_load(&d->ctl) == VMGPU_CHAN_FREE)
			return i;
	}
	CHECK(!"a free channel");
	return 0;
}

int main(void)
{
	watchdog(60);
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 8;
	p.bulk_size = 256 << 10;
	struct test_region r;
	test_region_create(&r, 32 << 20, &p);
	struct echo_host e;
	echo_host_start(&e, &r, 0);
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);
	const struct vmgpu_layout *l = vmgpu_guest_layout(g);
	uint32_t limit = VMGPU_CHANS_PER_OWNER_DEFAULT;
	CHECK(limit < p.nchannels);

	/* through the library: the claim past the limit is refused with a sentence */
	struct vmgpu_gchan *c[8];
	for (uint32_t i = 0; i < limit; i++)
		test_claim(g, &c[i]);
	struct vmgpu_gchan *x;
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &x), -EMFILE);
	CHECK(strstr(vmgpu_shm_errmsg(), "close one first"));

	/* past the library, by hand, with this process's pid: the host refuses it */
	uint32_t me = (uint32_t)getpid();
	uint32_t idx = free_channel(r.base, l);
	CHECK_EQ(hand_claim(r.base, l, idx, me), VMGPU_HOST_REFUSED_LIMIT);
	CHECK(e.refused >= 1);
	/* the refused claimer gives the channel back (its word ends) and it is reclaimed */
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)((uint8_t *)r.base + l->chan_table_off) + idx;
	int rec0 = e.reclaimed;
	atomic_store(&d->owner_word, VMGPU_OWNER_DIED);
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_CLOSING | (atomic_load(&d->ctl) & ~0xffffffffull));
	for (int i = 0; i < 2000 && e.reclaimed == rec0; i++)
		usleep(1000);
	CHECK_EQ(e.reclaimed, rec0 + 1);

	/* another process (another pid) is still served */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct vmgpu_gchan *y;
		int rc = vmgpu_guest_claim(g, 5 * SEC, &y);
		if (rc == 0)
			vmgpu_gchan_close(y);
		_exit(rc == 0 ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);

	/* closing one of ours makes room again */
	vmgpu_gchan_close(c[0]);
	uint64_t t0 = vmgpu_now_ns();
	int rc;
	while ((rc = vmgpu_guest_claim(g, 5 * SEC, &c[0])) == -EMFILE && vmgpu_now_ns() - t0 < 5 * SEC)
		usleep(1000); /* until the host has reclaimed the closed one */
	CHECK_EQ(rc, 0);

	/* the stated bound: a process that writes other pids gets at most the region's channels */
	uint32_t accepted = 0, k = 0;
	while (accepted + limit < p.nchannels)
		accepted += hand_claim(r.base, l, free_channel(r.base, l), 100000 + k++) == VMGPU_HOST_ACCEPTED;
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, &x), -EMFILE); /* and this process still holds its limit */
	echo_host_stop(&e);
	for (uint32_t i = 0; i < limit; i++)
		vmgpu_gchan_abandon(c[i]);
	vmgpu_guest_detach(g);
	printf("t_owner_limit: %u channels per process; a liar about its pid held %u more\n", limit, accepted);
	puts("t_owner_limit: ok");
	return 0;
}
