/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One CUDA call over this process's channel (call.c): the request is built in
 * place, each argument padded to 8 bytes (native/cuda_api/include/vg_wire.h),
 * sent, and for a sync call its reply read back.  The generated entries
 * (native/cuda_api/generated/guest_entries.c) and the hand-written ones use it.
 */
#ifndef VG_CALL_H
#define VG_CALL_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "vg_ops.h"
#include "vg_wire.h"

#define VG_EXPORT __attribute__((visibility("default")))

struct vg_call {
	uint8_t *buf;          /* the request, built in place */
	uint32_t len, cap;
	int bad;               /* an argument did not fit, or the reply was shorter than read */
	const uint8_t *reply;  /* the reply's values, after its header */
	uint32_t reply_len, reply_pos;
	uint64_t seq;
};

/* Start a call: needs cuInit done; takes the channel lock (recursive). */
CUresult vg_begin(struct vg_call *c, uint32_t op, unsigned flags);
void vg_put(struct vg_call *c, const void *p, size_t n);
void vg_put_u64(struct vg_call *c, uint64_t v);
void vg_put_opt(struct vg_call *c, const void *p, size_t n);
void vg_put_str(struct vg_call *c, const char *s);
void vg_put_arr(struct vg_call *c, const void *p, uint64_t count, size_t elsz);
void vg_put_ctx(struct vg_call *c, CUcontext ctx);
/* Sync: send, wait for the reply; the lock is held until vg_end. */
CUresult vg_call_sync(struct vg_call *c);
/* The two halves of vg_call_sync, for pipelining under vg_lock(): replies come in request order. */
CUresult vg_send_request(struct vg_call *c);
CUresult vg_wait_reply(struct vg_call *c);
void vg_get(struct vg_call *c, void *dst, size_t n);
uint64_t vg_get_u64(struct vg_call *c);
const void *vg_get_ref(struct vg_call *c, size_t n); /* n bytes of the reply, in place */
CUresult vg_end(struct vg_call *c, CUresult r);
/* Async: send without a reply, release the lock. */
CUresult vg_send_async(struct vg_call *c);

/* Hold the channel across several calls (chunked copies); connection.c owns the lock. */
void vg_lock(void);
void vg_unlock(void);

#endif
