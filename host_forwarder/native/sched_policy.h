/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute scheduler's arithmetic (see vh_sched.h): who has the next turn, what a turn costs,
 * when a turn is over, what a cap allows per period.  Each function works on the page and a time
 * its caller gives (CLOCK_MONOTONIC ns in the forwarder, a fake clock in
 * host_forwarder/tests/t_sched_policy.c); none sleeps, locks or wakes anyone.  "Under the lock":
 * the caller holds the page's mutex (sched_page.c).
 */
#ifndef VH_SCHED_POLICY_H
#define VH_SCHED_POLICY_H

#include <stdint.h>

#include "vh_sched.h"

#define SCHED_IDLE_NS 2000000ull     /* a holder with no work for this long gives the GPU up (page idle_us 0) */
#define SCHED_IDLE_LOWER_NS 500000ull /* ... when only guests of a lower priority wait for it (or idle_us, if less) */
#define SCHED_IDLE_MIN_NS 50000ull   /* the least idle_us means: 50 us */
#define SCHED_RECENT_NS 50000000ull  /* a guest with no turn and no wish for one this long was idle */
#define SCHED_DEFAULT_SLICE_US 10000u
#define SCHED_DEFAULT_PERIOD_US 100000u

/* How long a holder without work keeps its turn while others wait: the page's idle_us (0: SCHED_IDLE_NS;
 * held to 50 us .. the slice, or SCHED_IDLE_NS where the slice is shorter);
 * lower: while only guests of a lower priority wait (SCHED_IDLE_LOWER_NS, or idle_us if less). */
uint64_t sched_idle_ns(struct vmgpu_sched_page *pg, int lower);

/* Is the forwarder with this pid still there?  A zombie (dead, not yet reaped) is not. */
int sched_alive(uint32_t pid);

/* Under the lock: the lowest virtual time of the live members (dead ones are let go), or
 * UINT64_MAX if none: where a new member starts, so it is owed nothing for time before it came. */
uint64_t sched_vtime_floor(struct vmgpu_sched_page *pg);

/* A guest's share on one GPU, as the forwarder's command line gives it (vmgpu/spec.py's grammar). */
struct sched_share {
	int weight;    /* 1..100: relative */
	int cap;       /* 0: none; 1..100: at most cap% of each period */
	int priority;  /* enum vmgpu_sched_priority */
	int guarantee; /* 0..100: % reserved at admission */
};

/* Under the lock: fill the free slot g for guest (each field clamped to its range) joining at now
 * with virtual time floor (sched_vtime_floor); its pid is stored last by the caller. */
void sched_seat(struct vmgpu_sched_slot *g, const char *guest, const struct sched_share *share, uint64_t now,
		uint64_t floor);

/* Virtual time a turn of `held` ns costs g: its held time per weight (equal weights under
 * the policies that do not weigh; under weighted, guarantees first: effective_weight). */
uint64_t sched_vcost(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t held);

/* Held-time budget per period of g at now under a capping policy (equal: 1/N; fixed: weight%), or
 * of a guest with a cap of its own (cap%, the tighter of the two under a capping policy); where
 * vmgpud's cap controller set the slot's cap_pm and has looked within VMGPU_SCHED_CAPS_FRESH_MS
 * (the page's caps_ms), that part of the period in place of cap% and fixed's weight% (so that the
 * guest's progress, not its time, is its cap's part). */
uint64_t sched_budget_ns(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now);

/* Under the lock: the GPU to whoever should have it at now (pick, and begin its turn); the
 * slot index, or -1 for nobody.  The caller wakes the waiters. */
int sched_give_turn(struct vmgpu_sched_page *pg, uint64_t now);

/* Under the lock: charge g, the holder, for its turn up to now (its used_ns), and charge it from
 * now on (the page's hold_start moved to now; its turn_start stays), one change to its GPU time for
 * readers (its time_seq: sched_abi.h). */
void sched_charge(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now);

/* Does a member other than `me` wait for the GPU that may have it now and is behind virtual
 * time `mine` (UINT64_MAX: any)? */
int sched_others_wait(struct vmgpu_sched_page *pg, int me, uint64_t now, uint64_t mine);

/* g's priority as an order: low 0 < normal 1 < high 2 (an unknown value is normal). */
int sched_rank(struct vmgpu_sched_slot *g);

