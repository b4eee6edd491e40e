/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute scheduler's shared page (native/sched_page.c) when a process dies in the middle of
 * ending a turn: a worker killed while it held the page's lock and had marked its guest's turn
 * as being ended (draining 3).  The lock's next holder must see it, so that the supervisor, whose
 * guest has no worker left, gives the GPU up; before, the turn stayed "being ended" for ever and
 * every other guest on the GPU waited.  And one killed in the middle of changing its guest's GPU
 * time (its slot's time_seq odd): the lock's next holder makes it even, or every reader of GPU
 * time (vmgpud) would look again for ever.  Runs on a page in a private directory of its own.
 * Exit 0 and "t_sched_dead: ok" when every check holds.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "page_test.h"
#include "sched_policy.h"
#include "vh_sched.h"


int main(void)
{
	char dir[] = "/tmp/t_sched_dead.XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	struct sched_share share = {.weight = 100, .priority = VMGPU_SCHED_PRIO_NORMAL};
	struct vh_sched a, b;
	CHECK_EQ(vh_sched_join(&a, dir, PAGE_TEST_UUID, "a", &share, 0), 0);
	CHECK_EQ(vh_sched_join(&b, dir, PAGE_TEST_UUID, "b", &share, 0), 0);
	struct vmgpu_sched_page *pg = a.pg;
	pthread_mutex_t *mu = (pthread_mutex_t *)(void *)pg->mu_space;

	/* a holds the GPU; its only worker dies holding the lock while ending a's turn */
	vh_sched_worker(&a, 1);
	CHECK_EQ(pthread_mutex_lock(mu), 0);
	atomic_store(&pg->owner, a.me);
	pthread_mutex_unlock(mu);
	pid_t w = fork();
	CHECK(w >= 0);
	if (w == 0) {
		pthread_mutex_lock(mu);
		atomic_store(&pg->slot[a.me].draining, 3u);
		atomic_fetch_add(&pg->slot[a.me].time_seq, 1); /* its GPU time being charged */
		_exit(0); /* dies holding the lock, the turn half ended */
	}
	int st;
	CHECK_EQ(waitpid(w, &st, 0), w);
	/* the supervisor counts the dead worker out and looks after its guest's turn */
	vh_sched_worker(&a, -1);
	atomic_fetch_add(&pg->slot[b.me].waiters, 1); /* b waits for the GPU */
	vh_sched_unheld(&a);
	CHECK_EQ(atomic_load(&pg->slot[a.me].draining), 0);
	CHECK(atomic_load(&pg->owner) != a.me);
	CHECK_EQ(atomic_load(&pg->slot[a.me].time_seq) % 2, 0);
	/* the lock is whole again: b (or anyone) can take it */
	CHECK_EQ(pthread_mutex_trylock(mu), 0);
	pthread_mutex_unlock(mu);
	atomic_fetch_sub(&pg->slot[b.me].waiters, 1);

	vh_sched_leave(&b);
	vh_sched_leave(&a);
	page_test_remove(dir);
	puts("t_sched_dead: ok");
	return 0;
}
