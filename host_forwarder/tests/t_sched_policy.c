/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute scheduler's arithmetic (native/sched_policy.c) on a fake clock: who gets the next
 * turn, what a turn costs, caps per period, an idle guest's time and a returning guest.  Each
 * case runs guests on a page in this process's memory for seconds of fake time, in steps of the
 * workers' tick, doing what sched_page.c does at each step (a guest with work waits for the GPU;
 * the holder's turn ends when sched_turn_over says so, is charged and handed over), and checks
 * each guest's held time exactly: no sleeping, no timing, the same result every run.
 * Exit 0 and "t_sched_policy: ok" when every check holds.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sched_policy.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define TICK (100 * 1000ull) /* a worker's scheduler thread runs every few hundred microseconds */

static int failures;

static void check(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s: ", ok ? "ok  " : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures += !ok;
}

/* A GPU's page and its guests, on a fake clock. */
struct sim {
	struct vmgpu_sched_page pg;
	uint64_t now;
	int n;
	int busy[8];    /* the guest has work to put on the GPU */
	int waiting[8]; /* its serving thread waits at the gate (sched_wait_begin) */
	uint64_t held[8]; /* the time it held the GPU, tick by tick */
	uint64_t work[8]; /* the time it held the GPU with work */
};

static void sim_init(struct sim *s, uint32_t policy)
{
	memset(s, 0, sizeof *s);
	s->pg.magic = VMGPU_SCHED_MAGIC;
	s->pg.version = VMGPU_SCHED_VERSION;
	s->pg.nslots = VMGPU_SCHED_SLOTS;
	atomic_store(&s->pg.policy, policy);
	atomic_store(&s->pg.slice_us, SCHED_DEFAULT_SLICE_US);
	atomic_store(&s->pg.period_us, SCHED_DEFAULT_PERIOD_US);
	atomic_store(&s->pg.owner, -1);
	s->now = 1000 * SEC;
}

/* A guest joins as vh_sched_join seats it; its pid is this process (alive). */
static int sim_join(struct sim *s, const char *name, int weight, int busy)
{
	int i = s->n++;
	uint64_t floor = sched_vtime_floor(&s->pg);
	struct sched_share share = {.weight = weight, .priority = VMGPU_SCHED_PRIO_NORMAL};
	sched_seat(&s->pg.slot[i], name, &share, s->now, floor);
	atomic_store(&s->pg.slot[i].pid, (uint32_t)getpid());
	s->busy[i] = busy;
	return i;
}

/* The usual pair: a (slot 0) busy, b (slot 1) busy or not, under policy. */
enum { A = 0, B = 1 };
static void sim_pair(struct sim *s, uint32_t policy, int weight_a, int weight_b, int b_busy)
{
	sim_init(s, policy);
	sim_join(s, "a", weight_a, 1);
	sim_join(s, "b", weight_b, b_busy);
}

/* One tick: guests with work wait at the gate; the holder's turn ends when the policy says so
 * (charged, handed over); with nobody holding, a waiter takes the GPU; the one given it passes. */
static void sim_step(struct sim *s)
{
	struct vmgpu_sched_page *pg = &s->pg;
	int owner = atomic_load(&pg->owner);
	for (int i = 0; i < s->n; i++) {
		if (s->busy[i] && !s->waiting[i] && i != owner) {
			sched_wait_begin(pg, i, s->now);
			s->waiting[i] = 1;
		} else if (!s->busy[i] && s->waiting[i]) {
			sched_wait_end(&pg->slot[i]);
			s->waiting[i] = 0;
		}
	}
	if (owner >= 0 && sched_turn_over(pg, owner, s->now, !s->busy[owner])) {
		if (s->busy[owner]) { /* its next call waits while it drains */
			sched_wait_begin(pg, owner, s->now);
			s->waiting[owner] = 1;
		}
		sched_charge(pg, &pg->slot[owner], s->now);
		owner = sched_give_turn(pg, s->now);
	} else if (owner < 0) {
		for (int i = 0; i < s->n; i++)
			if (s->waiting[i]) {
				owner = sched_give_turn(pg, s->now);
				break;
			}
	}
	if (owner >= 0 && s->waiting[owner]) {
		sched_wait_end(&pg->slot[owner]);
		s->waiting[owner] = 0;
	}
	if (owner >= 0) {
		s->held[owner] += TICK;
		s->work[owner] += s->busy[owner] ? TICK : 0;
	}
	s->now += TICK;
}

/* Run for ns of fake time; each guest's held time in that time, in ‰ of it.  What the page
 * charged each guest (used_ns) is checked against the time it held the GPU at every turn's end. */
static void sim_run(struct sim *s, uint64_t ns, unsigned permille[8])
{
	uint64_t before[8], end = s->now + ns;
	for (int i = 0; i < s->n; i++)
		before[i] = s->held[i];
	while (s->now < end)
		sim_step(s);
	int owner = atomic_load(&s->pg.owner);
	for (int i = 0; i < s->n; i++) {
		permille[i] = (unsigned)((s->held[i] - before[i]) * 1000 / ns);
		uint64_t charged = atomic_load(&s->pg.slot[i].used_ns) + (i == owner ? s->now - s->pg.hold_start : 0);
		if (charged != s->held[i])
			check(0, "%s was charged %llu ns for %llu ns held", s->pg.slot[i].name,
			      (unsigned long long)charged, (unsigned long long)s->held[i]);
	}
}

static int near(unsigned got, unsigned want, unsigned tolerance)
{
	return got + tolerance >= want && got <= want + tolerance;
}

static void weights_share_the_gpu_and_change_live(void)
{
	struct sim s;
	unsigned p[8];
	sim_pair(&s, VMGPU_SCHED_WEIGHTED, 30, 70, 1);
	sim_run(&s, 10 * SEC, p);
	check(near(p[A], 300, 3) && near(p[B], 700, 3), "weighted 30/70, both busy: a %u‰ b %u‰", p[A], p[B]);
	atomic_store(&s.pg.slot[A].weight, 75);
	atomic_store(&s.pg.slot[B].weight, 25);
	sim_run(&s, 5 * SEC, p);
	check(near(p[A], 750, 5) && near(p[B], 250, 5), "weights turned round live to 75/25: a %u‰ b %u‰", p[A], p[B]);
}

