/* SPDX-License-Identifier: Apache-2.0 */
/* Pinned host memory: blocks of the region's heap (hostmem.c). */
#ifndef VG_HOSTMEM_H
#define VG_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

/* The region offset of [p, p+n), or UINT64_MAX if it is not inside the region's heap. */
uint64_t vg_heap_offset(const void *p, size_t n);
/* 1 if p is inside pinned memory of a remote guest (its own pages: hostmem.c), with the block. */
int vg_local_pinned(const void *p, void **base, size_t *size);

#endif
