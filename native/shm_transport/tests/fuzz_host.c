/* Fuzz the host side with hostile region contents.  The region sits between
 * PROT_NONE guard pages, so a read or write outside it crashes; build with
 * ASan/UBSan to catch the rest.  Every pointer and length the host hands out
 * is also checked to lie inside the region.
 *
 * Builds as a libFuzzer target (LLVMFuzzerTestOneInput) or, without
 * -DVMGPU_LIBFUZZER, as a standalone driver: fuzz_host SECONDS [SEED].
 *
 * fuzz_host live SECONDS [SEED]: the host serves a live region of several
 * channels while guest processes claim, send, take bulk and heap, close,
 * abandon and are killed (kill -9), and another process scribbles random words
 * over the header, channel table, ring and bulk control, ring data and heap map.
 * At the end the scribbling stops and an honest guest must be served again. */
#include "common.h"

#define RSIZE (4u << 20)
static uint8_t *region;
static struct vmgpu_shm_params P;

static void setup(void)
{
	if (region)
		return;
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, RSIZE + 2 * (size_t)pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	CHECK(mprotect(m + pg, RSIZE, PROT_READ | PROT_WRITE) == 0);
	region = m + pg;
	vmgpu_shm_params_default(&P);
	P.nchannels = 2;
	P.req_ring_size = 4096;
	P.cpl_ring_size = 4096;
	P.bulk_size = 64 << 10;
	P.heap_block_size = 64 << 10;
}

static inline int inside(const void *p, uint64_t len)
{
	const uint8_t *q = p;
	return q >= region && q <= region + RSIZE && len <= (uint64_t)(region + RSIZE - q);
}

struct in {
	const uint8_t *d;
	size_t n, i;
};
static uint64_t take(struct in *in, int bytes)
{
	uint64_t v = 0;
	for (int k = 0; k < bytes; k++)
		v |= (uint64_t)(in->i < in->n ? in->d[in->i++] : 0) << (8 * k);
	return v;
}

/* A guest claim written by hand (the fuzzer is the guest). */
static void fake_claim(const struct vmgpu_layout *l, uint32_t i, uint32_t gen, uint32_t version)
{
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)(region + l->chan_table_off) + i;
	d->guest_version = version;
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_ACTIVE | ((uint64_t)gen << 32));
}