static void preemptive_and_equal_do_not_weigh(void)
{
	uint32_t policies[] = {VMGPU_SCHED_PREEMPTIVE, VMGPU_SCHED_EQUAL};
	for (int k = 0; k < 2; k++) {
		struct sim s;
		unsigned p[8];
		sim_pair(&s, policies[k], 30, 70, 1);
		sim_run(&s, 10 * SEC, p);
		check(near(p[A], 500, 3) && near(p[B], 500, 3), "%s, weights 30/70, both busy: a %u‰ b %u‰",
		      k ? "equal" : "preemptive", p[A], p[B]);
	}
}

static void an_idle_guests_time_goes_to_the_busy_one_unless_capped(void)
{
	uint32_t policies[] = {VMGPU_SCHED_WEIGHTED, VMGPU_SCHED_PREEMPTIVE, VMGPU_SCHED_EQUAL};
	unsigned want[] = {1000, 1000, 500};
	const char *names[] = {"weighted", "preemptive", "equal"};
	for (int k = 0; k < 3; k++) {
		struct sim s;
		unsigned p[8];
		sim_pair(&s, policies[k], 30, 70, 0);
		sim_run(&s, 5 * SEC, p);
		check(near(p[A], want[k], 3) && p[B] == 0, "%s, b idle: a (weight 30) holds %u‰, b %u‰", names[k], p[A],
		      p[B]);
	}
}

static void a_guest_back_from_idle_is_owed_nothing(void)
{
	struct sim s;
	unsigned p[8];
	sim_pair(&s, VMGPU_SCHED_WEIGHTED, 30, 70, 1);
	sim_run(&s, 2 * SEC, p);
	s.busy[B] = 0;
	sim_run(&s, 5 * SEC, p);
	check(p[A] >= 995, "b idle 5 s: a holds %u‰", p[A]);
	s.busy[B] = 1;
	sim_run(&s, 1 * SEC, p);
	/* owed the 5 s it left, b would hold the GPU alone for seconds */
	check(near(p[A], 300, 10) && near(p[B], 700, 10), "b back: from the first second a %u‰ b %u‰", p[A], p[B]);
}

static void a_late_joiner_is_owed_nothing(void)
{
	struct sim s;
	unsigned p[8];
	sim_pair(&s, VMGPU_SCHED_WEIGHTED, 30, 70, 1);
	sim_run(&s, 3 * SEC, p);
	int c = sim_join(&s, "c", 50, 1);
	sim_run(&s, 3 * SEC, p);
	check(near(p[A], 200, 5) && near(p[B], 467, 5) && near(p[c], 333, 5),
	      "c joins late at weight 50 and is owed nothing: a %u‰ b %u‰ c %u‰", p[A], p[B], p[c]);
}

static void fixed_caps_even_an_idle_card(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_FIXED);
	int a = sim_join(&s, "a", 30, 1);
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 300, 2), "fixed 30, alone and busy: holds %u‰ of the card", p[a]);
	int b = sim_join(&s, "b", 50, 1);
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 300, 2) && near(p[b], 500, 2), "fixed 30 and 50 together: a %u‰ b %u‰", p[a], p[b]);
	/* equal caps too: 1/N each even with the other idle (an_idle_guests_time_...) */
}

static void an_overrun_is_paid_from_the_next_period(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_FIXED);
	int a = sim_join(&s, "a", 30, 1);
	struct vmgpu_sched_slot *g = &s.pg.slot[a];
	uint64_t budget = sched_budget_ns(&s.pg, g, s.now);
	check(budget == 30 * MS, "fixed 30: budget %llu ms of a 100 ms period", (unsigned long long)(budget / MS));
	/* a kernel runs 45 ms past the start of a turn: charged in full */
	sched_wait_begin(&s.pg, a, s.now);
	check(sched_give_turn(&s.pg, s.now) == a, "the lone waiter gets the turn");
	sched_wait_end(g);
	s.now += 45 * MS;
	check(sched_turn_over(&s.pg, a, s.now, 0), "a turn past its budget is over");
	sched_charge(&s.pg, g, s.now);
	sched_wait_begin(&s.pg, a, s.now);
	check(sched_give_turn(&s.pg, s.now) == -1, "spent for the period: nobody holds the card although a waits");
	s.now += 55 * MS + 1; /* the next period: 15 ms of it already paid */
	check(sched_give_turn(&s.pg, s.now) == a, "the next period gives a its turn");
	sched_wait_end(g);
	check(g->period_used == 15 * MS, "the overrun carried into the next period: %llu ms",
	      (unsigned long long)(g->period_used / MS));
	s.now += 15 * MS;
	check(sched_turn_over(&s.pg, a, s.now, 0), "after 15 ms of it the turn is over");
	/* an overrun of more than a budget is paid with one budget, not more */
	s.now += 200 * MS;
	sched_charge(&s.pg, g, s.now);
	sched_give_turn(&s.pg, s.now);
	sched_wait_begin(&s.pg, a, s.now);
	s.now += 100 * MS + 1;
	check(sched_give_turn(&s.pg, s.now) == -1 && g->period_used == budget,
	      "a huge overrun costs the next period, no more: %llu ms", (unsigned long long)(g->period_used / MS));
}

static void native_ends_every_turn_at_once(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join(&s, "a", 30, 1);
	sched_wait_begin(&s.pg, a, s.now);
	sched_give_turn(&s.pg, s.now);
	sched_wait_end(&s.pg.slot[a]);
	check(!sched_turn_over(&s.pg, a, s.now + TICK, 0), "weighted, alone, busy: the turn goes on");
	atomic_store(&s.pg.policy, VMGPU_SCHED_NATIVE);
	check(sched_turn_over(&s.pg, a, s.now, 0), "native: the turn is over at once (no time is held)");
	check(sched_vcost(&s.pg, &s.pg.slot[a], 10 * MS) == 10 * MS, "native: a turn costs its time, unweighted");
}