/* The MPS client priority (CUDA_MPS_CLIENT_PRIORITY, read when a client opens the driver) of a
 * worker whose guest has these n slots, one per GPU (NULL: not on that GPU's page, whose priority
 * is then high_opt[i], the forwarder's --priority): the MPS server has two levels, "0" (normal)
 * and "1" (below normal), and runs the blocks of a normal client's kernels before those of a
 * client below normal as SMs free up.  "0" for a guest that is high on any of its GPUs, "1" for
 * every other, so that a high guest's kernels go ahead of what lower guests already have on the
 * GPU (the gate keeps the rest of their work in their rings). */
const char *sched_mps_client_priority(struct vmgpu_sched_slot *const *slots, const int *high_opt, int n);

/* Do members other than `me` wait for the GPU that may have it now, all of a lower priority? */
int sched_only_lower_wait(struct vmgpu_sched_page *pg, int me, uint64_t now);

/* Is a member of a higher priority than `me` on the page (waiting or not)?  Never under the native
 * policy.  Its work then goes only so far ahead of the GPU (sched_depth.c). */
int sched_higher_member(struct vmgpu_sched_page *pg, int me);

/* Does a member of a higher priority than `me` wait for the GPU that may have it now? */
int sched_higher_waits(struct vmgpu_sched_page *pg, int me, uint64_t now);

/* Is the turn of `me`, the holder, over at now?  idle: none of its workers has work (the
 * worker's own measure, SCHED_IDLE_NS).  Over when idle while another waits (or where its budget
 * is counted: capped below the whole period; alone it keeps the GPU between calls), when its slice
 * is spent while another
 * waits that is behind it, when its cap for the period is spent, as soon as a guest of a higher
 * priority waits, or under the native policy. */
int sched_turn_over(struct vmgpu_sched_page *pg, int me, uint64_t now, int idle);

/* Is the holder `me` capped with its budget not counted now (the whole period: a probe of the cap
 * controller)?  Its turn is then charged as it goes (sched_charge_turn every slice; its slice still
 * counts from the turn's start, turn_start), so that its budget counted again (the probe over) finds only
 * the time since, not the whole probe as an overrun paid from the next period. */
int sched_turn_uncounted(struct vmgpu_sched_page *pg, int me, uint64_t now);

/* Under the lock: g holds the GPU idle and alone (its turn not over): charged for its turn up to
 * its last work, its turn goes on from now (its slice too), so that idle time alone is nobody's
 * GPU time. */
void sched_rest(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t last_work, uint64_t now);

/* Under the lock: g, the holder, charged for its turn up to now (sched_turn_uncounted); its slice
 * still counts from its turn's start. */
void sched_charge_turn(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now);

/* Under the shared policy: how long from now until g's work may pass (0: at once).  g is held the
 * first hold per mille of every period (the page's period_us, on the common CLOCK_MONOTONIC, so
 * every guest's period begins together); at 1000 and above, held throughout.  alone: no other
 * guest of its priority or above is at work (vh_sched.h, alone), so that it is held only as far
 * as its cap holds it as well (the less of its hold and 1000 - 10 x cap, or 1000 - cap_pm where
 * the cap controller set it and is looking; not at all without a cap; the share controller's hold includes the
 * cap's): a hold is there to give the
 * others the GPU, and an idle guest's share goes to the busy ones at once.  Under every other
 * policy, 0: turns decide. */
uint64_t sched_held_ns(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now, int alone);

/* Under the shared policy, the groups of SMs a worker's work runs on at now, from its slot's span
 * word (partition.h: ends in sixteenths of a group, lo << 16 | hi): lo << 8 | hi in whole groups,
 * an end at n + f/16 rounded up the first f/16 of each period (the page's period_us, on the common
 * clock: neighbours' ends round alike); 0, the whole GPU, for no span, one empty or past the
 * page's sm_groups, or one that is the whole GPU. */
uint32_t sched_span_now(struct vmgpu_sched_page *pg, uint32_t span, uint64_t now);

/* A worker thread of member me begins to wait for the GPU at now: counted a waiter; the first
 * waiter of a guest that neither holds the GPU nor had a turn for SCHED_RECENT_NS marks it back
 * from idle (level with the others at its pick). */
void sched_wait_begin(struct vmgpu_sched_page *pg, int me, uint64_t now);
void sched_wait_end(struct vmgpu_sched_slot *g);

#endif
