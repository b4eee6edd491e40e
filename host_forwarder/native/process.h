/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the forwarder's processes share: the supervisor (supervisor.c: start-up, the region
 * file, the channel table, workers' lives) sets it up; each worker it forks (worker.c, which
 * serves its channel through serve.c) inherits it.
 */
#ifndef VH_PROCESS_H
#define VH_PROCESS_H

#include <signal.h>

#include "vh_dispatch.h"

extern struct vh_fwd F;      /* this guest's forwarder: region, GPUs, quotas, shared books */
extern struct vh_backend BK; /* the driver (a worker loads it; the supervisor never does) */
extern const char *backend_name;
extern volatile sig_atomic_t stopping;      /* SIGTERM/SIGINT: finish the call under way, stop */
extern volatile sig_atomic_t region_broken; /* the guest truncated its region file (SIGBUS) */
extern _Atomic int open_captures;           /* stream captures the guest process has open (serve.c) */

void on_signal(int sig);
const char *errname(CUresult r);

/* A worker's life: serve channel idx for the guest process that opened it; the exit status. */
int vh_worker(uint32_t idx, pid_t supervisor);

#endif
