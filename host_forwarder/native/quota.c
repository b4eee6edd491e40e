/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory quota: where a memory refusal is decided.  What each worker (guest process) is
 * charged on each GPU, summed across the workers in shared memory and held under the quota.
 *
 * Charges are the truth where the driver can be measured (meter.c).  On a GPU, NVML's
 * per-process usage of the worker is read after every call that can take or give back device
 * memory, so the charges are what the worker really holds: the context's own overhead (about
 * 518 MiB on the H100 with driver 580), the driver's rounding (allocations over 1 MiB take
 * whole 2 MiB pages), pool chunks, graph memory, module code and globals, VMM handles.  Before
 * such a call the worker reserves an estimate, so that concurrent workers of the same guest
 * cannot both pass the check; after it the reservation is replaced by the measurement, and a
 * call that left the guest over its quota is undone and answered CUDA_ERROR_OUT_OF_MEMORY.
 *
 * cuMemAlloc and cuMemFree, which programs call in loops (and cuBLAS, cuDNN and XLA's autotuner
 * for workspaces), take the bounded path instead (vh_quota_bounded_*): what such a call can take
 * is known (the rounding above; at most one fresh 2 MiB page for an allocation of up to 1 MiB),
 * so where the guest is well inside its quota a call is charged that bound and NVML is not asked
 * (about 20 us a read).  The meter is read when the bytes so charged pass 256 MiB (128 small
 * allocations), after 32 calls charged by rounding alone, near the quota, before any refusal, and every 50 ms off the hot path
 * (vh_quota_refresh): the charges run ahead of the truth between two reads, never behind it, and
 * are the truth to the byte at rest.  How far a worker's charges may be ahead is in its shared row
 * (`ahead`); a reservation of another worker of the guest that does not fit the charges, but would
 * where theirs came down by that much, asks those workers to read their meters (their second
 * threads do at their next look, unless busy in a call that takes memory) and waits for the reads,
 * up to a tenth of a second, before it is refused: a guest process is not refused for what
 * another process's charges ran ahead by while those can be read.
 *
 * Where no per-process measurement exists (NVML without per-process accounting, as under
 * MIG), the estimates are the charges: each allocation is charged its rounded size until
 * freed, and every context a flat reserve (--ctx-reserve).
 *
 * A worker's row lives in shared memory so that the supervisor returns its charges when
 * the worker ends, however it ends.
 */
#include <stdio.h>
#include <stdlib.h>

#include "channel.h"
#include "meter.h"
#include "quota.h"

#define PAGE (2ull << 20)    /* the driver's page */
#define SMALL_MAX (1ull << 20) /* an allocation up to this size is a piece of a shared page */

uint64_t vh_quota_rounded(uint64_t n)
{
	/* as the H100's driver takes them: up to 1 MiB in 64 KiB pieces of shared 2 MiB pages,
	 * above that whole 2 MiB pages */
	uint64_t unit = n <= SMALL_MAX ? (64u << 10) : PAGE;
	return n == 0 ? unit : (n + unit - 1) / unit * unit;
}

int vh_quota_measured(struct vh_chan *ch)
{
	return vh_meter_on(ch, ch->cur_dev >= 0 ? ch->cur_dev : 0);
}

/* Is some of dev's memory on its way back: a row of a guest process that has closed its
 * channel (or lost it) whose worker has not yet given it back?  Its worker does so within
 * moments; until then the quota still counts it. */
static int returns_pending(const struct vh_chan *ch, int dev)
{
	const struct vh_fwd *f = ch->fwd;
	const struct vmgpu_layout *L = vmgpu_host_layout(f->host);
	for (uint32_t i = 0; i < L->nchannels; i++) {
		if (i == ch->index || !atomic_load(&f->charged[i][dev]))
			continue;
		struct vmgpu_chan_desc *d =
			(struct vmgpu_chan_desc *)(f->region + L->chan_table_off + (uint64_t)i * sizeof *d);
		if ((uint32_t)atomic_load_explicit(&d->ctl, memory_order_acquire) != VMGPU_CHAN_ACTIVE)
			return 1;
	}
	return 0;
}

/* A worker's charges change only inside a call that may take or give memory
 * (vh_quota_call_begin/end: quota_mu held, quota_gen odd), and only on the thread in it, so that
 * a reading of the meter begun before the change is not taken after it.  The checked build
 * (-DVH_CHECKED: the ASan/UBSan build the tests run forwarders from) ends the worker at a change
 * outside one, or on another thread while one is under way, saying which. */
