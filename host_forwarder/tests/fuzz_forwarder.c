/*
 * A hostile guest: claims a channel on a running forwarder and sends it
 * malformed and adversarial requests (every opcode, random lengths, random
 * handles and pointers mixed with real ones), then checks the forwarder still
 * serves a well-formed call.  Run against a forwarder built with ASan/UBSan.
 *
 *   fuzz_forwarder REGION ITERATIONS SEED
 * Exit 0: the forwarder survived and still answers correctly.
 *
 *   fuzz_forwarder REGION ITERATIONS SEED PROCS [scribble]
 * Several hostile guest processes at once (PROCS), each on its own channel with
 * its own seed; some are killed (kill -9) mid-way and replaced, some exit holding
 * their channel.  With `scribble`, another process meanwhile writes random words
 * over the region's header, channel table, ring and bulk control, ring data and
 * heap map.  Then all stop, and a fresh process must attach (the forwarder
 * re-publishes its header), claim a channel and be answered correctly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "raw_guest.h"
#include "vg_link.h"
#include "vg_ops.h"
#include "vg_wire.h"

static uint64_t rng;
static uint64_t rnd(void)
{
	return raw_rnd(&rng);
}

static struct raw_guest G; /* this fuzzer, as a guest */

/* Random words where the forwarder looks, until killed. */
static int scribbler(const char *region)
{
	int fd = open(region, O_RDWR);
	struct stat st;
	if (fd < 0 || fstat(fd, &st))
		return 2;
	uint8_t *b = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (b == MAP_FAILED)
		return 2;
	const struct vmgpu_region_header *h = (const void *)b;
	/* the geometry as formatted (the scribbler's own copy, taken before it starts) */
	struct vmgpu_shm_params p = {h->nchannels, h->req_ring_size, h->cpl_ring_size, h->wait_mode, h->bulk_size,
				     h->heap_block_size};
	struct vmgpu_layout l;
	if (vmgpu_layout_compute(st.st_size, &p, &l))
		return 2;
	for (;;) {
		uint64_t blk = l.chan_area_off + (rnd() % l.nchannels) * l.chan_stride, off;
		switch (rnd() % 6) {
		case 0: off = rnd() % VMGPU_PAGE; break;
		case 1: off = l.chan_table_off + rnd() % (l.nchannels * 64ull); break;
		case 2: off = blk + rnd() % (6 * VMGPU_CACHELINE); break;
		case 3: off = blk + l.req_ring_off + rnd() % l.req_ring_size; break;
		case 4: off = l.heap_map_off + rnd() % (l.heap_blocks * 8ull); break;
		default: off = blk + l.cpl_ring_off + rnd() % l.cpl_ring_size; break;
		}
		uint64_t v = rnd();
		if (rnd() % 2)
			v &= 0xffffffffull >> (rnd() % 32);
		__atomic_store_n((uint64_t *)(void *)(b + (off & ~7ull)), v, __ATOMIC_RELAXED);
		usleep((useconds_t)(rnd() % 2000));
	}
}

static pid_t spawn(char *const argv[])
{
	pid_t pid = fork();
	if (pid == 0) {
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	return pid;
}

static pid_t spawn_fuzzer(const char *region, long iters, uint64_t seed)
{
	char it[32], sd[32];
	snprintf(it, sizeof it, "%ld", iters);
	snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
	char *const args[] = {"fuzz_forwarder", (char *)region, it, sd, NULL};
	return spawn(args);
}

static int many(const char *region, long iters, uint64_t seed, int procs, int scribble)
{
	rng = seed * 2654435761u + 7;
	if (procs < 1 || procs > 64)
		return 2;
	pid_t kids[64], scrib = 0;
	long each = iters / procs + 1, started = 0, killed = 0, failed = 0, ok = 0;
	for (int k = 0; k < procs; k++, started++)
		kids[k] = spawn_fuzzer(region, each, seed * 1000 + (uint64_t)started);
	if (scribble) {
		char sd[32];
		snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
		char *const args[] = {"fuzz_forwarder", (char *)region, "scribble", sd, NULL};
		scrib = spawn(args);
	}
	/* replace each one that ends (or that we kill) until 3 generations have run */
	int alive = procs;
	while (alive) {
		usleep(20000);
		for (int k = 0; k < procs; k++) {
			if (!kids[k])
				continue;
			if (rnd() % 100 == 0) {
				kill(kids[k], SIGKILL);
				killed++;
			}
			int st;
			if (waitpid(kids[k], &st, WNOHANG) != kids[k])
				continue;
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
				ok++;
			else if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
				failed++;
			kids[k] = started < 3 * procs ? spawn_fuzzer(region, each, seed * 1000 + (uint64_t)started++) : 0;
			alive -= !kids[k];
		}
	}
	if (scrib) {
		kill(scrib, SIGKILL);
		waitpid(scrib, NULL, 0);
	}
	printf("fuzz_forwarder: %ld hostile processes (%d at once), %ld killed, %ld finished, %ld cut off%s\n",
	       started, procs, killed, ok, failed, scribble ? " by the scribbling" : "");
	if (failed && !scribble) {
		fprintf(stderr, "a hostile process that was neither killed nor scribbled on failed\n");
		return 1;
	}
	/* quiet again: a fresh process attaches, is served and answered correctly */
	fflush(stdout);
	pid_t probe = spawn_fuzzer(region, 200, seed + 99);
	int st;
	if (waitpid(probe, &st, 0) != probe || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "after the hostile processes, a fresh one was not served\n");
		return 1;
	}
	return 0;
}


