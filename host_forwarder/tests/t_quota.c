/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory quota (native/quota.c, native/oom_report.c) without a GPU and on a fake clock: a
 * reservation within the quota is charged to the worker's row and the guest's total, one past it
 * is refused; one that does not fit waits while a closed process's charges are on their way back
 * (and gets them when the supervisor returns them), but no longer than a second of the clock; a
 * live process's charges are not waited for, but another worker's charges that may be ahead of what
 * it holds are: it is asked to read its meter, and what the read gives back is had (no longer than
 * a tenth of a second); settling takes the meter's truth; the steps of a call
 * that takes memory give back what a failed or undone call reserved; refusals are reported at
 * most once a second.  The meter is this file's fake (meter.h); the region is a real one.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "channel.h"
#include "check.h"
#include "log.h"
#include "meter.h"
#include "quota.h"

#define MIB (1ull << 20)
#define MS 1000000ull

/* ---- fakes: the clock, the meter, the log ------------------------------------------ */

static uint64_t clock_ns = 1000 * MS, sleeps;
static void (*on_sleep)(void); /* what happens elsewhere while the quota sleeps */

static uint64_t fake_now(void)
{
	return clock_ns;
}

static void fake_sleep(uint64_t ns)
{
	clock_ns += ns;
	sleeps++;
	if (on_sleep)
		on_sleep();
}

static const struct vh_clock fake_clock = {fake_now, fake_sleep};

static int measured;            /* whether the fake meter gives numbers */
static int64_t held[VG_MAX_DEVICES]; /* what it says the worker holds */
static int reads;               /* how often it was read */
static void (*on_read)(void);   /* what happens elsewhere while it is read */

int vh_meter_on(const struct vh_chan *ch, int dev)
{
	(void)ch;
	(void)dev;
	return measured;
}

int64_t vh_meter_read(const struct vh_chan *ch, int dev)
{
	(void)ch;
	reads++;
	if (on_read)
		on_read();
	return measured ? held[dev] : -1;
}

int vh_kept_give_back(struct vh_chan *ch, int dev)
{
	(void)ch;
	(void)dev;
	return 0; /* no blocks kept for reuse here (alloc.c) */
}

static int oom_lines;

void vh_log(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (strstr(line, "out of memory"))
		oom_lines++;
}

/* ---- one guest: a region with 4 channels, 100 MiB on one GPU, the worker of channel 0 ---- */

static struct vh_fwd f;
static struct vh_chan ch;
static _Atomic uint64_t used[VG_MAX_DEVICES];
static _Atomic uint64_t rows[4][VG_MAX_DEVICES];
static struct vmgpu_stats_page stats; /* where refusals are counted */
static _Atomic uint64_t ahead[4][VG_MAX_DEVICES]; /* how far each worker's charges may be ahead of its truth */
static struct vh_shared shared;                   /* (its reads_asked) */

static void setup(void)
{
	static void *base;
	static const uint64_t size = 16 * MIB;
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 4;
	p.bulk_size = 1 << 20;
	if (!base) {
		base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		CHECK(base != MAP_FAILED);
		struct vmgpu_wait_opts wo;
		vmgpu_wait_opts_default(&wo);
		CHECK(vmgpu_region_format(base, size, &p, "t_quota") == 0);
		CHECK(vmgpu_host_attach(base, size, &p, &wo, &f.host) == 0);
	}
	struct vmgpu_host *host = f.host;
	memset(&f, 0, sizeof f);
	memset(used, 0, sizeof used);
	memset(rows, 0, sizeof rows);
	memset(&stats, 0, sizeof stats);
	memset(ahead, 0, sizeof ahead);
	atomic_store(&shared.reads_asked, 0);
	f.host = host;
	f.ahead = ahead;
	f.shared = &shared;
	f.stats = &stats;
	f.region = base;
	f.region_size = size;
	f.ndev = 1;
	f.quota[0] = 100 * MIB;
	f.used = used;
	f.charged = rows;
	f.clock = &fake_clock;
	memset(&ch, 0, sizeof ch);
	ch.fwd = &f;
	ch.index = 0;
	ch.cur_dev = 0;
	ch.charged = rows[0];
	pthread_mutex_init(&ch.quota_mu, NULL);
	atomic_store(&ch.quota_gen, 1); /* the test's steps are a call's code (refresh(): between calls) */
	ch.quota_owner = pthread_self();
	measured = 0;
	memset(held, 0, sizeof held);
	reads = 0;
	on_read = NULL;
	sleeps = 0;
	on_sleep = NULL;
}

/* The worker between two calls: its refresh reads the meter (the worker's charges change only
 * inside a call, which the checked build holds quota.c to). */
static void refresh(void)
{
	atomic_fetch_add(&ch.quota_gen, 1); /* (the call ends) */
	vh_quota_refresh(&ch);
	atomic_fetch_add(&ch.quota_gen, 1); /* (the next begins) */
}

/* Channel i's state in the region's table, as its guest process left it. */
static void channel_state(uint32_t i, uint32_t state)
{
	const struct vmgpu_layout *L = vmgpu_host_layout(f.host);
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)(f.region + L->chan_table_off + (uint64_t)i * sizeof *d);
	atomic_store(&d->ctl, (uint64_t)state);
}

