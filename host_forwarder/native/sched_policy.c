/* SPDX-License-Identifier: Apache-2.0 */
/* The compute scheduler's arithmetic: see sched_policy.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "sched_policy.h"

int sched_alive(uint32_t pid)
{
	if (!pid || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
		return 0;
	char state;
	if (vh_proc_stat(pid, &state, NULL) != 0)
		return 1; /* unreadable: kill said it is there */
	return state != 'Z' && state != 'X';
}

uint64_t sched_idle_ns(struct vmgpu_sched_page *pg, int lower)
{
	uint64_t idle = (uint64_t)atomic_load(&pg->idle_us) * 1000;
	uint64_t most = (uint64_t)atomic_load(&pg->slice_us) * 1000;
	if (most < SCHED_IDLE_NS)
		most = SCHED_IDLE_NS;
	/* at least a few of the workers' looks (a drain for every wish of another guest's otherwise),
	 * at most the slice (or the default, if the slice is shorter): an idle holder does not keep a
	 * waiter out past the turn a busy one would have */
	if (!idle)
		idle = SCHED_IDLE_NS;
	else if (idle < SCHED_IDLE_MIN_NS)
		idle = SCHED_IDLE_MIN_NS;
	else if (idle > most)
		idle = most;
	return lower && SCHED_IDLE_LOWER_NS < idle ? SCHED_IDLE_LOWER_NS : idle;
}

static int capped_policy(uint32_t policy)
{
	return policy == VMGPU_SCHED_EQUAL || policy == VMGPU_SCHED_FIXED;
}

/* Is g capped: every guest under a capping policy; under the others (native aside) a guest with a
 * cap of its own, while the uncapped beside it stay weighted.  Its budget is counted only where it
 * is less than the whole period (counted_budget). */
static int capped(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g)
{
	uint32_t policy = atomic_load(&pg->policy);
	return capped_policy(policy) || (policy != VMGPU_SCHED_NATIVE && atomic_load(&g->cap));
}

int sched_rank(struct vmgpu_sched_slot *g)
{
	uint32_t p = atomic_load(&g->priority);
	return p == VMGPU_SCHED_PRIO_HIGH ? 2 : p == VMGPU_SCHED_PRIO_LOW ? 0 : 1;
}

const char *sched_mps_client_priority(struct vmgpu_sched_slot *const *slots, const int *high_opt, int n)
{
	for (int i = 0; i < n; i++)
		if (slots[i] ? sched_rank(slots[i]) == 2 : high_opt[i])
			return "0";
	return "1";
}

static int nmembers(struct vmgpu_sched_page *pg)
{
	int n = 0;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++)
		n += atomic_load(&pg->slot[i].pid) != 0;
	return n;
}

static uint64_t period_ns(struct vmgpu_sched_page *pg)
{
	return (uint64_t)atomic_load(&pg->period_us) * 1000;
}

/* The part of each period (per mille) g's cap leaves its work at now: its cap% and under fixed its
 * weight%, whichever is less (1000: not capped), or, where it is capped, what vmgpud's cap
 * controller set in place of that (cap_pm, so that its progress is its cap's part of its rate
 * alone) while the controller is looking (the page's caps_ms recent).  A part in the slot of a
 * guest that is not capped is not taken: the controller sets none there, and one it stored for
 * the slot's last guest as a new one was seated lasts only to its next look.  vmgpud takes a
 * guest as capped by the same rule (vmgpu/sched.py cap_percent): a change here is made there too. */
static uint32_t cap_part_pm(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	/* the stamp first: the controller stores the parts, then stamps (a part older than the stamp
	 * read is never taken for one the stamp vouches for) */
	uint32_t looked = atomic_load(&pg->caps_ms);
	uint32_t pm = atomic_load(&g->cap_pm), cap = atomic_load(&g->cap), w = atomic_load(&g->weight);
	uint32_t part = cap ? 10 * (cap > 100 ? 100 : cap) : 1000;
	if (atomic_load(&pg->policy) == VMGPU_SCHED_FIXED && 10 * (w > 100 ? 100 : w) < part)
		part = 10 * w;
	int32_t age = (int32_t)((uint32_t)(now / 1000000) - looked); /* (both the low 32 bits of ms) */
	int32_t fresh = pm >= 1000 ? VMGPU_SCHED_PROBE_FRESH_MS : VMGPU_SCHED_CAPS_FRESH_MS; /* (a probe: less) */
	if (part < 1000 && pm && looked && age > -fresh && age <= fresh)
		return pm > 1000 ? 1000 : pm;
	return part;
}

