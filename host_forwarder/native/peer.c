/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer copies between the GPUs of one guest process (api.toml: cuMemcpyPeer, cuMemcpyPeerAsync).
 * The other peer calls are generated: devices are the guest's ordinals, contexts the process's
 * own (context.c, vh_context_in), and the driver's answers (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
 * _NOT_ENABLED, _UNSUPPORTED) go back as they are.
 *
 * A peer copy names two contexts, each one of this process's own (a context of another guest
 * process is none of its: contexts cross the wire as the process's device ordinals), and two
 * ranges, each of which must be this process's device memory on its context's GPU.  Which GPU
 * an object is on: an allocation's or a mapping's is the record its quota follows
 * (allocations.c); a module global's is the driver's answer for it, asked only once the address
 * is known to be the process's own.  Where the two GPUs have no direct path, the driver stages
 * the copy through host memory itself: nothing here depends on a peer path.
 */
#include "addresses.h"
#include "allocations.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* The guest ordinal of this process's context c (a host context, as vh_context_in gave it), or
 * -1 (NULL: the guest named none). */
static int context_device(const struct vh_chan *ch, CUcontext c)
{
	for (int d = 0; c && d < ch->fwd->ndev; d++)
		if (ch->ctx[d] == c)
			return d;
	return -1;
}

/* The guest ordinal of the GPU an object of this process lies on, or -1. */
static int object_device(struct vh_chan *ch, const struct vh_span *s)
{
	if (s->kind == VH_SPAN_GLOBAL) {
		int ordinal = -1;
		if (ch->backend->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, s->base) !=
		    CUDA_SUCCESS)
			return -1;
		for (int d = 0; d < ch->fwd->ndev; d++)
			if (ch->fwd->ordinal[d] == ordinal)
				return d;
		return -1;
	}
	unsigned kinds = s->kind == VH_SPAN_MAP ? 1u << VH_VMM_MAP : 1u << VH_MEM | 1u << VH_MEM_ASYNC;
	const struct vh_alloc *a = vh_alloc_find(ch, s->base, kinds);
	return a ? a->dev : -1;
}

/* Whether [addr, addr+n) is this process's device memory on guest device dev: inside its own
 * objects as any copy's range must be (addresses.c), and each of them on dev.  Pinned host memory
 * is not device memory of any GPU: refused here. */
static int on_device(struct vh_chan *ch, uint64_t addr, uint64_t n, int dev)
{
	if (vh_addr_ok(ch, addr, n))
		return 0;
	if (n == 0)
		return 1; /* names nothing; the driver does nothing */
	for (uint64_t p = addr, end = addr + n; p < end;) { /* no wrap: vh_addr_ok refuses one */
		const struct vh_span *s = vh_addr_span(ch, p);
		if (!s || object_device(ch, s) != dev)
			return 0;
		p = s->end; /* VMM mappings back to back: each must be on dev */
	}
	return 1;
}

static CUresult peer_copy(struct vh_chan *ch, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
			  size_t n, CUstream stream, int async)
{
	int dst_dev = context_device(ch, dst_ctx), src_dev = context_device(ch, src_ctx);
	if (dst_dev < 0 || src_dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!on_device(ch, dst, n, dst_dev) || !on_device(ch, src, n, src_dev))
		return CUDA_ERROR_INVALID_VALUE;
	const struct vh_backend *B = ch->backend;
	return async ? B->cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, stream)
		     : B->cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n);
}

CUresult guarded_cuMemcpyPeer(struct vh_chan *ch, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			      CUcontext srcContext, size_t ByteCount)
{
	return peer_copy(ch, dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, 0);
}

/* The _ptsz variant's NULL stream runs on the legacy default stream here, which orders the copy
 * after and before the per-thread stream's work as well (it waits for every blocking stream). */
CUresult guarded_cuMemcpyPeerAsync(struct vh_chan *ch, CUdeviceptr dstDevice, CUcontext dstContext,
				   CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	return peer_copy(ch, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, 1);
}
