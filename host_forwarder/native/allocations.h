/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a guest process holds that its quota follows (allocations.c): each allocation, array,
 * VMM handle and mapping, graph with memory nodes and reserved address range, with what it is
 * charged.  A guest may free, map or destroy only what is recorded here as its own.
 */
#ifndef VH_ALLOCATIONS_H
#define VH_ALLOCATIONS_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;

enum vh_alloc_kind {
	VH_MEM,          /* cuMemAlloc, cuMemAllocPitch: base is the address */
	VH_MEM_ASYNC,    /* stream-ordered, from a pool */
	VH_VMM,          /* cuMemCreate: base is the handle */
	VH_VMM_RELEASED, /* released but still mapped: its memory stays */
	VH_VMM_MAP,      /* a mapping at base of size bytes of handle ref */
	VH_ARRAY,        /* base is the host CUarray */
	VH_GRAPH,        /* an executable graph with memory nodes: base is the host CUgraphExec */
	VH_VA,           /* a virtual address range reserved for VMM mappings: base, size bytes */
	VH_IPC,          /* another process's block mapped by cuIpcOpenMemHandle (ipc.c): ref opens,
			  * size 0 (the exporter's charge, not this process's) */
};
struct vh_alloc {
	CUdeviceptr base;
	uint64_t size; /* what it is charged where the driver cannot be measured (VH_VA: its length) */
	uint64_t ref;
	uint64_t guest; /* VH_VMM, VH_VMM_RELEASED: the value the guest knows the handle by */
	int dev, kind;
	int exported; /* VH_MEM, VH_VMM: its IPC handle is in the forwarder's table (ipc.c) */
	uint64_t holds; /* VH_VMM: the guest's holds of the handle (cuMemCreate or an import, and
			 * each cuMemRetainAllocationHandle), each given back by a cuMemRelease */
	int shareable;  /* VH_VMM: may be exported as a file descriptor */
};

/* A new record, or NULL if there is no memory for it. */
struct vh_alloc *vh_alloc_track(struct vh_chan *ch, CUdeviceptr base, uint64_t size, int dev, int kind);
/* The record of base among the kinds in the mask (1 << kind), or NULL. */
struct vh_alloc *vh_alloc_find(struct vh_chan *ch, uint64_t base, unsigned kinds);
/* A VMM handle by the value the guest knows it by, or NULL. */
struct vh_alloc *vh_alloc_find_vmm(struct vh_chan *ch, uint64_t guest, unsigned kinds);
/* Whether [p, p+n) lies inside one virtual address range this process reserved. */
int vh_alloc_in_reserved(struct vh_chan *ch, uint64_t p, uint64_t n);
/* Forget a record (a is no longer valid, nor any pointer into the table); an exported block's IPC
 * handle opens nothing from now on. */
void vh_alloc_untrack(struct vh_chan *ch, struct vh_alloc *a);
/* The driver took a record's memory back: forget it, and the quota follows. */
void vh_alloc_release(struct vh_chan *ch, struct vh_alloc *a);

/* vmm.c: a VMM handle the driver gave this process (made or imported), recorded under a new number
 * of the guest's; or, if this process holds it already (*again set), held once more.  NULL if
 * there is no memory for the record. */
struct vh_alloc *vh_vmm_hold(struct vh_chan *ch, uint64_t real, uint64_t size, int dev, int shareable, int *again);
/* Undo a handle just recorded by vh_vmm_hold: the driver's handle released, the record gone. */
void vh_vmm_drop(struct vh_chan *ch, struct vh_alloc *a);

#endif