static void in_call(const struct vh_chan *ch, const char *what)
{
#ifdef VH_CHECKED
	if (!(atomic_load(&ch->quota_gen) & 1)) {
		fprintf(stderr, "vmgpu-forwarder: quota: %s outside a call (vh_quota_call_begin/end)\n", what);
		abort();
	}
	if (!pthread_equal(__atomic_load_n(&ch->quota_owner, __ATOMIC_RELAXED), pthread_self())) {
		fprintf(stderr,
			"vmgpu-forwarder: quota: %s on a thread other than the one in the call (outside a call of its "
			"own)\n",
			what);
		abort();
	}
#else
	(void)ch;
	(void)what;
#endif
}

/* This worker's charges on dev ran (up to) bytes further ahead of the truth: its shared row says so. */
static void add_ahead(struct vh_chan *ch, int dev, uint64_t bytes)
{
	in_call(ch, "charges marked ahead");
	if (ch->fwd->ahead)
		atomic_fetch_add(&ch->fwd->ahead[ch->index][dev], bytes);
}

static uint64_t own_ahead(const struct vh_chan *ch, int dev)
{
	return ch->fwd->ahead ? atomic_load(&ch->fwd->ahead[ch->index][dev]) : 0;
}

/* How much of dev's memory charged to the guest's other workers may be ahead of what they hold:
 * their next reads of their meters may give it back. */
static uint64_t others_ahead(const struct vh_chan *ch, int dev)
{
	const struct vh_fwd *f = ch->fwd;
	if (!f->ahead || !f->shared)
		return 0;
	const struct vmgpu_layout *L = vmgpu_host_layout(f->host);
	uint64_t sum = 0;
	for (uint32_t i = 0; i < L->nchannels; i++)
		if (i != ch->index && atomic_load(&f->charged[i][dev]))
			sum += atomic_load(&f->ahead[i][dev]);
	return sum;
}

int vh_quota_asked(struct vh_chan *ch, uint32_t *seen)
{
	struct vh_fwd *f = ch->fwd;
	if (!f->ahead || !f->shared)
		return 0;
	uint32_t asked = atomic_load(&f->shared->reads_asked);
	if (asked == *seen)
		return 0;
	*seen = asked; /* one read an ask (a waiter asks again while it waits) */
	for (int d = 0; d < f->ndev; d++)
		if (own_ahead(ch, d))
			return 1;
	return 0;
}

static int reserve_now(struct vh_chan *ch, int dev, uint64_t n)
{
	struct vh_fwd *f = ch->fwd;
	_Atomic uint64_t *used = &f->used[dev];
	uint64_t cur = atomic_load(used);
	in_call(ch, "memory reserved");
	do {
		if (n > f->quota[dev] || cur > f->quota[dev] - n)
			return -1;
	} while (!atomic_compare_exchange_weak(used, &cur, cur + n));
	atomic_fetch_add(&ch->charged[dev], n);
	return 0;
}

/* How long a reservation waits for other workers' charges to be read (their threads read at their
 * next look, a millisecond or less, unless busy in a call that takes memory), and how often it asks
 * them again meanwhile (each ask is answered with one read). */
#define AHEAD_WAIT_NS (100 * 1000000ull)
#define ASK_EVERY_NS (5 * 1000000ull)

/* Would n more bytes on dev fit if the other workers' charges came down by `ahead`? */
static int fits_below(const struct vh_chan *ch, int dev, uint64_t n, uint64_t ahead)
{
	uint64_t q = ch->fwd->quota[dev], used = atomic_load(&ch->fwd->used[dev]);
	uint64_t floor = used > ahead ? used - ahead : 0;
	return n <= q && floor <= q - n;
}

/* A guest process that starts as another ends must not be refused the memory the other is
 * giving back: a reservation that does not fit waits (up to a second) while such memory is
 * on its way, as natively a process's memory is free once it has exited.  Nor must it be refused
 * where the charges of another of the guest's processes are ahead of what that one holds (bounded
 * charges not yet measured) by enough that it would fit: it asks them to read their meters and
 * waits (up to AHEAD_WAIT_NS).  The wait counts from *start (the first look where it is 0).  With
 * take, n bytes are reserved as soon as they fit; without, it only waits until they would. */