static void an_idle_holder_alone_keeps_its_turn_and_is_not_charged_for_it(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join(&s, "a", 30, 1);
	int b = sim_join(&s, "b", 70, 0);
	sched_wait_begin(&s.pg, a, s.now);
	sched_give_turn(&s.pg, s.now);
	sched_wait_end(&s.pg.slot[a]);
	check(!sched_turn_over(&s.pg, a, s.now + 10 * MS, 1), "weighted, alone, idle: the turn goes on (no drain)");
	/* idle from 3 ms into its turn until 10 ms: charged 3 ms, its turn goes on from 10 ms */
	sched_rest(&s.pg, &s.pg.slot[a], s.now + 3 * MS, s.now + 10 * MS);
	check(atomic_load(&s.pg.slot[a].used_ns) == 3 * MS && s.pg.hold_start == s.now + 10 * MS,
	      "rested: charged %llu ns of GPU time for 3 ms of work", (unsigned long long)atomic_load(&s.pg.slot[a].used_ns));
	sched_rest(&s.pg, &s.pg.slot[a], s.now + 3 * MS, s.now + 20 * MS); /* still idle: nothing more */
	check(atomic_load(&s.pg.slot[a].used_ns) == 3 * MS, "rested again while idle: nothing more charged");
	sched_wait_begin(&s.pg, b, s.now + 20 * MS);
	check(sched_turn_over(&s.pg, a, s.now + 20 * MS, 1), "weighted, idle, another waits: the turn is over");
	check(!sched_turn_over(&s.pg, a, s.now + 20 * MS, 0), "busy, within its slice: the turn goes on");
	sched_wait_end(&s.pg.slot[b]);
	atomic_store(&s.pg.policy, VMGPU_SCHED_FIXED);
	check(sched_turn_over(&s.pg, a, s.now + 20 * MS, 1), "fixed (capped), idle, alone: the turn is over");
}

static void ties_go_to_the_other_and_the_dead_are_let_go(void)
{
	struct sim s;
	sim_pair(&s, VMGPU_SCHED_WEIGHTED, 50, 50, 1);
	for (int i = 0; i < 2; i++)
		sched_wait_begin(&s.pg, i, s.now);
	atomic_store(&s.pg.owner, A);
	check(sched_give_turn(&s.pg, s.now) == B, "a tie in virtual time: not the one that had the last turn");
	check(sched_give_turn(&s.pg, s.now) == A, "and back");
	pid_t child = fork();
	if (child == 0)
		_exit(0);
	waitpid(child, NULL, 0);
	int d = sim_join(&s, "dead", 50, 1);
	atomic_store(&s.pg.slot[d].pid, (uint32_t)child);
	s.pg.slot[d].vtime = 0;
	sched_wait_begin(&s.pg, d, s.now);
	int next = sched_give_turn(&s.pg, s.now);
	check(next != d && atomic_load(&s.pg.slot[d].pid) == 0, "a member whose forwarder is gone is let go (got %d)",
	      next);
	check(!sched_alive(0) && sched_alive((uint32_t)getpid()) && !sched_alive((uint32_t)child), "sched_alive");
}

/* A guest joins with a priority, a cap or a guarantee besides its weight. */
static int sim_join_share(struct sim *s, const char *name, struct sched_share share, int busy)
{
	int i = sim_join(s, name, share.weight, busy);
	struct sched_share full = share;
	sched_seat(&s->pg.slot[i], name, &full, s->now, sched_vtime_floor(&s->pg));
	return i;
}

static void a_waiting_higher_priority_guest_takes_the_gpu_at_once(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int lo = sim_join_share(&s, "low", (struct sched_share){.weight = 100, .priority = VMGPU_SCHED_PRIO_LOW}, 1);
	int hi = sim_join_share(&s, "high", (struct sched_share){.weight = 1, .priority = VMGPU_SCHED_PRIO_HIGH}, 0);
	sim_run(&s, 1 * SEC, p);
	check(p[lo] >= 995 && p[hi] == 0, "high idle: low holds %u‰", p[lo]);
	/* low holds the GPU well within its slice; high gets work: low's turn is over at the next tick */
	check(atomic_load(&s.pg.owner) == lo, "low holds the GPU");
	s.busy[hi] = 1;
	sim_step(&s); /* high begins to wait */
	check(atomic_load(&s.pg.owner) == hi, "high waits: low's turn ended in one tick, its slice not awaited");
	sim_run(&s, 2 * SEC, p);
	check(p[hi] >= 995 && p[lo] <= 5, "both busy: high (weight 1) holds %u‰, low (weight 100) %u‰", p[hi], p[lo]);
	s.busy[hi] = 0;
	sim_run(&s, 1 * SEC, p);
	check(p[lo] >= 990, "high idle again: low soaks up the rest, %u‰", p[lo]);
	/* at a hand-over the higher waiter goes first whatever the virtual times say */
	int n = sim_join_share(&s, "normal", (struct sched_share){.weight = 100}, 0);
	s.pg.slot[n].vtime = 0;
	s.pg.slot[hi].vtime = UINT64_MAX / 2;
	sched_wait_begin(&s.pg, n, s.now);
	sched_wait_begin(&s.pg, hi, s.now);
	atomic_store(&s.pg.owner, -1);
	check(sched_give_turn(&s.pg, s.now) == hi, "high and normal wait: high has the next turn though far ahead");
	check(!sched_turn_over(&s.pg, hi, s.now + 20 * MS, 0), "a high holder keeps its turn past its slice beside lower waiters");
	sched_wait_end(&s.pg.slot[n]);
	sched_wait_end(&s.pg.slot[hi]);
}

