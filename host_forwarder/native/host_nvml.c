/* SPDX-License-Identifier: Apache-2.0 */
/* The host's NVML, opened once per worker: see host_nvml.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#include "channel.h"
#include "host_nvml.h"

/* Opened by whichever thread asks first (the serving thread for a guest's NVML query, or the
 * quota's refresh thread opening the meter): one that asks meanwhile waits for the answer, and
 * sees it only once N is filled. */
const struct vh_host_nvml *vh_host_nvml(const struct vh_chan *ch)
{
	const struct vh_fwd *f = ch->fwd;
	static struct vh_host_nvml N;
	static _Atomic int state; /* 0: not tried yet; 1: usable; -1: none */
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	int s = atomic_load(&state);
	if (s)
		return s > 0 ? &N : NULL;
	pthread_mutex_lock(&mu);
	if ((s = atomic_load(&state)) != 0) {
		pthread_mutex_unlock(&mu);
		return s > 0 ? &N : NULL;
	}
	/* the simulated backend carries its own NVML: the few calls of its GPUs' wiring (sim/nvml.c) */
	void *h = ch->backend->simulated ? ch->backend->dl : dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
	int (*by_uuid)(const char *, void **) =
		h ? (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID") : NULL;
	if (!init || !by_uuid || init() != 0) {
		atomic_store(&state, -1);
		pthread_mutex_unlock(&mu);
		return NULL;
	}
	for (int d = 0; d < f->ndev; d++) {
		char uuid[64];
		vh_uuid_str(f->info[d].uuid, uuid, sizeof uuid);
		if (by_uuid(uuid, &N.dev[d]) != 0)
			N.dev[d] = NULL;
	}
	N.lib = h;
	atomic_store(&state, 1);
	pthread_mutex_unlock(&mu);
	return &N;
}