static int fit_waiting(struct vh_chan *ch, int dev, uint64_t n, uint64_t *start, int take)
{
	const struct vh_clock *clock = ch->fwd->clock;
	uint64_t asked_at = 0;
	for (;;) {
		if (take ? reserve_now(ch, dev, n) == 0 : fits_below(ch, dev, n, 0))
			return 0;
		int back = returns_pending(ch, dev), ahead = fits_below(ch, dev, n, others_ahead(ch, dev));
		if (!back && !ahead) /* (once more: a read may have landed since the first look) */
			return (take ? reserve_now(ch, dev, n) == 0 : fits_below(ch, dev, n, 0)) ? 0 : -1;
		uint64_t now = clock->now_ns();
		if (!*start)
			*start = now;
		if (now - *start >= (back ? 1000000000ull : AHEAD_WAIT_NS))
			return -1;
		if (ahead && (!asked_at || now - asked_at >= ASK_EVERY_NS)) {
			atomic_fetch_add(&ch->fwd->shared->reads_asked, 1);
			asked_at = now;
		}
		clock->sleep_ns(1000000);
	}
}

int vh_quota_reserve(struct vh_chan *ch, int dev, uint64_t n)
{
	uint64_t start = 0;
	return fit_waiting(ch, dev, n, &start, 1);
}

int vh_quota_reserve_locked(struct vh_chan *ch, int dev, uint64_t n, void (*lock)(void *), void *arg)
{
	const struct vh_clock *clock = ch->fwd->clock;
	uint64_t start = 0; /* (a wait begun before the lock goes on under it, not again) */
	fit_waiting(ch, dev, n, &start, 0);
	uint64_t before = clock->now_ns();
	lock(arg);
	if (start) /* (the time the lock was waited for is not the reservation's wait) */
		start += clock->now_ns() - before;
	return fit_waiting(ch, dev, n, &start, 1);
}

/* Where this worker's charges on dev may not be the truth (bounds and rounding charged since its
 * last read, pieces of pages freed): read the meter now.  1 if it was read. */
static int measure_own_charges(struct vh_chan *ch, int dev)
{
	if (!(ch->unmeasured[dev] || ch->unmeasured_exact[dev] || own_ahead(ch, dev)) || !vh_meter_on(ch, dev))
		return 0;
	vh_quota_settle(ch, dev);
	return 1;
}

int vh_quota_reserve_here(struct vh_chan *ch, int dev, uint64_t n)
{
	if (reserve_now(ch, dev, n) == 0)
		return 0;
	return measure_own_charges(ch, dev) ? reserve_now(ch, dev, n) : -1;
}

void vh_quota_release(struct vh_chan *ch, int dev, uint64_t n)
{
	in_call(ch, "memory given back");
	atomic_fetch_sub(&ch->fwd->used[dev], n);
	atomic_fetch_sub(&ch->charged[dev], n);
}

/* The truth read for dev, taken as this worker's charge (under quota_mu). */
static void take_truth(struct vh_chan *ch, int dev, int64_t truth)
{
	ch->unmeasured[dev] = 0;
	ch->unmeasured_exact[dev] = 0;
	uint64_t old = atomic_exchange(&ch->charged[dev], (uint64_t)truth);
	atomic_fetch_add(&ch->fwd->used[dev], (uint64_t)truth - old); /* modular: a decrease too */
	if (ch->fwd->ahead) /* (after the charge: a waiter that sees it cleared sees them come down) */
		atomic_store(&ch->fwd->ahead[ch->index][dev], 0);
}

void vh_quota_worker_end(struct vh_chan *ch, int had_contexts)
{
	struct vh_fwd *f = ch->fwd;
	in_call(ch, "a worker's charges dropped");
	for (int d = 0; d < f->ndev; d++) {
		if (had_contexts && vh_meter_on(ch, d))
			vh_quota_settle(ch, d);
		else
			atomic_fetch_sub(&f->used[d], atomic_exchange(&ch->charged[d], 0));
		if (f->ahead)
			atomic_store(&f->ahead[ch->index][d], 0);
	}
}

/* vh_quota_settle, for the refresh too (between calls, under quota_mu: what it reads is the truth
 * at that moment, no call being under way). */
static int settle(struct vh_chan *ch, int dev)
{
	struct vh_fwd *f = ch->fwd;
	int64_t truth = vh_meter_read(ch, dev);
	if (truth >= 0)
		take_truth(ch, dev, truth);
	return atomic_load(&f->used[dev]) > f->quota[dev];
}

int vh_quota_settle(struct vh_chan *ch, int dev)
{
	in_call(ch, "charges set to the meter's reading");
	return settle(ch, dev);
}

void vh_quota_call_begin(struct vh_chan *ch)
{
	pthread_mutex_lock(&ch->quota_mu);
	atomic_fetch_add_explicit(&ch->quota_gen, 1, memory_order_relaxed); /* (odd: under way) */
#ifdef VH_CHECKED
	__atomic_store_n(&ch->quota_owner, pthread_self(), __ATOMIC_RELAXED);
#endif
}