/* Another worker (channel 1) holds bytes on GPU 0. */
static void other_holds(uint64_t bytes, uint32_t state)
{
	atomic_store(&rows[1][0], bytes);
	atomic_fetch_add(&used[0], bytes);
	channel_state(1, state);
}

/* The supervisor reaps channel 1's worker: its row comes back (supervisor.c: worker_ended). */
static uint64_t reap_at_ns;
static void supervisor_reaps(void)
{
	if (clock_ns >= reap_at_ns && atomic_load(&rows[1][0]))
		atomic_fetch_sub(&used[0], atomic_exchange(&rows[1][0], 0));
}

/* Channel 1's worker, its charges ahead of what it holds: once asked, and once the clock passes
 * reads_at_ns (its thread's next look), it reads its meter, which says `truth`. */
static uint64_t other_truth, reads_at_ns;
static void other_reads_when_asked(void)
{
	if (clock_ns >= reads_at_ns && atomic_load(&shared.reads_asked) && atomic_load(&ahead[1][0])) {
		uint64_t old = atomic_exchange(&rows[1][0], other_truth);
		atomic_fetch_add(&used[0], other_truth - old);
		atomic_store(&ahead[1][0], 0);
	}
}

/* ---- the behaviours ------------------------------------------------------------------ */

static void reserve_within_quota_is_charged_and_past_it_refused(void)
{
	setup();
	CHECK_EQ(vh_quota_reserve(&ch, 0, 60 * MIB), 0);
	CHECK_EQ(atomic_load(&used[0]), 60 * MIB);
	CHECK_EQ(atomic_load(&rows[0][0]), 60 * MIB);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 40 * MIB), 0); /* exactly to the quota */
	CHECK_EQ(vh_quota_reserve(&ch, 0, 1), -1);
	CHECK_EQ(vh_quota_reserve(&ch, 0, UINT64_MAX), -1); /* no wrap past the quota */
	CHECK_EQ(sleeps, 0); /* nothing on its way back: refused at once */
	CHECK_EQ(atomic_load(&used[0]), 100 * MIB);
	vh_quota_release(&ch, 0, 40 * MIB);
	CHECK_EQ(atomic_load(&used[0]), 60 * MIB);
	CHECK_EQ(atomic_load(&rows[0][0]), 60 * MIB);
}

static void reserve_waits_for_a_closed_process_and_gets_its_memory(void)
{
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_CLOSING);
	reap_at_ns = clock_ns + 5 * MS;
	on_sleep = supervisor_reaps;
	uint64_t t0 = clock_ns;
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), 0);
	CHECK_EQ(clock_ns - t0, 5 * MS); /* it waited until the row came back, and no longer */
	CHECK_EQ(sleeps, 5);
	CHECK_EQ(atomic_load(&used[0]), 50 * MIB);
	CHECK_EQ(atomic_load(&rows[0][0]), 50 * MIB);
}

static void reserve_gives_up_after_a_second_when_the_memory_does_not_come_back(void)
{
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_DEAD); /* lost, and its worker never gives it back */
	uint64_t t0 = clock_ns;
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK(clock_ns - t0 >= 1000 * MS);
	CHECK(clock_ns - t0 <= 1001 * MS);
	CHECK_EQ(atomic_load(&used[0]), 80 * MIB); /* nothing charged */
	CHECK_EQ(atomic_load(&rows[0][0]), 0);
}

static void reserve_does_not_wait_for_a_live_process(void)
{
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_ACTIVE);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK_EQ(sleeps, 0);
	/* nor for its own row, whatever its channel says */
	setup();
	CHECK_EQ(vh_quota_reserve(&ch, 0, 80 * MIB), 0);
	channel_state(0, VMGPU_CHAN_CLOSING);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK_EQ(sleeps, 0);
	channel_state(0, VMGPU_CHAN_FREE);
}

static int bounded_alloc(uint64_t n, int64_t took, uint64_t *bound); /* (below) */

/* Channel 1 charged 80 MiB, all of it bounds not yet read; asked, it reads after `after` and
 * holds `truth`.  The clock now. */
static uint64_t other_ahead_reads_after(uint64_t truth, uint64_t after)
{
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 80 * MIB);
	other_truth = truth;
	reads_at_ns = clock_ns + after;
	on_sleep = other_reads_when_asked;
	return clock_ns;
}

static void reserve_waits_for_another_workers_charges_measured_and_gets_what_they_were_ahead_by(void)
{
	/* channel 1 was charged 80 MiB of bounds and holds 30: 50 more fit the truth, not the charges */
	uint64_t t0 = other_ahead_reads_after(30 * MIB, 3 * MS);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), 0);
	CHECK_EQ(atomic_load(&shared.reads_asked), 1); /* it asked */
	CHECK_EQ(clock_ns - t0, 3 * MS);               /* and waited for the read, no longer */
	CHECK_EQ(atomic_load(&used[0]), 80 * MIB);
	CHECK_EQ(atomic_load(&rows[0][0]), 50 * MIB);

	/* the read gives nothing back (the charges were the truth): refused as soon as it is read */
	t0 = other_ahead_reads_after(80 * MIB, 2 * MS);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK_EQ(clock_ns - t0, 2 * MS);
	CHECK_EQ(atomic_load(&rows[0][0]), 0);

	/* a worker that does not read (busy in calls that take memory): asked again every 5 ms, a
	 * tenth of a second in all, then refused */
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 80 * MIB);
	t0 = clock_ns;
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK(clock_ns - t0 >= 100 * MS);
	CHECK(clock_ns - t0 <= 101 * MS);
	CHECK_EQ(atomic_load(&shared.reads_asked), 20);
	CHECK_EQ(atomic_load(&used[0]), 80 * MIB);

	/* not waited for: charges ahead by less than it lacks (reads could not make it fit), its own row,
	 * a row ahead that holds nothing */
	setup();
	other_holds(80 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 29 * MIB); /* 50 fit only if 30 come back */
	atomic_store(&ahead[0][0], 80 * MIB);
	atomic_store(&ahead[2][0], 80 * MIB);
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK_EQ(sleeps, 0);
	CHECK_EQ(atomic_load(&shared.reads_asked), 0);
	atomic_store(&ahead[1][0], 30 * MIB); /* (and by exactly enough, it is) */
	CHECK_EQ(vh_quota_reserve(&ch, 0, 50 * MIB), -1);
	CHECK_EQ(sleeps, 100);
}

