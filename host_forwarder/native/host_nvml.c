/* SPDX-License-Identifier: Apache-2.0 */
/* The host's NVML, opened once per worker: see host_nvml.h. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "channel.h"
#include "host_nvml.h"

const struct vh_host_nvml *vh_host_nvml(const struct vh_chan *ch)
{
	const struct vh_fwd *f = ch->fwd;
	static struct vh_host_nvml N;
	static int tried, ok;
	if (tried)
		return ok ? &N : NULL;
	tried = 1;
	/* the simulated backend carries its own NVML: the few calls of its GPUs' wiring (sim/nvml.c) */
	void *h = ch->backend->simulated ? ch->backend->dl : dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
	int (*by_uuid)(const char *, void **) =
		h ? (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID") : NULL;
	if (!init || !by_uuid || init() != 0)
		return NULL;
	for (int d = 0; d < f->ndev; d++) {
		char uuid[64];
		vh_uuid_str(f->info[d].uuid, uuid, sizeof uuid);
		if (by_uuid(uuid, &N.dev[d]) != 0)
			N.dev[d] = NULL;
	}
	N.lib = h;
	ok = 1;
	return &N;
}