void vh_quota_call_end(struct vh_chan *ch)
{
	atomic_fetch_add_explicit(&ch->quota_gen, 1, memory_order_relaxed); /* (even: ended) */
	pthread_mutex_unlock(&ch->quota_mu);
}

int vh_quota_call_begin_if_out(struct vh_chan *ch)
{
	if (atomic_load(&ch->quota_gen) & 1) { /* (only the serving thread begins and ends calls) */
#ifdef VH_CHECKED
		if (!pthread_equal(__atomic_load_n(&ch->quota_owner, __ATOMIC_RELAXED), pthread_self())) {
			fprintf(stderr, "vmgpu-forwarder: quota: a call begun while another thread's is under way (it would go on "
				"outside a call, without the lock)\n");
			abort();
		}
#endif
		return 0;
	}
	vh_quota_call_begin(ch);
	return 1;
}

void vh_quota_call_end_if(struct vh_chan *ch, int began)
{
	if (began)
		vh_quota_call_end(ch);
}

/* The meter is read without quota_mu (a read can take long; the guest's calls must not wait for
 * it), and its answer taken only if no call that may take or give memory ran meanwhile: such a
 * call makes quota_gen odd as it begins and even as it ends (vh_quota_call_begin/end), so a
 * reading begun during one, or with one begun or ended since, is not taken.  Four misses in a row (a busy
 * guest): read under the lock. */
void vh_quota_refresh(struct vh_chan *ch)
{
	for (int d = 0; d < ch->fwd->ndev; d++) {
		/* (ctx[d] is the serving thread's to set: read here with an atomic load) */
		if (!__atomic_load_n(&ch->ctx[d], __ATOMIC_ACQUIRE) || !vh_meter_on(ch, d)) {
			if (ch->fwd->ahead && !vh_meter_on(ch, d)) /* (estimates: the charges themselves, never read) */
				atomic_store(&ch->fwd->ahead[ch->index][d], 0);
			continue;
		}
		uint64_t gen = atomic_load(&ch->quota_gen);
		int64_t truth = (gen & 1) || ch->refresh_misses[d] >= 4 ? -1 : vh_meter_read(ch, d);
		if (pthread_mutex_trylock(&ch->quota_mu) != 0) {
			ch->refresh_misses[d]++;
			continue;
		}
		if (truth >= 0 && atomic_load(&ch->quota_gen) == gen) {
			take_truth(ch, d, truth);
			ch->refresh_misses[d] = 0;
		} else if (truth < 0 && ch->refresh_misses[d] >= 4) {
			settle(ch, d);
			ch->refresh_misses[d] = 0;
		} else {
			ch->refresh_misses[d]++;
		}
		pthread_mutex_unlock(&ch->quota_mu);
	}
}

/* Module images and contexts are taken by the driver and measured after. */
int vh_quota_settle_load(struct vh_chan *ch)
{
	int dev = ch->cur_dev >= 0 ? ch->cur_dev : 0;
	return vh_quota_measured(ch) && vh_quota_settle(ch, dev);
}

/* ---- the steps of a call that takes memory ------------------------------------------ */

int vh_quota_take_begin(struct vh_chan *ch, int dev, uint64_t est, const char *call)
{
	if (reserve_now(ch, dev, est) == 0)
		return 0;
	/* the blocks alloc.c keeps for cuMemAlloc are the guest's free memory: they go back first */
	if (vh_kept_give_back(ch, dev) && reserve_now(ch, dev, est) == 0)
		return 0;
	/* refused on the charges: where its own ran ahead of the truth (bounded takes, pieces of pages
	 * freed), ask the truth; then (vh_quota_reserve) wait for memory on its way back and for
	 * other workers' charges read */
	measure_own_charges(ch, dev);
	if (vh_quota_reserve(ch, dev, est) == 0)
		return 0;
	vh_oom_report(ch, dev, call, est);
	return -1;
}

int vh_quota_take_end(struct vh_chan *ch, int dev, uint64_t est, CUresult r)
{
	if (vh_quota_measured(ch))
		return vh_quota_settle(ch, dev) && r == CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		vh_quota_release(ch, dev, est);
	return 0;
}