/* The lock a context's reservation is made under (context.c's): what stood when it was taken, and
 * what happens elsewhere meanwhile. */
static int locks;
static uint64_t locked_at_ns, locked_at_sleeps, locked_with, locked_asks;
static void (*while_locking)(void);
static void fake_lock(void *arg)
{
	(void)arg;
	locks++;
	locked_at_ns = clock_ns;
	locked_at_sleeps = sleeps;
	locked_with = atomic_load(&rows[0][0]);
	locked_asks = atomic_load(&shared.reads_asked);
	if (while_locking)
		while_locking();
}

/* Channel 2's worker makes its context while channel 0 waits for the lock: 40 MiB charged, its
 * charges ahead by all of it, and it reads nothing (busy). */
static void another_takes_memory_meanwhile(void)
{
	atomic_store(&rows[2][0], 40 * MIB);
	atomic_fetch_add(&used[0], 40 * MIB);
	atomic_store(&ahead[2][0], 40 * MIB);
	channel_state(2, VMGPU_CHAN_ACTIVE);
}

/* The same, the lock taking half a second (the other's context being made) ... */
static void another_takes_memory_and_the_lock_half_a_second(void)
{
	clock_ns += 500 * MS;
	another_takes_memory_meanwhile();
}

/* ... and channel 2, asked after the lock was taken, reads its meter: it holds nothing yet (and
 * channel 1 reads as other_reads_when_asked). */
static void both_read_when_asked(void)
{
	other_reads_when_asked();
	if (atomic_load(&shared.reads_asked) > locked_asks && atomic_load(&ahead[2][0])) {
		atomic_fetch_sub(&used[0], atomic_exchange(&rows[2][0], 0));
		atomic_store(&ahead[2][0], 0);
	}
}

static void a_reservation_under_a_lock_waits_before_it_and_under_it_only_what_is_left(void)
{
	/* charges ahead that are never read (a busy worker): the tenth of a second is waited before the
	 * lock and nothing under it, so processes refused together wait side by side */
	setup();
	locks = 0;
	while_locking = NULL;
	other_holds(80 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 80 * MIB);
	uint64_t t0 = clock_ns;
	CHECK_EQ(vh_quota_reserve_locked(&ch, 0, 50 * MIB, fake_lock, NULL), -1);
	CHECK_EQ(locks, 1);
	CHECK(locked_at_ns - t0 >= 100 * MS);
	CHECK(locked_at_ns - t0 <= 101 * MS);
	CHECK_EQ(sleeps, locked_at_sleeps);
	CHECK_EQ(atomic_load(&used[0]), 80 * MIB);

	/* the read lands before the lock: nothing is reserved until the lock is held (the lock taken
	 * first, or the reservation made before it, fail here), then all of it */
	t0 = other_ahead_reads_after(30 * MIB, 3 * MS);
	locks = 0;
	CHECK_EQ(vh_quota_reserve_locked(&ch, 0, 50 * MIB, fake_lock, NULL), 0);
	CHECK_EQ(locks, 1);
	CHECK_EQ(locked_at_ns - t0, 3 * MS);
	CHECK_EQ(locked_with, 0);
	CHECK_EQ(sleeps, locked_at_sleeps);
	CHECK_EQ(atomic_load(&rows[0][0]), 50 * MIB);

	/* it fitted after 60 ms of waiting, and another's context took memory while it waited for the
	 * lock: under the lock it waits only the 40 ms left of the same wait, not another tenth */
	t0 = other_ahead_reads_after(30 * MIB, 60 * MS);
	while_locking = another_takes_memory_meanwhile;
	CHECK_EQ(vh_quota_reserve_locked(&ch, 0, 50 * MIB, fake_lock, NULL), -1);
	CHECK_EQ(locked_at_ns - t0, 60 * MS);
	CHECK(clock_ns - t0 >= 100 * MS);
	CHECK(clock_ns - t0 <= 101 * MS);
	CHECK_EQ(atomic_load(&rows[0][0]), 0);

	/* fitted at once before the lock, not under it: a wait of its own under it, as
	 * vh_quota_reserve's (no wait under the lock fails here) */
	setup();
	locks = 0;
	while_locking = another_takes_memory_meanwhile;
	other_holds(30 * MIB, VMGPU_CHAN_ACTIVE);
	t0 = clock_ns;
	CHECK_EQ(vh_quota_reserve_locked(&ch, 0, 50 * MIB, fake_lock, NULL), -1);
	CHECK_EQ(locked_at_ns, t0);
	CHECK(clock_ns - t0 >= 100 * MS);
	CHECK(clock_ns - t0 <= 101 * MS);

	/* it waited 3 ms before the lock, and the lock took half a second while another's context took
	 * memory that it gives back when asked: the time spent on the lock is not the reservation's
	 * wait, so it asks again and gets it (counted, it was refused at once, asking nothing) */
	t0 = other_ahead_reads_after(30 * MIB, 3 * MS);
	on_sleep = both_read_when_asked;
	while_locking = another_takes_memory_and_the_lock_half_a_second;
	CHECK_EQ(vh_quota_reserve_locked(&ch, 0, 50 * MIB, fake_lock, NULL), 0);
	CHECK_EQ(locked_at_ns - t0, 3 * MS);
	CHECK(atomic_load(&shared.reads_asked) > locked_asks);
	CHECK(clock_ns - t0 <= 505 * MS);
	CHECK_EQ(atomic_load(&rows[0][0]), 50 * MIB);
	while_locking = NULL;
	channel_state(2, VMGPU_CHAN_FREE);
}

