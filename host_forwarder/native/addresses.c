/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a guest address is checked: the device addresses a guest process may name (addresses.h).
 *
 * Every address a guest gives is resolved here before the driver sees it (DESIGN.md, the
 * trust boundary, rule 2).  With unified addressing the driver takes any address of the
 * worker for host memory, so an address that is not one of this process's own objects
 * would be a read or write of the worker itself.  The table is per guest process (one
 * worker each), sorted by base; a lookup is a binary search, so the check on every copy
 * and memset costs O(log n) however many allocations a program holds.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "addresses.h"
#include "channel.h"
#include "log.h"

/* The index of the last span whose base is <= addr, or -1. */
static ptrdiff_t span_at(const struct vh_chan *ch, uint64_t addr)
{
	size_t lo = 0, hi = ch->nspans;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ch->spans[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (ptrdiff_t)lo - 1;
}

int vh_addr_add(struct vh_chan *ch, uint64_t base, uint64_t size, int kind, void *owner)
{
	uint64_t end;
	if (size == 0 || __builtin_add_overflow(base, size, &end))
		return -1;
	ptrdiff_t i = span_at(ch, base);
	if (i >= 0 && ch->spans[i].base == base && ch->spans[i].end == end && ch->spans[i].kind == kind &&
	    ch->spans[i].owner == owner)
		return 0; /* the same global asked for again */
	/* the driver never hands out overlapping live objects; refuse rather than trust it */
	if ((i >= 0 && ch->spans[i].end > base) || ((size_t)(i + 1) < ch->nspans && ch->spans[i + 1].base < end))
		return -1;
	if (ch->nspans == ch->capspans) {
		size_t cap = ch->capspans ? ch->capspans * 2 : 64;
		struct vh_span *p = realloc(ch->spans, cap * sizeof *p);
		if (!p)
			return -1;
		ch->spans = p;
		ch->capspans = cap;
	}
	size_t at = (size_t)(i + 1);
	memmove(&ch->spans[at + 1], &ch->spans[at], (ch->nspans - at) * sizeof *ch->spans);
	ch->spans[at] = (struct vh_span){.base = base, .end = end, .owner = owner, .kind = kind};
	ch->nspans++;
	return 0;
}

void vh_addr_remove(struct vh_chan *ch, uint64_t base, int kind)
{
	ptrdiff_t i = span_at(ch, base);
	if (i < 0 || ch->spans[i].base != base || ch->spans[i].kind != kind)
		return;
	memmove(&ch->spans[i], &ch->spans[i + 1], (ch->nspans - (size_t)i - 1) * sizeof *ch->spans);
	ch->nspans--;
}

void vh_addr_forget_owner(struct vh_chan *ch, void *owner)
{
	size_t k = 0;
	for (size_t i = 0; i < ch->nspans; i++)
		if (ch->spans[i].kind != VH_SPAN_GLOBAL || ch->spans[i].owner != owner)
			ch->spans[k++] = ch->spans[i];
	ch->nspans = k;
}

int vh_addr_owned(struct vh_chan *ch, uint64_t addr)
{
	ptrdiff_t i = span_at(ch, addr);
	return i >= 0 && addr < ch->spans[i].end;
}

const struct vh_span *vh_addr_span(const struct vh_chan *ch, uint64_t addr)
{
	ptrdiff_t i = span_at(ch, addr);
	return i >= 0 && addr < ch->spans[i].end ? &ch->spans[i] : NULL;
}

static int refused(const struct vh_chan *ch, uint64_t addr, uint64_t n, ptrdiff_t i)
{
	if (vh_tracing_errors()) { /* where a program's address was refused, and the object nearest below it */
		if (i >= 0)
			vh_log("channel %u: refused the range [%#llx, +%llu): the nearest object below it is "
			       "[%#llx, %#llx) (kind %d)", ch->index, (unsigned long long)addr, (unsigned long long)n,
			       (unsigned long long)ch->spans[i].base, (unsigned long long)ch->spans[i].end, ch->spans[i].kind);
		else
			vh_log("channel %u: refused the range [%#llx, +%llu): no object of this process is below it",
			       ch->index, (unsigned long long)addr, (unsigned long long)n);
	}
	return -1;
}

/* Pinned memory of the region's heap at the guest's own address (the region mapped again there,
 * host_memory.c): with unified addressing that is also its device address, which a program may
 * give a memset or a copy as it would a device pointer (XLA does).  The heap only: never the
 * region's rings or bulk areas. */
static int in_heap_alias(const struct vh_chan *ch, uint64_t addr, uint64_t end)
{
	const struct vh_fwd *f = ch->fwd;
	uint64_t base = (uint64_t)(uintptr_t)ch->alias;
	if (!ch->alias || addr < base || addr - base < f->heap_off || f->heap_size == 0)
		return 0;
	return end - base <= f->heap_off + f->heap_size;
}

int vh_addr_ok(struct vh_chan *ch, uint64_t addr, uint64_t n)
{
	uint64_t end;
	if (__builtin_add_overflow(addr, n, &end))
		return -1; /* a range that wraps names nothing of anyone's */
	ptrdiff_t i = span_at(ch, addr);
	if (n == 0)
		return addr == 0 || (i >= 0 && addr <= ch->spans[i].end) ? 0 : -1;
	if (i < 0 || addr >= ch->spans[i].end)
		return in_heap_alias(ch, addr, end) ? 0 : refused(ch, addr, n, i);
	/* inside one object; VMM mappings placed back to back (an expandable segment) count as one */
	for (ptrdiff_t first = i; end > ch->spans[i].end; i++)
		if (ch->spans[i].kind != VH_SPAN_MAP || (size_t)(i + 1) >= ch->nspans ||
		    ch->spans[i + 1].kind != VH_SPAN_MAP || ch->spans[i + 1].base != ch->spans[i].end)
			return refused(ch, addr, n, first);
	return 0;
}

int vh_dev_range(struct vh_chan *ch, uint64_t addr, uint64_t count, uint64_t elsz)
{
	uint64_t n;
	if (__builtin_mul_overflow(count, elsz, &n))
		return -1;
	return vh_addr_ok(ch, addr, n);
}
