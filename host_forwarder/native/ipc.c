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
 *           charges at rest against NVML with a block open in another process).
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

#include <unistd.h>

#include "allocations.h"
#include "channel.h"
#include "context.h"
#include "fd_broker.h"
#include "ipc.h"
#include "quota.h"
#include "log.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

enum { VH_IPC_FREE, VH_IPC_MEM, VH_IPC_EVENT, VH_IPC_VMM, VH_IPC_VMM_PEND };

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

/* Under the table's lock: the slot of this process's entry of kind for base, with *found set, or
 * else the first free slot; VH_IPC_SLOTS when there is neither. */
static uint32_t find_slot(const struct vh_shared *s, uint32_t kind, uint32_t chan, uint64_t base, int *found)
{
	uint32_t free_slot = VH_IPC_SLOTS;
	*found = 0;
	for (uint32_t i = 0; i < VH_IPC_SLOTS; i++) {
		const struct vh_ipc_entry *e = &s->ipc[i];
		if (e->kind == kind && e->chan == chan && e->base == base) {
			*found = 1;
			return i;
		}
		if (e->kind == VH_IPC_FREE && free_slot == VH_IPC_SLOTS)
			free_slot = i;
	}
	return free_slot;
}

/* An export refused because the table is full (said once per worker: a guest that keeps trying
 * must not flood the log). */