static void a_worker_is_asked_for_one_read_an_ask_while_its_charges_may_be_ahead(void)
{
	setup();
	f.quota[0] = 1024 * MIB;
	measured = 1;
	uint32_t seen = 0;
	CHECK_EQ(vh_quota_asked(&ch, &seen), 0); /* nobody asked */
	atomic_fetch_add(&shared.reads_asked, 1);
	CHECK_EQ(vh_quota_asked(&ch, &seen), 0); /* asked, but its charges are the truth */
	CHECK_EQ(seen, 1);
	uint64_t bound;
	CHECK_EQ(bounded_alloc(MIB, 0, &bound), 0); /* a bound charged: its charges may be ahead by it */
	CHECK_EQ(bound, 2 * MIB);
	CHECK_EQ(atomic_load(&ahead[0][0]), 2 * MIB);
	CHECK_EQ(vh_quota_asked(&ch, &seen), 0); /* (no new ask) */
	atomic_fetch_add(&shared.reads_asked, 1);
	CHECK_EQ(vh_quota_asked(&ch, &seen), 1); /* one read for the ask, */
	CHECK_EQ(vh_quota_asked(&ch, &seen), 0); /* not one each look after (a busy worker's reads miss) */
	atomic_fetch_add(&shared.reads_asked, 1);
	CHECK_EQ(vh_quota_asked(&ch, &seen), 1);
	ch.ctx[0] = (CUcontext)1;
	refresh();
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
	CHECK_EQ(atomic_load(&used[0]), 0);
	atomic_fetch_add(&shared.reads_asked, 1);
	CHECK_EQ(vh_quota_asked(&ch, &seen), 0);
	CHECK_EQ(seen, 4);
	/* whole pages charged by their rounding are not ahead; a piece of a page freed may be */
	CHECK_EQ(bounded_alloc(4 * MIB, 4 * MIB, &bound), 0);
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
	vh_quota_bounded_free(&ch, 0, 4 * MIB);
	held[0] -= 4 * MIB;
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
	CHECK_EQ(bounded_alloc(64 << 10, 2 * MIB, &bound), 0);
	CHECK_EQ(vh_quota_settle(&ch, 0), 0); /* (read: the truth, not ahead) */
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
	vh_quota_bounded_free(&ch, 0, 64 << 10);
	CHECK_EQ(atomic_load(&ahead[0][0]), 64 << 10);
	/* a GPU whose meter stops giving numbers: its estimates are the charges, nothing to read */
	measured = 0;
	refresh();
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
	ch.ctx[0] = NULL;
}

static void a_refusal_measures_its_own_charges_first(void)
{
	/* a piece freed keeps its page charged until a read; the driver gave the page back: a call
	 * that fits only the truth is granted, its worker's charges read first */
	setup();
	measured = 1;
	uint64_t bound;
	CHECK_EQ(bounded_alloc(64 << 10, 2 * MIB, &bound), 0);
	CHECK_EQ(vh_quota_settle(&ch, 0), 0);
	vh_quota_bounded_free(&ch, 0, 64 << 10);
	held[0] = 0;
	CHECK_EQ(atomic_load(&used[0]), 2 * MIB);
	int r0 = reads;
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 100 * MIB, "cuMemAlloc"), 0);
	CHECK_EQ(reads, r0 + 1);
	CHECK_EQ(atomic_load(&used[0]), 100 * MIB);
	CHECK_EQ(atomic_load(&stats.oom_refusals[0]), 0);

	/* its own charges and another worker's both ahead: its own are read first, and where that
	 * makes room it does not wait for the other's */
	setup();
	f.quota[0] = 200 * MIB;
	measured = 1;
	for (int i = 0; i < 10; i++) /* 20 MiB of bounds; the driver took nothing */
		CHECK_EQ(bounded_alloc(64 << 10, 0, &bound), 0);
	other_holds(150 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 150 * MIB); /* (it never reads) */
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 40 * MIB, "cuMemAlloc"), 0);
	CHECK_EQ(sleeps, 0);
	CHECK_EQ(atomic_load(&used[0]), 190 * MIB);

	/* a green context (no wait: its call holds the GPU's gate) reads its own charges too */
	setup();
	measured = 1;
	CHECK_EQ(bounded_alloc(64 << 10, 0, &bound), 0);
	other_holds(97 * MIB, VMGPU_CHAN_ACTIVE);
	atomic_store(&ahead[1][0], 97 * MIB);
	CHECK_EQ(vh_quota_reserve_here(&ch, 0, 3 * MIB), 0);
	CHECK_EQ(vh_quota_reserve_here(&ch, 0, MIB), -1);
	CHECK_EQ(sleeps, 0);
}

