/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images built byte by byte for image_guest.c: a small well-formed cubin with sections of
 * every kind the forwarder's check reads, fatbins of such entries, PTX; and a reader of images
 * from files (an executable's .nv_fatbin section).  The hostile modes then make them lie.
 */
#ifndef IMAGE_BUILD_H
#define IMAGE_BUILD_H

#include <stdint.h>

/* A growing byte buffer. */
struct buf {
	uint8_t *p;
	uint64_t n, cap;
};

static const char PTX_TEXT[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
			       ".visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n{\n"
			       "\tret;\n}\n";

void buf_put(struct buf *b, const void *p, uint64_t n);
void buf_pad(struct buf *b, uint64_t align);              /* zeros up to a multiple of align */
void buf_put_u(struct buf *b, uint64_t v, unsigned bytes); /* the low bytes of v */
void buf_set(struct buf *b, uint64_t at, uint64_t v, unsigned bytes);
struct buf buf_copy(const struct buf *a);

/* A small, well-formed cubin: sections of every kind the check reads. */
struct buf image_cubin(void);
/* A fatbin entry of kind (1 PTX, 2 ELF) with payload (padded to 8). */
void image_entry(struct buf *b, unsigned kind, const void *payload, uint64_t n);
/* A fatbin container holding the entries. */
void image_container(struct buf *b, const struct buf *entries);
/* Two containers back to back: an ELF and a PTX entry, then a PTX entry. */
struct buf image_fatbin(void);
/* An executable's .nv_fatbin section, or the file itself (exits 2 if it cannot be read). */
struct buf image_read(const char *path);

#endif