/* A holder that only lower guests wait for gives the GPU up sooner when idle (sched_page.c). */
static void a_holder_knows_when_only_lower_guests_wait(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int lo = sim_join_share(&s, "low", (struct sched_share){.weight = 50, .priority = VMGPU_SCHED_PRIO_LOW}, 0);
	int nm = sim_join_share(&s, "normal", (struct sched_share){.weight = 50}, 0);
	int nm2 = sim_join_share(&s, "normal2", (struct sched_share){.weight = 50}, 0);
	int hi = sim_join_share(&s, "high", (struct sched_share){.weight = 50, .priority = VMGPU_SCHED_PRIO_HIGH}, 0);
	check(!sched_only_lower_wait(&s.pg, nm, s.now), "nobody waits: not 'only lower'");
	check(sched_higher_member(&s.pg, lo) && sched_higher_member(&s.pg, nm) && !sched_higher_member(&s.pg, hi),
	      "a higher member, waiting or not, is there for low and normal, not for high");
	sched_wait_begin(&s.pg, lo, s.now);
	check(sched_only_lower_wait(&s.pg, nm, s.now) && !sched_only_lower_wait(&s.pg, lo, s.now),
	      "a low guest waits: only lower for the normal holder, not for itself");
	sched_wait_begin(&s.pg, nm2, s.now);
	check(!sched_only_lower_wait(&s.pg, nm, s.now), "a guest of the holder's own priority waits too: not only lower");
	sched_wait_end(&s.pg.slot[nm2]);
	sched_wait_begin(&s.pg, hi, s.now);
	check(!sched_only_lower_wait(&s.pg, nm, s.now) && sched_only_lower_wait(&s.pg, hi, s.now),
	      "a high guest waits: not only lower for the normal holder; for a high holder the low one is");
	sched_wait_end(&s.pg.slot[hi]);
	sched_wait_end(&s.pg.slot[lo]);
}

static void equal_priorities_stay_weighted(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 30, .priority = VMGPU_SCHED_PRIO_HIGH}, 1);
	int b = sim_join_share(&s, "b", (struct sched_share){.weight = 70, .priority = VMGPU_SCHED_PRIO_HIGH}, 1);
	int c = sim_join_share(&s, "c", (struct sched_share){.weight = 100, .priority = VMGPU_SCHED_PRIO_LOW}, 1);
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 300, 3) && near(p[b], 700, 3) && p[c] == 0,
	      "two high at 30/70 beside a busy low: a %u‰ b %u‰ c %u‰", p[a], p[b], p[c]);
}

static void a_cap_holds_one_guest_while_the_others_stay_weighted(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 10}, 1);
	sim_run(&s, 5 * SEC, p);
	check(near(p[a], 100, 2), "cap 10, alone and busy on a weighted card: holds %u‰", p[a]);
	int b = sim_join_share(&s, "b", (struct sched_share){.weight = 30}, 1);
	int c = sim_join_share(&s, "c", (struct sched_share){.weight = 70}, 1);
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 100, 3) && near(p[b], 270, 5) && near(p[c], 630, 5),
	      "cap 10 beside weights 30/70: a %u‰ b %u‰ c %u‰", p[a], p[b], p[c]);
	atomic_store(&s.pg.slot[a].cap, 50); /* live: vmgpu share set */
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 500, 5) && near(p[b], 150, 5) && near(p[c], 350, 5),
	      "cap raised live to 50, weight 100 of 200: a %u‰ b %u‰ c %u‰", p[a], p[b], p[c]);
	atomic_store(&s.pg.slot[a].cap, 0);
	sim_run(&s, 10 * SEC, p);
	check(near(p[a], 500, 5) && near(p[b], 150, 5) && near(p[c], 350, 5),
	      "cap lifted: weights 100/30/70 of 200 (a's weight is worth 50%%): a %u‰ b %u‰ c %u‰", p[a], p[b], p[c]);
}

/* vmgpud's cap controller sets a capped guest's part of each period (cap_pm) so that its progress
 * is its cap's part of its rate alone: that part holds in place of cap% (and of fixed's weight%),
 * under turns and under shared alike; 0 there is cap% again. */
/* The cap controller looking now (the page's caps_ms): the fake clock's ms, never 0. */
static void caps_look(struct sim *s)
{
	atomic_store(&s->pg.caps_ms, (uint32_t)(s->now / 1000000) | 1);
}