/* A call that takes memory, begun (vh_quota_call_begin), ends while the refresh reads. */
static void a_call_ends(void)
{
	held[0] += 2 * MIB;
	atomic_fetch_add(&rows[0][0], 2 * MIB); /* its own charge */
	atomic_fetch_add(&used[0], 2 * MIB);
	vh_quota_call_end(&ch);
}

static void a_refresh_begun_during_a_call_reads_nothing(void)
{
	setup();
	atomic_store(&ch.quota_gen, 0); /* between calls */
	f.quota[0] = 1024 * MIB;
	measured = 1;
	ch.ctx[0] = (CUcontext)1;
	held[0] = 10 * MIB;
	atomic_store(&rows[0][0], 10 * MIB);
	atomic_store(&used[0], 10 * MIB);
	vh_quota_call_begin(&ch); /* a call under way */
	on_read = a_call_ends;
	vh_quota_refresh(&ch);
	CHECK_EQ(reads, 0); /* no reading begun: it would be of before the call's memory */
	CHECK_EQ(atomic_load(&used[0]), 10 * MIB);
	on_read = NULL;
	a_call_ends();
	vh_quota_refresh(&ch); /* (the call over: read and taken) */
	CHECK_EQ(reads, 1);
	CHECK_EQ(atomic_load(&used[0]), (uint64_t)held[0]);
	ch.ctx[0] = NULL;
}

static void settle_takes_the_meters_truth(void)
{
	setup();
	measured = 1;
	CHECK_EQ(vh_quota_reserve(&ch, 0, 10 * MIB), 0);
	held[0] = 30 * MIB; /* the driver rounded and added module code */
	CHECK_EQ(vh_quota_settle(&ch, 0), 0);
	CHECK_EQ(atomic_load(&rows[0][0]), 30 * MIB);
	CHECK_EQ(atomic_load(&used[0]), 30 * MIB);
	held[0] = 120 * MIB;
	CHECK(vh_quota_settle(&ch, 0) != 0); /* over the quota */
	held[0] = 5 * MIB;                   /* and back down: a decrease too */
	CHECK_EQ(vh_quota_settle(&ch, 0), 0);
	CHECK_EQ(atomic_load(&used[0]), 5 * MIB);
	measured = 0; /* not measured: the estimate stays the charge */
	CHECK_EQ(vh_quota_settle(&ch, 0), 0);
	CHECK_EQ(atomic_load(&rows[0][0]), 5 * MIB);
}

static void a_call_that_fails_or_is_undone_gives_its_reservation_back(void)
{
	setup(); /* estimates */
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 20 * MIB, "cuMemAlloc"), 0);
	CHECK_EQ(vh_quota_take_end(&ch, 0, 20 * MIB, CUDA_ERROR_INVALID_VALUE), 0);
	CHECK_EQ(atomic_load(&used[0]), 0);
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 20 * MIB, "cuMemAlloc"), 0);
	CHECK_EQ(vh_quota_take_end(&ch, 0, 20 * MIB, CUDA_SUCCESS), 0);
	CHECK_EQ(atomic_load(&used[0]), 20 * MIB); /* kept as the charge */
	vh_quota_given_back(&ch, 0, 20 * MIB);
	CHECK_EQ(atomic_load(&used[0]), 0);
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 101 * MIB, "cuMemAlloc"), -1);
	CHECK_EQ(atomic_load(&used[0]), 0);

	setup(); /* measured: the driver took more than the estimate, past the quota */
	measured = 1;
	CHECK_EQ(vh_quota_take_begin(&ch, 0, 20 * MIB, "cuMemAlloc"), 0);
	held[0] = 110 * MIB;
	CHECK(vh_quota_take_end(&ch, 0, 20 * MIB, CUDA_SUCCESS) != 0);
	held[0] = 0; /* the caller undid the call */
	CHECK_EQ(vh_quota_take_undo(&ch, 0, 20 * MIB, "cuMemAlloc"), CUDA_ERROR_OUT_OF_MEMORY);
	CHECK_EQ(atomic_load(&used[0]), 0);
	CHECK_EQ(atomic_load(&rows[0][0]), 0);
}

