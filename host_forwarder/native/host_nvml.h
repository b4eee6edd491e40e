/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host's NVML as a worker uses it (host_nvml.c): opened and initialised once per worker,
 * with each guest GPU's NVML device found by its UUID once.  The meter (meter.c) and the
 * guest's NVML answers (nvml_query.c) both read through it.
 */
#ifndef VH_HOST_NVML_H
#define VH_HOST_NVML_H

#include "vg_wire.h"

struct vh_chan;

struct vh_host_nvml {
	void *lib;                    /* for dlsym of the functions a reader needs */
	void *dev[VG_MAX_DEVICES];    /* each guest GPU's nvmlDevice_t, NULL where NVML has none */
};

/* The host's NVML (on the simulated backend: its own, sim/nvml.c), or NULL where there is no usable NVML. */
const struct vh_host_nvml *vh_host_nvml(const struct vh_chan *ch);

#endif