uint64_t sched_budget_ns(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	uint64_t period = period_ns(pg), budget = period, by_cap = period * cap_part_pm(pg, g, now) / 1000;
	if (atomic_load(&pg->policy) == VMGPU_SCHED_EQUAL) {
		int n = nmembers(pg);
		budget = period / (uint64_t)(n ? n : 1);
	}
	return by_cap < budget ? by_cap : budget; /* its cap (or fixed's weight), where tighter */
}

/* The budget g's work is counted against in each period at now, or NO_BUDGET: where it is not
 * capped, and where its budget is the whole period (a cap of 100%, fixed at weight 100, alone under
 * equal, the cap controller's probe: cap_pm 1000).  Such a guest goes as an uncapped one does:
 * counting its turns would only end them at each idle moment and at each period's end, each a
 * drain of the GPU (on an H200 a batch-64 ResNet-50 trainer so held in its probes ran at 92% of its
 * rate alone, and the controller held it to its cap of that).  Read once per decision: the parts
 * it depends on may change between two reads. */
#define NO_BUDGET UINT64_MAX
static uint64_t counted_budget(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	if (!capped(pg, g))
		return NO_BUDGET;
	uint64_t period = period_ns(pg), b = sched_budget_ns(pg, g, now);
	return period && b >= period ? NO_BUDGET : b;
}

/* Has g spent its budget b (counted_budget) for the period under way?  (Read only: a period over
 * is not spent.) */
static int budget_spent(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now, uint64_t b)
{
	return b != NO_BUDGET && now - g->period_start < period_ns(pg) && g->period_used >= b;
}

static int spent_for_period(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	return budget_spent(pg, g, now, counted_budget(pg, g, now));
}

/* Under the lock: may g have a turn now?  Starts its new period if the last one is over: unspent
 * budget is not kept, an overrun (a kernel that ran past the turn) is paid from the next period,
 * at most one budget. */
static int eligible(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	uint64_t b = counted_budget(pg, g, now);
	if (b != NO_BUDGET && now - g->period_start >= period_ns(pg)) {
		uint64_t over = g->period_used > b ? g->period_used - b : 0;
		g->period_used = over < b ? over : b;
		g->period_start = now;
	}
	return !budget_spent(pg, g, now, b);
}

/* Is g taking part now: holding the GPU or waiting for it? */
static int active(struct vmgpu_sched_page *pg, int i)
{
	return atomic_load(&pg->slot[i].pid) && (atomic_load(&pg->slot[i].waiters) || atomic_load(&pg->owner) == i);
}

/* g's weight for virtual time.  Under weighted, guests with a guarantee among the active ones
 * first get their guaranteed shares, and the rest is shared by weight: g's share is
 * guarantee + (100 - G) * weight / W (G, W: the active guests' guarantees and weights), in
 * proportion to guarantee * W + (100 - G) * weight, which is 100 * weight when no active guest
 * has a guarantee (the plain weighted share). */
static uint64_t effective_weight(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g)
{
	uint64_t w = atomic_load(&g->weight), gsum = 0, wsum = 0;
	if (w > 100)
		w = 100;
	if (atomic_load(&pg->policy) != VMGPU_SCHED_WEIGHTED)
		return 100 * w;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *o = &pg->slot[i];
		if (!active(pg, i) && o != g)
			continue;
		uint32_t gi = atomic_load(&o->guarantee), wi = atomic_load(&o->weight);
		gsum += gi > 100 ? 100 : gi;
		wsum += wi > 100 ? 100 : wi;
	}
	if (!gsum)
		return 100 * w;
	uint64_t mine = atomic_load(&g->guarantee), rest = gsum < 100 ? 100 - gsum : 0;
	return (mine > 100 ? 100 : mine) * wsum + rest * w;
}

uint64_t sched_vcost(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t held)
{
	uint32_t policy = atomic_load(&pg->policy);
	uint64_t w = policy == VMGPU_SCHED_WEIGHTED || policy == VMGPU_SCHED_FIXED ? effective_weight(pg, g) : 10000;
	return held * 10000 / (w ? w : 1);
}