static void refusals_are_reported_at_most_once_a_second_and_every_one_counted(void)
{
	setup();
	clock_ns += 10000 * MS; /* well after any earlier report */
	oom_lines = 0;
	vh_oom_report(&ch, 0, "cuMemAlloc", MIB);
	vh_oom_report(&ch, 0, "cuMemAlloc", MIB);
	clock_ns += 999 * MS;
	vh_oom_report(&ch, 0, "cuMemAlloc", MIB);
	CHECK_EQ(oom_lines, 1);
	clock_ns += 1 * MS;
	vh_oom_report(&ch, 0, "cuMemAlloc", MIB);
	CHECK_EQ(oom_lines, 2);
	CHECK_EQ(vh_quota_card_full(&ch, 0, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", MIB), CUDA_ERROR_OUT_OF_MEMORY);
	CHECK_EQ(oom_lines, 2); /* within the second again */
	CHECK_EQ(atomic_load(&stats.oom_refusals[0]), 5); /* on the statistics page: every one */
	CHECK_EQ(atomic_load(&stats.oom_refusals[1]), 0);
}

static void charges_are_rounded_as_the_driver_takes_memory(void)
{
	CHECK_EQ(vh_quota_rounded(0), 64 << 10);
	CHECK_EQ(vh_quota_rounded(1), 64 << 10);
	CHECK_EQ(vh_quota_rounded(64 << 10), 64 << 10);
	CHECK_EQ(vh_quota_rounded((64 << 10) + 1), 128 << 10);
	CHECK_EQ(vh_quota_rounded(MIB), MIB);
	CHECK_EQ(vh_quota_rounded(MIB + 1), 2 * MIB);
	CHECK_EQ(vh_quota_rounded(3 * MIB), 4 * MIB);
}

/* cuMemAlloc/cuMemFree through the bounded steps, as alloc.c makes them; the fake driver takes
 * `took` bytes (what the meter will say the worker holds more). */
static int bounded_alloc(uint64_t n, int64_t took, uint64_t *bound)
{
	uint64_t est = vh_quota_rounded(n);
	if (vh_quota_bounded_begin(&ch, 0, est, "cuMemAlloc", bound))
		return -1;
	held[0] += took;
	return vh_quota_bounded_end(&ch, 0, est, *bound, CUDA_SUCCESS);
}

static void bounded_allocations_far_from_the_quota_charge_their_bound_without_reading_the_meter(void)
{
	setup();
	f.quota[0] = 1024 * MIB;
	measured = 1;
	uint64_t bound;
	CHECK_EQ(bounded_alloc(MIB, 0, &bound), 0); /* 1 MiB: a piece of a page, which may be a fresh one */
	CHECK_EQ(bound, 2 * MIB);
	CHECK_EQ(bounded_alloc(3 * MIB, 4 * MIB, &bound), 0); /* whole pages: exactly its rounding */
	CHECK_EQ(bound, 4 * MIB);
	CHECK_EQ(reads, 0); /* (the fake meter was read for none of it) */
	CHECK_EQ(atomic_load(&used[0]), 6 * MIB);
	CHECK_EQ(atomic_load(&rows[0][0]), 6 * MIB);
	/* the charges are ahead of the truth (4 MiB), never behind; a read sets them to it */
	CHECK_EQ(vh_quota_settle(&ch, 0), 0);
	CHECK_EQ(atomic_load(&used[0]), 4 * MIB);
	/* a free of whole pages gives them back at once; a piece of a page stays charged until a read */
	vh_quota_bounded_free(&ch, 0, 4 * MIB);
	held[0] -= 4 * MIB;
	CHECK_EQ(atomic_load(&used[0]), 0);
	CHECK_EQ(reads, 1);
	CHECK_EQ(bounded_alloc(64 << 10, 2 * MIB, &bound), 0);
	vh_quota_bounded_free(&ch, 0, 64 << 10);
	CHECK_EQ(atomic_load(&used[0]), 2 * MIB);
	CHECK_EQ(reads, 1);
	/* a failed call gives its bound back */
	CHECK_EQ(vh_quota_bounded_begin(&ch, 0, 8 * MIB, "cuMemAlloc", &bound), 0);
	CHECK_EQ(vh_quota_bounded_end(&ch, 0, 8 * MIB, bound, CUDA_ERROR_INVALID_VALUE), 0);
	CHECK_EQ(atomic_load(&used[0]), 2 * MIB);
}

static void the_meter_is_read_after_256_mib_of_bounds_or_32_exact_charges(void)
{
	setup();
	f.quota[0] = 4096 * MIB;
	measured = 1;
	uint64_t bound;
	for (int i = 0; i < 128; i++) /* 128 pieces: 256 MiB of bounds, no read */
		CHECK_EQ(bounded_alloc(64 << 10, 0, &bound), 0);
	CHECK_EQ(reads, 0);
	CHECK_EQ(atomic_load(&used[0]), 256 * MIB);
	CHECK_EQ(bounded_alloc(64 << 10, 0, &bound), 0); /* the 129th is measured */
	CHECK_EQ(bound, 0);
	CHECK_EQ(reads, 1);
	CHECK_EQ(atomic_load(&used[0]), 0); /* the fake driver took nothing: the truth */
	for (int i = 0; i < 16; i++) { /* 32 exact charges: 16 allocations and their frees */
		CHECK_EQ(bounded_alloc(4 * MIB, 4 * MIB, &bound), 0);
		vh_quota_bounded_free(&ch, 0, 4 * MIB);
		held[0] -= 4 * MIB;
	}
	CHECK_EQ(reads, 1);
	CHECK_EQ(bounded_alloc(4 * MIB, 4 * MIB, &bound), 0);
	CHECK_EQ(bound, 0); /* measured */
	CHECK_EQ(reads, 2);
	CHECK_EQ(atomic_load(&used[0]), 4 * MIB);
	/* and a refresh off the hot path sets the charges to the truth at rest */
	CHECK_EQ(bounded_alloc(64 << 10, 0, &bound), 0);
	CHECK_EQ(atomic_load(&used[0]), 6 * MIB);
	refresh();
	ch.ctx[0] = NULL; /* (no context: nothing to refresh) */
	CHECK_EQ(atomic_load(&used[0]), 6 * MIB);
	ch.ctx[0] = (CUcontext)1;
	refresh();
	ch.ctx[0] = NULL;
	CHECK_EQ(atomic_load(&used[0]), 4 * MIB);
}

/* The serving thread runs a call that takes memory while the refresh reads the meter. */
static void a_call_runs(void)
{
	vh_quota_call_begin(&ch);
	held[0] += 2 * MIB;
	atomic_fetch_add(&rows[0][0], 2 * MIB); /* as its own settle would have */
	atomic_fetch_add(&used[0], 2 * MIB);
	vh_quota_call_end(&ch);
}

static void a_refresh_that_raced_a_call_is_not_taken_and_a_busy_guest_is_read_under_the_lock(void)
{
	setup();
	atomic_store(&ch.quota_gen, 0); /* between calls */
	f.quota[0] = 1024 * MIB;
	measured = 1;
	ch.ctx[0] = (CUcontext)1;
	held[0] = 10 * MIB; /* module code the driver loaded at a launch, say */
	on_read = a_call_runs;
	int64_t truth_before_call = held[0];
	vh_quota_refresh(&ch); /* read 10 MiB, but a call ran meanwhile: not taken */
	CHECK_EQ(atomic_load(&used[0]), 2 * MIB);
	CHECK(truth_before_call != (int64_t)atomic_load(&used[0]));
	for (int i = 0; i < 3; i++)
		vh_quota_refresh(&ch);
	CHECK_EQ(atomic_load(&used[0]), 8 * MIB); /* four misses */
	on_read = NULL; /* (under the lock no call can run) */
	vh_quota_refresh(&ch);
	CHECK_EQ(atomic_load(&used[0]), (uint64_t)held[0]); /* the fifth: read under the lock, taken */
	CHECK_EQ(atomic_load(&used[0]), 18 * MIB);
	vh_quota_refresh(&ch); /* and a quiet one is taken as read */
	CHECK_EQ(atomic_load(&used[0]), 18 * MIB);
	ch.ctx[0] = NULL;
}

static void near_the_quota_every_allocation_is_measured_and_refusals_are_on_the_truth(void)
{
	setup();
	f.quota[0] = 64 * MIB; /* within the margin (33 pages) of the quota: always measured */
	measured = 1;
	uint64_t bound;
	CHECK_EQ(bounded_alloc(MIB, 2 * MIB, &bound), 0);
	CHECK_EQ(bound, 0);
	CHECK_EQ(reads, 1);
	CHECK_EQ(atomic_load(&used[0]), 2 * MIB);

	setup();
	f.quota[0] = 200 * MIB;
	measured = 1;
	for (int i = 0; i < 32; i++) /* 64 MiB of bounds charged; the driver took one page */
		CHECK_EQ(bounded_alloc(64 << 10, i == 0 ? 2 * MIB : 0, &bound), 0);
	CHECK_EQ(atomic_load(&used[0]), 64 * MIB);
	CHECK_EQ(reads, 0);
	/* 190 MiB more fits the truth (2 MiB held) but not the charges: read, then granted */
	CHECK_EQ(bounded_alloc(190 * MIB, 190 * MIB, &bound), 0);
	CHECK_EQ(bound, 0);
	CHECK_EQ(atomic_load(&used[0]), 192 * MIB);
	CHECK_EQ(atomic_load(&stats.oom_refusals[0]), 0);
	/* and past the truth: refused, counted */
	CHECK_EQ(bounded_alloc(10 * MIB, 0, &bound), -1);
	CHECK_EQ(atomic_load(&used[0]), 192 * MIB);
	CHECK_EQ(atomic_load(&stats.oom_refusals[0]), 1);
}

static void without_a_meter_bounded_steps_charge_the_rounding(void)
{
	setup();
	uint64_t bound;
	CHECK_EQ(bounded_alloc(MIB, 0, &bound), 0);
	CHECK_EQ(bound, 0);
	CHECK_EQ(atomic_load(&used[0]), MIB);
	uint64_t est = MIB;
	CHECK_EQ(vh_quota_bounded_widen(&ch, 0, &est, 3 * MIB, &bound), 0); /* a wider pitch */
	CHECK_EQ(est, 3 * MIB);
	CHECK_EQ(atomic_load(&used[0]), 3 * MIB);
	CHECK_EQ(vh_quota_bounded_widen(&ch, 0, &est, 200 * MIB, &bound), -1);
	CHECK_EQ(est, 3 * MIB);
	vh_quota_bounded_free(&ch, 0, 3 * MIB);
	CHECK_EQ(atomic_load(&used[0]), 0);
}

#ifdef VH_CHECKED /* (the checked build: -DVH_CHECKED, as `make native-asan` builds) */
/* A worker's charges changed outside a call (quota_gen even: a reading of the meter begun before
 * would be taken after) end the worker in the checked build, each way they change; in a call
 * they do not. */
static int ends_between_calls(void (*change)(void))
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 2); /* (its message is quota.c's to write, not this test's) */
		setup();
		atomic_store(&used[0], 10 * MIB);
		atomic_store(&rows[0][0], 10 * MIB);
		atomic_store(&ch.quota_gen, 0); /* between calls */
		change();
		_exit(0);
	}
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void give_back(void)
{
	vh_quota_release(&ch, 0, MIB);
}