static void the_cap_controllers_part_replaces_cap_percent(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 10}, 1);
	atomic_store(&s.pg.slot[a].cap_pm, 73);
	sim_run(&s, 1 * SEC, p);
	check(near(p[a], 100, 2), "the controller's 73 per mille with no look of its on the page: cap 10 holds %u‰", p[a]);
	for (int i = 0; i < 50; i++) { /* looking every 100 ms */
		caps_look(&s);
		sim_run(&s, SEC / 10, p);
	}
	sim_run(&s, 1 * SEC, p); /* (its last look 1 s old: still fresh) */
	check(near(p[a], 73, 2), "cap 10 with the controller's 73 per mille, looking, alone and busy: holds %u‰", p[a]);
	caps_look(&s);
	atomic_store(&s.pg.slot[a].cap_pm, 1000); /* a probe, and then the controller dies: */
	sim_run(&s, 1 * SEC, p);
	check(near(p[a], 1000, 2), "a probe (1000 per mille) in the second after its last look: holds %u‰", p[a]);
	sim_run(&s, 4 * SEC, p);
	check(near(p[a], 100, 2), "the controller gone in a probe (its last look 1 s past and more): cap 10 holds %u‰ again",
	      p[a]);
	caps_look(&s);
	atomic_store(&s.pg.slot[a].cap_pm, 150);
	sim_run(&s, 1500 * MS, p);
	check(near(p[a], 150, 3), "a part below 1000 stands 1.5 s after the last look: cap 10 holds %u‰", p[a]);
	sim_run(&s, 500 * MS, p); /* (the rest of VMGPU_SCHED_CAPS_FRESH_MS) */
	sim_run(&s, 4 * SEC, p);
	check(near(p[a], 100, 2), "the controller gone (its last look 2 s past and more): cap 10 holds %u‰ again", p[a]);
	atomic_store(&s.pg.slot[a].cap_pm, 73);
	for (int i = 0; i < 20; i++) {
		caps_look(&s);
		sim_run(&s, SEC / 10, p);
	}
	sim_run(&s, SEC, p);
	check(near(p[a], 73, 2), "looking again: the controller's 73 per mille holds %u‰", p[a]);
	caps_look(&s);
	atomic_store(&s.pg.slot[a].cap_pm, 0);
	sim_run(&s, 5 * SEC, p);
	check(near(p[a], 100, 2), "the controller's part withdrawn: cap 10 holds %u‰", p[a]);

	/* a part left in the slot of a guest that is not capped (stored for the slot's last guest as
	 * this one was seated) is not taken */
	sim_init(&s, VMGPU_SCHED_EQUAL);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 100}, 1);
	int b = sim_join_share(&s, "b", (struct sched_share){.weight = 100}, 1);
	atomic_store(&s.pg.slot[a].cap_pm, 100);
	caps_look(&s);
	sim_run(&s, 1 * SEC, p);
	check(near(p[a], 500, 3) && near(p[b], 500, 3),
	      "equal, uncapped, a stray part of 100 per mille while the controller looks: a %u‰ b %u‰", p[a], p[b]);
	sim_init(&s, VMGPU_SCHED_FIXED);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 100}, 1);
	atomic_store(&s.pg.slot[a].cap_pm, 100);
	caps_look(&s);
	sim_run(&s, 1 * SEC, p);
	check(near(p[a], 1000, 2), "fixed at weight 100, a stray part of 100 per mille: holds %u‰", p[a]);

	sim_init(&s, VMGPU_SCHED_FIXED);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 40}, 1);
	sim_run(&s, 5 * SEC, p);
	check(near(p[a], 400, 3), "fixed 40 without the controller: holds %u‰", p[a]);
	atomic_store(&s.pg.slot[a].cap_pm, 350);
	caps_look(&s);
	sim_run(&s, 2 * SEC, p);
	check(near(p[a], 350, 3), "fixed 40 with the controller's 350 per mille: holds %u‰", p[a]);
	atomic_store(&s.pg.slot[a].cap_pm, 5000);
	caps_look(&s);
	sim_run(&s, 900 * MS, p); /* (within VMGPU_SCHED_PROBE_FRESH_MS: a whole period is a probe's) */
	check(near(p[a], 1000, 2), "a part past 1000 per mille is the whole period: holds %u‰", p[a]);

	sim_init(&s, VMGPU_SCHED_SHARED);
	struct vmgpu_sched_slot *g = &s.pg.slot[sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 30}, 1)];
	uint64_t period = SCHED_DEFAULT_PERIOD_US * 1000ull, start = 1000 * SEC;
	atomic_store(&s.pg.period_us, SCHED_DEFAULT_PERIOD_US);
	atomic_store(&g->hold, 900);
	check(sched_held_ns(&s.pg, g, start, 1) == period * 7 / 10, "shared, alone, cap 30: the cap's 700");
	atomic_store(&g->cap_pm, 240);
	check(sched_held_ns(&s.pg, g, start, 1) == period * 7 / 10, "shared, the controller's 240 not looking: the cap's 700");
	atomic_store(&s.pg.caps_ms, (uint32_t)(start / 1000000));
	check(sched_held_ns(&s.pg, g, start, 1) == period * 76 / 100, "shared, alone, the controller's 240: held 760");
	atomic_store(&g->cap_pm, 1000);
	check(sched_held_ns(&s.pg, g, start, 1) == 0, "shared, alone, the controller's 1000: not held");
	check(sched_held_ns(&s.pg, g, start + 3 * SEC, 1) == period * 7 / 10, "3 s after its last look: the cap's 700");
}

/* A capped guest whose budget is the whole period (the cap controller's probe, cap_pm 1000; fixed
 * at weight 100; a cap of 100) goes as an uncapped one does: its turn does not end when it is idle
 * alone, nor at a period's end (each a drain of the GPU: an H200's probes so held read a trainer at
 * 92% of its rate alone).  With less than the whole period its turns are counted as before. */
