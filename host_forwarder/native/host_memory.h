/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host memory a guest names (host_memory.c): an offset in its region's heap, a position in its
 * channel's bulk area, or its own address of pinned memory (the region mapped again at the
 * guest's address, for kernels).  Every one is checked against the region; a host address of
 * the worker is never taken from the guest nor given to it.
 */
#ifndef VH_HOST_MEMORY_H
#define VH_HOST_MEMORY_H

#include <stdint.h>

struct vh_chan;

/* The worker's address of a guest-named host buffer (kind VG_BUF_HEAP: offset a; VG_BUF_BULK:
 * position a) of n bytes, or NULL if it is not inside the heap or the bulk area. */
void *vh_host_buf(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n);
/* The call is done with it (bulk space is reused). */
void vh_host_buf_done(struct vh_chan *ch, uint64_t kind, uint64_t a, uint64_t n);
/* The region's offset of an address inside its mapping at the guest's own address, or UINT64_MAX. */
uint64_t vh_alias_offset(struct vh_chan *ch, uint64_t addr);

#endif