static void take(void)
{
	CHECK_EQ(vh_quota_reserve_here(&ch, 0, MIB), 0);
}

static void free_a_piece(void) /* (a piece of a page: marked ahead) */
{
	measured = 1;
	CHECK(vh_meter_on(&ch, 0)); /* (else it would be given back, not marked) */
	vh_quota_bounded_free(&ch, 0, 64 << 10);
}

static void set_to_the_meter(void)
{
	measured = 1;
	vh_quota_settle(&ch, 0);
}

static void end_the_worker(void)
{
	vh_quota_worker_end(&ch, 0);
}

#endif

#ifdef VH_CHECKED
static void *give_back_here(void *arg)
{
	(void)arg;
	give_back();
	return NULL;
}

static void *begin_if_out_here(void *arg)
{
	(void)arg;
	vh_quota_call_begin_if_out(&ch);
	return NULL;
}

/* A thread other than the one in the call changes charges, or begins a call of its own (which,
 * seeing one under way, would go on without the lock), while this one is in a call: the checked
 * worker ends (SIGABRT). */
static int ends_from_another_thread(void *(*change)(void *))
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 2);
		setup();
		atomic_store(&used[0], 10 * MIB);
		atomic_store(&rows[0][0], 10 * MIB);
		atomic_store(&ch.quota_gen, 0);
		vh_quota_call_begin(&ch); /* (this thread's call) */
		pthread_t t;
		CHECK_EQ(pthread_create(&t, NULL, change, NULL), 0);
		pthread_join(t, NULL);
		_exit(0);
	}
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}
#endif

