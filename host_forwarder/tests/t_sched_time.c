/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A guest's GPU time read from the scheduler's page without its lock, while the forwarders charge
 * it, never steps back and never counts a stretch twice: a writer thread charges a busy guest
 * alone as it goes (sched_charge_turn, sched_rest) and then hands the GPU to and fro between two
 * (sched_charge, sched_give_turn), as fast as it can, while a reader thread takes looks the way
 * vmgpu/sched.py Page.gpu_time does (native/shm_transport/include/vmgpu/sched_abi.h, "Reading a
 * guest's GPU time": time_seq).  Their sum must be at most the time since the first turn began,
 * and each guest's time at least what the last look had, less at most the longest the writer
 * took from reading its clock to finishing a change (the change's time stamp: a look just before
 * it carries the holder's turn up to the reader's clock).  Before the slots' time_seq, a look
 * between a charge's two stores (used_ns added, hold_start not yet moved) or a hand-over's (the
 * owner named, its turn's start not yet stored) counted the stretch twice and the next look was
 * smaller by that stretch: vmgpud's GPU time counter stepped back.  Each turn or charged stretch
 * here is tens of microseconds (the writer sleeps between changes), each change well under one.
 * Real threads and clocks on a page in memory.
 * Exit 0 and "t_sched_time: ok" when every check holds.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "sched_policy.h"
#include "vh_sched.h"

#define RUN_NS 400000000ull /* each way of charging, this long */
#define MIN_LOOKS 1000      /* looks each way at least, or the checks are empty */

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

struct run {
	struct vmgpu_sched_page *pg;
	int a, b;
	int handing_over; /* 0: a alone, charged as it goes; 1: a and b, turn about */
	uint64_t first;   /* when the first turn began: no more GPU time than since then */
	_Atomic int done;
	uint64_t worst_change; /* the writer's: the longest from its clock read to its change made */
	/* the reader's findings */
	unsigned long looks, retaken, stepped_back, over;
	uint64_t worst_back, worst_over;
};

/* The writer: a forwarder's charges and hand-overs, each under the page's lock as the forwarders
 * make them (sched_page.c: vh_sched_tick, end_turn), for RUN_NS. */
static void *write_times(void *arg)
{
	struct run *r = arg;
	struct vmgpu_sched_page *pg = r->pg;
	pthread_mutex_t *mu = (pthread_mutex_t *)(void *)pg->mu_space;
	uint64_t end = r->first + RUN_NS;
	for (unsigned long n = 0;; n++) {
		struct timespec gap = {0, 20000}; /* a stretch of some length to count twice */
		nanosleep(&gap, NULL);
		uint64_t now = now_ns();
		if (now >= end)
			break;
		pthread_mutex_lock(mu);
		int owner = atomic_load(&pg->owner);
		CHECK(owner == r->a || owner == r->b);
		if (r->handing_over) {
			sched_charge(pg, &pg->slot[owner], now); /* end_turn: charged, then handed over */
			sched_give_turn(pg, now);
		} else if (n % 2) {
			sched_charge_turn(pg, &pg->slot[owner], now); /* busy, charged as it goes */
		} else {
			sched_rest(pg, &pg->slot[owner], now, now); /* resting with its last work now: */
		}                                                   /* nothing of its time passed over */
		pthread_mutex_unlock(mu);
		uint64_t took = now_ns() - now;
		if (took > r->worst_change)
			r->worst_change = took;
	}
	atomic_store(&r->done, 1);
	return NULL;
}

/* One look at slots a's and b's GPU time, without the lock, as vmgpu/sched.py takes it: the clock,
 * their time_seq (again while one is odd), the owner, their used_ns, the charge point, their
 * time_seq again (again if one moved).  How many looks it took again. */
static unsigned look(struct vmgpu_sched_page *pg, const int slots[2], uint64_t out[2])
{
	for (unsigned again = 0;; again++) {
		CHECK(again < 100000000u); /* a writer finishes its change in microseconds */
		uint64_t now = now_ns();
		uint32_t seq[2];
		for (int k = 0; k < 2; k++)
			seq[k] = atomic_load_explicit(&pg->slot[slots[k]].time_seq, memory_order_acquire);
		if ((seq[0] | seq[1]) & 1)
			continue;
		int32_t owner = atomic_load_explicit(&pg->owner, memory_order_acquire);
		uint64_t used[2];
		for (int k = 0; k < 2; k++)
			used[k] = atomic_load_explicit(&pg->slot[slots[k]].used_ns, memory_order_acquire);
		uint64_t start = __atomic_load_n(&pg->hold_start, __ATOMIC_RELAXED);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&pg->slot[slots[0]].time_seq, memory_order_relaxed) != seq[0] ||
		    atomic_load_explicit(&pg->slot[slots[1]].time_seq, memory_order_relaxed) != seq[1])
			continue;
		for (int k = 0; k < 2; k++)
			out[k] = used[k] + (owner == slots[k] && now > start ? now - start : 0);
		return again;
	}
}

