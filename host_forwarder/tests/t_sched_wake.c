/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute scheduler's page (native/sched_page.c) wakes whom it must, at once, and nobody
 * else: a guest of a higher priority that begins to wait wakes the holder's scheduler threads
 * (vh_sched_nap), whose next tick ends the holder's turn, drains it and hands the GPU over in
 * that one tick; a wake that comes while a scheduler thread ticks is not missed; a guest of a
 * lower priority that begins to wait wakes nobody, and a holder that only such guests wait for
 * gives the GPU up after 0.5 ms idle; and waiters that their caps all hold back,
 * with nobody holding the GPU, do not wake one another (and every scheduler thread on the GPU)
 * for as long as their caps hold them; and a worker's work is held to its depth from its first
 * call (vh_sched_worker_begins), not from its scheduler thread's first tick.  Real threads and
 * clocks on a page in a private directory of its own.  Exit 0 and "t_sched_wake: ok" when every check holds.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "page_test.h"
#include "sched_policy.h"
#include "vh_sched.h"


static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&t, NULL);
}

static void lock(struct vmgpu_sched_page *pg)
{
	CHECK_EQ(pthread_mutex_lock((pthread_mutex_t *)(void *)pg->mu_space), 0);
}

static void unlock(struct vmgpu_sched_page *pg)
{
	pthread_mutex_unlock((pthread_mutex_t *)(void *)pg->mu_space);
}

/* A worker's serving thread: one work call through the gate. */
struct caller {
	struct vh_sched *s;
	pthread_t t;
	_Atomic int passed;
};

static void *call(void *arg)
{
	struct caller *c = arg;
	vh_sched_enter(c->s);
	vh_sched_exit(c->s);
	atomic_store(&c->passed, 1);
	return NULL;
}

static void start(struct caller *c, struct vh_sched *s)
{
	c->s = s;
	atomic_store(&c->passed, 0);
	CHECK_EQ(pthread_create(&c->t, NULL, call, c), 0);
}

static void wait_waiting(struct vmgpu_sched_page *pg, struct vh_sched *s)
{
	for (int i = 0; i < 5000 && !atomic_load(&pg->slot[s->me].waiters); i++)
		sleep_ms(1);
	CHECK(atomic_load(&pg->slot[s->me].waiters) > 0);
}

/* A worker's scheduler thread, asleep between ticks for up to 2 s: how long it slept. */
struct napper {
	struct vh_sched *s;
	pthread_t t;
	uint64_t slept;
};

static void *nap(void *arg)
{
	struct napper *n = arg;
	uint64_t t0 = now_ns();
	vh_sched_nap(n->s, vh_sched_look(n->s), 2000000000ull);
	n->slept = now_ns() - t0;
	return NULL;
}

static int drains;
static void drain(void *ctx, int dev)
{
	(void)ctx;
	(void)dev;
	drains++;
}

static void a_higher_guest_that_begins_to_wait_wakes_the_holder_which_hands_over_in_one_tick(
	struct vmgpu_sched_page *pg, struct vh_sched *low, struct vh_sched *high)
{
	lock(pg);
	atomic_store(&pg->owner, low->me);
	pg->hold_start = now_ns();
	unlock(pg);
	/* the holder's scheduler thread, asleep for up to 2 s, is woken by it */
	struct napper n = {.s = low};
	CHECK_EQ(pthread_create(&n.t, NULL, nap, &n), 0);
	sleep_ms(20);
	struct caller hi;
	start(&hi, high);
	pthread_join(n.t, NULL);
	CHECK(n.slept < 1000000000ull);
	wait_waiting(pg, high);
	/* its next tick ends the turn, drains this worker and completes the hand-over at once */
	drains = 0;
	vh_sched_tick(low, drain, NULL);
	CHECK_EQ(drains, 1);
	CHECK_EQ(atomic_load(&pg->owner), high->me);
	CHECK_EQ(atomic_load(&pg->slot[low->me].draining), 0);
	pthread_join(hi.t, NULL);
	CHECK(atomic_load(&hi.passed));
	/* a wake that came while the scheduler thread ticked, between its look and its sleep, is
	 * not missed: it does not sleep */
	uint32_t looked = vh_sched_look(low);
	atomic_fetch_add(&pg->gen, 1); /* (as a wake does) */
	uint64_t t0 = now_ns();
	vh_sched_nap(low, looked, 2000000000ull);
	CHECK(now_ns() - t0 < 1000000000ull);
	/* a tick after it: no second hand-over, no second drain */
	vh_sched_tick(low, drain, NULL);
	CHECK_EQ(drains, 1);
}

static void a_lower_guest_that_begins_to_wait_wakes_nobody(struct vmgpu_sched_page *pg, struct vh_sched *low,
							   struct vh_sched *high)
{
	CHECK_EQ(atomic_load(&pg->owner), high->me); /* the high guest holds the GPU, between calls */
	lock(pg);
	pg->hold_start = now_ns();
	unlock(pg);
	uint32_t gen = atomic_load(&pg->gen);
	struct caller lo;
	start(&lo, low);
	wait_waiting(pg, low);
	sleep_ms(20);
	CHECK_EQ(atomic_load(&pg->gen), gen);
	CHECK(!atomic_load(&lo.passed));
	/* the high guest gives the GPU up (idle), and the low one has it */
	lock(pg);
	atomic_store(&pg->owner, -1);
	unlock(pg);
	pthread_join(lo.t, NULL);
	CHECK(atomic_load(&lo.passed));
}

