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
 *   weighted   work-conserving, shares by weight (`vmgpu weight`; default: the spec's, 100), the
 *              busy guests' guarantees first.
 *   fixed      a hard cap of weight% per period, even when the card is otherwise idle.
 * Under each but native, a guest's own cap (`vmgpu cap`) is a budget per period for it alone, and
 * a waiting guest of a higher priority (`vmgpu priority`) has the GPU before any lower one.
 *
 * The page's layout: native/shm_transport/include/vmgpu/sched_abi.h.  The arithmetic (who is next,
 * what a turn costs, when it is over): sched_policy.c; the page's mechanics: sched_page.c.
 */
#ifndef VH_SCHED_H
#define VH_SCHED_H

#include <stdatomic.h>
#include <stdint.h>

#include <vmgpu/sched_abi.h> /* the page's layout, shared with vmgpu/sched.py */

#define VS_DIR VMGPU_SCHED_DIR /* the default directory of the pages */
/* under shared, a guest of a higher priority whose work calls have not moved for this long no
 * longer holds the lower ones back (its requests' kernels come closer together than that) */
#define VH_YIELD_QUIET_NS 3000000ull
/* under shared, for this long after a guest of a higher priority last put work on the GPU, a lower
 * one is held to its forwarder's --yield-depth (the higher guest's next request is near) */
#define VH_NEAR_HIGHER_NS 500000000ull
/* under shared, a guest none of whose workers has served a call or passed the gate for this long,
 * and that has no work waiting, is not at work: a guest held for the others is let go while none
 * of them is (in ms: the slot's active_ms) */
#define VH_PEERS_QUIET_MS 20u

struct vh_fwd;

/* One forwarder's membership in one GPU's scheduler.  The supervisor joins; its worker
 * processes inherit the mapping and take part (vh_sched_worker). */
struct vh_sched {
	struct vmgpu_sched_page *pg;
	int me;                    /* slot index */
	int dev;                   /* the forwarder's device index */
	/* per worker process: */
	_Atomic int inflight;      /* this worker's work calls past the gate */
	_Atomic int bounded;       /* a higher-priority guest is on this GPU, or the policy is shared: its queue depth is held (sched_depth.c) */
	_Atomic uint64_t calls;    /* this worker's work calls (one writer, its serving thread) */
	uint64_t published;        /* how many of them the scheduler thread has added to the page */
	uint32_t synced_gen;       /* the last hand-over this worker drained for */
	uint64_t seen_calls, seen_at; /* work_calls as this worker's tick last saw it change */
	/* under shared: a guest of a higher priority put work on the GPU within the last
	 * VH_YIELD_QUIET_NS (its work_calls moved, as this worker's tick saw them), so this one's work
	 * waits in its ring, unless it keeps to a span that leaves the higher one's SMs free
	 * (sched_page.c, the priority reserve; set by the tick, read at the gate) */
	_Atomic int yield;
	/* under shared: a guest of a higher priority put work on the GPU within VH_YIELD_QUIET_NS,
	 * whether or not this one yields to it (set by the tick) */
	_Atomic int higher;
	/* the call at the gate puts its work on the whole GPU whatever span this guest has (a
	 * cooperative launch): it waits while a higher guest works even where the span would let it
	 * go on (set by the serving thread before it enters the gate; read there) */
	int whole_call;
	/* under shared: such a guest put work on the GPU within the last VH_NEAR_HIGHER_NS, so this
	 * one's work is held to --yield-depth (set by the tick, read at the depth: sched_depth.c) */
	_Atomic int near_higher;
	/* under shared: no other guest of this one's priority or above is at work (none has work
	 * waiting at its gate, and none served a call or passed the gate within VH_PEERS_QUIET_MS: its
	 * slot's active_ms), so its hold, which is there to give them the GPU, holds it only for its
	 * cap (sched_held_ns; set by the tick) */
	_Atomic int alone;
	/* this worker's serving thread is serving a call that puts work on this GPU (the current one)
	 * or waits for its work, as the scheduler thread last saw it (worker.c; published to the
	 * slot's active_ms by the tick under shared) */
	_Atomic int in_call;
	/* under shared, while another guest of its priority or above is at work: the groups of SMs its
	 * work runs on now (lo << 8 | hi: sched_span_now), else 0, the whole GPU (set by the tick,
	 * read where the work goes: partition.c) */
	_Atomic uint32_t part;
	/* this worker's guest process is not partitioned on this GPU (partition.c, refuse), or a call
	 * of it last left work off its span at part_stuck (ns: a stream capture was open); the tick
	 * publishes either to the slot's whole_ms while another is at work */
	_Atomic int part_off;
	_Atomic uint64_t part_stuck;
	uint64_t higher_seen[VMGPU_SCHED_SLOTS], higher_at;
	uint64_t swept_at;         /* the supervisor's last look for members that are gone */
};

/* Join the scheduler of the GPU with this UUID (a page in dir) with the guest's share there.  0 on success. */
struct sched_share;
int vh_sched_join(struct vh_sched *s, const char *dir, const char *uuid, const char *guest,
		  const struct sched_share *share, int dev);
void vh_sched_leave(struct vh_sched *s);
/* A worker process starts or stops taking part: the supervisor counts one in (start 1) before
 * it forks it, and it is counted out once: by itself as it leaves (0), or by the supervisor on
 * its behalf when it is reaped, however it ended (-1). */
void vh_sched_worker(struct vh_sched *s, int start);
/* In a worker, before its first call is served and its scheduler thread starts: whether its work
 * is held to a depth, from the page as it is now (the thread's first tick may come late on a
 * loaded host, and calls served before it went through unheld and unmarked). */
void vh_sched_worker_begins(struct vh_sched *s);
/* Completes a hand-over that workers which are gone left under way, and gives up the GPU if the
 * guest holds it with no worker left to use it: the supervisor every turn of its loop, and a
 * worker as it leaves (so the GPU is free at once when the guest's last process ends).  Once a
 * second it also lets go the slots of members whose forwarder is gone (a hand-over would, but a
 * guest holding the GPU alone makes none). */
void vh_sched_unheld(struct vh_sched *s);
/* Around a call that puts work on the GPU. */
uint64_t vh_sched_enter(struct vh_sched *s); /* the nanoseconds it waited for the turn (0: none) */
/* The gate entered only if it can be at once (the guest's turn, no hand-over under way): 1, else
 * 0, with nothing entered and no wait begun.  A call that needs several GPUs' gates waits for one
 * while it holds none of the others (serve.c): a hand-over's drain waits for what is in flight
 * through its gate, so a gate held while another GPU's turn is waited for would hold up every
 * guest on its GPU as long as that wait, without end where a guest of a higher priority keeps
 * the other GPU busy. */
int vh_sched_try_enter(struct vh_sched *s);
void vh_sched_exit(struct vh_sched *s);
/* Each worker's scheduler thread, every few hundred microseconds: hands the GPU over when it
 * must.  drain(ctx, dev) waits for the worker's queued work on that device. */
void vh_sched_tick(struct vh_sched *s, void (*drain)(void *ctx, int dev), void *ctx);
/* The scheduler thread's sleep between ticks: ns, or less if the page is woken (a guest of a
 * higher priority begins to wait, a hand-over begins or ends) after vh_sched_look, which the
 * thread calls before its ticks: a wake while it ticks is not missed. */
uint32_t vh_sched_look(struct vh_sched *s);
void vh_sched_nap(struct vh_sched *s, uint32_t looked, uint64_t ns);

#endif