/* Write a record header at a ring offset, with any length and type. */
static void put_rec(const struct vmgpu_layout *l, uint32_t ch, int cpl, uint32_t off, uint32_t len, uint16_t type)
{
	uint8_t *blk = test_chan_block(region, l, ch);
	uint32_t size = cpl ? l->cpl_ring_size : l->req_ring_size;
	uint8_t *ring = blk + (cpl ? l->cpl_ring_off : l->req_ring_off);
	off &= (size - 1) & ~7u;
	struct vmgpu_rec_hdr *h = (struct vmgpu_rec_hdr *)(ring + off);
	h->type = type;
	atomic_store(&h->len, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	struct in in = {data, size, 0};
	CHECK_EQ(vmgpu_region_format(region, RSIZE, &P, "fuzz"), 0);
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.spin_ns = 0;
	o.peer_timeout_ns = take(&in, 1) & 1 ? 0 : 1000000000ull;
	struct vmgpu_host *h;
	CHECK_EQ(vmgpu_host_attach(region, RSIZE, &P, &o, &h), 0);
	const struct vmgpu_layout *l = vmgpu_host_layout(h);
	uint8_t buf[4096];
	for (int step = 0; step < 64 && in.i < in.n; step++) {
		uint32_t op = (uint32_t)take(&in, 1) % 12, ch = (uint32_t)take(&in, 1) % 2;
		struct vmgpu_hchan *c = vmgpu_host_chan(h, ch);
		switch (op) {
		case 0: /* hostile bytes anywhere in the region */
		{
			uint64_t off = take(&in, 4) % RSIZE;
			uint32_t n = (uint32_t)take(&in, 1) % 16;
			for (uint32_t k = 0; k < n && off + k < RSIZE; k++)
				region[off + k] = (uint8_t)take(&in, 1);
			break;
		}
		case 1: /* hostile bytes in the control structures, where it hurts */
		{
			uint64_t areas[] = {0, l->chan_table_off, l->chan_area_off, l->chan_area_off + l->chan_stride,
					    l->heap_map_off};
			uint64_t off = areas[take(&in, 1) % 5] + take(&in, 2) % 4096;
			uint64_t v = take(&in, 8);
			memcpy(region + off, &v, off + 8 <= RSIZE ? 8 : 0);
			break;
		}
		case 2:
			fake_claim(l, ch, (uint32_t)take(&in, 1) + 1,
				   take(&in, 1) & 1 ? (VMGPU_SHM_VERSION_MAJOR << 16) : (uint32_t)take(&in, 4));
			break;
		case 3:
			put_rec(l, ch, 0, (uint32_t)take(&in, 2), (uint32_t)take(&in, 4) % 8192,
				(uint16_t)(take(&in, 1) % 3));
			break;
		case 4:
			vmgpu_hchan_poll(c, vmgpu_now_ns() + take(&in, 4) * 1000);
			break;
		case 5: {
			uint16_t t;
			uint32_t cap = (uint32_t)take(&in, 2) % sizeof buf;
			int n = vmgpu_hchan_recv(c, buf, cap, &t, 0);
			CHECK(n < 0 || (uint32_t)n <= cap);
			break;
		}
		case 6: {
			uint32_t n = (uint32_t)take(&in, 2) % 3000;
			memset(buf, 0xAB, n);
			vmgpu_hchan_send(c, 1, buf, n, 0);
			break;
		}
		case 7: {
			uint64_t pos = take(&in, 8), len = take(&in, 4) | (take(&in, 1) & 1 ? 0 : take(&in, 8));
			void *p = vmgpu_hchan_bulk(c, pos, len);
			if (p) {
				CHECK(inside(p, len));
				if (len)
					((volatile uint8_t *)p)[len - 1] ^= 0;
			}
			break;
		}
		case 8:
			vmgpu_hchan_bulk_release(c, take(&in, 8));
			break;
		case 9: {
			uint64_t off = take(&in, 8), len = take(&in, 8);
			if (take(&in, 1) & 1)
				off = l->heap_off + off % (l->heap_size + 1), len %= l->heap_size + 2;
			void *p = vmgpu_host_heap(h, off, len);
			if (p) {
				CHECK(inside(p, len));
				if (len)
					((volatile uint8_t *)p)[len - 1] ^= 0;
			}
			break;
		}
		case 10:
			vmgpu_hchan_reclaim(c);
			break;
		case 11: {
			struct vmgpu_chan_info info;
			CHECK_EQ(vmgpu_region_chan_info(region, RSIZE, l, ch, &info), 0);
			CHECK(info.req_used <= l->req_ring_size && info.bulk_used <= l->bulk_size);
			/* and a host re-attach over a tampered header is refused or fine, never a crash */
			struct vmgpu_host *h2;
			if (vmgpu_host_attach(region, RSIZE, &P, &o, &h2) == 0)
				vmgpu_host_detach(h2);
			break;
		}
		}
	}
	vmgpu_host_detach(h);
	return 0;
}

#ifndef VMGPU_LIBFUZZER
/* ---- live: mutation while the host serves --------------------------------------------- */

#define LCHANS 4u
static struct vmgpu_shm_params LP;

static void live_params(void)
{
	vmgpu_shm_params_default(&LP);
	LP.nchannels = LCHANS;
	LP.req_ring_size = 4096;
	LP.cpl_ring_size = 4096;
	LP.bulk_size = 64 << 10;
	LP.heap_block_size = 64 << 10;
}

/* The memfd region between guard pages, at the same place in every process that asks. */
static uint8_t *live_map(int fd)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, RSIZE + 2 * (size_t)pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	uint8_t *r = mmap(m + pg, RSIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	CHECK(r == m + pg);
	return r;
}

/* A guest process: honest library calls, in random order, then an end of any kind. */
static void live_guest(int fd, uint64_t seed, int probe)
{
	uint8_t *b = live_map(fd);
	uint64_t s = seed | 1;
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.peer_timeout_ns = 500 * MS;
	for (int life = 0; life < 1000; life++) {
		struct vmgpu_guest *g;
		struct vmgpu_gchan *c;
		if (vmgpu_guest_attach(b, RSIZE, &o, &g) != 0) {
			usleep(2000);
			continue;
		}
		if (vmgpu_guest_claim(g, 2 * SEC, &c) != 0) {
			vmgpu_guest_detach(g);
			usleep(2000);
			continue;
		}
		uint8_t buf[4096];
		uint16_t t;
		int ops = probe ? 1 : 1 + (int)(xorshift(&s) % 200);
		for (int k = 0; k < ops; k++) {
			uint64_t ref[2] = {xorshift(&s), xorshift(&s) % 100000};
			switch (xorshift(&s) % 5) {
			case 0: { /* a bulk chunk, announced in a record */
				void *p;
				if (vmgpu_gchan_bulk_alloc(c, 1 + xorshift(&s) % (32 << 10), 20 * MS, &ref[0], &p) == 0)
					memset(p, 0x5a, 64);
				break;
			}
			case 1: /* a heap range, real or not */
				vmgpu_guest_heap_alloc(c, 1 + xorshift(&s) % (256 << 10), &ref[0]);
				break;
			default:
				break;
			}
			memcpy(buf, ref, sizeof ref);
			uint32_t len = 16 + (uint32_t)(xorshift(&s) % 1500);
			if (vmgpu_gchan_send(c, (uint16_t)(1 + xorshift(&s) % 3), buf, len, 50 * MS) != 0)
				break;
			int n = vmgpu_gchan_recv(c, buf, sizeof buf, &t, probe ? 5 * SEC : 50 * MS);
			if (probe)
				_exit(n == 16 ? 0 : 1);
		}
		switch (xorshift(&s) % 3) {
		case 0: vmgpu_gchan_close(c); break;
		case 1: vmgpu_gchan_abandon(c); break;
		default: _exit(0); /* exits holding the channel */
		}
		vmgpu_guest_detach(g);
	}
	_exit(0);
}

/* The scribbler: random words where the host looks. */
static void live_scribbler(int fd, uint64_t seed)
{
	uint8_t *b = live_map(fd);
	struct vmgpu_layout l;
	CHECK_EQ(vmgpu_layout_compute(RSIZE, &LP, &l), 0);
	uint64_t s = seed | 1;
	for (;;) {
		uint32_t ch = (uint32_t)(xorshift(&s) % LCHANS);
		uint64_t blk = l.chan_area_off + ch * l.chan_stride, off;
		switch (xorshift(&s) % 7) {
		case 0: off = xorshift(&s) % VMGPU_PAGE; break;                                  /* header */
		case 1: off = l.chan_table_off + xorshift(&s) % (LCHANS * 64); break;            /* descriptors */
		case 2: off = blk + xorshift(&s) % (6 * VMGPU_CACHELINE); break;                 /* ring, bulk ctl */
		case 3: off = blk + l.req_ring_off + xorshift(&s) % l.req_ring_size; break;      /* request data */
		case 4: off = l.heap_map_off + xorshift(&s) % (l.heap_blocks * 8ull); break;     /* heap map */
		case 5: off = blk + l.cpl_ring_off + xorshift(&s) % l.cpl_ring_size; break;      /* completions */
		default: off = xorshift(&s) % RSIZE; break;
		}
		off &= ~7ull;
		uint64_t v = xorshift(&s);
		if (xorshift(&s) % 2)
			v &= 0xffffffffull >> (xorshift(&s) % 32); /* small numbers hurt more */
		__atomic_store_n((uint64_t *)(void *)(b + off), v, __ATOMIC_RELAXED);
		usleep((useconds_t)(xorshift(&s) % 300));
	}
}

static pid_t live_spawn(const char *role, int fd, uint64_t seed)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char f[16], sd[32];
		snprintf(f, sizeof f, "%d", fd);
		snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
		execl("/proc/self/exe", "fuzz_host", role, f, sd, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* One pass of the host's loop over every channel, checking what it hands out. */
static long live_serve(struct vmgpu_host *h, uint8_t *b, uint8_t *buf, long *served)
{
	const struct vmgpu_layout *l = vmgpu_host_layout(h);
	long reclaims = 0;
	vmgpu_host_beat(h);
	vmgpu_host_republish(h);
	for (uint32_t i = 0; i < l->nchannels; i++) {
		struct vmgpu_hchan *c = vmgpu_host_chan(h, i);
		int ev = vmgpu_hchan_poll(c, vmgpu_now_ns());
		if (ev == VMGPU_HC_CLOSED || ev == VMGPU_HC_LOST) {
			reclaims += vmgpu_hchan_reclaim(c) == 0;
			continue;
		}
		if (ev != VMGPU_HC_OPENED && ev != VMGPU_HC_SERVING)
			continue;
		uint16_t t;
		int n;
		for (int k = 0; k < 8 && (n = vmgpu_hchan_recv(c, buf, 4096, &t, 0)) >= 0; k++) {
			CHECK(n <= 4096);
			uint64_t ref[2] = {0, 0};
			memcpy(ref, buf, n >= 16 ? 16 : 0);
			uint8_t *p = vmgpu_hchan_bulk(c, ref[0], ref[1]);
			if (p) {
				CHECK(p >= b && ref[1] <= (uint64_t)(b + RSIZE - p));
				if (ref[1])
					((volatile uint8_t *)p)[ref[1] - 1] ^= 0;
				vmgpu_hchan_bulk_release(c, ref[0] + ref[1]);
			}
			p = vmgpu_host_heap(h, ref[0], ref[1]);
			if (p) {
				CHECK(p >= b && ref[1] <= (uint64_t)(b + RSIZE - p));
				if (ref[1])
					((volatile uint8_t *)p)[ref[1] - 1] ^= 0;
			}
			vmgpu_hchan_send(c, 9, ref, sizeof ref, 0);
			(*served)++;
		}
		struct vmgpu_chan_info info;
		CHECK_EQ(vmgpu_region_chan_info(b, RSIZE, l, i, &info), 0);
		CHECK(info.req_used <= l->req_ring_size && info.bulk_used <= l->bulk_size);
	}
	return reclaims;
}

static int live(double secs, uint64_t seed)
{
	live_params();
	int fd = memfd_create("vmgpu-fuzz-live", 0);
	CHECK(fd >= 0 && ftruncate(fd, RSIZE) == 0);
	uint8_t *b = live_map(fd);
	CHECK_EQ(vmgpu_region_format(b, RSIZE, &LP, "fuzz-live"), 0);
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.spin_ns = 0;
	o.peer_timeout_ns = 300 * MS;
	struct vmgpu_host *h;
	CHECK_EQ(vmgpu_host_attach(b, RSIZE, &LP, &o, &h), 0);
	uint8_t *buf = malloc(4096);
	enum { NG = 6 };
	pid_t guests[NG], scrib = live_spawn("scribble", fd, seed ^ 0x5c);
	uint64_t s = seed | 1;
	for (int k = 0; k < NG; k++)
		guests[k] = live_spawn("guest", fd, xorshift(&s));
	long served = 0, reclaims = 0, kills = 0;
	uint64_t end = vmgpu_now_ns() + (uint64_t)(secs * 1e9);
	while (vmgpu_now_ns() < end) {
		reclaims += live_serve(h, b, buf, &served);
		for (int k = 0; k < NG; k++) {
			int st;
			if (xorshift(&s) % 4000 == 0) { /* kill -9, mid-whatever */
				kill(guests[k], SIGKILL);
				kills++;
			}
			if (waitpid(guests[k], &st, WNOHANG) == guests[k])
				guests[k] = live_spawn("guest", fd, xorshift(&s));
		}
		usleep(200);
	}
	kill(scrib, SIGKILL);
	waitpid(scrib, NULL, 0);
	for (int k = 0; k < NG; k++) {
		kill(guests[k], SIGKILL);
		waitpid(guests[k], NULL, 0);
	}
	/* quiet now: the host heals the header and frees what is stuck, and serves an honest guest */
	pid_t probe = live_spawn("probe", fd, seed);
	int st = 0;
	uint64_t t0 = vmgpu_now_ns();
	while (waitpid(probe, &st, WNOHANG) == 0) {
		CHECK(vmgpu_now_ns() - t0 < 30 * SEC);
		reclaims += live_serve(h, b, buf, &served);
		usleep(200);
	}
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	vmgpu_host_detach(h);
	free(buf);
	printf("fuzz_host live: %ld records served, %ld reclaims, %ld guests killed; an honest guest is served "
	       "after it; no crash, no access outside the region\n",
	       served, reclaims, kills);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && (!strcmp(argv[1], "guest") || !strcmp(argv[1], "probe"))) {
		live_params();
		live_guest(atoi(argv[2]), strtoull(argv[3], NULL, 0), argv[1][0] == 'p');
	}
	if (argc == 4 && !strcmp(argv[1], "scribble")) {
		live_params();
		live_scribbler(atoi(argv[2]), strtoull(argv[3], NULL, 0));
	}
	if (argc >= 3 && !strcmp(argv[1], "live")) {
		uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : (uint64_t)time(NULL);
		printf("fuzz_host live: %s s, seed %llu\n", argv[2], (unsigned long long)seed);
		fflush(stdout);
		return live(atof(argv[2]), seed);
	}
	double secs = argc > 1 ? atof(argv[1]) : 10;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
	printf("fuzz_host: %.0f s, seed %llu\n", secs, (unsigned long long)seed);
	fflush(stdout);
	uint64_t end = vmgpu_now_ns() + (uint64_t)(secs * 1e9), s = seed | 1;
	long iters = 0;
	uint8_t data[2048];
	while (vmgpu_now_ns() < end) {
		size_t n = 16 + xorshift(&s) % (sizeof data - 16);
		for (size_t k = 0; k < n; k++)
			data[k] = (uint8_t)xorshift(&s);
		/* bias towards the record paths: claim, write a record, poll, receive */
		if (iters % 2) {
			uint8_t pre[] = {0, 2, 0, 1, 4, 0, 3, 0, (uint8_t)(s >> 8), (uint8_t)(s >> 16), 0, 0, 0, 1, 5, 0, 0, 16};
			memcpy(data + 1, pre, sizeof pre);
		}
		LLVMFuzzerTestOneInput(data, n);
		iters++;
	}
	printf("fuzz_host: %ld inputs, no crash, no access outside the region\n", iters);
	return 0;
}
#endif
