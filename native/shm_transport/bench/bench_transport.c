/* make bench-transport: guest and host as two processes on two cores.
 *   ping-pong round trip (p50, p99), spinning and sleeping
 *   one-way record rate, 64-byte and 512-byte records
 *   bulk throughput through the bulk area, next to plain memcpy in the same run
 * Environment: VMGPU_BENCH_CPUS="A,B" (default 0,1), VMGPU_BENCH_SCALE (default 1). */
#define _GNU_SOURCE
#include "vmgpu/shm.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SEC 1000000000ull
enum { T_PING = 1, T_ONEWAY, T_SYNC, T_BULK, T_QUIT };

static void die(const char *what, int e)
{
	fprintf(stderr, "bench_transport: %s: %d (%s)\n", what, e, vmgpu_shm_errmsg());
	exit(1);
}

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (sched_setaffinity(0, sizeof s, &s))
		perror("sched_setaffinity");
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

#define CHUNK (256u << 10)
#define BUFSZ (64u << 20)

static void host_main(void *base, uint64_t size, struct vmgpu_shm_params *p, int cpu, uint64_t spin_ns)
{
	pin(cpu);
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.spin_ns = spin_ns;
	struct vmgpu_host *h;
	int e = vmgpu_host_attach(base, size, p, &o, &h);
	if (e)
		die("host attach", e);
	struct vmgpu_hchan *c = vmgpu_host_chan(h, 0);
	while (vmgpu_hchan_poll(c, vmgpu_now_ns()) != VMGPU_HC_OPENED)
		usleep(100);
	uint8_t *dst = malloc(BUFSZ);
	memset(dst, 1, BUFSZ);
	uint64_t dpos = 0;
	static uint8_t buf[65536];
	uint64_t beat = 0;
	for (;;) {
		uint16_t t;
		int n = vmgpu_hchan_recv(c, buf, sizeof buf, &t, 100000000ull);
		if (++beat % 4096 == 0 || n == -ETIMEDOUT)
			vmgpu_host_beat(h);
		if (n == -ETIMEDOUT)
			continue;
		if (n < 0)
			die("host recv", n);
		switch (t) {
		case T_PING:
		case T_SYNC:
			vmgpu_hchan_send(c, t, buf, (uint32_t)n, SEC);
			break;
		case T_ONEWAY:
			break;
		case T_BULK: {
			uint64_t ref[2];
			memcpy(ref, buf, sizeof ref);
			uint8_t *src = vmgpu_hchan_bulk(c, ref[0], ref[1]);
			if (!src)
				die("bulk ref", -ERANGE);
			if (dpos + ref[1] > BUFSZ)
				dpos = 0;
			memcpy(dst + dpos, src, ref[1]);
			dpos += ref[1];
			vmgpu_hchan_bulk_release(c, ref[0] + ref[1]);
			break;
		}
		case T_QUIT:
			vmgpu_hchan_send(c, t, buf, 0, SEC);
			_exit(0);
		}
	}
}

static struct vmgpu_gchan *G;

static void sync_host(void)
{
	uint8_t b[8] = {0};
	uint16_t t;
	int e = vmgpu_gchan_send(G, T_SYNC, b, 8, SEC);
	if (!e)
		e = vmgpu_gchan_recv(G, b, sizeof b, &t, 10 * SEC);
	if (e < 0)
		die("sync", e);
}

static void rtt(long iters, uint64_t *p50, uint64_t *p99)
{
	uint64_t *lat = malloc(sizeof *lat * (size_t)iters);
	uint8_t msg[64] = {0}, in[64];
	uint16_t t;
	for (long i = -iters / 10; i < iters; i++) {
		uint64_t t0 = vmgpu_now_ns();
		int e = vmgpu_gchan_send(G, T_PING, msg, sizeof msg, SEC);
		if (e)
			die("ping send", e);
		e = vmgpu_gchan_recv(G, in, sizeof in, &t, 10 * SEC);
		if (e < 0)
			die("ping recv", e);
		if (i >= 0)
			lat[i] = vmgpu_now_ns() - t0;
	}
	qsort(lat, (size_t)iters, sizeof *lat, cmp_u64);
	*p50 = lat[iters / 2];
	*p99 = lat[iters * 99 / 100];
	free(lat);
}

static double oneway(uint32_t len, long n)
{
	uint8_t msg[512] = {0};
	sync_host();
	uint64_t t0 = vmgpu_now_ns();
	for (long i = 0; i < n; i++) {
		int err = 0;
		void *slot = vmgpu_gchan_reserve(G, len, SEC, &err);
		if (!slot)
			die("oneway reserve", err);
		memcpy(slot, msg, len);
		vmgpu_gchan_commit(G, T_ONEWAY);
	}
	sync_host(); /* all consumed */
	return (double)n / ((double)(vmgpu_now_ns() - t0) / 1e9);
}

static double bulk(uint64_t total, uint8_t *src)
{
	sync_host();
	uint64_t t0 = vmgpu_now_ns(), spos = 0;
	for (uint64_t done = 0; done < total; done += CHUNK) {
		uint64_t pos;
		void *p;
		int e = vmgpu_gchan_bulk_alloc(G, CHUNK, 10 * SEC, &pos, &p);
		if (e)
			die("bulk alloc", e);
		if (spos + CHUNK > BUFSZ)
			spos = 0;
		memcpy(p, src + spos, CHUNK);
		spos += CHUNK;
		uint64_t ref[2] = {pos, CHUNK};
		if ((e = vmgpu_gchan_send(G, T_BULK, ref, sizeof ref, SEC)))
			die("bulk send", e);
	}
	sync_host();
	return (double)total / ((double)(vmgpu_now_ns() - t0) / 1e9);
}

