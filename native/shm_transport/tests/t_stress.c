/* Several channels, millions of records of random sizes, checksummed, with
 * bulk chunks and replies.  Producers are processes (default) or threads
 * (for ThreadSanitizer). Usage: t_stress [proc|thread] [channels] [records per channel] */
#include "sink.h"

struct prod {
	struct vmgpu_guest *g;
	long n;
	int id, rc;
};

static void *prod_thread(void *arg)
{
	struct prod *p = arg;
	struct vmgpu_gchan *c;
	p->rc = vmgpu_guest_claim(p->g, 10 * SEC, &c);
	if (p->rc)
		return NULL;
	vmgpu_gchan_autobeat(c, 50 * MS);
	p->rc = produce(c, p->n, 0x9E3779B97F4A7C15ull * (uint64_t)(p->id + 1), 1000, 1);
	vmgpu_gchan_close(c);
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 && strcmp(argv[1], "thread") == 0;
	int nch = argc > 2 ? atoi(argv[2]) : 4;
	long n = argc > 3 ? atol(argv[3]) : 500000;
	watchdog(600);
	struct test_region r;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = (uint32_t)nch;
	p.req_ring_size = 64 << 10;
	p.bulk_size = 1 << 20;
	test_region_create(&r, vmgpu_region_min_size(&p, 4 << 20), &p);
	struct vmgpu_host *h;
	struct vmgpu_wait_opts o = test_wait_opts(5 * SEC);
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, &o, &h), 0);
	struct sink_chan *s = calloc((size_t)nch, sizeof *s);
	uint64_t t0 = vmgpu_now_ns();
	struct prod *pr = calloc((size_t)nch, sizeof *pr);
	pthread_t *pt = calloc((size_t)nch, sizeof *pt);
	pid_t *pids = calloc((size_t)nch, sizeof *pids);
	for (int i = 0; i < nch; i++) {
		pr[i] = (struct prod){.n = n, .id = i};
		if (threads) {
			CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &pr[i].g), 0);
			pthread_create(&pt[i], NULL, prod_thread, &pr[i]);
		} else {
			pids[i] = fork();
			CHECK(pids[i] >= 0);
			if (pids[i] == 0) {
				void *mine = test_region_map_again(&r);
				CHECK_EQ(vmgpu_guest_attach(mine, r.size, NULL, &pr[i].g), 0);
				prod_thread(&pr[i]);
				if (pr[i].rc)
					fprintf(stderr, "producer %d: %d (%s)\n", i, pr[i].rc, vmgpu_shm_errmsg());
				_exit(pr[i].rc ? 1 : 0);
			}
		}
	}
	/* host threads start after the fork: forking a threaded process is unsafe */
	for (int i = 0; i < nch; i++) {
		s[i].h = h;
		s[i].idx = (uint32_t)i;
		pthread_create(&s[i].t, NULL, sink_main, &s[i]);
	}
	int failed = 0;
	for (int i = 0; i < nch; i++) {
		if (threads) {
			while (pthread_tryjoin_np(pt[i], NULL) != 0) {
				vmgpu_host_beat(h);
				usleep(10000);
			}
			if (pr[i].rc) {
				fprintf(stderr, "producer %d: %d (%s)\n", i, pr[i].rc, vmgpu_shm_errmsg());
				failed = 1;
			}
		} else {
			int st;
			while (waitpid(pids[i], &st, WNOHANG) == 0) {
				vmgpu_host_beat(h);
				usleep(10000);
			}
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				failed = 1;
		}
	}
	double secs = (double)(vmgpu_now_ns() - t0) / 1e9;
	/* let the sinks reclaim the closed channels */
	for (int k = 0; k < 2000; k++) {
		int all = 1;
		for (int i = 0; i < nch; i++)
			all &= s[i].reclaimed >= 1;
		if (all)
			break;
		usleep(1000);
	}
	long total = 0, bad = 0, bulk = 0;
	for (int i = 0; i < nch; i++) {
		s[i].stop = 1;
		pthread_join(s[i].t, NULL);
		total += s[i].received;
		bad += s[i].bad;
		bulk += s[i].bulk_bytes;
		CHECK_EQ(s[i].received, n);
		CHECK_EQ(s[i].reclaimed, 1);
	}
	printf("t_stress: %s mode, %d channels, %ld records (%.1f MiB bulk) in %.2f s: %.2f M records/s, %ld bad\n",
	       threads ? "thread" : "process", nch, total, (double)bulk / (1 << 20), secs, (double)total / secs / 1e6,
	       bad);
	CHECK_EQ(failed, 0);
	CHECK_EQ(bad, 0);
	for (int i = 0; i < nch; i++)
		if (pr[i].g)
			vmgpu_guest_detach(pr[i].g);
	free(pr);
	free(pt);
	free(pids);
	free(s);
	vmgpu_host_detach(h);
	puts("t_stress: ok");
	return 0;
}
