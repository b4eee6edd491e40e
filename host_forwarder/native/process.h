/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the forwarder's processes share: the supervisor (main.c parses the command line and sets
 * up; supervisor.c watches the region and the channel table and starts and reaps workers) sets it
 * up; each worker it forks (worker.c, which serves its channel through serve.c) inherits it.
 */
#ifndef VH_PROCESS_H
#define VH_PROCESS_H

#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "vh_dispatch.h"

extern struct vh_fwd F;      /* this guest's forwarder: region, GPUs, quotas, shared rows */
extern struct vh_backend BK; /* the driver (a worker loads it; the supervisor never does) */
extern const char *backend_name;
extern volatile sig_atomic_t stopping;      /* SIGTERM/SIGINT: finish the call under way, stop */
extern volatile sig_atomic_t region_broken; /* the guest truncated its region file (SIGBUS) */
extern _Atomic int open_captures;           /* stream captures the guest process has open (serve.c) */
/* serve.c and worker.c: a capture is beginning (the serving thread), a context-wide drain is under
 * way (a scheduler thread).  Each sets its own and then looks at the other's, so a capture never
 * begins while a drain synchronises a context, which would invalidate it. */
extern _Atomic int capture_beginning, ctx_draining;
/* worker.c: of ctx_draining, those synchronising the worker's context on each guest GPU
 * (context.c: a context is released only once none is under way on its GPU) */
extern _Atomic int ctx_draining_on[VG_MAX_DEVICES];

void on_signal(int sig);
/* The driver's name of a CUresult (log.c). */
const char *vh_error_name(CUresult r);

/* devices.c: check the GPUs (--gpus) and their quotas (--mem) and read what guests will be told,
 * in a child process (this one never opens the driver); then refuse a GPU whose kernels reach
 * pageable host memory unless allowed.  0, or 1 after logging why. */
int vh_devices_probe(const char *gpus, const char *mems, int allow_pageable);
/* A size: digits with an optional K, M, G or T (powers of 1024), then an optional "i" and "B". */
int vh_parse_size(const char *s, uint64_t *out);

/* supervisor.c: catch the SIGBUS of a region file the guest truncated (set up once the region
 * is mapped, before it is formatted). */
void vh_region_guard(void);
/* supervisor.c: watch the region file (fd) and the channel table until told to stop; a worker
 * for each guest process that opens a channel.  The exit status. */
int vh_supervise(int fd, const struct vmgpu_shm_params *params, const struct vmgpu_wait_opts *wopts);

/* A worker's life: serve channel idx for the guest process that opened it; the exit status. */
int vh_worker(uint32_t idx, pid_t supervisor);

/* A worker ends with VH_EXIT_ORPHANED when its supervisor is gone, told by VH_ORPHAN_SIGNAL, its
 * death signal (worker.c: on_orphaned). */
#define VH_EXIT_ORPHANED 5
#define VH_ORPHAN_SIGNAL SIGUSR2

/* Serve one channel until its owner closes it or is lost (serve.c).  Returns 0, or
 * VH_EXIT_PROTOCOL if the guest broke the protocol (it must be cut off). */
#define VH_EXIT_PROTOCOL 4
int vh_serve(struct vh_chan *ch);

/* sched_depth.c: while another guest shares the GPU, at most --sched-depth of a process's calls
 * that put work on it may be on the GPU unfinished.  Before such a call: wait until one more may
 * go (the nanoseconds waited).  While the process has a stream capture open (serve.c:
 * open_captures), a hand-over's drain waits for drain marks instead of the whole context; before
 * a first capture opens, the work queued so far is waited for (the marks cover only what comes
 * after).  After a call that put work on the GPU: its marker (beside a higher priority) and its
 * drain mark (a capture open) on the stream it used, neither on a stream being captured. */
#define VH_DEPTH_MAX 1024  /* the deepest --sched-depth */
#define VH_DEPTH_MARKS 64 /* the markers (events) of one process on one GPU that hold it */
uint64_t vh_depth_wait(struct vh_chan *ch);
/* (Also, for a graph's launch that holds the gates of other GPUs, ch->gates_more: a drain mark on
 * its stream in each of their tables, with or without a capture open, since a context-wide wait of
 * theirs is not known to cover work launched from another GPU's stream.  Called before those gates
 * are let go.) */
void vh_work_marks(struct vh_chan *ch, uint32_t flags, CUresult r);
void vh_depth_forget(const struct vh_backend *B, int dev); /* the process's context on dev is gone, its markers with it */
void vh_capture_drain(const struct vh_backend *B, int dev);
void vh_capture_opening(struct vh_chan *ch);

#endif
