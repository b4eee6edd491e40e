/* SPDX-License-Identifier: Apache-2.0 */
/* The compute scheduler shared by the forwarders of one GPU: see vh_sched.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "region_file.h"
#include "vh_sched.h"

_Static_assert(sizeof(struct vs_slot) == 256, "slot layout");
_Static_assert(offsetof(struct vs_page, slot) == 128, "page layout");
_Static_assert(offsetof(struct vs_page, hold_start) == 40, "page layout");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex space");
_Static_assert(offsetof(struct vs_slot, vtime) == 80, "slot layout");

#define IDLE_NS 2000000ull            /* no work for this long: give the GPU up */
#define DEFAULT_SLICE_US 10000u
#define DEFAULT_PERIOD_US 100000u

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static pthread_mutex_t *mu(struct vs_page *pg)
{
	return (pthread_mutex_t *)(void *)pg->mu_space;
}

static void lock(struct vs_page *pg)
{
	if (pthread_mutex_lock(mu(pg)) == EOWNERDEAD) /* a forwarder died holding it: state is whole */
		pthread_mutex_consistent(mu(pg));
}

static void unlock(struct vs_page *pg)
{
	pthread_mutex_unlock(mu(pg));
}

static void wake(struct vs_page *pg)
{
	atomic_fetch_add(&pg->gen, 1);
	syscall(SYS_futex, &pg->gen, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Is the forwarder with this pid still there?  A zombie (dead, not yet reaped by vmgpud) is not. */
static int alive(uint32_t pid)
{
	if (!pid || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 1;
	buf[n] = '\0';
	const char *end = strrchr(buf, ')'); /* "pid (comm) S ..." */
	return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

static int capped(uint32_t policy)
{
	return policy == VS_EQUAL || policy == VS_FIXED;
}

static int nmembers(struct vs_page *pg)
{
	int n = 0;
	for (int i = 0; i < VS_SLOTS; i++)
		n += atomic_load(&pg->slot[i].pid) != 0;
	return n;
}

static uint64_t period_ns(struct vs_page *pg)
{
	return (uint64_t)atomic_load(&pg->period_us) * 1000;
}

/* Held-time budget per period of a slot under a capping policy. */
static uint64_t budget_ns(struct vs_page *pg, struct vs_slot *g)
{
	uint64_t period = period_ns(pg);
	if (atomic_load(&pg->policy) == VS_EQUAL) {
		int n = nmembers(pg);
		return period / (uint64_t)(n ? n : 1);
	}
	uint32_t w = atomic_load(&g->weight);
	return period * (w > 100 ? 100 : w) / 100;
}

/* Start a new period for g if its last one is over; unspent budget is not kept, an overrun
 * (a kernel that ran past the turn) is paid from the next period. */
static void roll(struct vs_page *pg, struct vs_slot *g, uint64_t now)
{
	if (now - g->period_start < period_ns(pg))
		return;
	/* an overrun (a kernel that ran past the turn) is paid from the next period, at most one budget */
	uint64_t b = budget_ns(pg, g), over = g->period_used > b ? g->period_used - b : 0;
	g->period_used = over < b ? over : b;
	g->period_start = now;
}

/* Has g spent its budget for the period under way?  (Read only: a period over is not spent.) */
static int spent_for_period(struct vs_page *pg, struct vs_slot *g, uint64_t now)
{
	return capped(atomic_load(&pg->policy)) && now - g->period_start < period_ns(pg) &&
	       g->period_used >= budget_ns(pg, g);
}

/* Under the lock: may g have a turn now?  Starts its new period if the last one is over. */
static int eligible(struct vs_page *pg, struct vs_slot *g, uint64_t now)
{
	if (capped(atomic_load(&pg->policy)))
		roll(pg, g, now);
	return !spent_for_period(pg, g, now);
}

/* Virtual time a turn of `held` ns costs g: its held time per weight (equal weights under
 * the policies that do not weigh). */
static uint64_t vcost(struct vs_page *pg, struct vs_slot *g, uint64_t held)
{
	uint32_t policy = atomic_load(&pg->policy), w = atomic_load(&g->weight);
	if (policy != VS_WEIGHTED && policy != VS_FIXED)
		w = 100;
	return held * 100 / (w ? w : 1);
}

#define RECENT_NS 50000000ull /* a guest with no turn and no wish for one this long was idle */

/* Under the lock: the waiting, eligible guest furthest behind in virtual time, or -1; on a
 * tie, not the one that had the last turn.  A guest back from idle first starts level with
 * the others: time it left unused is not owed to it. */
static int pick(struct vs_page *pg, uint64_t now, int prev)
{
	uint64_t floor = UINT64_MAX;
	for (int i = 0; i < VS_SLOTS; i++) {
		struct vs_slot *g = &pg->slot[i];
		if (atomic_load(&g->pid) && !atomic_load(&g->rejoin) && (atomic_load(&g->waiters) || i == prev) &&
		    g->vtime < floor)
			floor = g->vtime;
	}
	int best = -1;
	for (int i = 0; i < VS_SLOTS; i++) {
		struct vs_slot *g = &pg->slot[i];
		uint32_t pid = atomic_load(&g->pid);
		if (!pid)
			continue;
		if (atomic_exchange(&g->rejoin, 0) && floor != UINT64_MAX && g->vtime < floor)
			g->vtime = floor;
		if (!atomic_load(&g->waiters))
			continue;
		if (!alive(pid)) {
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

/* Under the lock: give the GPU to whoever should have it now. */
static void hand_over(struct vs_page *pg, uint64_t now)
{
	int next = pick(pg, now, atomic_load(&pg->owner));
	atomic_store(&pg->owner, next);
	pg->hold_start = now;
	if (next >= 0) {
		atomic_fetch_add(&pg->slot[next].turns, 1);
		pg->slot[next].last_active = now;
	}
	wake(pg);
}

/* Under the lock: charge the holder for its turn. */
static void charge(struct vs_page *pg, struct vs_slot *g, uint64_t now)
{
	uint64_t held = now - pg->hold_start;
	atomic_fetch_add(&g->used_ns, held);
	g->vtime += vcost(pg, g, held);
	if (capped(atomic_load(&pg->policy))) {
		g->period_used += held;
	} else { /* no debt from uncapped time when a cap comes in later */
		g->period_used = 0;
		g->period_start = now;
	}
	g->last_active = now;
}

static struct vs_page *map_page(const char *dir, const char *uuid)
{
	/* in a directory only root can change, made by us: no one else can plant or swap a page */
	char name[128];
	snprintf(name, sizeof name, "vmgpu-sched-%s", uuid);
	int dfd = vh_private_dir(dir);
	if (dfd < 0)
		return NULL;
	int fd = vh_private_file(dfd, dir, name);
	close(dfd);
	if (fd < 0)
		return NULL;
	flock(fd, LOCK_EX);
	struct stat st;
	int fresh = fstat(fd, &st) == 0 && st.st_size == 0;
	if (fresh && ftruncate(fd, sizeof(struct vs_page)) != 0) {
		close(fd);
		return NULL;
	}
	struct vs_page *pg = NULL;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct vs_page))
		pg = mmap(NULL, sizeof *pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pg == MAP_FAILED)
		pg = NULL;
	if (pg && fresh) {
		pthread_mutexattr_t a;
		pthread_mutexattr_init(&a);
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
		pthread_mutex_init(mu(pg), &a);
		pthread_mutexattr_destroy(&a);
		pg->version = VS_VERSION;
		pg->nslots = VS_SLOTS;
		atomic_store(&pg->policy, VS_WEIGHTED);
		atomic_store(&pg->slice_us, DEFAULT_SLICE_US);
		atomic_store(&pg->period_us, DEFAULT_PERIOD_US);
		atomic_store(&pg->owner, -1);
		__atomic_store_n(&pg->magic, VS_MAGIC, __ATOMIC_RELEASE);
	}
	if (pg && (pg->magic != VS_MAGIC || pg->version != VS_VERSION)) {
		munmap(pg, sizeof *pg);
		pg = NULL;
	}
	flock(fd, LOCK_UN);
	close(fd);
	return pg;
}

int vh_sched_join(struct vh_sched *s, const char *dir, const char *uuid, const char *guest, int weight, int dev)
{
	memset(s, 0, sizeof *s);
	s->me = -1;
	s->dev = dev;
	s->pg = map_page(dir, uuid);
	if (!s->pg)
		return -1;
	struct vs_page *pg = s->pg;
	uint64_t now = now_ns();
	lock(pg);
	uint64_t min_vtime = UINT64_MAX;
	for (int i = 0; i < VS_SLOTS; i++) {
		uint32_t pid = atomic_load(&pg->slot[i].pid);
		if (pid && !alive(pid))
			atomic_store(&pg->slot[i].pid, 0);
		else if (pid && pg->slot[i].vtime < min_vtime)
			min_vtime = pg->slot[i].vtime;
	}
	if (atomic_load(&pg->owner) >= 0 && !atomic_load(&pg->slot[atomic_load(&pg->owner)].pid))
		hand_over(pg, now);
	for (int i = 0; i < VS_SLOTS && s->me < 0; i++) {
		struct vs_slot *g = &pg->slot[i];
		if (atomic_load(&g->pid))
			continue;
		memset((char *)g + sizeof g->pid, 0, sizeof *g - sizeof g->pid);
		snprintf(g->name, sizeof g->name, "%s", guest);
		atomic_store(&g->weight, (uint32_t)(weight < 1 ? 1 : weight > 100 ? 100 : weight));
		g->vtime = min_vtime == UINT64_MAX ? 0 : min_vtime; /* no credit for time not spent here */
		g->period_start = now;
		g->joined_ns = now;
		atomic_store(&g->pid, (uint32_t)getpid());
		s->me = i;
	}
	unlock(pg);
	if (s->me < 0) {
		munmap(pg, sizeof *pg);
		s->pg = NULL;
		return -1;
	}
	return 0;
}

void vh_sched_leave(struct vh_sched *s)
{
	if (!s->pg)
		return;
	struct vs_page *pg = s->pg;
	lock(pg);
	atomic_store(&pg->slot[s->me].pid, 0);
	if (atomic_load(&pg->owner) == s->me)
		hand_over(pg, now_ns());
	unlock(pg);
	munmap(pg, sizeof *pg);
	s->pg = NULL;
}

void vh_sched_worker(struct vh_sched *s, int start)
{
	if (s->pg) {
		struct vs_slot *g = &s->pg->slot[s->me];
		if (start > 0) {
			atomic_fetch_add(&g->nworkers, 1);
			/* a hand-over under way waits for this worker too: it drains (nothing) at once */
			s->synced_gen = atomic_load(&g->drain_gen) - (atomic_load(&g->draining) ? 1u : 0u);
		} else {
			/* a worker that has already counted itself drained in the hand-over under way takes
			 * that back, or the hand-over would not wait for the others (a supervisor counting
			 * a dead worker out cannot know, and a hand-over may then end a little early) */
			if (start == 0 && atomic_load(&g->draining) && s->synced_gen == atomic_load(&g->drain_gen))
				atomic_fetch_sub(&g->drained, 1);
			atomic_fetch_sub(&g->nworkers, 1);
		}
	}
}

/* The guest's turn ends: charged, and the GPU handed to whoever should have it.  Called by
 * the one that moved draining from `from` to 3 (completing); draining is 0 again after. */
static void end_turn(struct vs_page *pg, struct vs_slot *g, uint32_t from)
{
	if (!atomic_compare_exchange_strong(&g->draining, &from, 3u))
		return;
	lock(pg);
	if (atomic_load(&pg->owner) == (int32_t)(g - pg->slot)) {
		uint64_t end = now_ns();
		charge(pg, g, end);
		hand_over(pg, end);
	}
	unlock(pg);
	atomic_store(&g->draining, 0);
}

/* Complete the hand-over under way (draining 1) once every worker has drained; whoever gets
 * here first does it: a worker's scheduler thread or, for workers that are gone, the
 * supervisor. */
static void complete(struct vs_page *pg, struct vs_slot *g)
{
	if (atomic_load(&g->drained) >= atomic_load(&g->nworkers))
		end_turn(pg, g, 1);
}

void vh_sched_unheld(struct vh_sched *s)
{
	struct vs_page *pg = s->pg;
	if (!pg || atomic_load(&pg->owner) != s->me)
		return;
	struct vs_slot *g = &pg->slot[s->me];
	if (atomic_load(&g->draining) == 1)
		complete(pg, g); /* the workers that would have completed it are gone */
	else if (atomic_load(&g->nworkers) == 0)
		end_turn(pg, g, 0); /* holding the GPU with no worker to use it or give it up */
}

void vh_sched_enter(struct vh_sched *s)
{
	struct vs_page *pg = s->pg;
	if (!pg)
		return;
	struct vs_slot *g = &pg->slot[s->me];
	int waiting = 0;
	for (;;) {
		if (atomic_load(&pg->policy) == VS_NATIVE || (atomic_load(&pg->owner) == s->me && !atomic_load(&g->draining))) {
			/* the fast path touches only this worker's own counters: the scheduler thread
			 * publishes them to the page (vh_sched_tick) */
			atomic_fetch_add(&s->inflight, 1);
			if (!atomic_load(&g->draining)) {
				atomic_store_explicit(&s->calls, atomic_load_explicit(&s->calls, memory_order_relaxed) + 1,
						      memory_order_relaxed);
				break;
			}
			atomic_fetch_sub(&s->inflight, 1);
		}
		if (!waiting) {
			waiting = 1;
			if (atomic_fetch_add(&g->waiters, 1) == 0 && now_ns() - g->last_active > RECENT_NS)
				atomic_store(&g->rejoin, 1);
		}
		if (atomic_load(&pg->owner) < 0) {
			lock(pg);
			if (atomic_load(&pg->owner) < 0)
				hand_over(pg, now_ns());
			unlock(pg);
		}
		uint32_t gen = atomic_load(&pg->gen);
		if (atomic_load(&pg->owner) == s->me && !atomic_load(&g->draining))
			continue;
		struct timespec t = {0, 1000000}; /* re-check: a dead holder, a rolled period */
		syscall(SYS_futex, &pg->gen, FUTEX_WAIT, gen, &t, NULL, 0);
	}
	if (waiting)
		atomic_fetch_sub(&g->waiters, 1);
}

void vh_sched_exit(struct vh_sched *s)
{
	if (s->pg) {
		atomic_fetch_sub(&s->inflight, 1);
	}
}

/* Does another member wait for the GPU that may have it now and is behind virtual time
 * `mine` (UINT64_MAX: any)?  The holder yields at the end of a slice only to one behind what
 * it would be, charged for its turn so far: a holder between two calls is not waiting, but
 * it is not done either. */
static int others_wait(struct vh_sched *s, uint64_t now, uint64_t mine)
{
	struct vs_page *pg = s->pg;
	for (int i = 0; i < VS_SLOTS; i++) {
		struct vs_slot *g = &pg->slot[i];
		if (i == s->me || !atomic_load(&g->pid) || !atomic_load(&g->waiters) || spent_for_period(pg, g, now))
			continue;
		if (atomic_load(&g->rejoin) || g->vtime < mine)
			return 1;
	}
	return 0;
}

void vh_sched_tick(struct vh_sched *s, void (*drain)(void *ctx, int dev), void *ctx)
{
	struct vs_page *pg = s->pg;
	if (!pg)
		return;
	uint64_t now = now_ns();
	int owner = atomic_load(&pg->owner);
	struct vs_slot *g = &pg->slot[s->me];
	/* this worker's work calls, for the guest's idle test */
	uint64_t mine = atomic_load_explicit(&s->calls, memory_order_relaxed);
	if (mine != s->published) {
		atomic_fetch_add_explicit(&g->work_calls, mine - s->published, memory_order_relaxed);
		s->published = mine;
	}
	if (owner != s->me) {
		/* a holder that died, or nobody holding while guests wait (a period rolled) */
		if (owner >= 0 && !alive(atomic_load(&pg->slot[owner].pid))) {
			lock(pg);
			if (atomic_load(&pg->owner) == owner) {
				atomic_store(&pg->slot[owner].pid, 0);
				hand_over(pg, now);
			}
			unlock(pg);
		} else if (owner < 0 && others_wait(s, now, UINT64_MAX)) {
			lock(pg);
			if (atomic_load(&pg->owner) < 0)
				hand_over(pg, now);
			unlock(pg);
		}
		return;
	}
	if (atomic_load(&g->draining)) {
		/* a hand-over is under way: finish this worker's part, then (its starter) complete it */
		uint32_t gen = atomic_load(&g->drain_gen);
		if (s->synced_gen != gen) {
			while (atomic_load(&s->inflight))
				sched_yield();
			drain(ctx, s->dev);
			s->synced_gen = gen;
			atomic_fetch_add(&g->drained, 1);
		}
		/* every worker counts itself drained only with nothing of its own past the gate */
		complete(pg, g);
		return;
	}
	uint32_t policy = atomic_load(&pg->policy);
	uint64_t held = now - pg->hold_start;
	uint64_t calls = atomic_load_explicit(&g->work_calls, memory_order_relaxed);
	if (calls != s->seen_calls || atomic_load(&s->inflight)) {
		s->seen_calls = calls;
		s->seen_at = now;
	}
	/* idle: no worker of the guest has passed the gate for a while (a call that another worker
	 * still has in flight is waited for by the drain) */
	int idle = atomic_load(&s->inflight) == 0 && !atomic_load(&g->waiters) && now - s->seen_at > IDLE_NS;
	int expired = held >= (uint64_t)atomic_load(&pg->slice_us) * 1000 &&
		      others_wait(s, now, g->vtime + vcost(pg, g, held));
	int spent = capped(policy) && g->period_used + held >= budget_ns(pg, g);
	if (!(idle || expired || spent || policy == VS_NATIVE))
		return;
	uint32_t zero = 0;
	if (!atomic_compare_exchange_strong(&g->draining, &zero, 2u)) /* 2: starting */
		return;
	atomic_store(&g->drained, 0);
	atomic_fetch_add(&g->drain_gen, 1);
	atomic_store(&g->draining, 1);
}
