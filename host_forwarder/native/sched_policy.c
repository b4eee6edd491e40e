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

static int capped(uint32_t policy)
{
	return policy == VMGPU_SCHED_EQUAL || policy == VMGPU_SCHED_FIXED;
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

uint64_t sched_budget_ns(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g)
{
	uint64_t period = period_ns(pg);
	if (atomic_load(&pg->policy) == VMGPU_SCHED_EQUAL) {
		int n = nmembers(pg);
		return period / (uint64_t)(n ? n : 1);
	}
	uint32_t w = atomic_load(&g->weight);
	return period * (w > 100 ? 100 : w) / 100;
}

/* Start a new period for g if its last one is over; unspent budget is not kept, an overrun
 * (a kernel that ran past the turn) is paid from the next period, at most one budget. */
static void roll(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	if (now - g->period_start < period_ns(pg))
		return;
	uint64_t b = sched_budget_ns(pg, g), over = g->period_used > b ? g->period_used - b : 0;
	g->period_used = over < b ? over : b;
	g->period_start = now;
}

/* Has g spent its budget for the period under way?  (Read only: a period over is not spent.) */
static int spent_for_period(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	return capped(atomic_load(&pg->policy)) && now - g->period_start < period_ns(pg) &&
	       g->period_used >= sched_budget_ns(pg, g);
}

/* Under the lock: may g have a turn now?  Starts its new period if the last one is over. */
static int eligible(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	if (capped(atomic_load(&pg->policy)))
		roll(pg, g, now);
	return !spent_for_period(pg, g, now);
}

uint64_t sched_vcost(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t held)
{
	uint32_t policy = atomic_load(&pg->policy), w = atomic_load(&g->weight);
	if (policy != VMGPU_SCHED_WEIGHTED && policy != VMGPU_SCHED_FIXED)
		w = 100;
	return held * 100 / (w ? w : 1);
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

void sched_seat(struct vmgpu_sched_slot *g, const char *guest, int weight, uint64_t now, uint64_t floor)
{
	memset((char *)g + sizeof g->pid, 0, sizeof *g - sizeof g->pid);
	snprintf(g->name, sizeof g->name, "%s", guest);
	atomic_store(&g->weight, (uint32_t)(weight < 1 ? 1 : weight > 100 ? 100 : weight));
	g->vtime = floor == UINT64_MAX ? 0 : floor; /* no credit for time not spent here */
	g->period_start = now;
	g->joined_ns = now;
}

/* Under the lock: the waiting, eligible guest furthest behind in virtual time, or -1; on a
 * tie, not the one that had the last turn.  A guest back from idle first starts level with
 * the others: time it left unused is not owed to it. */
static int pick(struct vmgpu_sched_page *pg, uint64_t now, int prev)
{
	uint64_t floor = UINT64_MAX;
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (atomic_load(&g->pid) && !atomic_load(&g->rejoin) && (atomic_load(&g->waiters) || i == prev) &&
		    g->vtime < floor)
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
		if (!eligible(pg, g, now))
			continue;
		if (best < 0 || g->vtime < pg->slot[best].vtime || (g->vtime == pg->slot[best].vtime && best == prev))
			best = i;
	}
	return best;
}

int sched_give_turn(struct vmgpu_sched_page *pg, uint64_t now)
{
	int next = pick(pg, now, atomic_load(&pg->owner));
	atomic_store(&pg->owner, next);
	pg->hold_start = now;
	if (next >= 0) {
		atomic_fetch_add(&pg->slot[next].turns, 1);
		pg->slot[next].last_active = now;
	}
	return next;
}

void sched_charge(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t now)
{
	uint64_t held = now - pg->hold_start;
	atomic_fetch_add(&g->used_ns, held);
	g->vtime += sched_vcost(pg, g, held);
	if (capped(atomic_load(&pg->policy))) {
		g->period_used += held;
	} else { /* no debt from uncapped time when a cap comes in later */
		g->period_used = 0;
		g->period_start = now;
	}
	g->last_active = now;
}

/* The holder yields at the end of a slice only to one behind what it would be, charged for its
 * turn so far: a holder between two calls is not waiting, but it is not done either. */
int sched_others_wait(struct vmgpu_sched_page *pg, int me, uint64_t now, uint64_t mine)
{
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i == me || !atomic_load(&g->pid) || !atomic_load(&g->waiters) || spent_for_period(pg, g, now))
			continue;
		if (atomic_load(&g->rejoin) || g->vtime < mine)
			return 1;
	}
	return 0;
}

int sched_turn_over(struct vmgpu_sched_page *pg, int me, uint64_t now, int idle)
{
	struct vmgpu_sched_slot *g = &pg->slot[me];
	uint32_t policy = atomic_load(&pg->policy);
	uint64_t held = now - pg->hold_start;
	int expired = held >= (uint64_t)atomic_load(&pg->slice_us) * 1000 &&
		      sched_others_wait(pg, me, now, g->vtime + sched_vcost(pg, g, held));
	int spent = capped(policy) && g->period_used + held >= sched_budget_ns(pg, g);
	/* an idle holder alone on the GPU keeps its turn (a hand-over drains the GPU, and its next
	 * call would wait for that: a pipeline bubble for nothing), unless a cap counts its turns */
	int idle_over = idle && (capped(policy) || sched_others_wait(pg, me, now, UINT64_MAX));
	return idle_over || expired || spent || policy == VMGPU_SCHED_NATIVE;
}

void sched_rest(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint64_t last_work, uint64_t now)
{
	if (last_work > pg->hold_start)
		sched_charge(pg, g, last_work < now ? last_work : now);
	pg->hold_start = now;
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