static void a_budget_of_the_whole_period_counts_no_turns(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	atomic_store(&s.pg.period_us, SCHED_DEFAULT_PERIOD_US);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 50}, 1);
	struct vmgpu_sched_slot *g = &s.pg.slot[a];
	sched_wait_begin(&s.pg, a, s.now);
	check(sched_give_turn(&s.pg, s.now) == a, "the lone waiter gets the turn");
	sched_wait_end(g);
	check(sched_turn_over(&s.pg, a, s.now + MS, 1), "cap 50, idle, alone: the turn is over (its budget counts it)");
	caps_look(&s);
	atomic_store(&g->cap_pm, 1000); /* a probe */
	check(!sched_turn_over(&s.pg, a, s.now + MS, 1), "cap 50 in a probe, idle, alone: the turn goes on (no drain)");
	check(!sched_turn_over(&s.pg, a, s.now + 99 * MS, 0), "in a probe, busy 99 ms: the turn goes on");
	sched_charge(&s.pg, g, s.now + 99 * MS);
	s.pg.hold_start = s.now + 99 * MS;
	check(!sched_turn_over(&s.pg, a, s.now + 105 * MS, 0) && g->period_used == 0,
	      "in a probe, past a period's end: the turn goes on, nothing counted against a budget (%llu ns)",
	      (unsigned long long)g->period_used);
	atomic_store(&g->cap_pm, 500); /* the probe over */
	caps_look(&s);
	check(sched_turn_over(&s.pg, a, s.now + 105 * MS, 1), "the probe over, idle: the turn is over again");
	check(!sched_turn_over(&s.pg, a, s.now + 105 * MS, 0) && sched_turn_over(&s.pg, a, s.now + 150 * MS, 0),
	      "the probe over, busy: the turn goes on to its 50 ms budget, then is over");

	sim_init(&s, VMGPU_SCHED_FIXED);
	atomic_store(&s.pg.period_us, SCHED_DEFAULT_PERIOD_US);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 100}, 1);
	sched_wait_begin(&s.pg, a, s.now);
	sched_give_turn(&s.pg, s.now);
	sched_wait_end(&s.pg.slot[a]);
	check(!sched_turn_over(&s.pg, a, s.now + MS, 1), "fixed at weight 100, idle, alone: the turn goes on");
	check(!sched_turn_over(&s.pg, a, s.now + 150 * MS, 0), "fixed at weight 100, busy past a period: the turn goes on");
	atomic_store(&s.pg.slot[a].weight, 99);
	check(sched_turn_over(&s.pg, a, s.now + MS, 1), "fixed at weight 99, idle, alone: the turn is over");

	/* what a trainer showed: work in bursts (5 ms of work, 3 ms without) through a 0.6 s probe
	 * keeps one turn (no drain), and at a part of 500 per mille its turns are counted */
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 50}, 1);
	unsigned turns[2];
	for (int k = 0; k < 2; k++) {
		atomic_store(&s.pg.slot[a].cap_pm, k ? 500 : 1000);
		uint32_t t0 = atomic_load(&s.pg.slot[a].turns);
		for (int i = 0; i < 75; i++) {
			caps_look(&s);
			s.busy[a] = 1;
			sim_run(&s, 5 * MS, p);
			s.busy[a] = 0;
			sim_run(&s, 3 * MS, p);
		}
		turns[k] = atomic_load(&s.pg.slot[a].turns) - t0;
	}
	check(turns[0] <= 1 && turns[1] >= 50, "bursts through a 0.6 s probe: %u turn(s); at a part of 500: %u", turns[0],
	      turns[1]);

	/* a busy guest's 0.6 s probe, charged every slice as sched_page.c's tick does while its
	 * budget is not counted: the probe over, its first period at 500 per mille is its own (not
	 * the whole probe paid from it as an overrun) */
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 50}, 1);
	g = &s.pg.slot[a];
	atomic_store(&g->cap_pm, 1000);
	int uncounted = 1;
	for (int i = 0; i < 600; i++) {
		caps_look(&s);
		sim_run(&s, MS, p);
		if (atomic_load(&s.pg.owner) == a && s.now - s.pg.hold_start >= SCHED_DEFAULT_SLICE_US * 1000ull) {
			uncounted &= sched_turn_uncounted(&s.pg, a, s.now);
			sched_charge_turn(&s.pg, g, s.now);
		}
	}
	check(uncounted, "a probe alone: its turn is charged as it goes");
	atomic_store(&g->cap_pm, 500);
	caps_look(&s);
	check(!sched_turn_uncounted(&s.pg, a, s.now), "the probe over (500 per mille): its budget counted again");
	sim_run(&s, 100 * MS, p);
	check(near(p[a], 500, 20), "the probe over: its next 100 ms holds %u per mille (its part)", p[a]);
	/* a probe again, and another guest comes to work: the probing guest's slice counts from its
	 * turn's start, not from where it was last charged, so the turn is the other's at once */
	int b = sim_join_share(&s, "b", (struct sched_share){.weight = 100}, 0);
	atomic_store(&g->cap_pm, 1000);
	for (int i = 0; i < 50; i++) {
		caps_look(&s);
		sim_run(&s, MS, p);
		if (atomic_load(&s.pg.owner) == a && s.now - s.pg.hold_start >= SCHED_DEFAULT_SLICE_US * 1000ull)
			sched_charge_turn(&s.pg, g, s.now);
	}
	check(atomic_load(&s.pg.owner) == a && s.now - s.pg.turn_start >= 40 * MS && s.now - s.pg.hold_start < 11 * MS,
	      "a probe: one turn for %llu ms, charged up to %llu ms ago", (unsigned long long)((s.now - s.pg.turn_start) / MS),
	      (unsigned long long)((s.now - s.pg.hold_start) / MS));
	s.busy[b] = 1;
	sim_run(&s, 2 * TICK, p);
	check(atomic_load(&s.pg.owner) == b, "b comes to work beside the probing a: the turn is b's at once (owner %d)",
	      atomic_load(&s.pg.owner));
}

static void a_guarantee_is_given_first_and_the_rest_by_weight(void)
{
	struct sim s;
	unsigned p[8];
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .guarantee = 60}, 1);
	int b = sim_join_share(&s, "b", (struct sched_share){.weight = 100}, 1);
	sim_run(&s, 10 * SEC, p);
	/* a: 60 + 40 * 100/200 = 80%; b: 40 * 100/200 = 20% */
	check(near(p[a], 800, 5) && near(p[b], 200, 5), "guarantee 60 + equal weights: a %u‰ b %u‰", p[a], p[b]);
	s.busy[a] = 0;
	sim_run(&s, 2 * SEC, p);
	check(p[b] >= 995, "the guaranteed guest idle: its time goes to b (%u‰)", p[b]);
}

static void the_pages_idle_time_is_how_long_an_idle_holder_keeps_its_turn(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	struct vmgpu_sched_page *pg = &s.pg;
	check(sched_idle_ns(pg, 0) == SCHED_IDLE_NS && sched_idle_ns(pg, 1) == SCHED_IDLE_LOWER_NS,
	      "idle_us 0: the defaults (%llu / %llu ns)", (unsigned long long)sched_idle_ns(pg, 0),
	      (unsigned long long)sched_idle_ns(pg, 1));
	atomic_store(&pg->idle_us, 300);
	check(sched_idle_ns(pg, 0) == 300000 && sched_idle_ns(pg, 1) == 300000,
	      "idle_us 300: 300 us, and no longer when only lower guests wait (%llu / %llu ns)",
	      (unsigned long long)sched_idle_ns(pg, 0), (unsigned long long)sched_idle_ns(pg, 1));
	atomic_store(&pg->idle_us, 5000);
	check(sched_idle_ns(pg, 0) == 5 * MS && sched_idle_ns(pg, 1) == SCHED_IDLE_LOWER_NS,
	      "idle_us 5000: 5 ms, 0.5 ms when only lower guests wait (%llu / %llu ns)",
	      (unsigned long long)sched_idle_ns(pg, 0), (unsigned long long)sched_idle_ns(pg, 1));
	atomic_store(&pg->idle_us, 1);
	check(sched_idle_ns(pg, 0) == SCHED_IDLE_MIN_NS, "idle_us 1: held to 50 us (%llu ns)",
	      (unsigned long long)sched_idle_ns(pg, 0));
	atomic_store(&pg->idle_us, 60000000);
	check(sched_idle_ns(pg, 0) == 10 * MS, "idle_us a minute: held to the 10 ms slice (%llu ns)",
	      (unsigned long long)sched_idle_ns(pg, 0));
	atomic_store(&pg->slice_us, 1000);
	check(sched_idle_ns(pg, 0) == SCHED_IDLE_NS, "a 1 ms slice: at most the default 2 ms (%llu ns)",
	      (unsigned long long)sched_idle_ns(pg, 0));
}

