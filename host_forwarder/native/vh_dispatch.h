/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the generated dispatcher (native/cuda_api/generated/host_dispatch.c) sees: one worker
 * thread per guest channel decodes requests, runs them on the backend (the real libcuda.so.1,
 * or the simulated backend) and replies.  Everything read from the channel is untrusted:
 * decoding is bounds-checked (wire.h), handles go through the channel's table (handles.h),
 * device pointers and host buffers are checked against what this channel owns (addresses.h,
 * host_memory.h).
 *
 * Names: vh_ is the host forwarder's, vg_ the wire's (shared with the guest).  The generated
 * code calls two kinds of hand-written halves, named by the generator: handwritten_<call>(ch,
 * flags, rd, wr) decodes its own request (copy.c, module.c, launch.c, ...); guarded_<call>(ch,
 * args...) is given the decoded arguments and runs the call behind its own checks and charges
 * (alloc.c, pool.c, vmm.c, graph.c, module.c).
 */
#ifndef VH_DISPATCH_H
#define VH_DISPATCH_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#include "backend.h"
#include "channel.h"
#include "context.h"
#include "log.h"
#include "vg_kinds.h"
#include "vg_ops.h"
#include "vg_wire.h"
#include "wire.h"

/* Run one request (generated); the calls it does not know go to vh_dispatch_proto (protocol.c). */
CUresult vh_dispatch(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr);
CUresult vh_dispatch_proto(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr);
/* Generated: whether a call reports an earlier async call's error; whether it puts work on the GPU. */
int vh_op_reports_async(uint32_t op);
int vh_op_gpu_work(uint32_t op);
int vh_op_gpu_stream(uint32_t op); /* a work call that names its stream */
int vh_op_async(uint32_t op);      /* a call of the async class (queued on a stream) */
/* Whether a call begins a stream capture. */
static inline int vh_op_begins_capture(uint32_t op)
{
	return op == VG_OP_cuStreamBeginCapture_v2 || op == VG_OP_cuStreamBeginCaptureToGraph;
}

/* launch.c: a launch configuration from the request (api.toml's launch_config): dims, the stream,
 * up to VG_MAX_LAUNCH_ATTRS attributes into attrs, their events translated, unknown ones refused. */
CUresult vh_launch_config_in(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, CUlaunchConfig *cfg,
			     CUlaunchAttribute *attrs);
/* launch.c: a kernel's parameter bytes from the request, checked against the function's own
 * layout (the host driver's); args points into the request (a launch, a graph's kernel node). */
struct vh_handle;
CUresult vh_launch_params_in(struct vh_chan *ch, struct vh_handle *e, struct vh_rd *rd, void **args);

/* A handwritten_ entry point that is one variant of a shared implementation,
 * impl(ch, flags, rd, wr, variant): a synchronous and an asynchronous copy, a get and a set. */
#define VH_CUSTOM_VARIANT(name, impl, variant)                                                \
	CUresult name(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr) \
	{                                                                                     \
		return impl(ch, flags, rd, wr, variant);                                      \
	}

#endif