/* A link package (vg_link.h) of the PTX, with both logs, then changed at random: bytes and words
 * of its headers, its length cut or grown.  The forwarder must refuse or link it, and go on. */
static int fuzz_link(const char *ptx, size_t ptx_size, long rounds)
{
	uint8_t pkg[1024];
	for (long i = 0; i < rounds; i++) {
		size_t n = 0;
		struct vg_link_header h = {VG_LINK_MAGIC, 2, 1, 0};
		struct vg_jit_opt o[2] = {{CU_JIT_INFO_LOG_BUFFER, 0, 0}, {CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, 0, 64}};
		struct vg_link_input in = {CU_JIT_INPUT_PTX, 0, 2, ptx_size};
		memset(pkg, 0, sizeof pkg);
		memcpy(pkg, &h, sizeof h);
		memcpy(pkg + (n += sizeof h), o, sizeof o);
		memcpy(pkg + (n += sizeof o), &in, sizeof in);
		memcpy(pkg + (n += sizeof in), "x", 2);
		memcpy(pkg + (n += 8), ptx, ptx_size);
		n += (ptx_size + 7) & ~(size_t)7;
		for (int k = (int)(rnd() % 4); k >= 0; k--) {
			switch (rnd() % 4) {
			case 0: pkg[rnd() % n] = (uint8_t)rnd(); break;
			case 1: {
				static const uint32_t odd[] = {0, 1, 0xFFFFFFFFu, 0x80000000u, 4097, 16385, 65};
				uint32_t v = rnd() % 2 ? odd[rnd() % 7] : (uint32_t)rnd();
				memcpy(pkg + (rnd() % 24) * 4, &v, 4); /* the headers and options */
				break;
			}
			case 2: n -= rnd() % n; break;
			default: n += rnd() % (sizeof pkg - n + 1); break;
			}
		}
		if (!n)
			continue;
		uint64_t begin[3] = {n, rnd(), rnd()}, pos, out_pos;
		void *bulk, *out;
		if (raw_call(&G, VG_OP_BLOB_BEGIN, 0, 0, begin, sizeof begin) != 0 ||
		    vmgpu_gchan_bulk_alloc(G.ch, n, 5000000000ull, &pos, &bulk) < 0)
			return 1;
		memcpy(bulk, pkg, n);
		uint64_t put[3] = {0, pos, n};
		raw_call(&G, VG_OP_BLOB_PUT, 0, VG_F_NOREPLY, put, sizeof put);
		if (vmgpu_gchan_bulk_alloc(G.ch, 4096, 5000000000ull, &out_pos, &out) < 0)
			return 1;
		uint64_t req[3] = {VG_BUF_BULK, out_pos, 4096};
		if (raw_call(&G, VG_OP_cuLinkComplete, 0, 0, req, sizeof req) < 0) {
			fprintf(stderr, "forwarder stopped answering after link package %ld\n", i);
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[2], "scribble")) {
		rng = strtoull(argv[3], NULL, 10) * 2654435761u + 1;
		return scribbler(argv[1]);
	}
	if (argc == 5 || argc == 6)
		return many(argv[1], atol(argv[2]), strtoull(argv[3], NULL, 10), atoi(argv[4]),
			    argc == 6 && !strcmp(argv[5], "scribble"));
	if (argc != 4) {
		fprintf(stderr, "usage: fuzz_forwarder REGION ITERATIONS SEED [PROCS [scribble]]\n");
		return 2;
	}
	long iters = atol(argv[2]);
	rng = strtoull(argv[3], NULL, 10) * 2654435761u + 88172645463325252ull;
	/* a header just scribbled is re-published by the forwarder within a tick: retry a while */
	if (raw_guest_open(&G, argv[1], 3000))
		return 2;

	/* real values to mix in: a device allocation, a module, a function, a stream */
	struct vg_hello_req hello = {VG_PROTO_VERSION, (uint32_t)getpid()};
	if (raw_call(&G, VG_OP_HELLO, VG_NO_DEVICE, 0, &hello, sizeof hello) != 0)
		return 1;
	uint64_t real[8] = {0};
	uint64_t a[4] = {1, 4096};
	if (raw_call(&G, VG_OP_cuMemAlloc_v2, 0, 0, a, 16) == 0)
		real[0] = raw_out(&G, 0);
	uint64_t sa[2] = {1, 0};
	if (raw_call(&G, VG_OP_cuStreamCreate, 0, 0, sa, 16) == 0)
		real[1] = raw_out(&G, 0);
	real[2] = 1;
	real[3] = 2; /* CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
	real[4] = 0xFFFFFFFFFFFFFFFFull;

	/* a guest that lies about an image's hash gets its load, but the lie is not cached */
	static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry lie() { ret; }\n";
	for (int round = 0; round < 2; round++) {
		uint64_t begin[3] = {sizeof ptx, 0x1234, 0x5678}, cached = 99, pos;
		void *bulk;
		if (raw_call(&G, VG_OP_BLOB_BEGIN, 0, 0, begin, sizeof begin) != 0)
			return 1;
		cached = raw_out(&G, 0);
		if (cached != 0) {
			fprintf(stderr, "an image with a false hash was served from the cache\n");
			return 1;
		}
		if (vmgpu_gchan_bulk_alloc(G.ch, sizeof ptx, 5000000000ull, &pos, &bulk) < 0)
			return 1;
		memcpy(bulk, ptx, sizeof ptx);
		uint64_t put[3] = {0, pos, sizeof ptx};
		raw_call(&G, VG_OP_BLOB_PUT, 0, VG_F_NOREPLY, put, sizeof put);
		if (raw_call(&G, VG_OP_cuModuleLoadData, 0, 0, NULL, 0) != 0) {
			fprintf(stderr, "the lying guest's own load failed\n");
			return 1;
		}
	}

	if (fuzz_link(ptx, sizeof ptx, iters / 20 < 500 ? iters / 20 : 500))
		return 1;

	long replies = 0, errors = 0;
	for (long i = 0; i < iters; i++) {
		uint64_t args[256];
		uint32_t words = (uint32_t)(rnd() % 24);
		for (uint32_t w = 0; w < words; w++) {
			switch (rnd() % 6) {
			case 0: args[w] = rnd(); break;
			case 1: args[w] = rnd() % 8; break;
			case 2: args[w] = real[rnd() % 8] + (rnd() % 3 == 0 ? rnd() % 8192 : 0); break;
			case 3: args[w] = (rnd() % 40) << 8 | (rnd() % 8); break; /* handle-shaped */
			case 4: args[w] = 1ull << (rnd() % 64); break;
			default: args[w] = (uint64_t)-(int64_t)(rnd() % 4); break;
			}
		}
		uint32_t len = words * 8;
		if (rnd() % 8 == 0 && len)
			len -= (uint32_t)(rnd() % 8); /* truncated */
		uint32_t op = rnd() % 10 ? (uint32_t)(rnd() % (VG_OP_LIMIT + 4)) : (uint32_t)rnd();
		if (op == VG_OP_GOODBYE)
			continue;
		uint16_t dev = rnd() % 10 ? 0 : (uint16_t)rnd();
		uint16_t flags = (uint16_t)(rnd() % 4);
		int r = raw_call(&G, op, dev, flags, args, len);
		if (r < 0) {
			fprintf(stderr, "forwarder stopped answering after %ld requests (op %u)\n", i, op);
			return 1;
		}
		replies += !(flags & VG_F_NOREPLY);
		errors += r != 0;
	}
	/* still serving, and still correct */
	uint64_t info[2] = {1, 1};
	int r = raw_call(&G, VG_OP_cuMemGetInfo_v2, 0, 0, info, 16);
	uint32_t n = G.rlen;
	if (r != 0 || n != 16) {
		fprintf(stderr, "the forwarder no longer answers cuMemGetInfo correctly (%d, %u bytes)\n", r, n);
		return 1;
	}
	printf("fuzz_forwarder: %ld requests, %ld replies, %ld refused; forwarder healthy\n", iters, replies, errors);
	raw_guest_close(&G);
	return 0;
}