static void charges_change_only_inside_a_call(void)
{
#ifdef VH_CHECKED
	void (*const changes[])(void) = {give_back, take, free_a_piece, end_the_worker, set_to_the_meter};
	for (size_t i = 0; i < sizeof changes / sizeof *changes; i++)
		CHECK(ends_between_calls(changes[i]));
	CHECK(ends_from_another_thread(give_back_here));
	CHECK(ends_from_another_thread(begin_if_out_here));
#endif
	/* what may take memory within work for the GPU begins a call of its own only outside one:
	 * the lock is not taken twice (a hang), and the call it is in does not end early */
	setup();
	atomic_store(&ch.quota_gen, 0);
	vh_quota_call_begin(&ch);
	CHECK_EQ(vh_quota_call_begin_if_out(&ch), 0);
	vh_quota_call_end_if(&ch, 0);
	CHECK_EQ(atomic_load(&ch.quota_gen), 1);
	vh_quota_call_end(&ch);
	int began = vh_quota_call_begin_if_out(&ch);
	CHECK_EQ(began, 1);
	CHECK_EQ(atomic_load(&ch.quota_gen), 3);
	CHECK(pthread_mutex_trylock(&ch.quota_mu) != 0); /* (held: the refresh waits its turn) */
	vh_quota_call_end_if(&ch, began);
	CHECK_EQ(atomic_load(&ch.quota_gen), 4);
	CHECK_EQ(pthread_mutex_trylock(&ch.quota_mu), 0);
	pthread_mutex_unlock(&ch.quota_mu);
	/* in a call (the tests' steps otherwise): the worker's end takes its charges back */
	setup();
	atomic_store(&used[0], 10 * MIB);
	atomic_store(&rows[0][0], 10 * MIB);
	atomic_store(&ahead[0][0], MIB);
	vh_quota_worker_end(&ch, 0);
	CHECK_EQ(atomic_load(&used[0]), 0);
	CHECK_EQ(atomic_load(&rows[0][0]), 0);
	CHECK_EQ(atomic_load(&ahead[0][0]), 0);
}

int main(void)
{
	reserve_within_quota_is_charged_and_past_it_refused();
	reserve_waits_for_a_closed_process_and_gets_its_memory();
	reserve_gives_up_after_a_second_when_the_memory_does_not_come_back();
	reserve_does_not_wait_for_a_live_process();
	reserve_waits_for_another_workers_charges_measured_and_gets_what_they_were_ahead_by();
	a_worker_is_asked_for_one_read_an_ask_while_its_charges_may_be_ahead();
	a_reservation_under_a_lock_waits_before_it_and_under_it_only_what_is_left();
	a_refusal_measures_its_own_charges_first();
	a_refresh_begun_during_a_call_reads_nothing();
	settle_takes_the_meters_truth();
	a_call_that_fails_or_is_undone_gives_its_reservation_back();
	refusals_are_reported_at_most_once_a_second_and_every_one_counted();
	charges_are_rounded_as_the_driver_takes_memory();
	bounded_allocations_far_from_the_quota_charge_their_bound_without_reading_the_meter();
	the_meter_is_read_after_256_mib_of_bounds_or_32_exact_charges();
	near_the_quota_every_allocation_is_measured_and_refusals_are_on_the_truth();
	without_a_meter_bounded_steps_charge_the_rounding();
	a_refresh_that_raced_a_call_is_not_taken_and_a_busy_guest_is_read_under_the_lock();
	charges_change_only_inside_a_call();
	printf("ok\n");
	return 0;
}