uint64_t sched_vtime_floor(struct vmgpu_sched_page *pg)
{
	uint64_t floor = UINT64_MAX;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		uint32_t pid = atomic_load(&pg->slot[i].pid);
		if (pid && !sched_alive(pid))
			atomic_store(&pg->slot[i].pid, 0);
		else if (pid && pg->slot[i].vtime < floor)
			floor = pg->slot[i].vtime;
	}
	return floor;
}

static uint32_t clamp(int v, int lo, int hi)
{
	return (uint32_t)(v < lo ? lo : v > hi ? hi : v);
}

void sched_seat(struct vmgpu_sched_slot *g, const char *guest, const struct sched_share *share, uint64_t now,
		uint64_t floor)
{
	/* the slot's time_seq goes on from where it was: a reader's look at the slot's last guest that
	 * the seat overlaps sees it moved (and the slot's pid, stored last, new) */
	uint32_t seq = atomic_load_explicit(&g->time_seq, memory_order_relaxed);
	memset((char *)g + sizeof g->pid, 0, sizeof *g - sizeof g->pid);
	atomic_store_explicit(&g->time_seq, seq, memory_order_relaxed);
	/* the whole name, NUL padded: a guest's name may fill all 64 bytes (vmgpu/names.py allows 64),
	 * and `vmgpu cap/priority/weight` find a guest's slot by it: cut to 63, two guests would share one */
	memcpy(g->name, guest, strnlen(guest, sizeof g->name));
	atomic_store(&g->weight, clamp(share->weight, 1, 100));
	atomic_store(&g->cap, clamp(share->cap, 0, 100));
	atomic_store(&g->guarantee, clamp(share->guarantee, 0, 100));
	atomic_store(&g->priority, share->priority == VMGPU_SCHED_PRIO_HIGH || share->priority == VMGPU_SCHED_PRIO_LOW
					   ? (uint32_t)share->priority
					   : VMGPU_SCHED_PRIO_NORMAL);
	g->vtime = floor == UINT64_MAX ? 0 : floor; /* no credit for time not spent here */
	g->period_start = now;
	g->joined_ns = now;
}

/* Under the lock: of the waiting, eligible guests of the highest priority among them, the one
 * furthest behind in virtual time, or -1; on a tie, not the one that had the last turn.  A guest
 * back from idle first starts level with the others: time it left unused is not owed to it; nor is
 * the time its cap held it back. */
static int pick(struct vmgpu_sched_page *pg, uint64_t now, int prev)
{
	uint64_t floor = UINT64_MAX;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (atomic_load(&g->pid) && !atomic_load(&g->rejoin) && (atomic_load(&g->waiters) || i == prev) &&
		    !spent_for_period(pg, g, now) && g->vtime < floor)
			floor = g->vtime;
	}
	int best = -1;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		uint32_t pid = atomic_load(&g->pid);
		if (!pid)
			continue;
		if (atomic_exchange(&g->rejoin, 0) && floor != UINT64_MAX && g->vtime < floor)
			g->vtime = floor;
		if (!atomic_load(&g->waiters))
			continue;
		if (!sched_alive(pid)) {
			atomic_store(&g->pid, 0);
			continue;
		}
		if (!eligible(pg, g, now)) { /* held back by its cap: owed nothing for the time it lost */
			if (floor != UINT64_MAX && g->vtime < floor)
				g->vtime = floor;
			continue;
		}
		if (best < 0 || sched_rank(g) > sched_rank(&pg->slot[best]))
			best = i;
		else if (sched_rank(g) == sched_rank(&pg->slot[best]) &&
			 (g->vtime < pg->slot[best].vtime || (g->vtime == pg->slot[best].vtime && best == prev)))
			best = i;
	}
	return best;
}

/* Under the lock: the GPU time of the member in slot i (sched_abi.h, "Reading a guest's GPU time")
 * is about to change: its time_seq odd until time_written (i out of range: nobody's, nothing). */
static void time_writing(struct vmgpu_sched_page *pg, int i)
{
	if (i < 0 || i >= VMGPU_SCHED_SLOTS)
		return;
	VMGPU_ATOMIC(uint32_t) *seq = &pg->slot[i].time_seq;
	atomic_store_explicit(seq, atomic_load_explicit(seq, memory_order_relaxed) + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release); /* odd before any of the changes it marks */
}

