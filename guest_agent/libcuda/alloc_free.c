/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuMemAlloc and cuMemFree in the guest.  The driver's free of memory that this process's
 * cuMemAlloc gave, and that nothing has freed since, cannot fail; such a free is sent without
 * waiting for its reply (the host frees it before anything sent after it, so the memory is back
 * for the next allocation).  Any other pointer's free crosses and waits, so that the driver's
 * answer for a pointer that is not a live allocation stays immediate.  Programs that allocate and
 * free per step (and cuBLAS, cuDNN and XLA's autotuner for their workspaces) pay one round trip
 * for the pair instead of two.
 *
 * The host checks every free as before (host_forwarder/native/alloc.c): this set only decides
 * whether the guest waits for the answer.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "call.h"
#include "vg_guest_protos.h"

#define TOMB 1u /* a slot whose pointer was freed (0: never used); no allocation is at 0 or 1 */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *slot;
static size_t cap, used, tombs; /* cap: a power of two */

static size_t hash(uint64_t p)
{
	return (size_t)((p >> 9) * 0x9E3779B97F4A7C15ull);
}

static int insert_locked(uint64_t p);

static int grow_locked(void)
{
	uint64_t *old = slot;
	size_t oldcap = cap;
	size_t ncap = cap ? (used * 4 > cap ? cap * 2 : cap) : 256;
	uint64_t *n = calloc(ncap, sizeof *n);
	if (!n)
		return -1;
	slot = n;
	cap = ncap;
	used = tombs = 0;
	for (size_t i = 0; i < oldcap; i++)
		if (old[i] > TOMB)
			insert_locked(old[i]);
	free(old);
	return 0;
}

static int insert_locked(uint64_t p)
{
	if ((used + tombs + 1) * 2 > cap && grow_locked())
		return -1;
	size_t i = hash(p) & (cap - 1);
	while (slot[i] > TOMB) {
		if (slot[i] == p)
			return 0;
		i = (i + 1) & (cap - 1);
	}
	if (slot[i] == TOMB)
		tombs--;
	slot[i] = p;
	used++;
	return 0;
}

/* Forget p; nonzero if it was a live allocation of this process. */
static int take(uint64_t p)
{
	int found = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = cap ? hash(p) & (cap - 1) : 0, n = 0; cap && slot[i] && n < cap; i = (i + 1) & (cap - 1), n++) {
		if (slot[i] == p) {
			slot[i] = TOMB;
			used--;
			tombs++;
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return found;
}

static void remember(uint64_t p)
{
	if (p <= TOMB)
		return;
	pthread_mutex_lock(&mu);
	insert_locked(p); /* out of memory: its free will wait for the answer, as any other's */
	pthread_mutex_unlock(&mu);
}

CUresult handwritten_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize, unsigned f)
{
	CUresult r = forward_cuMemAlloc_v2(dptr, bytesize, f);
	if (r == CUDA_SUCCESS && dptr)
		remember(*dptr);
	return r;
}

CUresult handwritten_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
					unsigned int ElementSizeBytes, unsigned f)
{
	CUresult r = forward_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, f);
	if (r == CUDA_SUCCESS && dptr)
		remember(*dptr);
	return r;
}

CUresult handwritten_cuMemFree_v2(CUdeviceptr dptr, unsigned f)
{
	if (!take(dptr))
		return forward_cuMemFree_v2(dptr, f); /* not known live here: the host answers */
	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_cuMemFree_v2, f);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put(&c, &dptr, sizeof dptr);
	return vg_send_async(&c);
}

CUresult handwritten_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream, unsigned f)
{
	take(dptr); /* a stream-ordered free of cuMemAlloc's memory: not live for cuMemFree after it */
	return forward_cuMemFreeAsync(dptr, hStream, f);
}