/* A guest capped at 50% that uses 10% of the GPU (1 ms of work every 10 ms) is held to nothing:
 * each piece of work starts at once.  (A capped holder that kept its turn through its gaps,
 * charged for them, spent its budget in the first half of each period, and its work in the second
 * half waited for the next: 50 ms, the p99 of a latency-sensitive guest; helper-9's review.) */
static void a_cap_above_what_a_guest_uses_adds_no_latency(void)
{
	struct sim s;
	sim_init(&s, VMGPU_SCHED_WEIGHTED);
	int a = sim_join_share(&s, "a", (struct sched_share){.weight = 100, .cap = 50}, 0);
	uint64_t pending = 0, since = 0, worst = 0, t0 = s.now, end = s.now + 10 * SEC;
	while (s.now < end) {
		if ((s.now - t0) % (10 * MS) == 0) { /* a piece of work arrives */
			if (!pending)
				since = s.now;
			pending += 1 * MS;
		}
		s.busy[a] = pending > 0;
		uint64_t w = s.work[a], at = s.now;
		sim_step(&s);
		if (s.work[a] != w) { /* it worked this tick */
			if (since && at - since > worst)
				worst = at - since;
			since = 0;
			pending -= TICK;
		}
	}
	check(worst <= 1 * MS, "cap 50, 10%% used: its work waited at most %llu us to start",
	      (unsigned long long)(worst / 1000));
}

/* Under shared no guest has turns: each passes except the first hold per mille of each period,
 * measured on the common clock (so every guest's period begins together), and lifted at once
 * when the hold is.  Other policies never hold this way. */
static void shared_holds_only_the_first_part_of_each_period(void)
{
	struct sim s;
	sim_pair(&s, VMGPU_SCHED_SHARED, 30, 70, 1);
	struct vmgpu_sched_slot *a = &s.pg.slot[A];
	uint64_t period = SCHED_DEFAULT_PERIOD_US * 1000ull, start = 1000 * SEC; /* a period begins at 1000 s */
	check(sched_held_ns(&s.pg, a, start, 0) == 0, "shared, hold 0: passes at once");
	atomic_store(&a->hold, 250);
	uint64_t passes = 0, steps = 0;
	for (uint64_t t = start; t < start + 10 * period; t += TICK, steps++)
		passes += sched_held_ns(&s.pg, a, t, 0) == 0;
	check(passes * 1000 / steps == 750, "hold 250: passes %llu of 1000 looks", (unsigned long long)(passes * 1000 / steps));
	check(sched_held_ns(&s.pg, a, start, 0) == period / 4, "held at a period's start until a quarter in (%llu ns)",
	      (unsigned long long)sched_held_ns(&s.pg, a, start, 0));
	check(sched_held_ns(&s.pg, a, start + period / 4, 0) == 0, "open from a quarter in");
	check(sched_held_ns(&s.pg, &s.pg.slot[B], start, 0) == 0, "the other guest, not held, passes");
	atomic_store(&a->hold, 1000);
	check(sched_held_ns(&s.pg, a, start + period / 2, 0) == period / 2, "hold 1000: held to the period's end");
	atomic_store(&a->hold, 5000);
	check(sched_held_ns(&s.pg, a, start + period - 1, 0) == 1, "a hold past 1000 is 1000");
	atomic_store(&s.pg.period_us, 0);
	atomic_store(&a->hold, 500);
	check(sched_held_ns(&s.pg, a, start, 0) == period / 2, "period 0 on the page: the default period");
	/* alone (no other guest at work): held only as far as its cap holds it */
	check(sched_held_ns(&s.pg, a, start, 1) == 0, "alone without a cap: not held");
	atomic_store(&a->cap, 30);
	check(sched_held_ns(&s.pg, a, start, 1) == period / 2, "alone, hold 500 and cap 30: the hold (less than the cap's 700)");
	atomic_store(&a->hold, 900);
	check(sched_held_ns(&s.pg, a, start, 1) == period * 7 / 10, "alone, hold 900 and cap 30: the cap's 700");
	check(sched_held_ns(&s.pg, a, start, 0) == period * 9 / 10, "beside others at work: the hold, 900");
	atomic_store(&a->cap, 100);
	check(sched_held_ns(&s.pg, a, start, 1) == 0, "alone with a cap of 100: not held");
	atomic_store(&a->cap, 0);
	atomic_store(&a->hold, 500);
	atomic_store(&s.pg.policy, VMGPU_SCHED_WEIGHTED);
	check(sched_held_ns(&s.pg, a, start, 0) == 0, "under weighted a hold means nothing (turns decide)");
	atomic_store(&s.pg.policy, VMGPU_SCHED_SHARED);
	atomic_store(&a->priority, VMGPU_SCHED_PRIO_LOW);
	atomic_store(&s.pg.slot[B].priority, VMGPU_SCHED_PRIO_HIGH);
	check(!sched_higher_member(&s.pg, A), "under shared priority holds no queue (every queue is held: sched_page.c)");
}

static void only_a_high_guests_workers_are_normal_mps_clients(void)
{
	struct sim s;
	sim_pair(&s, VMGPU_SCHED_SHARED, 50, 50, 1);
	struct vmgpu_sched_slot *a = &s.pg.slot[A], *b = &s.pg.slot[B];
	struct vmgpu_sched_slot *one[1] = {a}, *two[3] = {a, NULL, b}, *none[2] = {NULL, NULL};
	int opt[3] = {0, 0, 0}, opt_high[3] = {0, 1, 0}, opt_paged[3] = {1, 0, 1};
	check(!strcmp(sched_mps_client_priority(one, opt, 1), "1"), "a normal guest: below normal");
	atomic_store(&a->priority, VMGPU_SCHED_PRIO_LOW);
	check(!strcmp(sched_mps_client_priority(one, opt, 1), "1"), "a low guest: below normal");
	atomic_store(&a->priority, VMGPU_SCHED_PRIO_HIGH);
	check(!strcmp(sched_mps_client_priority(one, opt, 1), "0"), "a high guest: normal");
	atomic_store(&a->priority, 7);
	check(!strcmp(sched_mps_client_priority(one, opt, 1), "1"), "an unknown priority is normal: below normal");
	atomic_store(&b->priority, VMGPU_SCHED_PRIO_HIGH);
	check(!strcmp(sched_mps_client_priority(two, opt, 3), "0"), "high on one of its GPUs: normal");
	atomic_store(&b->priority, VMGPU_SCHED_PRIO_LOW);
	check(!strcmp(sched_mps_client_priority(two, opt, 3), "1"), "high on none: below normal");
	check(!strcmp(sched_mps_client_priority(none, opt, 2), "1"), "on no page (--no-sched), not --priority high: below normal");
	check(!strcmp(sched_mps_client_priority(none, opt_high, 2), "0"), "on no page, --priority high on one GPU: normal");
	check(!strcmp(sched_mps_client_priority(two, opt_paged, 3), "1"), "a page's priority wins over the option");
}

