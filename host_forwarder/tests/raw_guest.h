/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A raw guest: a process that speaks the wire protocol itself, without the guest library, so
 * that it can send what the library never would.  The hostile test programs (fuzz_forwarder.c,
 * image_guest.c, guest_addresses.c) reach the forwarder through it.
 */
#ifndef RAW_GUEST_H
#define RAW_GUEST_H

#include <stdint.h>

#include "vmgpu/shm.h"

struct raw_guest {
	struct vmgpu_guest *g;
	struct vmgpu_gchan *ch;
	uint8_t *base; /* this process's mapping of the region */
	uint64_t size;
	uint64_t seq;
	uint64_t reply_timeout_ns; /* how long raw_call waits for a reply */
	uint32_t rlen;             /* the out bytes of the last reply */
	uint8_t req[1 << 16], rep[1 << 16];
};

/* Map the region file at path, attach to it (trying again each millisecond, up to attach_tries
 * times in all, while a scribbled header is being put back by the forwarder), claim a channel
 * and keep it beating.  0, or -1 after saying why on stderr. */
int raw_guest_open(struct raw_guest *rg, const char *path, int attach_tries);
void raw_guest_close(struct raw_guest *rg);

/* Send one request (args: len bytes) for guest device dev; wait for its reply unless flags has
 * VG_F_NOREPLY (then 0).  The reply's CUresult, or -1 if it could not be sent or no reply came
 * (said on stderr). */
int raw_call(struct raw_guest *rg, uint32_t op, uint16_t dev, uint16_t flags, const void *args, uint32_t len);
/* The hostile programs' random numbers (xorshift64): the same seed, the same run. */
static inline uint64_t raw_rnd(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return *state;
}

/* The i-th 8-byte out value of the last reply, or 0 if it has none. */
uint64_t raw_out(const struct raw_guest *rg, unsigned i);

#endif
