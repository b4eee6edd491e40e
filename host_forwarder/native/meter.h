/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The meter (meter.c): what this worker process really holds on a GPU, as NVML's per-process
 * accounting says (or the simulated backend's vmgpuSimProcessUsage).  Where there is no such
 * number (NVML without per-process accounting, as under MIG) the quota keeps estimates.
 */
#ifndef VH_METER_H
#define VH_METER_H

#include <stdint.h>

struct vh_chan;

/* Whether this worker's use of guest GPU dev can be measured (asked once per worker). */
int vh_meter_on(const struct vh_chan *ch, int dev);
/* Bytes this worker holds on guest GPU dev now, or -1 if that cannot be measured (a GPU whose
 * measurement fails once is not measured again). */
int64_t vh_meter_read(const struct vh_chan *ch, int dev);

#endif
