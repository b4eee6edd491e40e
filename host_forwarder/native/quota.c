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
 * Where no per-process measurement exists (NVML without per-process accounting, as under
 * MIG), the estimates are the charges: each allocation is charged its rounded size until
 * freed, and every context a flat reserve (--ctx-reserve).
 *
 * A worker's row lives in shared memory so that the supervisor returns its charges when
 * the worker ends, however it ends.
 */
#include "channel.h"
#include "meter.h"
#include "quota.h"

uint64_t vh_quota_rounded(uint64_t n)
{
	/* as the H100's driver takes them: up to 1 MiB in 64 KiB pieces of shared 2 MiB pages,
	 * above that whole 2 MiB pages */
	uint64_t unit = n <= (1u << 20) ? (64u << 10) : (2u << 20);
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

static int reserve_now(struct vh_chan *ch, int dev, uint64_t n)
{
	struct vh_fwd *f = ch->fwd;
	_Atomic uint64_t *used = &f->used[dev];
	uint64_t cur = atomic_load(used);
	do {
		if (n > f->quota[dev] || cur > f->quota[dev] - n)
			return -1;
	} while (!atomic_compare_exchange_weak(used, &cur, cur + n));
	atomic_fetch_add(&ch->charged[dev], n);
	return 0;
}

/* A guest process that starts as another ends must not be refused the memory the other is
 * giving back: a reservation that does not fit waits (up to a second) while such memory is
 * on its way, as natively a process's memory is free once it has exited. */
int vh_quota_reserve(struct vh_chan *ch, int dev, uint64_t n)
{
	const struct vh_clock *clock = ch->fwd->clock;
	uint64_t deadline = 0;
	for (;;) {
		if (reserve_now(ch, dev, n) == 0)
			return 0;
		if (!returns_pending(ch, dev))
			return -1;
		uint64_t now = clock->now_ns();
		if (!deadline)
			deadline = now + 1000000000ull;
		else if (now >= deadline)
			return -1;
		clock->sleep_ns(1000000);
	}
}

void vh_quota_release(struct vh_chan *ch, int dev, uint64_t n)
{
	atomic_fetch_sub(&ch->fwd->used[dev], n);
	atomic_fetch_sub(&ch->charged[dev], n);
}

int vh_quota_settle(struct vh_chan *ch, int dev)
{
	struct vh_fwd *f = ch->fwd;
	int64_t truth = vh_meter_read(ch, dev);
	if (truth >= 0) {
		uint64_t old = atomic_exchange(&ch->charged[dev], (uint64_t)truth);
		atomic_fetch_add(&f->used[dev], (uint64_t)truth - old); /* modular: a decrease too */
	}
	return atomic_load(&f->used[dev]) > f->quota[dev];
}

void vh_quota_refresh(struct vh_chan *ch)
{
	if (pthread_mutex_trylock(&ch->quota_mu) != 0)
		return; /* a call is taking memory: it settles itself */
	for (int d = 0; d < ch->fwd->ndev; d++)
		if (ch->ctx[d])
			vh_quota_settle(ch, d);
	pthread_mutex_unlock(&ch->quota_mu);
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
