/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a guest address is checked (addresses.c): the device address ranges a guest process may
 * name in a copy, a memset or a query: its allocations, its VMM mappings and the globals of its
 * modules.  Kept sorted by base and never overlapping, so an address is found in O(log n).
 */
#ifndef VH_ADDRESSES_H
#define VH_ADDRESSES_H

#include <stdint.h>

struct vh_chan;

enum vh_span_kind { VH_SPAN_MEM, VH_SPAN_MAP, VH_SPAN_GLOBAL };
struct vh_span {
	uint64_t base, end; /* [base, end) */
	void *owner;        /* a global's module or library (host object); NULL otherwise */
	int kind;
};

/* 0 if [addr, addr+n) lies inside this process's own device memory (one allocation or module
 * global, or VMM mappings back to back); -1 otherwise, and for a range that wraps.  n == 0
 * names nothing: only 0 or an address inside (or just past) one of its objects. */
int vh_addr_ok(struct vh_chan *ch, uint64_t addr, uint64_t n);
/* The same for count elements of elsz bytes. */
int vh_dev_range(struct vh_chan *ch, uint64_t addr, uint64_t count, uint64_t elsz);
/* Whether addr lies inside one of its objects. */
int vh_addr_owned(struct vh_chan *ch, uint64_t addr);
/* The object of this process that addr lies in, or NULL (valid until its table next changes). */
const struct vh_span *vh_addr_span(const struct vh_chan *ch, uint64_t addr);

/* A range the process may now name (the same global again is fine); -1 if it would overlap
 * another, wraps, is empty, or there is no memory for it. */
int vh_addr_add(struct vh_chan *ch, uint64_t base, uint64_t size, int kind, void *owner);
/* The range at base of that kind names nothing from now on. */
void vh_addr_remove(struct vh_chan *ch, uint64_t base, int kind);
/* A module or library went, and its globals with it. */
void vh_addr_forget_owner(struct vh_chan *ch, void *owner);

#endif
