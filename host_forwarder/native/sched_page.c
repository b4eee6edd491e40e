/* SPDX-License-Identifier: Apache-2.0 */
/* The compute scheduler's shared page (see vh_sched.h): mapping and joining it, the lock, the gate
 * a guest's work calls pass, and the hand-over between guests.  Who gets the turn and what it
 * costs is sched_policy.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
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
#include "sched_policy.h"

_Static_assert(sizeof(pthread_mutex_t) <= sizeof(((struct vmgpu_sched_page *)0)->mu_space), "mutex space");

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static pthread_mutex_t *mu(struct vmgpu_sched_page *pg)
{
	return (pthread_mutex_t *)(void *)pg->mu_space;
}

static void lock(struct vmgpu_sched_page *pg)
{
	if (pthread_mutex_lock(mu(pg)) == EOWNERDEAD) {
		/* a forwarder (or a worker) died holding it.  Every change made under the lock leaves
		 * the page whole but two: a turn being ended (draining 3 exists only under the lock).
		 * Its hand-over either happened or not; the turn is not being ended any more, so a
		 * live worker or the supervisor ends it again (vh_sched_tick, vh_sched_unheld).  And a
		 * guest's GPU time being changed (time_seq odd, only under the lock): each of its words
		 * is whole, and at worst a stretch is left uncharged (sched_abi.h); made even, or its
		 * readers would look again for ever. */
		for (uint32_t i = 0; i < VMGPU_SCHED_SLOTS; i++) {
			uint32_t ending = 3;
			atomic_compare_exchange_strong(&pg->slot[i].draining, &ending, 0u);
			if (atomic_load(&pg->slot[i].time_seq) & 1)
				atomic_fetch_add(&pg->slot[i].time_seq, 1);
		}
		pthread_mutex_consistent(mu(pg));
	}
}

static void unlock(struct vmgpu_sched_page *pg)
{
	pthread_mutex_unlock(mu(pg));
}

static void wake(struct vmgpu_sched_page *pg)
{
	atomic_fetch_add(&pg->gen, 1);
	syscall(SYS_futex, &pg->gen, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Under the lock: give the GPU to whoever should have it now, and wake the waiters.  Nobody is
 * woken when it stays with nobody (every waiter held back by its cap): each waiter that looks
 * again would hand it over to nobody again and wake the others, and they it, for as long as the
 * caps hold them, and every scheduler thread on the GPU with them (they sleep on the same word). */
static void hand_over(struct vmgpu_sched_page *pg, uint64_t now)
{
	int32_t before = atomic_load(&pg->owner);
	if (sched_give_turn(pg, now) >= 0 || before >= 0)
		wake(pg);
}

static struct vmgpu_sched_page *map_page(const char *dir, const char *uuid)
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
	if (fresh && ftruncate(fd, sizeof(struct vmgpu_sched_page)) != 0) {
		close(fd);
		return NULL;
	}
	struct vmgpu_sched_page *pg = NULL;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct vmgpu_sched_page))
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
		pg->version = VMGPU_SCHED_VERSION;
		pg->nslots = VMGPU_SCHED_SLOTS;
		atomic_store(&pg->policy, VMGPU_SCHED_WEIGHTED);
		atomic_store(&pg->slice_us, SCHED_DEFAULT_SLICE_US);
		atomic_store(&pg->period_us, SCHED_DEFAULT_PERIOD_US);
		atomic_store(&pg->owner, -1);
		__atomic_store_n(&pg->magic, VMGPU_SCHED_MAGIC, __ATOMIC_RELEASE);
	}
	if (pg && (pg->magic != VMGPU_SCHED_MAGIC || pg->version != VMGPU_SCHED_VERSION)) {
		munmap(pg, sizeof *pg);
		pg = NULL;
	}
	flock(fd, LOCK_UN);
	close(fd);
	return pg;
}

