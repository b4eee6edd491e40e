/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuMemAlloc and cuMemFree in front of their generated calls.  The guest library remembers the
 * blocks cuMemAlloc gave this process, so that cuMemFree of one of them is sent without waiting
 * for the answer (it cannot fail but for a broken context, whose error the next call that
 * reports asynchronous errors returns, as after a launch).  A free of anything else (a double
 * free, an address of another kind) makes the round trip and gets the driver's answer.  The
 * host checks every free as before: this set is the guest's own bookkeeping, not a boundary.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "call.h"
#include "context.h"
#include "vg_guest.h"
#include "vg_guest_protos.h"

/* open addressing, linear probing, deletion by backward shift; 0 is the empty slot */
static uint64_t *slots;
static size_t cap, used;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t home(uint64_t p, size_t c)
{
	p ^= p >> 29;
	p *= 0xbf58476d1ce4e5b9ull;
	return (size_t)(p ^ p >> 32) & (c - 1);
}

static void put_slot(uint64_t *s, size_t c, uint64_t p)
{
	size_t i = home(p, c);
	while (s[i] && s[i] != p)
		i = (i + 1) & (c - 1);
	s[i] = p;
}

static void remember(uint64_t p)
{
	pthread_mutex_lock(&mu);
	if ((used + 1) * 2 > cap) {
		size_t nc = cap ? cap * 2 : 256;
		uint64_t *ns = calloc(nc, sizeof *ns);
		if (!ns) { /* not remembered: its free makes the round trip */
			pthread_mutex_unlock(&mu);
			return;
		}
		for (size_t i = 0; i < cap; i++)
			if (slots[i])
				put_slot(ns, nc, slots[i]);
		free(slots);
		slots = ns;
		cap = nc;
	}
	size_t i = home(p, cap);
	while (slots[i] && slots[i] != p)
		i = (i + 1) & (cap - 1);
	used += !slots[i];
	slots[i] = p;
	pthread_mutex_unlock(&mu);
}

/* 1 if p was remembered (and is no longer). */
static int forget(uint64_t p)
{
	pthread_mutex_lock(&mu);
	if (!cap) {
		pthread_mutex_unlock(&mu);
		return 0;
	}
	size_t i = home(p, cap);
	while (slots[i] && slots[i] != p)
		i = (i + 1) & (cap - 1);
	if (!slots[i]) {
		pthread_mutex_unlock(&mu);
		return 0;
	}
	slots[i] = 0;
	used--;
	for (size_t j = (i + 1) & (cap - 1); slots[j]; j = (j + 1) & (cap - 1)) {
		size_t h = home(slots[j], cap);
		/* move slots[j] into the hole at i if its home is not in (i, j] (cyclically) */
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
			slots[i] = slots[j];
			slots[j] = 0;
			i = j;
		}
	}
	pthread_mutex_unlock(&mu);
	return 1;
}

/* A forked child connects afresh (connection.c): its parent's blocks are not its own, and a free
 * of one must make the round trip and be refused there and then.  The lock is held across the
 * fork so that the child finds the set whole. */
static void before_fork(void)
{
	pthread_mutex_lock(&mu);
}

static void parent_after_fork(void)
{
	pthread_mutex_unlock(&mu);
}

static void child_after_fork(void)
{
	free(slots);
	slots = NULL;
	cap = used = 0;
	pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void device_memory_ctor(void)
{
	pthread_atfork(before_fork, parent_after_fork, child_after_fork);
}

CUresult handwritten_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize, unsigned f)
{
	CUresult r = forward_cuMemAlloc_v2(dptr, bytesize, f);
	if (r == CUDA_SUCCESS && dptr && *dptr)
		remember(*dptr);
	return r;
}

CUresult handwritten_cuMemFree_v2(CUdeviceptr dptr, unsigned f)
{
	if (!dptr || vg_current_device() < 0 || !forget(dptr))
		return forward_cuMemFree_v2(dptr, f);
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuMemFree_v2, f);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put(&c, &dptr, sizeof dptr);
	return vg_send_async(&c);
}