static void time_written(struct vmgpu_sched_page *pg, int i)
{
	if (i < 0 || i >= VMGPU_SCHED_SLOTS)
		return;
	VMGPU_ATOMIC(uint32_t) *seq = &pg->slot[i].time_seq;
	atomic_store_explicit(seq, atomic_load_explicit(seq, memory_order_relaxed) + 1, memory_order_release);
}

/* Under the lock: the page's hold_start (read without the lock by readers of GPU time and by the
 * holder's scheduler threads: one whole store). */
static void set_hold_start(struct vmgpu_sched_page *pg, uint64_t t)
{
	__atomic_store_n(&pg->hold_start, t, __ATOMIC_RELAXED);
}

int sched_give_turn(struct vmgpu_sched_page *pg, uint64_t now)
{
	int prev = atomic_load(&pg->owner), next = pick(pg, now, prev);
	time_writing(pg, prev);
	if (next != prev)
		time_writing(pg, next);
	/* the turn's start before the owner (a release): a look without time_seq that sees the
	 * new owner sees its start, and does not give it the last holder's stretch */
	set_hold_start(pg, now);
	pg->turn_start = now;
	atomic_store(&pg->owner, next);
	if (next != prev)
		time_written(pg, next);
	time_written(pg, prev);
	if (next >= 0) {
		atomic_fetch_add(&pg->slot[next].turns, 1);
		pg->slot[next].last_active = now;
	}
	return next;
}

void sched_charge(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	int me = (int)(g - pg->slot);
	uint64_t held = now - pg->hold_start;
	time_writing(pg, me);
	/* the charge point first, then the charge (a release): a look without time_seq that sees the
	 * charge sees the point moved, and never counts the stretch twice (one between them counts
	 * it not at all) */
	set_hold_start(pg, now);
	atomic_fetch_add(&g->used_ns, held);
	time_written(pg, me);
	g->vtime += sched_vcost(pg, g, held);
	if (counted_budget(pg, g, now) != NO_BUDGET) {
		g->period_used += held;
	} else { /* no debt from uncounted time when a budget comes in later (but for a turn under way) */
		g->period_used = 0;
		g->period_start = now;
	}
	g->last_active = now;
}

/* The holder yields at the end of a slice only to one behind what it would be, charged for its
 * turn so far: a holder between two calls is not waiting, but it is not done either.  A waiter of
 * a lower priority than the holder's counts only when mine is UINT64_MAX (any). */
int sched_others_wait(struct vmgpu_sched_page *pg, int me, uint64_t now, uint64_t mine)
{
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i == me || !atomic_load(&g->pid) || !atomic_load(&g->waiters) || spent_for_period(pg, g, now))
			continue;
		if (mine == UINT64_MAX || sched_rank(g) > sched_rank(&pg->slot[me]))
			return 1;
		if (sched_rank(g) == sched_rank(&pg->slot[me]) && (atomic_load(&g->rejoin) || g->vtime < mine))
			return 1;
	}
	return 0;
}

int sched_only_lower_wait(struct vmgpu_sched_page *pg, int me, uint64_t now)
{
	int lower = 0;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i == me || !atomic_load(&g->pid) || !atomic_load(&g->waiters) || spent_for_period(pg, g, now))
			continue;
		if (sched_rank(g) >= sched_rank(&pg->slot[me]))
			return 0;
		lower = 1;
	}
	return lower;
}

uint64_t sched_held_ns(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now, int alone)
{
	uint32_t hold = atomic_load(&g->hold);
	uint64_t period = period_ns(pg);
	if (alone) {
		uint32_t by_cap = 1000 - cap_part_pm(pg, g, now);
		hold = hold < by_cap ? hold : by_cap;
	}
	if (atomic_load(&pg->policy) != VMGPU_SCHED_SHARED || !hold)
		return 0;
	if (!period)
		period = (uint64_t)SCHED_DEFAULT_PERIOD_US * 1000;
	if (hold >= 1000)
		return period - now % period; /* held throughout: look again at the next period */
	uint64_t into = now % period, closed = period * hold / 1000;
	return into < closed ? closed - into : 0;
}

