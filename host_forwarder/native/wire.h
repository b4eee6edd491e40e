/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading a request and writing a reply.  A request's arguments are a private copy of what the
 * guest sent, and everything in them is untrusted: every read is bounds-checked (a read past the
 * end marks the reader bad and yields zeros), every write too.  Values are 8-byte aligned, as
 * the guest library writes them (guest_agent/libcuda).
 */
#ifndef VH_WIRE_H
#define VH_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Bounds-checked reader over a request's arguments (a private copy). */
struct vh_rd {
	const uint8_t *p;
	uint32_t len, pos;
	int bad;
};
/* Writer for a reply's out values. */
struct vh_wr {
	uint8_t *p;
	uint32_t cap, len;
	int bad;
};

static inline uint32_t vh_pad8(uint64_t n)
{
	return (uint32_t)((n + 7) & ~7ull);
}

static inline void vh_get(struct vh_rd *rd, void *dst, size_t n)
{
	if (rd->bad || n > rd->len - rd->pos || vh_pad8(n) > rd->len - rd->pos) {
		rd->bad = 1;
		memset(dst, 0, n);
		return;
	}
	memcpy(dst, rd->p + rd->pos, n);
	rd->pos += vh_pad8(n);
}

static inline uint64_t vh_get_u64(struct vh_rd *rd)
{
	uint64_t v;
	vh_get(rd, &v, sizeof v);
	return v;
}

static inline void *vh_get_opt(struct vh_rd *rd, void *dst, size_t n)
{
	if (!vh_get_u64(rd))
		return NULL;
	vh_get(rd, dst, n);
	return dst;
}

/* A pointer to count * elsz bytes inside the request, 8-byte aligned. */
static inline void *vh_get_arr(struct vh_rd *rd, size_t elsz, uint64_t *count)
{
	uint64_t n = vh_get_u64(rd);
	*count = 0;
	if (rd->bad || (elsz && n > (rd->len - rd->pos) / elsz)) {
		rd->bad = 1;
		return NULL;
	}
	uint64_t bytes = n * elsz;
	if (vh_pad8(bytes) > rd->len - rd->pos) {
		rd->bad = 1;
		return NULL;
	}
	void *p = (void *)(rd->p + rd->pos);
	rd->pos += vh_pad8(bytes);
	*count = n;
	return n ? p : NULL;
}

/* A NUL-terminated string inside the request. */
static inline const char *vh_get_str(struct vh_rd *rd)
{
	uint64_t n;
	const char *s = vh_get_arr(rd, 1, &n);
	if (rd->bad || n == 0 || s[n - 1] != '\0') {
		rd->bad = 1;
		return NULL;
	}
	return s;
}

static inline void vh_put(struct vh_wr *wr, const void *src, size_t n)
{
	if (wr->bad || n > wr->cap - wr->len || vh_pad8(n) > wr->cap - wr->len) {
		wr->bad = 1;
		return;
	}
	if (n) /* (a function of no parameters has no layout: src NULL, which memcpy may not be given) */
		memcpy(wr->p + wr->len, src, n);
	memset(wr->p + wr->len + n, 0, vh_pad8(n) - n);
	wr->len += vh_pad8(n);
}

#endif
