/* SPDX-License-Identifier: Apache-2.0 */
/*
 * IPC between the processes of one guest (api.toml: cuIpcGetMemHandle, cuIpcOpenMemHandle_v2,
 * cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle): NCCL and PyTorch's
 * multiprocessing pass these handles between a guest's processes through the guest's own means
 * (a socket, a file), and each process is served by its own worker.
 *
 * The boundary.  A guest's processes share one trust domain (DESIGN.md), so any of them may open
 * what another exported; guests do not trust each other, so a handle must open nothing in any
 * other guest.  The driver's real handle never leaves the host: it names the exporting worker's
 * memory to every process on the host that can reach the GPU, so handing it to a guest would let
 * a guest that learns it (or guesses its layout) present it elsewhere.  Instead:
 *
 *   export  the worker checks that the address is the base of a block this process took with
 *           cuMemAlloc (allocations.c: the driver's own rule is "the base of an allocation"; pool
 *           and VMM memory have their own export calls), or that the event is its own (the handle
 *           table), asks the driver for the real handle, and puts it in a table of VH_IPC_SLOTS
 *           entries in memory shared by all of this forwarder's workers (forwarder.h, struct
 *           vh_shared: mapped by the supervisor before it forks them; one forwarder serves one
 *           guest, so the table is the guest's).  The guest gets an opaque handle of its own: a
 *           magic, the kind, the slot and a random 128-bit token (getrandom), nothing else.
 *   open    another worker of the same forwarder finds the slot, compares the token in constant
 *           time, and only then gives the real handle to the driver.  A handle made by another
 *           guest's forwarder names a slot of a table this one does not have (its token is not
 *           in ours), a forged one names nothing: CUDA_ERROR_INVALID_VALUE, the driver's answer
 *           for a handle that is not one.  The mapping is recorded as the opener's own (VH_IPC in
 *           allocations.c, a span in addresses.c) so that its copies, memsets and launches may
 *           name it, and cuIpcCloseMemHandle closes only what it opened.
 *   quota   an open charges nothing to the opener: the memory is the exporter's, charged to it
 *           (both are this guest's quota: charging it twice would refuse the guest memory it does
 *           not use).  NVML is expected to count the block as the exporter's too, so that the
 *           meter's per-process reading of the opener leaves it out (to be confirmed on a GPU: the
 *           books at rest against NVML with a block open in another process).
 *   end     when the exporter frees the block (cuMemFree) or ends, its entries go from the table,
 *           so the stale handle opens nothing new; mappings already open keep the driver's
 *           semantics (the memory stays until they are closed), so an exported block is never kept
 *           for the exporter's reuse (alloc.c): its next block must not alias one still mapped.  A worker that dies without saying so is covered
 *           by the supervisor, which removes its channel's entries when it reaps it.  An event's
 *           entry lives until its process ends; a new event exported at the same host address
 *           gets a new token.
 *
 * The table's lock is process-shared and robust (a worker may die holding it); an entry is
 * marked used only after it is filled, so one a dying worker left half-written is a free slot.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "allocations.h"
#include "channel.h"
#include "ipc.h"
#include "log.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

enum { VH_IPC_FREE, VH_IPC_MEM, VH_IPC_EVENT };

/* What the guest holds: CUipcMemHandle / CUipcEventHandle's 64 bytes. */
struct guest_handle {
	char magic[8];
	uint32_t kind;
	uint32_t slot;
	uint8_t token[16];
	uint8_t zero[32];
};
_Static_assert(sizeof(struct guest_handle) == CU_IPC_HANDLE_SIZE, "a guest IPC handle is the driver's size");
static const char MAGIC[8] = "vmgpuipc";

static void table_lock(struct vh_shared *s)
{
	if (pthread_mutex_lock(&s->ipc_mu) == EOWNERDEAD)
		pthread_mutex_consistent(&s->ipc_mu); /* a worker died holding it: a half-filled entry is free */
}