static void a_holder_that_only_lower_guests_wait_for_gives_the_gpu_up_after_half_a_millisecond_idle(
	struct vmgpu_sched_page *pg, struct vh_sched *low, struct vh_sched *high)
{
	lock(pg);
	atomic_store(&pg->owner, high->me);
	pg->hold_start = now_ns();
	unlock(pg);
	struct caller lo;
	start(&lo, low);
	wait_waiting(pg, low);
	vh_sched_tick(high, drain, NULL); /* its calls so far seen: not idle yet */
	CHECK_EQ(atomic_load(&pg->owner), high->me);
	high->seen_at = now_ns() - 1000000; /* its last work 1 ms ago (a guest of its own priority
					       * waiting would wait for 2) */
	vh_sched_tick(high, drain, NULL);
	CHECK_EQ(atomic_load(&pg->owner), low->me);
	pthread_join(lo.t, NULL);
	CHECK(atomic_load(&lo.passed));
}

static void waiters_their_caps_hold_back_do_not_wake_one_another(struct vmgpu_sched_page *pg, struct vh_sched *a,
								 struct vh_sched *b)
{
	/* both capped and spent for the period under way; nobody holds the GPU */
	lock(pg);
	uint64_t now = now_ns();
	for (int i = 0; i < 2; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i ? b->me : a->me];
		atomic_store(&g->cap, 10);
		g->period_start = now;
		g->period_used = 1000000000ull;
	}
	atomic_store(&pg->period_us, 10000000u); /* 10 s: the caps hold them all through */
	atomic_store(&pg->owner, -1);
	unlock(pg);
	struct caller ca, cb;
	start(&ca, a);
	start(&cb, b);
	wait_waiting(pg, a);
	wait_waiting(pg, b);
	sleep_ms(10);
	uint32_t gen = atomic_load(&pg->gen);
	sleep_ms(100);
	uint32_t woken = atomic_load(&pg->gen) - gen;
	/* (before: they handed the GPU to nobody and woke each other, thousands of times a second) */
	CHECK(woken < 5);
	CHECK(!atomic_load(&ca.passed) && !atomic_load(&cb.passed));
	CHECK_EQ(atomic_load(&pg->owner), -1);
	/* the caps lifted: both pass, taking turns */
	lock(pg);
	for (int i = 0; i < 2; i++)
		atomic_store(&pg->slot[i ? b->me : a->me].cap, 0);
	unlock(pg);
	for (int i = 0; i < 5000 && !(atomic_load(&ca.passed) && atomic_load(&cb.passed)); i++) {
		vh_sched_tick(a, drain, NULL);
		vh_sched_tick(b, drain, NULL);
		sleep_ms(1);
	}
	pthread_join(ca.t, NULL);
	pthread_join(cb.t, NULL);
	CHECK(atomic_load(&ca.passed) && atomic_load(&cb.passed));
}

/* A worker held to a depth (a guest of a higher priority on the page, or the shared policy) is
 * held from its first call: its scheduler thread's first tick may come late on a loaded host, and
 * the calls served before it went through unmarked (a guest churning streams was let through at
 * 2.4 times its depth's rate in one run of ten on the simulated GPU). */
static void a_worker_is_held_to_its_depth_before_its_first_tick(struct vmgpu_sched_page *pg, struct vh_sched *low,
								 struct vh_sched *high)
{
	atomic_store(&low->bounded, 0);
	atomic_store(&high->bounded, 0);
	vh_sched_worker_begins(low);
	vh_sched_worker_begins(high);
	CHECK(atomic_load(&low->bounded));   /* weighted, a higher guest on the page: the lower one held */
	CHECK(!atomic_load(&high->bounded)); /* weighted: the highest guest is not held */
	uint32_t policy = atomic_load(&pg->policy);
	atomic_store(&pg->policy, VMGPU_SCHED_SHARED);
	vh_sched_worker_begins(high);
	CHECK(atomic_load(&high->bounded)); /* shared: every guest held from the start */
	atomic_store(&pg->policy, policy);
}

int main(void)
{
	char dir[] = "/tmp/t_sched_wake.XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	struct sched_share lo_share = {.weight = 50, .priority = VMGPU_SCHED_PRIO_LOW};
	struct sched_share hi_share = {.weight = 50, .priority = VMGPU_SCHED_PRIO_HIGH};
	struct vh_sched low, high;
	CHECK_EQ(vh_sched_join(&low, dir, PAGE_TEST_UUID, "low", &lo_share, 0), 0);
	CHECK_EQ(vh_sched_join(&high, dir, PAGE_TEST_UUID, "high", &hi_share, 0), 0);
	vh_sched_worker(&low, 1);
	vh_sched_worker(&high, 1);
	struct vmgpu_sched_page *pg = low.pg;

	a_worker_is_held_to_its_depth_before_its_first_tick(pg, &low, &high);
	a_higher_guest_that_begins_to_wait_wakes_the_holder_which_hands_over_in_one_tick(pg, &low, &high);
	a_lower_guest_that_begins_to_wait_wakes_nobody(pg, &low, &high);
	a_holder_that_only_lower_guests_wait_for_gives_the_gpu_up_after_half_a_millisecond_idle(pg, &low, &high);
	atomic_store(&high.pg->slot[high.me].priority, VMGPU_SCHED_PRIO_LOW); /* two of one priority */
	waiters_their_caps_hold_back_do_not_wake_one_another(pg, &low, &high);

	vh_sched_worker(&high, 0);
	vh_sched_worker(&low, 0);
	vh_sched_leave(&high);
	vh_sched_leave(&low);
	page_test_remove(dir);
	puts("t_sched_wake: ok");
	return 0;
}
