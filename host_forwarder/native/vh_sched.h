/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute scheduler: one shared page per physical GPU (/dev/shm/vmgpu/vmgpu-sched-<GPU UUID>,
 * in a directory only root can change: region_file.h)
 * through which every forwarder on that GPU takes turns.  A guest's calls that put work on
 * the GPU (vh_op_gpu_work) pass only while its forwarder holds the GPU; the holder gives it
 * up, after draining what it queued, when its slice ends and another guest waits, when it
 * goes idle, or when its cap for the period is spent.  Held time is what a guest is
 * charged, so a share holds for long kernels, tiny kernels, graphs and sync loops alike.
 *
 * Policies (the GPU's, set live with `vmgpu policy`):
 *   native     no control: calls pass at once.
 *   equal      every guest on the GPU gets 1/N of the time, even when the others are idle.
 *   preemptive equal shares, work-conserving: an idle guest's time goes to busy ones.
 *   weighted   work-conserving, shares by weight (`vmgpu weight`; default: the compute %).
 *   fixed      a hard cap of weight% per period, even when the card is otherwise idle.
 *
 * The layout is read and written by Python (vmgpu/sched.py): keep the offsets.
 */
#ifndef VH_SCHED_H
#define VH_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define VS_MAGIC 0x3144454843534756ull /* "VGSCHED1" */
#define VS_VERSION 1
#define VS_SLOTS 64
#define VS_NAME 64
#define VS_DIR "/dev/shm/vmgpu" /* the default directory of the pages (root's, 0700) */

enum vs_policy { VS_NATIVE = 0, VS_EQUAL = 1, VS_PREEMPTIVE = 2, VS_WEIGHTED = 3, VS_FIXED = 4 };

struct vs_slot {             /* 256 bytes */
	_Atomic uint32_t pid;     /* 0: free */
	_Atomic uint32_t weight;  /* 1..100: share weight, or the cap in % under fixed */
	_Atomic uint32_t waiters; /* worker threads waiting to put work on the GPU */
	uint32_t pad0;
	char name[VS_NAME];       /* the guest */
	uint64_t vtime;           /* held ns * 100 / weight: who is furthest behind goes next */
	_Atomic uint64_t used_ns; /* all held time */
	uint64_t period_start, period_used;
	uint64_t joined_ns;
	_Atomic uint64_t turns;   /* times it was given the GPU */
	uint64_t last_active;     /* when its last turn began or ended */
	/* the guest's worker processes (one per guest process) share its turn: */
	_Atomic uint32_t inflight;  /* unused (layout kept): each worker counts its own */
	_Atomic uint32_t draining;  /* handing over: no new work passes */
	_Atomic uint64_t work_calls; /* work calls that passed the gate, as the workers' scheduler
	                              * threads publish them (idle: it stops moving) */
	_Atomic uint32_t nworkers;  /* worker processes */
	_Atomic uint32_t drained;   /* workers that finished their queued work this hand-over */
	_Atomic uint32_t drain_gen; /* hand-overs begun */
	_Atomic uint32_t rejoin;    /* back from idle: starts level with the others at its next pick */
	uint8_t pad[256 - 168];
};

struct vs_page {
	uint64_t magic;            /*  0 */
	uint32_t version, nslots;  /*  8 */
	_Atomic uint32_t policy;   /* 16 */
	_Atomic uint32_t slice_us; /* 20: longest turn while another guest waits */
	_Atomic uint32_t period_us;/* 24: the accounting period of caps */
	_Atomic int32_t owner;     /* 28: slot holding the GPU, -1 none */
	_Atomic uint32_t gen;      /* 32: futex word, bumped at every hand-over */
	uint32_t pad0;
	uint64_t hold_start;       /* 40 */
	uint8_t mu_space[64];      /* 48: pthread_mutex_t (process-shared, robust) */
	uint8_t pad1[128 - 112];
	struct vs_slot slot[VS_SLOTS]; /* 128 */
};

struct vh_fwd;

/* One forwarder's membership in one GPU's scheduler.  The supervisor joins; its worker
 * processes inherit the mapping and take part (vh_sched_worker). */
struct vh_sched {
	struct vs_page *pg;
	int me;                    /* slot index */
	int dev;                   /* the forwarder's device index */
	/* per worker process: */
	_Atomic int inflight;      /* this worker's work calls past the gate */
	_Atomic uint64_t calls;    /* this worker's work calls (one writer, its serving thread) */
	uint64_t published;        /* how many of them the scheduler thread has added to the page */
	uint32_t synced_gen;       /* the last hand-over this worker drained for */
	uint64_t seen_calls, seen_at; /* work_calls as this worker's tick last saw it change */
};

/* Join the scheduler of the GPU with this UUID (a page in dir).  weight 1..100.  0 on success. */
int vh_sched_join(struct vh_sched *s, const char *dir, const char *uuid, const char *guest, int weight, int dev);
void vh_sched_leave(struct vh_sched *s);
/* A worker process starts or stops taking part: the supervisor counts one in (start 1) before
 * it forks it, and it is counted out once: by itself as it leaves (0), or by the supervisor on
 * its behalf when it is reaped, however it ended (-1). */
void vh_sched_worker(struct vh_sched *s, int start);
/* Completes a hand-over that workers which are gone left under way, and gives up the GPU if the
 * guest holds it with no worker left to use it: the supervisor every turn of its loop, and a
 * worker as it leaves (so the GPU is free at once when the guest's last process ends). */
void vh_sched_unheld(struct vh_sched *s);
/* Around a call that puts work on the GPU. */
void vh_sched_enter(struct vh_sched *s);
void vh_sched_exit(struct vh_sched *s);
/* Each worker's scheduler thread, every few hundred microseconds: hands the GPU over when it
 * must.  drain(ctx, dev) waits for the worker's queued work on that device. */
void vh_sched_tick(struct vh_sched *s, void (*drain)(void *ctx, int dev), void *ctx);

#endif
