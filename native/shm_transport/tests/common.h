/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the transport's test programs.  Exit 0 pass, 1 fail, 77 skip. */
#ifndef VMGPU_SHM_TEST_COMMON_H
#define VMGPU_SHM_TEST_COMMON_H
#define _GNU_SOURCE
#include "vmgpu/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond)                                                                                       \
	do {                                                                                              \
		if (!(cond)) {                                                                            \
			fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, \
				#cond, vmgpu_shm_errmsg());                                               \
			exit(1);                                                                          \
		}                                                                                         \
	} while (0)
#define CHECK_EQ(a, b)                                                                                     \
	do {                                                                                               \
		long long _a = (long long)(a), _b = (long long)(b);                                        \
		if (_a != _b) {                                                                            \
			fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld (last error: %s)\n", \
				__FILE__, __LINE__, #a, _a, #b, _b, vmgpu_shm_errmsg());                   \
			exit(1);                                                                           \
		}                                                                                          \
	} while (0)

#define MS 1000000ull
#define SEC 1000000000ull

/* A region backed by a memfd, so that forked children share it. */
struct test_region {
	int fd;
	uint64_t size;
	void *base;
	struct vmgpu_shm_params p;
};

static inline void test_region_create(struct test_region *r, uint64_t size, const struct vmgpu_shm_params *p)
{
	r->fd = memfd_create("vmgpu-test", 0);
	CHECK(r->fd >= 0);
	CHECK(ftruncate(r->fd, (off_t)size) == 0);
	r->size = size;
	r->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	CHECK(r->base != MAP_FAILED);
	if (p) {
		r->p = *p;
	} else {
		vmgpu_shm_params_default(&r->p);
		r->p.nchannels = 4;
		r->p.bulk_size = 1 << 20;
	}
	CHECK_EQ(vmgpu_region_format(r->base, size, &r->p, "test"), 0);
}

/* Where channel idx's block starts in a mapping (the library keeps its own copy private). */
static inline uint8_t *test_chan_block(void *base, const struct vmgpu_layout *l, uint32_t idx)
{
	return (uint8_t *)base + l->chan_area_off + (uint64_t)idx * l->chan_stride;
}

/* A second mapping of the same region (another address, as in another process). */
static inline void *test_region_map_again(struct test_region *r)
{
	void *b = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	CHECK(b != MAP_FAILED);
	return b;
}

static inline struct vmgpu_wait_opts test_wait_opts(uint64_t peer_timeout_ns)
{
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	if (peer_timeout_ns)
		o.peer_timeout_ns = peer_timeout_ns;
	return o;
}

/* Claim a channel and keep its owner beating, so that however slowly the test runs
 * (ASan, TSan, a loaded CI machine) the host never takes the test's own owner for
 * a dead one. Tests of silence (t_liveness) claim without it on purpose. */
static inline void test_claim(struct vmgpu_guest *g, struct vmgpu_gchan **c)
{
	CHECK_EQ(vmgpu_guest_claim(g, 5 * SEC, c), 0);
	CHECK_EQ(vmgpu_gchan_autobeat(*c, 50 * MS), 0);
}

/* A host thread that accepts channels, echoes every request back as a
 * completion (type + 1), and reclaims closed or lost channels. */
struct echo_host {
	struct vmgpu_host *h;
	pthread_t t;
	_Atomic int stop;
	_Atomic int opened, reclaimed, lost, refused;
	_Atomic long echoed;
	uint64_t beat_every_ns;
	_Atomic int no_beat; /* pretend the host hung */
};

static void *echo_host_main(void *arg)
{
	struct echo_host *e = arg;
	const struct vmgpu_layout *l = vmgpu_host_layout(e->h);
	static __thread uint8_t buf[1 << 20];
	uint64_t last_beat = 0;
	while (!e->stop) {
		uint64_t now = vmgpu_now_ns();
		if (!e->no_beat && now - last_beat > e->beat_every_ns) {
			vmgpu_host_beat(e->h);
			vmgpu_host_republish(e->h); /* as the forwarder's supervisor does every tick */
			last_beat = now;
		}
		int busy = 0;
		for (uint32_t i = 0; i < l->nchannels; i++) {
			struct vmgpu_hchan *c = vmgpu_host_chan(e->h, i);
			int ev = vmgpu_hchan_poll(c, now);
			if (ev == VMGPU_HC_OPENED)
				e->opened++;
			if (ev == VMGPU_HC_REFUSED)
				e->refused++;
			if (ev == VMGPU_HC_CLOSED || ev == VMGPU_HC_LOST) {
				if (ev == VMGPU_HC_LOST)
					e->lost++;
				if (vmgpu_hchan_reclaim(c) == 0)
					e->reclaimed++;
				continue;
			}
			if (ev != VMGPU_HC_OPENED && ev != VMGPU_HC_SERVING)
				continue;
			uint16_t type;
			int n;
			while ((n = vmgpu_hchan_recv(c, buf, sizeof buf, &type, 0)) >= 0) {
				busy = 1;
				if (vmgpu_hchan_send(c, (uint16_t)(type + 1), buf, (uint32_t)n, 2 * SEC) == 0)
					e->echoed++;
			}
		}
		if (!busy)
			usleep(50);
	}
	return NULL;
}

static inline void echo_host_start(struct echo_host *e, struct test_region *r, uint64_t peer_timeout_ns)
{
	memset(e, 0, sizeof *e);
	struct vmgpu_wait_opts o = test_wait_opts(peer_timeout_ns);
	CHECK_EQ(vmgpu_host_attach(r->base, r->size, &r->p, &o, &e->h), 0);
	e->beat_every_ns = 10 * MS;
	CHECK(pthread_create(&e->t, NULL, echo_host_main, e) == 0);
}

static inline void echo_host_stop(struct echo_host *e)
{
	e->stop = 1;
	pthread_join(e->t, NULL);
	vmgpu_host_detach(e->h);
}

/* FNV-1a, for checksummed payloads. */
static inline uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static inline uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Run the test body under a watchdog: a hang is a failure, not a stuck CI. */
static inline void watchdog(unsigned seconds)
{
	signal(SIGALRM, SIG_DFL);
	alarm(seconds);
}
#endif