CUresult vh_quota_take_undo(struct vh_chan *ch, int dev, uint64_t est, const char *call)
{
	vh_quota_given_back(ch, dev, est);
	vh_oom_report(ch, dev, call, est);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

void vh_quota_given_back(struct vh_chan *ch, int dev, uint64_t charge)
{
	if (vh_quota_measured(ch))
		vh_quota_settle(ch, dev);
	else
		vh_quota_release(ch, dev, charge);
}

CUresult vh_quota_card_full(struct vh_chan *ch, int dev, CUresult r, const char *call, uint64_t want)
{
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		vh_oom_report(ch, dev, call, want); /* the card itself is full */
	return r;
}

/* ---- bounded takes: cuMemAlloc and cuMemFree without reading the meter each time ---------- */

/* The meter is read when the bytes charged by bound since the last read pass this (the charges are
 * then at most this far ahead of the truth), */
#define UNMEASURED_MAX (256ull << 20)
/* or after this many takes and frees charged by the rounding alone (were the driver ever to take a
 * page more than its rounding, the charges would lag by at most this many pages, */
#define UNMEASURED_EXACT_MAX 32u
/* which the guest's distance from its quota covers, or the call is measured). */
#define MARGIN ((uint64_t)(UNMEASURED_EXACT_MAX + 1) * PAGE)

/* The most a cuMemAlloc of est bytes (already rounded) can take: est, or a fresh page for a small one. */
static uint64_t bound_of(uint64_t est)
{
	return est <= SMALL_MAX ? PAGE : est;
}

/* May a take of bound bytes be charged by bound now? */
static int bounded_ok(struct vh_chan *ch, int dev, uint64_t bound)
{
	if (!vh_meter_on(ch, dev))
		return 0; /* the estimates are the charges anyway: take_begin's path */
	if (ch->unmeasured_exact[dev] >= UNMEASURED_EXACT_MAX || ch->unmeasured[dev] + bound > UNMEASURED_MAX)
		return 0;
	uint64_t q = ch->fwd->quota[dev], used = atomic_load(&ch->fwd->used[dev]);
	return q >= MARGIN && used <= q - MARGIN && bound <= q - MARGIN - used;
}

int vh_quota_near(struct vh_chan *ch, int dev, uint64_t est)
{
	uint64_t q = ch->fwd->quota[dev], used = atomic_load(&ch->fwd->used[dev]), b = bound_of(est);
	return q < MARGIN || used > q - MARGIN || b > q - MARGIN - used;
}

static void count_bounded(struct vh_chan *ch, int dev, uint64_t est, uint64_t bound)
{
	if (bound == est) {
		ch->unmeasured_exact[dev]++;
	} else {
		ch->unmeasured[dev] += bound;
		add_ahead(ch, dev, bound);
	}
}

int vh_quota_bounded_begin(struct vh_chan *ch, int dev, uint64_t est, const char *call, uint64_t *bound)
{
	uint64_t b = bound_of(est);
	if (bounded_ok(ch, dev, b) && reserve_now(ch, dev, b) == 0) {
		count_bounded(ch, dev, est, b);
		*bound = b;
		return 0;
	}
	*bound = 0;
	return vh_quota_take_begin(ch, dev, est, call);
}

int vh_quota_bounded_widen(struct vh_chan *ch, int dev, uint64_t *est, uint64_t real, uint64_t *bound)
{
	if (real <= *est)
		return 0;
	if (*bound) { /* charged by bound: charge the wider one's bound */
		uint64_t nb = bound_of(real);
		if (nb > *bound) {
			if (reserve_now(ch, dev, nb - *bound))
				return -1;
			count_bounded(ch, dev, real, nb - *bound);
			*bound = nb;
		}
	} else if (!vh_meter_on(ch, dev)) { /* estimates: the difference */
		if (vh_quota_reserve(ch, dev, real - *est))
			return -1;
	} /* else measured after the call */
	*est = real;
	return 0;
}

int vh_quota_bounded_end(struct vh_chan *ch, int dev, uint64_t est, uint64_t bound, CUresult r)
{
	if (!bound)
		return vh_quota_take_end(ch, dev, est, r);
	if (r != CUDA_SUCCESS)
		vh_quota_release(ch, dev, bound);
	return 0;
}

void vh_quota_bounded_free(struct vh_chan *ch, int dev, uint64_t est)
{
	if (!vh_meter_on(ch, dev)) {
		vh_quota_release(ch, dev, est);
	} else if (est <= SMALL_MAX) {
		/* a piece of a shared page, which may stay taken: the charges keep it until the next read */
		add_ahead(ch, dev, est);
	} else if (ch->unmeasured_exact[dev] < UNMEASURED_EXACT_MAX) {
		/* whole 2 MiB pages of its own: they go back with it */
		vh_quota_release(ch, dev, est);
		ch->unmeasured_exact[dev]++;
	} else {
		vh_quota_settle(ch, dev);
	}
}