/* Whether two tokens are equal, in time that does not depend on where they differ. */
static int token_equal(const uint8_t *a, const uint8_t *b)
{
	volatile uint8_t d = 0;
	for (int i = 0; i < 16; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/* Put the driver's handle real for (kind, this process, base) in the table and write the guest's
 * handle to out: the same entry (and token) for the same object and real handle, a fresh token
 * otherwise. */
static CUresult publish(struct vh_chan *ch, uint32_t kind, uint64_t base, uint64_t size, const char *real, char *out)
{
	struct vh_shared *s = ch->fwd->shared;
	struct guest_handle g = {.kind = kind};
	memcpy(g.magic, MAGIC, sizeof g.magic);
	uint8_t token[16];
	if (getrandom(token, sizeof token, 0) != (ssize_t)sizeof token)
		return CUDA_ERROR_OPERATING_SYSTEM;
	table_lock(s);
	uint32_t slot = VH_IPC_SLOTS, free_slot = VH_IPC_SLOTS;
	for (uint32_t i = 0; i < VH_IPC_SLOTS; i++) {
		struct vh_ipc_entry *e = &s->ipc[i];
		if (e->kind == kind && e->chan == ch->index && e->base == base) {
			slot = i;
			break;
		}
		if (e->kind == VH_IPC_FREE && free_slot == VH_IPC_SLOTS)
			free_slot = i;
	}
	if (slot < VH_IPC_SLOTS && memcmp(s->ipc[slot].real, real, sizeof s->ipc[slot].real) == 0) {
		memcpy(g.token, s->ipc[slot].token, sizeof g.token); /* the same handle again, as the driver's */
	} else {
		if (slot == VH_IPC_SLOTS)
			slot = free_slot;
		if (slot == VH_IPC_SLOTS) {
			static int said; /* once per process: a guest that keeps trying must not flood the log */
			pthread_mutex_unlock(&s->ipc_mu);
			if (!said++)
				vh_log("channel %u: the forwarder's IPC table is full (%u handles); exports are refused "
				       "until the guest's processes free exported blocks or end",
				       ch->index, VH_IPC_SLOTS);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		struct vh_ipc_entry *e = &s->ipc[slot];
		e->kind = VH_IPC_FREE; /* marked used only once whole */
		e->chan = ch->index;
		e->base = base;
		e->size = size;
		memcpy(e->token, token, sizeof e->token);
		memcpy(e->real, real, sizeof e->real);
		__atomic_store_n(&e->kind, kind, __ATOMIC_RELEASE);
		memcpy(g.token, token, sizeof g.token);
	}
	pthread_mutex_unlock(&s->ipc_mu);
	g.slot = slot;
	memcpy(out, &g, sizeof g);
	return CUDA_SUCCESS;
}

/* The entry a guest handle names, copied to *out: 0, or -1 if it names none of that kind. */
static int lookup(struct vh_chan *ch, uint32_t kind, const char *handle, struct vh_ipc_entry *out)
{
	struct guest_handle g;
	memcpy(&g, handle, sizeof g); /* the request's own copy: the guest cannot change it now */
	if (memcmp(g.magic, MAGIC, sizeof g.magic) != 0 || g.kind != kind || g.slot >= VH_IPC_SLOTS)
		return -1;
	struct vh_shared *s = ch->fwd->shared;
	table_lock(s);
	*out = s->ipc[g.slot];
	pthread_mutex_unlock(&s->ipc_mu);
	return out->kind == kind && token_equal(out->token, g.token) ? 0 : -1;
}

/* Make dev's context current for a call on its memory; the previous one is given back by put_ctx. */
static int take_ctx(struct vh_chan *ch, int dev)
{
	int other = dev != ch->cur_dev && dev >= 0 && ch->ctx[dev];
	if (other)
		ch->backend->cuCtxSetCurrent(ch->ctx[dev]);
	return other;
}

static void put_ctx(struct vh_chan *ch, int other)
{
	if (other)
		ch->backend->cuCtxSetCurrent(ch->cur_dev >= 0 ? ch->ctx[ch->cur_dev] : NULL);
}

CUresult guarded_cuIpcGetMemHandle(struct vh_chan *ch, CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	/* the base of a block of its own from cuMemAlloc, nothing else */
	struct vh_alloc *a = vh_alloc_find(ch, dptr, 1u << VH_MEM);
	const struct vh_span *sp = a ? vh_addr_span(ch, dptr) : NULL;
	if (!a || !sp || sp->base != dptr)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t size = sp->end - sp->base;
	CUipcMemHandle real;
	int other = take_ctx(ch, a->dev);
	CUresult r = ch->backend->cuIpcGetMemHandle(&real, dptr);
	put_ctx(ch, other);
	if (r != CUDA_SUCCESS)
		return r;
	r = publish(ch, VH_IPC_MEM, dptr, size, real.reserved, pHandle->reserved);
	if (r == CUDA_SUCCESS)
		a->exported = 1; /* (the table of records has not changed since the find) */
	return r;
}

CUresult guarded_cuIpcOpenMemHandle_v2(struct vh_chan *ch, CUdeviceptr *pdptr, CUipcMemHandle handle,
				       unsigned int Flags)
{
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct vh_ipc_entry e;
	if (lookup(ch, VH_IPC_MEM, handle.reserved, &e))
		return CUDA_ERROR_INVALID_VALUE; /* not a handle of this guest's: as the driver's answer to a bad one */
	CUipcMemHandle real;
	memcpy(real.reserved, e.real, sizeof real.reserved);
	const struct vh_backend *B = ch->backend;
	CUresult r = B->cuIpcOpenMemHandle_v2(pdptr, real, Flags);
	if (r != CUDA_SUCCESS)
		return r;
	/* the driver gives the same address for the same block opened again, and counts the opens */
	struct vh_alloc *a = vh_alloc_find(ch, *pdptr, 1u << VH_IPC);
	if (a) {
		a->ref++;
		return CUDA_SUCCESS;
	}
	/* charged to nobody here: the memory is the exporter's (see the top of this file) */
	a = vh_alloc_track(ch, *pdptr, 0, dev, VH_IPC);
	if (!a || vh_addr_add(ch, *pdptr, e.size, VH_SPAN_MEM, NULL)) {
		if (a)
			vh_alloc_untrack(ch, a);
		B->cuIpcCloseMemHandle(*pdptr);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->ref = 1;
	return CUDA_SUCCESS;
}

CUresult guarded_cuIpcCloseMemHandle(struct vh_chan *ch, CUdeviceptr dptr)
{
	struct vh_alloc *a = vh_alloc_find(ch, dptr, 1u << VH_IPC);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE; /* nothing this process opened */
	int other = take_ctx(ch, a->dev);
	CUresult r = ch->backend->cuIpcCloseMemHandle(dptr);
	put_ctx(ch, other);
	if (r != CUDA_SUCCESS)
		return r;
	if (--a->ref == 0) {
		vh_addr_remove(ch, dptr, VH_SPAN_MEM); /* from now on the address names nothing */
		vh_alloc_untrack(ch, a);
	}
	return CUDA_SUCCESS;
}

CUresult guarded_cuIpcGetEventHandle(struct vh_chan *ch, CUipcEventHandle *pHandle, CUevent event)
{
	/* event is this process's own (the generated half translated it through its handle table);
	 * the driver refuses one not made with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING */
	CUipcEventHandle real;
	CUresult r = ch->backend->cuIpcGetEventHandle(&real, event);
	if (r != CUDA_SUCCESS)
		return r;
	return publish(ch, VH_IPC_EVENT, (uint64_t)(uintptr_t)event, 0, real.reserved, pHandle->reserved);
}

CUresult guarded_cuIpcOpenEventHandle(struct vh_chan *ch, CUevent *phEvent, CUipcEventHandle handle)
{
	struct vh_ipc_entry e;
	if (lookup(ch, VH_IPC_EVENT, handle.reserved, &e))
		return CUDA_ERROR_INVALID_VALUE;
	CUipcEventHandle real;
	memcpy(real.reserved, e.real, sizeof real.reserved);
	/* the event becomes an entry of this process's handle table (the generated half) */
	return ch->backend->cuIpcOpenEventHandle(phEvent, real);
}

/* ---- what goes from the table ----------------------------------------------------------- */

static void forget(struct vh_shared *s, uint32_t chan, uint32_t kind, uint64_t base, int all)
{
	table_lock(s);
	for (uint32_t i = 0; i < VH_IPC_SLOTS; i++) {
		struct vh_ipc_entry *e = &s->ipc[i];
		if (e->kind != VH_IPC_FREE && e->chan == chan && (all || (e->kind == kind && e->base == base)))
			memset(e, 0, sizeof *e);
	}
	pthread_mutex_unlock(&s->ipc_mu);
}

void vh_ipc_unexport(struct vh_chan *ch, uint64_t base)
{
	forget(ch->fwd->shared, ch->index, VH_IPC_MEM, base, 0);
}

void vh_ipc_forget_channel(struct vh_fwd *f, uint32_t chan)
{
	forget(f->shared, chan, VH_IPC_FREE, 0, 1);
}

void vh_ipc_release_all(struct vh_chan *ch)
{
	vh_ipc_forget_channel(ch->fwd, ch->index);
	for (size_t i = 0; i < ch->nallocs; i++) {
		const struct vh_alloc *a = &ch->allocs[i];
		if (a->kind != VH_IPC || a->dev < 0 || !ch->ctx[a->dev])
			continue;
		ch->backend->cuCtxSetCurrent(ch->ctx[a->dev]);
		for (uint64_t n = 0; n < a->ref; n++)
			ch->backend->cuIpcCloseMemHandle(a->base);
	}
}
