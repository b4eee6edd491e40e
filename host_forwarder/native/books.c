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
	int tried, ok;
	int (*get)(void *, unsigned *, nvml_proc *);
	void *dev[VG_MAX_DEVICES];
	int (*sim)(CUdevice, unsigned long long *);
} M;

static void meter_open(const struct vh_chan *ch)
{
	const struct vh_fwd *f = ch->fwd;
	M.tried = 1;
	if (ch->backend->simulated) {
		M.sim = (int (*)(CUdevice, unsigned long long *))dlsym(ch->backend->dl, "vmgpuSimProcessUsage");
		M.ok = M.sim != NULL;
		return;
	}
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return;
	int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
	int (*by_uuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID");
	M.get = (int (*)(void *, unsigned *, nvml_proc *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!init || !by_uuid || !M.get || init() != 0)
		return;
	for (int d = 0; d < f->ndev; d++) {
		char uuid[64];
		vh_uuid_str(f->info[d].uuid, uuid, sizeof uuid);
		if (by_uuid(uuid, &M.dev[d]) != 0)
			return;
	}
	M.ok = 1;
}

/* Bytes this process holds on guest device dev, or -1 if that cannot be measured. */
static int64_t meter(const struct vh_chan *ch, int dev)
{
	const struct vh_fwd *f = ch->fwd;
	if (!M.tried)
		meter_open(ch);
	if (!M.ok)
		return -1;
	if (M.sim) {
		unsigned long long b = 0;
		return M.sim(f->dev[dev], &b) == 0 ? (int64_t)b : -1;
	}
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
	int64_t out = r == 0 ? 0 : -1;
	unsigned pid = (unsigned)getpid();
	for (unsigned i = 0; r == 0 && i < n; i++)
		if (p[i].pid == pid)
			out = p[i].used == NVML_NOT_AVAILABLE ? -1 : (int64_t)p[i].used;
	if (p != stack)
		free(p);
	if (out < 0 && M.ok) {
		M.ok = 0; /* said once, then the estimates are the charges */
		vh_log("NVML gives no per-process memory usage here: quotas are kept by estimates");
	}
	return out;
}

int vh_books_metered(struct vh_chan *ch)
{
	return meter(ch, ch->cur_dev >= 0 ? ch->cur_dev : 0) >= 0;
}

/* ---- the books ------------------------------------------------------------------------ */

uint64_t vh_round_charge(uint64_t n)
{
	/* as the H100's driver takes them: up to 1 MiB in 64 KiB pieces of shared 2 MiB pages,
	 * above that whole 2 MiB pages */
	uint64_t unit = n <= (1u << 20) ? (64u << 10) : (2u << 20);
	return n == 0 ? unit : (n + unit - 1) / unit * unit;
}

int vh_books_reserve(struct vh_chan *ch, int dev, uint64_t n)
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

int vh_books_over(struct vh_chan *ch, int dev)
{
	return atomic_load(&ch->fwd->used[dev]) > ch->fwd->quota[dev];
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