/* An SM span (partition.h): ends in sixteenths of a group, a fractional one rounded up the first
 * part of each period, so that two neighbours' spans meet and never overlap. */
static void an_sm_span_rounds_its_ends_alike_for_neighbours(void)
{
	struct sim s;
	sim_pair(&s, VMGPU_SCHED_SHARED, 30, 70, 1);
	uint64_t period = SCHED_DEFAULT_PERIOD_US * 1000ull, start = 1000 * SEC;
	check(sched_span_now(&s.pg, 0 << 16 | 80, start) == 0, "no groups on the page: the whole GPU");
	atomic_store(&s.pg.sm_groups, 16);
	check(sched_span_now(&s.pg, 0, start) == 0, "no span: the whole GPU");
	check(sched_span_now(&s.pg, 0 << 16 | 80, start) == (0 << 8 | 5), "[0, 5): groups 0..4");
	check(sched_span_now(&s.pg, 80 << 16 | 256, start) == (5 << 8 | 16), "[5, 16): the rest");
	check(sched_span_now(&s.pg, 0 << 16 | 256, start) == 0, "[0, 16): the whole GPU");
	check(sched_span_now(&s.pg, 80 << 16 | 4000, start) == (5 << 8 | 16), "an end past the groups: at the last");
	check(sched_span_now(&s.pg, 80 << 16 | 80, start) == 0, "empty: the whole GPU");
	check(sched_span_now(&s.pg, 96 << 16 | 80, start) == 0, "backwards: the whole GPU");
	/* 4.5 groups and the rest: 5 the first half of each period, 4 the second; always apart */
	uint32_t a = 0 << 16 | 72, b = 72 << 16 | 256;
	int five = 0, steps = 0, apart = 1;
	for (uint64_t t = start; t < start + 4 * period; t += TICK, steps++) {
		uint32_t sa = sched_span_now(&s.pg, a, t), sb = sched_span_now(&s.pg, b, t);
		five += (sa & 0xff) == 5;
		apart &= (sa & 0xff) == (sb >> 8) && (sb & 0xff) == 16 && sa >> 8 == 0;
	}
	check(apart, "neighbours' spans meet at the same group at every moment");
	check(five * 2 == steps, "4.5 groups: 5 half of the time (%d of %d looks)", five, steps);
	check(sched_span_now(&s.pg, a, start) == 5 && sched_span_now(&s.pg, a, start + period - 1) == 4,
	      "rounded up the first part of the period, down the rest");
}

/* --table: for a guest alone under each policy (by number), each cap and weight (as its slot has
 * them: sched_seat holds a weight to 1..100), the % of each
 * period its cap leaves it and whether its turns are counted (idle alone, its turn is over):
 * tests/native/test_sched_policy.py holds vmgpud's rule (vmgpu/sched.py cap_percent) to it. */
static void table(void)
{
	static const uint32_t caps[] = {0, 1, 10, 99, 100, 150}, weights[] = {0, 30, 100};
	for (uint32_t policy = VMGPU_SCHED_EQUAL; policy <= VMGPU_SCHED_SHARED; policy++)
		for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
			for (size_t w = 0; w < sizeof weights / sizeof *weights; w++) {
				struct sim s;
				sim_init(&s, policy);
				int a = sim_join_share(&s, "a", (struct sched_share){.weight = weights[w], .cap = caps[c]}, 1);
				uint64_t period = SCHED_DEFAULT_PERIOD_US * 1000ull;
				uint64_t pct = sched_budget_ns(&s.pg, &s.pg.slot[a], s.now) * 100 / period;
				sched_wait_begin(&s.pg, a, s.now);
				sched_give_turn(&s.pg, s.now);
				sched_wait_end(&s.pg.slot[a]);
				int counted = sched_turn_over(&s.pg, a, s.now + MS, 1);
				printf("%u %u %u %llu %d\n", policy, atomic_load(&s.pg.slot[a].cap),
				       atomic_load(&s.pg.slot[a].weight), (unsigned long long)pct, counted); /* (as seated) */
			}
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--table")) {
		table();
		return 0;
	}
	weights_share_the_gpu_and_change_live();
	preemptive_and_equal_do_not_weigh();
	an_idle_guests_time_goes_to_the_busy_one_unless_capped();
	a_guest_back_from_idle_is_owed_nothing();
	a_late_joiner_is_owed_nothing();
	fixed_caps_even_an_idle_card();
	an_overrun_is_paid_from_the_next_period();
	native_ends_every_turn_at_once();
	an_idle_holder_alone_keeps_its_turn_and_is_not_charged_for_it();
	ties_go_to_the_other_and_the_dead_are_let_go();
	a_waiting_higher_priority_guest_takes_the_gpu_at_once();
	a_holder_knows_when_only_lower_guests_wait();
	equal_priorities_stay_weighted();
	a_cap_holds_one_guest_while_the_others_stay_weighted();
	the_cap_controllers_part_replaces_cap_percent();
	a_budget_of_the_whole_period_counts_no_turns();
	a_guarantee_is_given_first_and_the_rest_by_weight();
	the_pages_idle_time_is_how_long_an_idle_holder_keeps_its_turn();
	a_cap_above_what_a_guest_uses_adds_no_latency();
	shared_holds_only_the_first_part_of_each_period();
	only_a_high_guests_workers_are_normal_mps_clients();
	an_sm_span_rounds_its_ends_alike_for_neighbours();
	if (failures) {
		printf("t_sched_policy: %d failed\n", failures);
		return 1;
	}
	printf("t_sched_policy: ok\n");
	return 0;
}
