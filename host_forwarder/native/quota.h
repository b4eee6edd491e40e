/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory quota (quota.c): where a memory refusal is decided.  Each worker (guest process) has
 * a row of charges per GPU in shared memory; their sum per GPU (`used`, in the statistics page)
 * is held under the guest's quota.  The context's own charge is made in context.c, through the
 * same calls; the measurement of what a worker really holds is meter.c's.
 */
#ifndef VH_QUOTA_H
#define VH_QUOTA_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;

/* -1 if n more bytes on dev would pass the quota (after waiting, up to a second, while a closed
 * process's charges are on their way back); else 0, and they are charged to this worker. */
int vh_quota_reserve(struct vh_chan *ch, int dev, uint64_t n);
/* As vh_quota_reserve, for a reservation made under a lock (contexts: a guest's workers make them
 * one at a time): its waits come before lock(arg) is called, so that the guest's processes refused
 * together wait side by side, not one after another; under the lock, a wait begun before goes on
 * only for what is left of it, the time the lock took not counted (one that fitted before the
 * lock and not under it, the memory taken meanwhile, waits as vh_quota_reserve does).  lock(arg)
 * has been called on return, whatever the answer. */
int vh_quota_reserve_locked(struct vh_chan *ch, int dev, uint64_t n, void (*lock)(void *), void *arg);
/* As vh_quota_reserve, but without waiting (where the caller holds what others wait on: the
 * guest's GPU gate); its own charges read first where they may be ahead of the truth. */
int vh_quota_reserve_here(struct vh_chan *ch, int dev, uint64_t n);
/* Give back n bytes reserved on dev. */
void vh_quota_release(struct vh_chan *ch, int dev, uint64_t n);
/* Replace this worker's charge on dev by what the driver says it holds (where it can say);
 * nonzero if the guest is then over its quota. */
int vh_quota_settle(struct vh_chan *ch, int dev);
/* Whether the charges on the current GPU are measurements (else they are estimates). */
int vh_quota_measured(struct vh_chan *ch);
/* What the driver takes for an allocation of n bytes (as the H100's driver rounds them). */
uint64_t vh_quota_rounded(uint64_t n);
/* After a module load: nonzero if it left the guest over its quota. */
int vh_quota_settle_load(struct vh_chan *ch);
/* A call that may take or give memory begins and ends (serve.c; partition.c's green contexts): it
 * keeps the worker's quota row to itself (quota_mu), and quota_gen is odd while it runs, so that a
 * reading of the meter begun during it, or with one begun or ended since, is not taken. */
void vh_quota_call_begin(struct vh_chan *ch);
void vh_quota_call_end(struct vh_chan *ch);
/* What may take or give memory within work for the GPU (a context made for it, a span's green
 * context made or dropped) begins a call of its own, unless the worker is in one already (quota_mu
 * is not taken twice): 1 if it began one, for vh_quota_call_end_if. */
int vh_quota_call_begin_if_out(struct vh_chan *ch);
void vh_quota_call_end_if(struct vh_chan *ch, int began);
/* A worker ends (inside a call, its contexts dropped: had_contexts if it held any): its charges go,
 * measured where the meter is on, and nothing of it is marked ahead. */
void vh_quota_worker_end(struct vh_chan *ch, int had_contexts);
/* From the worker's second thread now and then: the charges take what the driver says now
 * (memory given back at a synchronisation, module code loaded at a launch). */
void vh_quota_refresh(struct vh_chan *ch);
/* Whether another worker of the guest, refused on the charges, asked for reads since *seen (the
 * count of asks last answered: it takes the count now) while this worker's charges may be ahead of
 * the truth: then its second thread refreshes now, once an ask. */
int vh_quota_asked(struct vh_chan *ch, uint32_t *seen);

/* The steps of every call that takes device memory (alloc.c, pool.c, vmm.c, graph.c):
 *   begin:     reserve an estimate, or refuse (and report it): -1.
 *   end:       after the call, the charge takes the truth, or keeps the estimate (a failed
 *              call's is given back).  Nonzero if the call succeeded but left the guest over
 *              its quota: the caller undoes the call, then calls undo.
 *   undo:      the charge follows the undone call; reported; CUDA_ERROR_OUT_OF_MEMORY.
 *   given_back: memory went back to the driver: the charge follows (truth, or minus charge).
 *   card_full: r passed on, reported if the card itself was out of memory. */
int vh_quota_take_begin(struct vh_chan *ch, int dev, uint64_t est, const char *call);
int vh_quota_take_end(struct vh_chan *ch, int dev, uint64_t est, CUresult r);
CUresult vh_quota_take_undo(struct vh_chan *ch, int dev, uint64_t est, const char *call);
void vh_quota_given_back(struct vh_chan *ch, int dev, uint64_t charge);
CUresult vh_quota_card_full(struct vh_chan *ch, int dev, CUresult r, const char *call, uint64_t want);

/* cuMemAlloc's and cuMemFree's steps (alloc.c): the same as take_begin/take_end/given_back, but
 * where the guest is well inside its quota a call is charged what it can at most take (the
 * driver's rounding; a fresh 2 MiB page for an allocation of up to 1 MiB), and the meter is read
 * off the hot path, not after every call.  begin: -1 refused (reported); else 0, and *bound is
 * what was charged now (0: the call is measured after, as take_begin's). */
int vh_quota_bounded_begin(struct vh_chan *ch, int dev, uint64_t est, const char *call, uint64_t *bound);
/* The pitch came back wider than estimated: est becomes real (charged more, or -1: over the quota). */
int vh_quota_bounded_widen(struct vh_chan *ch, int dev, uint64_t *est, uint64_t real, uint64_t *bound);
int vh_quota_bounded_end(struct vh_chan *ch, int dev, uint64_t est, uint64_t bound, CUresult r);
void vh_quota_bounded_free(struct vh_chan *ch, int dev, uint64_t est);
/* Whether a cuMemAlloc of est bytes would take the guest near its quota on dev (within what the
 * charges may run ahead of the truth): the blocks alloc.c keeps for reuse are given back first. */
int vh_quota_near(struct vh_chan *ch, int dev, uint64_t est);

/* The guest was refused `want` bytes by `call` on dev: logged, and the operator's script run
 * (--oom-script), at most once a second per worker (oom_report.c). */
void vh_oom_report(struct vh_chan *ch, int dev, const char *call, uint64_t want);

#endif
