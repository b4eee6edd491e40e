/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest's memory books: what each worker (guest process) is charged on each GPU,
 * summed across the workers in shared memory and held under the quota.
 *
 * Charges are the truth where the driver can be measured.  On a GPU, NVML's per-process
 * usage of the worker is read after every call that can take or give back device memory
 * (about 15 us on the H100), so the books hold what the worker really holds: the
 * context's own overhead (about 518 MiB on the H100 with driver 580), the driver's
 * rounding (allocations over 1 MiB take whole 2 MiB pages), pool chunks, graph memory,
 * module code and globals, VMM handles.  Before such a call the worker reserves an
 * estimate, so that concurrent workers of the same guest cannot both pass the check; after
 * it the reservation is replaced by the measurement, and a call that left the guest over
 * its quota is undone and answered CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Where no per-process measurement exists (NVML without per-process accounting, as under
 * MIG), the estimates are the charges: each allocation is charged its rounded size until
 * freed, and every context a flat reserve (--ctx-reserve).
 *
 * A worker's row lives in shared memory so that the supervisor returns its charges when
 * the worker ends, however it ends.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "vh_dispatch.h"

/* ---- the meter: what this process really holds on a device ----------------------- */

typedef struct {
	unsigned pid;
	unsigned long long used;
	unsigned gi, ci;
} nvml_proc;
#define NVML_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull
#define NVML_ERROR_INSUFFICIENT_SIZE 7

static struct {
	int opened;
	int on[VG_MAX_DEVICES]; /* this guest GPU can be measured */
	int (*get)(void *, unsigned *, nvml_proc *);
	void *dev[VG_MAX_DEVICES];
	int (*sim)(CUdevice, unsigned long long *);
} M;

/* Bytes this process holds on guest device dev, asked now, or -1 if the answer is no number. */
static int64_t query(const struct vh_chan *ch, int dev)
{
	if (M.sim) {
		unsigned long long b = 0;
		return M.sim(ch->fwd->dev[dev], &b) == 0 ? (int64_t)b : -1;
	}
	if (!M.get || !M.dev[dev])
		return -1;
	nvml_proc stack[64], *p = stack;
	unsigned n = 64;
	int r = M.get(M.dev[dev], &n, p);
	if (r == NVML_ERROR_INSUFFICIENT_SIZE && n <= 4096) {
		n += 16;
		p = calloc(n, sizeof *p);
		if (!p)
			return -1;
		r = M.get(M.dev[dev], &n, p);
	}
	int64_t out = r == 0 ? 0 : -1; /* not listed yet: nothing held */
	unsigned pid = (unsigned)getpid();
	for (unsigned i = 0; r == 0 && i < n; i++)
		if (p[i].pid == pid)
			out = p[i].used == NVML_NOT_AVAILABLE ? -1 : (int64_t)p[i].used;
	if (p != stack)
		free(p);
	return out;
}

