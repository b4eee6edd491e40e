/* SPDX-License-Identifier: Apache-2.0 */
/*
 * IPC between the processes of one guest (ipc.c): the forwarder's table of exported handles,
 * shared by its workers, and what a process's end or a block's free takes out of it.
 */
#ifndef VH_IPC_H
#define VH_IPC_H

#include <stdint.h>

struct vh_chan;
struct vh_fwd;

/* A block (its base) or a VMM handle (the driver's) of this process is no longer its own: what it
 * exported opens nothing new. */
void vh_ipc_unexport(struct vh_chan *ch, uint64_t base);
/* The process ends: its exported handles go from the table, and the mappings it opened are closed
 * (before its contexts go). */
void vh_ipc_release_all(struct vh_chan *ch);
/* The supervisor's backstop, for a worker that could not say so itself: every handle channel
 * chan exported goes from the table. */
void vh_ipc_forget_channel(struct vh_fwd *f, uint32_t chan);

/* What slot of the table holds for token: no VMM handle's entry, one being exported (by channel
 * *chan), or an exported one. */
enum { VH_IPC_VMM_NONE, VH_IPC_VMM_PENDING, VH_IPC_VMM_READY };
int vh_ipc_vmm_state(struct vh_fwd *f, uint32_t slot, const uint8_t token[16], uint32_t *chan);
/* Every slot's VMM state and token at one moment (one pass under the table's lock): view has
 * VH_IPC_SLOTS entries. */
struct vh_ipc_vmm_view {
	uint32_t state;
	uint8_t token[16];
};
void vh_ipc_vmm_view(struct vh_fwd *f, struct vh_ipc_vmm_view *view);

#endif