uint32_t sched_span_now(struct vmgpu_sched_page *pg, uint32_t span, uint64_t now)
{
	uint32_t groups = atomic_load(&pg->sm_groups), lo16 = span >> 16, hi16 = span & 0xffff;
	if (!span || !groups || groups > 255)
		return 0;
	uint64_t period = period_ns(pg);
	if (!period)
		period = (uint64_t)SCHED_DEFAULT_PERIOD_US * 1000;
	uint32_t phase16 = (uint32_t)(now % period * 16 / period); /* 0..15 */
	uint32_t lo = lo16 / 16 + (phase16 < lo16 % 16), hi = hi16 / 16 + (phase16 < hi16 % 16);
	if (hi > groups)
		hi = groups;
	if (lo >= hi || (lo == 0 && hi == groups))
		return 0;
	return lo << 8 | hi;
}

int sched_higher_member(struct vmgpu_sched_page *pg, int me)
{
	uint32_t policy = atomic_load(&pg->policy);
	if (policy == VMGPU_SCHED_NATIVE || policy == VMGPU_SCHED_SHARED)
		return 0;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++)
		if (i != me && atomic_load(&pg->slot[i].pid) && sched_rank(&pg->slot[i]) > sched_rank(&pg->slot[me]))
			return 1;
	return 0;
}

int sched_higher_waits(struct vmgpu_sched_page *pg, int me, uint64_t now)
{
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i != me && atomic_load(&g->pid) && atomic_load(&g->waiters) && sched_rank(g) > sched_rank(&pg->slot[me]) &&
		    !spent_for_period(pg, g, now))
			return 1;
	}
	return 0;
}

int sched_turn_over(struct vmgpu_sched_page *pg, int me, uint64_t now, int idle)
{
	struct vmgpu_sched_slot *g = &pg->slot[me];
	uint32_t policy = atomic_load(&pg->policy);
	uint64_t held = now - pg->hold_start;
	/* (its slice counts from its turn's start: a turn charged as it went is no younger) */
	int expired = now - pg->turn_start >= (uint64_t)atomic_load(&pg->slice_us) * 1000 &&
		      sched_others_wait(pg, me, now, g->vtime + sched_vcost(pg, g, held));
	uint64_t b = counted_budget(pg, g, now);
	int spent = b != NO_BUDGET && g->period_used + held >= b;
	/* an idle holder alone on the GPU keeps its turn (a hand-over drains the GPU, and its next
	 * call would wait for that: a pipeline bubble for nothing), unless a budget counts its turns */
	int idle_over = idle && (b != NO_BUDGET || sched_others_wait(pg, me, now, UINT64_MAX));
	/* a higher-priority guest waits: the turn ends now, its slice not awaited */
	int preempted = policy != VMGPU_SCHED_NATIVE && sched_higher_waits(pg, me, now);
	return idle_over || expired || spent || preempted || policy == VMGPU_SCHED_NATIVE;
}

int sched_turn_uncounted(struct vmgpu_sched_page *pg, int me, uint64_t now)
{
	struct vmgpu_sched_slot *g = &pg->slot[me];
	return capped(pg, g) && counted_budget(pg, g, now) == NO_BUDGET;
}

void sched_rest(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t last_work, uint64_t now)
{
	/* (never back: another worker of the guest may have charged past now) */
	int later = now > pg->hold_start;
	if (last_work > pg->hold_start)
		sched_charge(pg, g, last_work < now ? last_work : now);
	if (later) {
		/* the idle stretch since its last work passed over: its time is nobody's */
		int me = (int)(g - pg->slot);
		time_writing(pg, me);
		set_hold_start(pg, now);
		time_written(pg, me);
		pg->turn_start = now;
	}
}

void sched_charge_turn(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	if (now > pg->hold_start) /* (never back, as in sched_rest) */
		sched_charge(pg, g, now);
}

void sched_wait_begin(struct vmgpu_sched_page *pg, int me, uint64_t now)
{
	struct vmgpu_sched_slot *g = &pg->slot[me];
	/* the holder waiting while it drains is not back from idle, however long its turn was */
	if (atomic_fetch_add(&g->waiters, 1) == 0 && atomic_load(&pg->owner) != me && now - g->last_active > SCHED_RECENT_NS)
		atomic_store(&g->rejoin, 1);
}

void sched_wait_end(struct vmgpu_sched_slot *g)
{
	atomic_fetch_sub(&g->waiters, 1);
}
