/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The meter (meter.h): what this worker really holds on a GPU.  On a GPU, NVML's per-process
 * usage of the worker (nvmlDeviceGetComputeRunningProcesses, about 15 us on the H100); on the
 * simulated backend, its vmgpuSimProcessUsage.  A GPU that gives no number is not measured, and
 * its quota is kept by estimates (quota.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "channel.h"
#include "host_nvml.h"
#include "log.h"
#include "meter.h"

typedef struct {
	unsigned pid;
	unsigned long long used;
	unsigned gi, ci;
} nvml_proc;
#define NVML_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull
#define NVML_ERROR_INSUFFICIENT_SIZE 7

static struct {
	_Atomic int opened; /* set once on[] is filled (meter_open) */
	_Atomic int on[VG_MAX_DEVICES]; /* this guest GPU can be measured (the serving and refresh threads read it) */
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

/* Once per worker: which of the guest's GPUs can be measured (each asked once).  The serving
 * thread and the quota's refresh thread may both be first: the other waits for the answer, and
 * sees the meter opened only once on[] is filled. */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static void meter_open(const struct vh_chan *ch)
{
	const struct vh_fwd *f = ch->fwd;
	pthread_mutex_lock(&open_mu);
	if (atomic_load(&M.opened)) {
		pthread_mutex_unlock(&open_mu);
		return;
	}
	if (ch->backend->simulated) {
		M.sim = (int (*)(CUdevice, unsigned long long *))dlsym(ch->backend->dl, "vmgpuSimProcessUsage");
	} else {
		const struct vh_host_nvml *n = vh_host_nvml(ch);
		if (n)
			M.get = (int (*)(void *, unsigned *, nvml_proc *))dlsym(n->lib, "nvmlDeviceGetComputeRunningProcesses_v3");
		for (int d = 0; M.get && d < f->ndev; d++)
			M.dev[d] = n->dev[d];
	}
	for (int d = 0; d < f->ndev; d++) {
		M.on[d] = (M.sim || M.get) && query(ch, d) >= 0;
		if (!M.on[d])
			vh_log("GPU %d: no per-process memory usage to be had here: its quota is kept by estimates", d);
	}
	atomic_store(&M.opened, 1);
	pthread_mutex_unlock(&open_mu);
}

int64_t vh_meter_read(const struct vh_chan *ch, int dev)
{
	if (!atomic_load(&M.opened))
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

int vh_meter_on(const struct vh_chan *ch, int dev)
{
	if (!atomic_load(&M.opened))
		meter_open(ch);
	return M.on[dev];
}