/* Once per worker: which of the guest's GPUs can be measured (each asked once). */
static void meter_open(const struct vh_chan *ch)
{
	const struct vh_fwd *f = ch->fwd;
	M.opened = 1;
	if (ch->backend->simulated) {
		M.sim = (int (*)(CUdevice, unsigned long long *))dlsym(ch->backend->dl, "vmgpuSimProcessUsage");
	} else {
		void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
		int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
		int (*by_uuid)(const char *, void **) =
			h ? (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID") : NULL;
		if (h)
			M.get = (int (*)(void *, unsigned *, nvml_proc *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
		if (!init || !by_uuid || !M.get || init() != 0)
			M.get = NULL;
		for (int d = 0; M.get && d < f->ndev; d++) {
			char uuid[64];
			vh_uuid_str(f->info[d].uuid, uuid, sizeof uuid);
			if (by_uuid(uuid, &M.dev[d]) != 0)
				M.dev[d] = NULL;
		}
	}
	for (int d = 0; d < f->ndev; d++) {
		M.on[d] = (M.sim || M.get) && query(ch, d) >= 0;
		if (!M.on[d])
			vh_log("GPU %d: no per-process memory usage to be had here: its quota is kept by estimates", d);
	}
}

/* Bytes this process holds on guest device dev, or -1 if that cannot be measured. */
static int64_t meter(const struct vh_chan *ch, int dev)
{
	if (!M.opened)
		meter_open(ch);
	if (!M.on[dev])
		return -1;
	int64_t v = query(ch, dev);
	if (v < 0) {
		M.on[dev] = 0; /* said once, then the estimates are the charges */
		vh_log("GPU %d: NVML stopped giving per-process memory usage: its quota is kept by estimates", dev);
	}
	return v;
}

/* Whether this worker's charges on guest GPU dev are measurements (no measuring here). */
int vh_books_metered_dev(struct vh_chan *ch, int dev)
{
	if (!M.opened)
		meter_open(ch);
	return M.on[dev];
}

/* The same for its current GPU. */
int vh_books_metered(struct vh_chan *ch)
{
	return vh_books_metered_dev(ch, ch->cur_dev >= 0 ? ch->cur_dev : 0);
}

/* ---- the books ------------------------------------------------------------------------ */

uint64_t vh_round_charge(uint64_t n)
{
	/* as the H100's driver takes them: up to 1 MiB in 64 KiB pieces of shared 2 MiB pages,
	 * above that whole 2 MiB pages */
	uint64_t unit = n <= (1u << 20) ? (64u << 10) : (2u << 20);
	return n == 0 ? unit : (n + unit - 1) / unit * unit;
}

/* Is some of dev's memory on its way back: a row of a guest process that has closed its
 * channel (or lost it) whose worker has not yet given it back?  Its worker does so within
 * moments; until then the books still count it. */
static int returns_pending(const struct vh_chan *ch, int dev)
{
	const struct vh_fwd *f = ch->fwd;
	const struct vmgpu_layout *L = vmgpu_host_layout(f->host);
	for (uint32_t i = 0; i < L->nchannels; i++) {
		if (i == ch->index || !atomic_load(&f->charged[i][dev]))
			continue;
		struct vmgpu_chan_desc *d =
			(struct vmgpu_chan_desc *)(f->region + L->chan_table_off + (uint64_t)i * sizeof *d);
		if ((uint32_t)atomic_load_explicit(&d->ctl, memory_order_acquire) != VMGPU_CHAN_ACTIVE)
			return 1;
	}
	return 0;
}

static int reserve_now(struct vh_chan *ch, int dev, uint64_t n)
{
	struct vh_fwd *f = ch->fwd;
	_Atomic uint64_t *used = &f->used[dev];
	uint64_t cur = atomic_load(used);
	do {
		if (n > f->quota[dev] || cur > f->quota[dev] - n)
			return -1;
	} while (!atomic_compare_exchange_weak(used, &cur, cur + n));
	atomic_fetch_add(&ch->charged[dev], n);
	return 0;
}

/* A guest process that starts as another ends must not be refused the memory the other is
 * giving back: a reservation that does not fit waits (up to a second) while such memory is
 * on its way, as natively a process's memory is free once it has exited. */
int vh_books_reserve(struct vh_chan *ch, int dev, uint64_t n)
{
	for (int waited_ms = 0;; waited_ms++) {
		if (reserve_now(ch, dev, n) == 0)
			return 0;
		if (waited_ms >= 1000 || !returns_pending(ch, dev))
			return -1;
		struct timespec t = {0, 1000000};
		nanosleep(&t, NULL);
	}
}

void vh_books_release(struct vh_chan *ch, int dev, uint64_t n)
{
	atomic_fetch_sub(&ch->fwd->used[dev], n);
	atomic_fetch_sub(&ch->charged[dev], n);
}

int vh_books_settle(struct vh_chan *ch, int dev)
{
	struct vh_fwd *f = ch->fwd;
	int64_t truth = meter(ch, dev);
	if (truth >= 0) {
		uint64_t old = atomic_exchange(&ch->charged[dev], (uint64_t)truth);
		atomic_fetch_add(&f->used[dev], (uint64_t)truth - old); /* modular: a decrease too */
	}
	return atomic_load(&f->used[dev]) > f->quota[dev];
}

void vh_books_refresh(struct vh_chan *ch)
{
	if (pthread_mutex_trylock(&ch->books_mu) != 0)
		return; /* a call is taking memory: it settles itself */
	for (int d = 0; d < ch->fwd->ndev; d++)
		if (ch->ctx[d])
			vh_books_settle(ch, d);
	pthread_mutex_unlock(&ch->books_mu);
}