static CUresult table_full(struct vh_chan *ch)
{
	static int said;
	if (!said++)
		vh_log("channel %u: the forwarder's IPC table is full (%u handles); exports are refused until the "
		       "guest's processes free exported memory or end",
		       ch->index, VH_IPC_SLOTS);
	return CUDA_ERROR_OUT_OF_MEMORY;
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
	int found;
	uint32_t slot = find_slot(s, kind, ch->index, base, &found);
	if (found && memcmp(s->ipc[slot].real, real, sizeof s->ipc[slot].real) == 0) {
		memcpy(g.token, s->ipc[slot].token, sizeof g.token); /* the same handle again, as the driver's */
	} else {
		if (slot == VH_IPC_SLOTS) {
			pthread_mutex_unlock(&s->ipc_mu);
			return table_full(ch);
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
		vh_context_back(ch);
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

/* ---- VMM handles as file descriptors ---------------------------------------------------
 *
 * cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR) gives the exporting worker a descriptor
 * for the handle's memory.  It never goes to the guest: the worker gives it to its supervisor
 * (fd_broker.c), which holds it under the entry's slot, and answers the guest an opaque handle
 * as for IPC (magic, kind, slot, random token), which the guest library puts in a file of its own.
 * An import presents that handle: another worker of this forwarder checks the entry and its
 * token, gets a copy of the descriptor from the supervisor, and only then calls the driver.
 *
 *   export  only a handle this process holds (cuMemCreate with requestedHandleTypes =
 *           POSIX_FILE_DESCRIPTOR, or one it imported), once: a second export of the same handle
 *           answers the same token.  The entry is pending while the supervisor takes the
 *           descriptor (an import cannot find a pending entry), exported after.
 *   import  charged to the importer like a cuMemCreate of the handle's size: an imported handle
 *           keeps the memory alive on its own, after the exporter lets go of it (the driver's
 *           semantics), so a block both hold counts twice, never less than it is.  Where the
 *           driver is measured (a GPU with NVML), the charge is the measurement.  Measured on an
 *           H100 (driver 580): NVML counts the block to its creator while the creator holds it,
 *           and to the importer once the creator has released it or ended; each import (of the
 *           same descriptor again, or of the process's own export) gives a new driver handle, so
 *           vh_vmm_hold's "a handle it holds already" serves only a backend that answers otherwise.
 *   end     when the exporter releases its last hold of the handle, or ends, the entry goes and
 *           the supervisor closes its descriptor: the handle imports nothing new (stricter than
 *           the driver, whose descriptor outlives the handle; NCCL exports and imports while
 *           both hold it).  Imported handles already held keep their memory until released.
 */

static uint32_t vmm_state(uint32_t kind)
{
	return kind == VH_IPC_VMM ? VH_IPC_VMM_READY : kind == VH_IPC_VMM_PEND ? VH_IPC_VMM_PENDING : VH_IPC_VMM_NONE;
}

int vh_ipc_vmm_state(struct vh_fwd *f, uint32_t slot, const uint8_t token[16], uint32_t *chan)
{
	if (slot >= VH_IPC_SLOTS)
		return VH_IPC_VMM_NONE;
	struct vh_shared *s = f->shared;
	table_lock(s);
	struct vh_ipc_entry e = s->ipc[slot];
	pthread_mutex_unlock(&s->ipc_mu);
	if (!token_equal(e.token, token))
		return VH_IPC_VMM_NONE;
	*chan = e.chan;
	return vmm_state(e.kind);
}

void vh_ipc_vmm_view(struct vh_fwd *f, struct vh_ipc_vmm_view *view)
{
	struct vh_shared *s = f->shared;
	table_lock(s);
	for (uint32_t i = 0; i < VH_IPC_SLOTS; i++) {
		view[i].state = vmm_state(s->ipc[i].kind);
		memcpy(view[i].token, s->ipc[i].token, sizeof view[i].token);
	}
	pthread_mutex_unlock(&s->ipc_mu);
}

/* The handle types asked for: a descriptor, or the driver's answer on a GPU without the type. */
static CUresult share_type(uint64_t type)
{
	if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_SUCCESS;
	return type == CU_MEM_HANDLE_TYPE_FABRIC ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}

static void slot_free(struct vh_shared *s, uint32_t slot, const uint8_t *token)
{
	table_lock(s);
	if (token_equal(s->ipc[slot].token, token))
		memset(&s->ipc[slot], 0, sizeof s->ipc[slot]);
	pthread_mutex_unlock(&s->ipc_mu);
}

/* Export a's handle: the guest's handle in out. */
static CUresult vmm_publish(struct vh_chan *ch, struct vh_alloc *a, char *out)
{
	struct vh_shared *s = ch->fwd->shared;
	struct guest_handle g = {.kind = VH_IPC_VMM};
	memcpy(g.magic, MAGIC, sizeof g.magic);
	uint8_t fresh[16];
	if (getrandom(fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh)
		return CUDA_ERROR_OPERATING_SYSTEM;
	table_lock(s);
	int found;
	uint32_t slot = find_slot(s, VH_IPC_VMM, ch->index, a->base, &found);
	if (found) {
		memcpy(g.token, s->ipc[slot].token, sizeof g.token); /* exported before: the same handle again */
		pthread_mutex_unlock(&s->ipc_mu);
	} else {
		memcpy(g.token, fresh, sizeof g.token);
		if (slot == VH_IPC_SLOTS) {
			pthread_mutex_unlock(&s->ipc_mu);
			return table_full(ch);
		}
		struct vh_ipc_entry *e = &s->ipc[slot];
		*e = (struct vh_ipc_entry){.chan = ch->index, .base = a->base, .size = a->size, .dev = a->dev};
		memcpy(e->token, g.token, sizeof e->token);
		__atomic_store_n(&e->kind, VH_IPC_VMM_PEND, __ATOMIC_RELEASE); /* not importable yet */
		pthread_mutex_unlock(&s->ipc_mu);
		int fd = -1;
		CUresult r = ch->backend->cuMemExportToShareableHandle(&fd, a->base, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		if (r != CUDA_SUCCESS || fd < 0) {
			slot_free(s, slot, g.token);
			return r != CUDA_SUCCESS ? r : CUDA_ERROR_OPERATING_SYSTEM;
		}
		int put = vh_broker_put(ch->fwd->broker, slot, g.token, fd);
		close(fd); /* the supervisor has its own copy now, or none */
		if (put != 0) {
			slot_free(s, slot, g.token);
			if (put == VH_BROKER_FULL) /* as a full table: the supervisor's open files are spent */
				return CUDA_ERROR_OUT_OF_MEMORY;
			vh_log("channel %u: the supervisor did not take an exported VMM handle's descriptor", ch->index);
			return CUDA_ERROR_OPERATING_SYSTEM;
		}
		table_lock(s);
		if (s->ipc[slot].kind == VH_IPC_VMM_PEND && token_equal(s->ipc[slot].token, g.token))
			__atomic_store_n(&s->ipc[slot].kind, VH_IPC_VMM, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&s->ipc_mu);
		a->exported = 1; /* its entry goes when the handle does (allocations.c, vmm.c) */
	}
	g.slot = slot;
	memcpy(out, &g, sizeof g);
	return CUDA_SUCCESS;
}

/* (u64 guest handle, u64 handle type, u64 flags) -> the guest's 64-byte handle */
CUresult handwritten_cuMemExportToShareableHandle(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t guest = vh_get_u64(rd), type = vh_get_u64(rd), fl = vh_get_u64(rd);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = share_type(type);
	if (r != CUDA_SUCCESS)
		return r;
	if (fl)
		return CUDA_ERROR_INVALID_VALUE;
	struct vh_alloc *a = vh_alloc_find_vmm(ch, guest, 1u << VH_VMM);
	if (!a || !a->shareable)
		return CUDA_ERROR_INVALID_VALUE; /* none of its handles, or one made not to be shared */
	char out[sizeof(struct guest_handle)];
	if ((r = vmm_publish(ch, a, out)) != CUDA_SUCCESS)
		return r;
	vh_put(wr, out, sizeof out);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* (u64 handle type, the guest's 64-byte handle) -> u64 the new handle's number */
CUresult handwritten_cuMemImportFromShareableHandle(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t type = vh_get_u64(rd);
	char h[sizeof(struct guest_handle)];
	vh_get(rd, h, sizeof h);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = share_type(type);
	if (r != CUDA_SUCCESS)
		return r;
	struct vh_ipc_entry e;
	if (lookup(ch, VH_IPC_VMM, h, &e) || e.dev < 0 || e.dev >= ch->fwd->ndev || e.size == 0)
		return CUDA_ERROR_INVALID_VALUE; /* not a handle of this guest's */
	uint32_t slot;
	memcpy(&slot, h + offsetof(struct guest_handle, slot), sizeof slot);
	int fd = vh_broker_get(ch->fwd->broker, slot, e.token);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE; /* it went meanwhile */
	const struct vh_backend *B = ch->backend;
	if (vh_quota_take_begin(ch, e.dev, e.size, "cuMemImportFromShareableHandle")) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUmemGenericAllocationHandle real = 0;
	r = B->cuMemImportFromShareableHandle(&real, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	int again = 0;
	struct vh_alloc *a = NULL;
	if (r == CUDA_SUCCESS && !(a = vh_vmm_hold(ch, real, e.size, e.dev, 1, &again))) {
		B->cuMemRelease(real);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (again) /* a handle it holds already: held once more, charged once */
		(void)vh_quota_take_end(ch, e.dev, e.size, CUDA_ERROR_ALREADY_MAPPED);
	else if (vh_quota_take_end(ch, e.dev, e.size, r)) {
		vh_vmm_drop(ch, a);
		return vh_quota_take_undo(ch, e.dev, e.size, "cuMemImportFromShareableHandle");
	}
	if (r != CUDA_SUCCESS)
		return vh_quota_card_full(ch, e.dev, r, "cuMemImportFromShareableHandle", e.size);
	uint64_t v = a->guest;
	vh_put(wr, &v, sizeof v);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
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
	forget(ch->fwd->shared, ch->index, VH_IPC_VMM, base, 0);
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
