/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu's guest libcuda.so.1: internal interface.  The entry points are
 * generated (native/cuda_api/generated/guest_entries.c); they marshal through
 * the call helpers below over this process's channel.  Hand-written parts:
 * rt.c (connection, calls), local.c (answers from the guest's caches),
 * custom.c (host memory, module images, launches), darkapi.c (export tables).
 */
#ifndef VG_GUEST_H
#define VG_GUEST_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "vg_ops.h"
#include "vg_wire.h"
#include "vmgpu/shm.h"

#define VG_EXPORT __attribute__((visibility("default")))

/* The documented, sticky result once the host forwarder is gone or broke the protocol. */
#define VG_ERROR_LOST CUDA_ERROR_DEVICE_UNAVAILABLE

struct vg_call {
	uint8_t *buf;
	uint32_t len, cap;
	int bad;
	const uint8_t *rep;
	uint32_t rlen, rpos;
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

/* Hold the channel across several calls (chunked copies). */
void vg_lock(void);
void vg_unlock(void);

/* The process's connection. */
struct vg_conn {
	int ready;
	CUresult init_result;
	struct vmgpu_guest *guest;
	struct vmgpu_gchan *chan;
	struct vg_hello_rep hello;
	struct vg_dev_info dev[VG_MAX_DEVICES];
	uint64_t bulk_size;
};
extern struct vg_conn vg;
CUresult vg_connect(void); /* idempotent; cuInit */
int vg_current_device(void); /* -1 if no context is current on this thread */
CUresult vg_check_ready(void);

/* Heap (pinned host memory in the region). */
uint64_t vg_heap_offset(const void *p, size_t n); /* UINT64_MAX if [p, p+n) is not in the region's heap */

/* Kernel parameter layouts, cached per function handle. */
struct vg_fninfo {
	uint64_t handle;
	uint32_t nparams, bytes;
	struct vg_param_info *params;
	char *name;
};
CUresult vg_fninfo(uint64_t handle, struct vg_fninfo **out);

/* A function as the guest sees it may be a tools node (export table 6e163fbe): its handle. */
uint64_t vg_fn_handle(CUfunction f);

void vg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
CUresult vg_unsupported(const char *name, int *once);

extern const int vg_probed_driver_version;

#endif