static void *read_times(void *arg)
{
	struct run *r = arg;
	const int slots[2] = {r->a, r->b};
	uint64_t last[2] = {0, 0};
	while (!atomic_load(&r->done)) {
		uint64_t t[2];
		r->retaken += look(r->pg, slots, t) > 0;
		uint64_t since = now_ns() - r->first;
		for (int k = 0; k < 2; k++) {
			if (t[k] < last[k]) {
				r->stepped_back++;
				if (last[k] - t[k] > r->worst_back)
					r->worst_back = last[k] - t[k];
			}
			last[k] = t[k];
		}
		if (t[0] + t[1] > since) {
			r->over++;
			if (t[0] + t[1] - since > r->worst_over)
				r->worst_over = t[0] + t[1] - since;
		}
		r->looks++;
	}
	return NULL;
}

static int failed;

static void one_way(struct vmgpu_sched_page *pg, int a, int b, int handing_over, const char *what)
{
	/* a fresh start: nothing charged, a (and under hand-overs b) waiting, a given the GPU */
	for (int i = 0; i < 2; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i ? b : a];
		atomic_store(&g->used_ns, 0);
		g->vtime = 0;
		atomic_store(&g->waiters, i == 0 || handing_over ? 1u : 0u);
	}
	atomic_store(&pg->owner, -1);
	struct run r = {.pg = pg, .a = a, .b = b, .handing_over = handing_over, .first = now_ns()};
	CHECK_EQ(sched_give_turn(pg, r.first), a);
	pthread_t w, rd;
	CHECK_EQ(pthread_create(&rd, NULL, read_times, &r), 0);
	CHECK_EQ(pthread_create(&w, NULL, write_times, &r), 0);
	pthread_join(w, NULL);
	pthread_join(rd, NULL);
	printf("%s: %lu looks (%lu taken again), %lu stepped back (at most %llu ns; a change took the "
	       "writer %llu ns at most), %lu over the time since the first turn (at most %llu ns)\n",
	       what, r.looks, r.retaken, r.stepped_back, (unsigned long long)r.worst_back,
	       (unsigned long long)r.worst_change, r.over, (unsigned long long)r.worst_over);
	if (r.looks < MIN_LOOKS || r.over || r.worst_back > r.worst_change) {
		printf("FAIL: %s: a guest's GPU time as read without the lock %s\n", what,
		       r.looks < MIN_LOOKS ? "was hardly read"
		       : r.over            ? "counted a stretch twice"
					   : "stepped back further than a change's time stamp explains");
		failed = 1;
	}
}

static struct vmgpu_sched_page page __attribute__((aligned(4096)));

int main(void)
{
	struct vmgpu_sched_page *pg = &page;
	pthread_mutex_init((pthread_mutex_t *)(void *)pg->mu_space, NULL);
	atomic_store(&pg->policy, VMGPU_SCHED_WEIGHTED);
	atomic_store(&pg->slice_us, SCHED_DEFAULT_SLICE_US);
	atomic_store(&pg->period_us, SCHED_DEFAULT_PERIOD_US);
	atomic_store(&pg->owner, -1);
	struct sched_share share = {.weight = 50, .priority = VMGPU_SCHED_PRIO_NORMAL};
	int a = 3, b = 7; /* (not the first slots: a slot's index is its own) */
	sched_seat(&pg->slot[a], "a", &share, now_ns(), UINT64_MAX);
	sched_seat(&pg->slot[b], "b", &share, now_ns(), UINT64_MAX);
	atomic_store(&pg->slot[a].pid, (uint32_t)getpid()); /* (alive: pick gives it turns) */
	atomic_store(&pg->slot[b].pid, (uint32_t)getpid());

	one_way(pg, a, b, 0, "a busy guest alone, charged as it goes");
	one_way(pg, a, b, 1, "two guests, the GPU handed over turn about");
	CHECK_EQ(atomic_load(&pg->slot[a].time_seq) % 2, 0);
	CHECK_EQ(atomic_load(&pg->slot[b].time_seq) % 2, 0);
	if (failed)
		return 1;
	printf("t_sched_time: ok\n");
	return 0;
}