int vh_sched_join(struct vh_sched *s, const char *dir, const char *uuid, const char *guest,
		  const struct sched_share *share, int dev)
{
	memset(s, 0, sizeof *s);
	s->me = -1;
	s->dev = dev;
	s->pg = map_page(dir, uuid);
	if (!s->pg)
		return -1;
	struct vmgpu_sched_page *pg = s->pg;
	uint64_t now = now_ns();
	lock(pg);
	uint64_t floor = sched_vtime_floor(pg); /* and dead members let go */
	int32_t held_by = atomic_load(&pg->owner);
	if (held_by >= VMGPU_SCHED_SLOTS || (held_by >= 0 && !atomic_load(&pg->slot[held_by].pid)))
		hand_over(pg, now); /* a holder that is gone, or an owner no slot has (a page written wrong) */
	for (int i = 0; i < VMGPU_SCHED_SLOTS && s->me < 0; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (atomic_load(&g->pid))
			continue;
		sched_seat(g, guest, share, now, floor);
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
	struct vmgpu_sched_page *pg = s->pg;
	lock(pg);
	atomic_store(&pg->slot[s->me].pid, 0);
	if (atomic_load(&pg->owner) == s->me)
		hand_over(pg, now_ns());
	unlock(pg);
	munmap(pg, sizeof *pg);
	s->pg = NULL;
}

/* Is this worker's work held to a depth (vh_sched.h, bounded)?  Under shared, or beside a guest
 * of a higher priority. */
static int bounded_now(struct vh_sched *s)
{
	return atomic_load(&s->pg->policy) == VMGPU_SCHED_SHARED || sched_higher_member(s->pg, s->me);
}

void vh_sched_worker_begins(struct vh_sched *s)
{
	if (s->pg)
		atomic_store(&s->bounded, bounded_now(s));
}

void vh_sched_worker(struct vh_sched *s, int start)
{
	if (s->pg) {
		struct vmgpu_sched_slot *g = &s->pg->slot[s->me];
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

/* The guest's turn ends: charged, and the GPU handed to whoever should have it, by whoever moves
 * draining from `from` (1: a hand-over whose workers all drained; 0: none under way) to 3; it is
 * 0 again after.  All of it under the page's lock, so that a process that dies in the middle
 * leaves nothing half done that the lock's next holder cannot see (lock()). */
static void end_turn(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g, uint32_t from)
{
	lock(pg);
	if (atomic_compare_exchange_strong(&g->draining, &from, 3u)) {
		if (atomic_load(&pg->owner) == (int32_t)(g - pg->slot)) {
			uint64_t end = now_ns();
			sched_charge(pg, g, end);
			hand_over(pg, end);
		}
		atomic_store(&g->draining, 0);
	}
	unlock(pg);
}

/* Complete the hand-over under way (draining 1) once every worker has drained; whoever gets
 * here first does it: a worker's scheduler thread or, for workers that are gone, the
 * supervisor. */
static void complete(struct vmgpu_sched_page *pg, struct vmgpu_sched_slot *g)
{
	if (atomic_load(&g->drained) >= atomic_load(&g->nworkers))
		end_turn(pg, g, 1);
}

void vh_sched_unheld(struct vh_sched *s)
{
	struct vmgpu_sched_page *pg = s->pg;
	if (!pg)
		return;
	uint64_t now = now_ns();
	if (now - s->swept_at >= 1000000000ull) {
		s->swept_at = now;
		lock(pg);
		(void)sched_vtime_floor(pg); /* members that are gone let go of their slots */
		unlock(pg);
	}
	if (atomic_load(&pg->owner) != s->me)
		return;
	struct vmgpu_sched_slot *g = &pg->slot[s->me];
	if (atomic_load(&g->draining) == 1)
		complete(pg, g); /* the workers that would have completed it are gone */
	else if (atomic_load(&g->nworkers) == 0)
		end_turn(pg, g, 0); /* holding the GPU with no worker to use it or give it up */
}

/* Under shared: whether the call at the gate waits for a guest of a higher priority at work (its
 * work would go where the higher one's is). */
static int yields(struct vh_sched *s)
{
	return atomic_load(&s->yield) || (s->whole_call && atomic_load(&s->higher));
}

/* Through the gate now if the turn allows: 1 (in flight), else 0 (nothing changed).  It touches
 * only this worker's own counters: the scheduler thread publishes them to the page
 * (vh_sched_tick). */
static int pass_now(struct vh_sched *s, struct vmgpu_sched_slot *g)
{
	struct vmgpu_sched_page *pg = s->pg;
	uint32_t policy = atomic_load(&pg->policy);
	if (policy == VMGPU_SCHED_SHARED) { /* no turns: held only the part of the period the controller says, */
		if (yields(s))                 /* and while a guest of a higher priority has work */
			return 0;
		if (atomic_load(&g->hold) && sched_held_ns(pg, g, now_ns(), atomic_load(&s->alone)))
			return 0;
	} else if (policy != VMGPU_SCHED_NATIVE && (atomic_load(&pg->owner) != s->me || atomic_load(&g->draining))) {
		return 0;
	}
	atomic_fetch_add(&s->inflight, 1);
	if (policy != VMGPU_SCHED_SHARED && atomic_load(&g->draining)) {
		atomic_fetch_sub(&s->inflight, 1);
		return 0;
	}
	atomic_store_explicit(&s->calls, atomic_load_explicit(&s->calls, memory_order_relaxed) + 1, memory_order_relaxed);
	return 1;
}

int vh_sched_try_enter(struct vh_sched *s)
{
	return !s->pg || pass_now(s, &s->pg->slot[s->me]);
}

uint64_t vh_sched_enter(struct vh_sched *s)
{
	struct vmgpu_sched_page *pg = s->pg;
	if (!pg)
		return 0;
	struct vmgpu_sched_slot *g = &pg->slot[s->me];
	int waiting = 0;
	uint64_t began = 0;
	for (;;) {
		if (pass_now(s, g))
			break;
		if (!waiting) {
			waiting = 1;
			began = now_ns();
			sched_wait_begin(pg, s->me, began);
			/* the holder's scheduler threads sleep on the page's word: one of a lower priority
			 * is told at once that its turn is over, not at its next look */
			int32_t holder = atomic_load(&pg->owner);
			if (holder >= 0 && holder < VMGPU_SCHED_SLOTS && sched_rank(&pg->slot[holder]) < sched_rank(g))
				wake(pg);
		}
		if (yields(s)) { /* shared, a higher guest at work: look again as the tick does */
			struct timespec t = {0, 250000};
			nanosleep(&t, NULL);
			continue;
		}
		uint64_t held = sched_held_ns(pg, g, now_ns(), atomic_load(&s->alone));
		if (held) { /* shared: until the held part of the period is over, looking again at least
			     * every 2 ms (the controller may lift the hold) */
			struct timespec t = {0, (long)(held < 2000000 ? held : 2000000)};
			nanosleep(&t, NULL);
			continue;
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
	if (!waiting)
		return 0; /* the fast path reads no clock */
	sched_wait_end(g);
	return now_ns() - began;
}

void vh_sched_exit(struct vh_sched *s)
{
	if (s->pg) {
		atomic_fetch_sub(&s->inflight, 1);
	}
}

/* A hand-over is under way: finish this worker's part, then (its last) complete it. */
static void drain_part(struct vh_sched *s, struct vmgpu_sched_slot *g, void (*drain)(void *ctx, int dev), void *ctx)
{
	uint32_t gen = atomic_load(&g->drain_gen);
	if (s->synced_gen != gen) {
		while (atomic_load(&s->inflight))
			sched_yield();
		drain(ctx, s->dev);
		s->synced_gen = gen;
		atomic_fetch_add(&g->drained, 1);
	}
	/* every worker counts itself drained only with nothing of its own past the gate */
	complete(s->pg, g);
}

uint32_t vh_sched_look(struct vh_sched *s)
{
	return s->pg ? atomic_load(&s->pg->gen) : 0;
}

void vh_sched_nap(struct vh_sched *s, uint32_t looked, uint64_t ns)
{
	struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	if (!s->pg)
		nanosleep(&t, NULL);
	else /* (at once if the page was woken since the look) */
		syscall(SYS_futex, &s->pg->gen, FUTEX_WAIT, looked, &t, NULL, 0);
}

/* Under shared: whether a member of a higher priority than this worker's guest put work on the
 * GPU within the last VH_YIELD_QUIET_NS, as its published work_calls show (a high-priority
 * guest's work is never queued behind a lower one's: the lower one's waits in its ring, and
 * what it has on the GPU already is at most its depth).  A member first seen counts as at work. */
static int higher_at_work(struct vh_sched *s, uint64_t now)
{
	struct vmgpu_sched_page *pg = s->pg;
	int mine = sched_rank(&pg->slot[s->me]);
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i == s->me || !atomic_load(&g->pid) || sched_rank(g) <= mine)
			continue;
		uint64_t calls = atomic_load_explicit(&g->work_calls, memory_order_relaxed);
		if (calls != s->higher_seen[i]) {
			s->higher_seen[i] = calls;
			s->higher_at = now;
		}
	}
	return s->higher_at && now - s->higher_at < VH_YIELD_QUIET_NS;
}

/* Under shared: is any other member of this one's priority or above at work?  One with work
 * waiting at its gate is, and so is one a worker of which served a call (however long it took:
 * a synchronisation waiting for slow kernels, a wait at its depth) or passed the gate within the
 * last VH_PEERS_QUIET_MS (its active_ms, which its workers' ticks publish), so that a guest whose
 * work the GPU runs slowly, or which another's work slows, still counts.  A member whose
 * forwarder publishes no active_ms (0) never counts as at work by it. */
static int peers_at_work(struct vh_sched *s, uint64_t now)
{
	struct vmgpu_sched_page *pg = s->pg;
	int mine = sched_rank(&pg->slot[s->me]);
	uint32_t now_ms = (uint32_t)(now / 1000000u);
	for (int i = 0; i < VMGPU_SCHED_SLOTS; i++) {
		struct vmgpu_sched_slot *g = &pg->slot[i];
		if (i == s->me || !atomic_load(&g->pid) || sched_rank(g) < mine)
			continue;
		uint32_t active = atomic_load_explicit(&g->active_ms, memory_order_relaxed);
		/* (signed: a peer's tick may have read the clock a little after this one) */
		if (atomic_load(&g->waiters) || (active && (int32_t)(now_ms - active) < (int32_t)VH_PEERS_QUIET_MS))
			return 1;
	}
	return 0;
}

void vh_sched_tick(struct vh_sched *s, void (*drain)(void *ctx, int dev), void *ctx)
{
	struct vmgpu_sched_page *pg = s->pg;
	if (!pg)
		return;
	uint64_t now = now_ns();
	int owner = atomic_load(&pg->owner);
	struct vmgpu_sched_slot *g = &pg->slot[s->me];
	/* this worker's work calls, for the guest's idle test */
	uint64_t mine = atomic_load_explicit(&s->calls, memory_order_relaxed);
	int passed = mine != s->published;
	if (passed) {
		atomic_fetch_add_explicit(&g->work_calls, mine - s->published, memory_order_relaxed);
		s->published = mine;
	}
	/* a guest of a higher priority on this GPU: this worker's work waits in its ring, not on the
	 * GPU, so that the higher guest waits behind little of it (sched_depth.c).  Beside guests of
	 * its own priority it is not held: a deep queue costs them nothing but a longer drain, which is
	 * charged to it, and held they did worse together; nor under a cap, where a capped trainer
	 * did worse held (make bench-sharing on H100s: README, Compute shares). */
	int shared = atomic_load(&pg->policy) == VMGPU_SCHED_SHARED;
	/* under shared every guest is held to the depth: its calls through the gate are then what the
	 * GPU has done of its work, give or take the depth, which is what the share controller
	 * measures (unheld, a trainer ran ahead at its rate alone while the GPU did half as much) */
	atomic_store(&s->bounded, bounded_now(s));
	int higher = shared && higher_at_work(s, now);
	if (!shared)
		s->higher_at = 0; /* (what it saw before the policy changed is stale when it comes back) */
	int near = shared && s->higher_at && now - s->higher_at < VH_NEAR_HIGHER_NS;
	atomic_store(&s->near_higher, near);
	/* at work off its span (not partitioned, or kept where it was by a capture) */
	uint64_t stuck = atomic_load_explicit(&s->part_stuck, memory_order_relaxed);
	int off_span = atomic_load(&s->part_off) || (stuck && now - stuck < VH_PEERS_QUIET_MS * 1000000ull);
	if (shared && (passed || atomic_load_explicit(&s->in_call, memory_order_relaxed))) {
		uint32_t now_ms = (uint32_t)(now / 1000000u);
		atomic_store_explicit(&g->active_ms, now_ms ? now_ms : 1, memory_order_relaxed);
		/* the share controller is told, and holds by time (partition.h) */
		if (off_span)
			atomic_store_explicit(&g->whole_ms, now_ms ? now_ms : 1, memory_order_relaxed);
	}
	/* a span the controller gives a guest while one of a higher priority is busy leaves the higher
	 * one's part of the SMs free (share_control.py, the priority reserve): while that guest is
	 * near, this one's work keeps to its span even between the higher one's requests, and does
	 * not wait in its ring while the higher one works (it is still held to --yield-depth), since
	 * it cannot be queued ahead of the higher one's on SMs it does not have.  Off its span (not
	 * partitioned, a capture open, a cooperative launch) it waits in its ring as ever.  Work is
	 * held before its span goes, and let go after it comes, so that what passes the gate finds
	 * the span the gate let it go for (a call already past the gate when the span changes goes
	 * where the new one says). */
	uint32_t span = shared ? sched_span_now(pg, atomic_load(&g->sm_part), now) : 0;
	int apart = near && span && !off_span;
	int alone = shared && !peers_at_work(s, now);
	int yield = higher && !apart;
	atomic_store(&s->alone, alone);
	if (yield)
		atomic_store(&s->yield, 1);
	atomic_store(&s->part, !alone || apart ? span : 0);
	atomic_store(&s->higher, higher);
	if (!yield)
		atomic_store(&s->yield, 0);
	if (shared)
		return; /* no turns to hand over (one held when the policy changed waits for it to change back) */
	if (owner != s->me) {
		/* a holder that died (or an owner no slot has), or nobody holding while guests wait */
		if (owner >= VMGPU_SCHED_SLOTS || (owner >= 0 && !sched_alive(atomic_load(&pg->slot[owner].pid)))) {
			lock(pg);
			if (atomic_load(&pg->owner) == owner) {
				if (owner < VMGPU_SCHED_SLOTS)
					atomic_store(&pg->slot[owner].pid, 0);
				hand_over(pg, now);
			}
			unlock(pg);
		} else if (owner < 0 && sched_others_wait(pg, s->me, now, UINT64_MAX)) {
			lock(pg);
			if (atomic_load(&pg->owner) < 0)
				hand_over(pg, now);
			unlock(pg);
		}
		return;
	}
	if (atomic_load(&g->draining)) {
		drain_part(s, g, drain, ctx);
		return;
	}
	uint64_t calls = atomic_load_explicit(&g->work_calls, memory_order_relaxed);
	if (calls != s->seen_calls || atomic_load(&s->inflight)) {
		s->seen_calls = calls;
		s->seen_at = now;
	}
	/* idle: no worker of the guest has passed the gate for a while (a call that another worker
	 * still has in flight is waited for by the drain) */
	int idle = atomic_load(&s->inflight) == 0 && !atomic_load(&g->waiters) &&
		   now - s->seen_at > sched_idle_ns(pg, sched_only_lower_wait(pg, s->me, now));
	if (!sched_turn_over(pg, s->me, now, idle)) {
		int rest = idle && now - pg->hold_start > sched_idle_ns(pg, 0); /* alone and idle: its time is nobody's */
		/* busy, capped, its budget not counted (a probe): charged as it goes (sched_turn_uncounted) */
		int uncounted = !idle && now - pg->hold_start >= (uint64_t)atomic_load(&pg->slice_us) * 1000 &&
				sched_turn_uncounted(pg, s->me, now);
		if (rest || uncounted) {
			lock(pg);
			if (atomic_load(&pg->owner) == s->me && !atomic_load(&g->draining)) {
				if (rest)
					sched_rest(pg, g, s->seen_at, now);
				else
					sched_charge_turn(pg, g, now);
			}
			unlock(pg);
		}
		return;
	}
	/* start the hand-over (one worker of the guest does): under the lock, so that a worker that
	 * dies here leaves either none begun or one begun whole, which the others or the supervisor
	 * complete once every live worker has drained */
	lock(pg);
	int began = 0;
	if (atomic_load(&pg->owner) == s->me && atomic_load(&g->draining) == 0) {
		atomic_store(&g->drained, 0);
		atomic_fetch_add(&g->drain_gen, 1);
		atomic_store(&g->draining, 1);
		began = 1;
		wake(pg); /* the guest's other workers' scheduler threads: drain now */
	}
	unlock(pg);
	if (began)
		drain_part(s, g, drain, ctx); /* this worker's part at once: the next guest waits for it */
}
