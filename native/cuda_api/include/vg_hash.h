/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The content hash that lets a module image cross the channel once: two 64-bit
 * lanes of multiply-xorshift over 8-byte words.  Not cryptographic: the host
 * recomputes it over what it received before caching, so a guest that lies
 * only loses the cache hit.
 */
#ifndef VG_HASH_H
#define VG_HASH_H

#include <stdint.h>
#include <string.h>

static inline void vg_hash128(const void *data, uint64_t n, uint64_t out[2])
{
	const uint8_t *p = data;
	uint64_t a = 0x9E3779B97F4A7C15ull ^ n, b = 0xC2B2AE3D27D4EB4Full + n;
	uint64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, 8);
		a = (a ^ w) * 0xFF51AFD7ED558CCDull;
		a ^= a >> 32;
		b = (b + w) * 0xC4CEB9FE1A85EC53ull;
		b ^= b >> 29;
	}
	uint64_t tail = 0;
	memcpy(&tail, p + i, n - i);
	a = (a ^ tail) * 0xFF51AFD7ED558CCDull;
	b = (b + tail) * 0xC4CEB9FE1A85EC53ull;
	a ^= a >> 33;
	b ^= b >> 31;
	out[0] = a ^ (b >> 7);
	out[1] = b ^ (a << 9);
}

#endif