static double plain_memcpy(uint64_t total, uint8_t *src, uint8_t *dst)
{
	uint64_t t0 = vmgpu_now_ns(), pos = 0;
	for (uint64_t done = 0; done < total; done += CHUNK) {
		if (pos + CHUNK > BUFSZ)
			pos = 0;
		memcpy(dst + pos, src + pos, CHUNK);
		pos += CHUNK;
	}
	__asm__ volatile("" ::"r"(dst) : "memory");
	return (double)total / ((double)(vmgpu_now_ns() - t0) / 1e9);
}

static double median(double *v, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (v[j] < v[i]) {
				double t = v[i];
				v[i] = v[j];
				v[j] = t;
			}
	return v[n / 2];
}

static pid_t host_pid;

/* A fresh region and host process; both sides spin spin_ns before sleeping. */
static void start(int cpu_a, int cpu_b, uint64_t spin_ns)
{
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 1;
	p.req_ring_size = 1 << 20;
	p.bulk_size = 4 << 20;
	uint64_t size = vmgpu_region_min_size(&p, 2 << 20);
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		die("mmap", -errno);
	int e = vmgpu_region_format(base, size, &p, "bench");
	if (e)
		die("format", e);
	host_pid = fork();
	if (host_pid == 0)
		host_main(base, size, &p, cpu_b, spin_ns);
	pin(cpu_a);
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.spin_ns = spin_ns;
	struct vmgpu_guest *g;
	if ((e = vmgpu_guest_attach(base, size, &o, &g)))
		die("guest attach", e);
	if ((e = vmgpu_guest_claim(g, 5 * SEC, &G)))
		die("claim", e);
}

static void stop(void)
{
	uint8_t tmp[8] = {0};
	uint16_t t;
	vmgpu_gchan_send(G, T_QUIT, tmp, 0, SEC);
	vmgpu_gchan_recv(G, tmp, sizeof tmp, &t, 10 * SEC);
	waitpid(host_pid, NULL, 0);
	vmgpu_gchan_close(G);
}

int main(void)
{
	int cpu_a = 0, cpu_b = 1;
	const char *cpus = getenv("VMGPU_BENCH_CPUS");
	if (cpus)
		sscanf(cpus, "%d,%d", &cpu_a, &cpu_b);
	double scale = getenv("VMGPU_BENCH_SCALE") ? atof(getenv("VMGPU_BENCH_SCALE")) : 1.0;
	const int reps = 5;
	long rtt_iters = (long)(200000 * scale), n64 = (long)(4000000 * scale), n512 = (long)(2000000 * scale);
	uint64_t bulk_total = (uint64_t)(2048.0 * scale) * CHUNK; /* 512 MiB at scale 1 */
	uint8_t *src = malloc(BUFSZ), *dst = malloc(BUFSZ);
	memset(src, 7, BUFSZ);
	memset(dst, 9, BUFSZ);

	start(cpu_a, cpu_b, 200000);
	double r50[5], r99[5], rate64[5], rate512[5], bk[5], mc[5], ratio[5];
	for (int r = 0; r < reps; r++) {
		uint64_t a, b;
		rtt(rtt_iters, &a, &b);
		r50[r] = (double)a / 1000.0;
		r99[r] = (double)b / 1000.0;
		rate64[r] = oneway(64, n64);
		rate512[r] = oneway(512, n512);
		mc[r] = plain_memcpy(bulk_total, src, dst);
		bk[r] = bulk(bulk_total, src);
		ratio[r] = bk[r] / mc[r];
	}
	stop();
	/* the sleeping path: both sides block on every message (futex), no spinning */
	uint64_t s50, s99;
	start(cpu_a, cpu_b, 0);
	rtt(rtt_iters / 10, &s50, &s99);
	stop();

	double m50 = median(r50, reps), m99 = median(r99, reps), m64 = median(rate64, reps),
	       m512 = median(rate512, reps), mbk = median(bk, reps), mmc = median(mc, reps),
	       mratio = median(ratio, reps);
	printf("vmgpu transport benchmark: guest on cpu %d, host on cpu %d, medians of %d runs\n", cpu_a, cpu_b, reps);
	printf("| measure                              | value          |\n");
	printf("|--------------------------------------|----------------|\n");
	printf("| ping-pong RTT p50, 64 B (spinning)   | %10.3f us  |\n", m50);
	printf("| ping-pong RTT p99, 64 B (spinning)   | %10.3f us  |\n", m99);
	printf("| ping-pong RTT p50, sleeping (futex)  | %10.3f us  |\n", (double)s50 / 1000.0);
	printf("| ping-pong RTT p99, sleeping (futex)  | %10.3f us  |\n", (double)s99 / 1000.0);
	printf("| one-way 64 B records                 | %10.2f M/s |\n", m64 / 1e6);
	printf("| one-way 512 B records                | %10.2f M/s |\n", m512 / 1e6);
	printf("| one-way 512 B payload bandwidth      | %10.2f GB/s|\n", m512 * 512 / 1e9);
	printf("| bulk area, 256 KiB chunks            | %10.2f GB/s|\n", mbk / 1e9);
	printf("| plain memcpy, same chunks, 1 thread  | %10.2f GB/s|\n", mmc / 1e9);
	printf("| bulk / memcpy                        | %10.3f     |\n", mratio);
	printf("transport rtt_p50_us=%.3f rtt_p99_us=%.3f rate_64B_per_s=%.0f rate_512B_per_s=%.0f bulk_vs_memcpy=%.3f\n",
	       m50, m99, m64, m512, mratio);
	return 0;
}
