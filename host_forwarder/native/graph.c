/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graphs: an executable graph's memory nodes charged to the quota when it is instantiated (and
 * uploaded, so that the memory is taken then) and never grown by an update, a stream's capture
 * state, a graph's nodes as handles.  Graphs built node by node: graph_nodes.c.
 */
#include <stdlib.h>

#include "channel.h"
#include "graph_devs.h"
#include "quota.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* What a graph's memory nodes ask for, in whole 2 MiB pages. */
static uint64_t graph_mem(struct vh_chan *ch, CUgraph g)
{
	const struct vh_backend *B = ch->backend;
	size_t n = 0;
	if (B->cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
		return 0;
	CUgraphNode *nodes = calloc(n, sizeof *nodes);
	uint64_t total = 0;
	if (nodes && B->cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
		for (size_t i = 0; i < n; i++) {
			CUgraphNodeType t;
			CUDA_MEM_ALLOC_NODE_PARAMS p;
			if (B->cuGraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
			    B->cuGraphMemAllocNodeGetParams(nodes[i], &p) == CUDA_SUCCESS)
				total += vh_quota_rounded(p.bytesize > (1u << 20) ? p.bytesize : (2u << 20));
		}
	}
	free(nodes);
	return total;
}

static CUresult instantiate(struct vh_chan *ch, CUgraphExec *exec, CUgraph g, unsigned long long flags);

/* An executable graph reaches the GPUs its graph does (graph_devs.h). */
CUresult guarded_cuGraphInstantiateWithFlags(struct vh_chan *ch, CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
	CUresult r = instantiate(ch, exec, g, flags);
	if (r == CUDA_SUCCESS) {
		vh_graph_devs_forget(*exec); /* (a host object made anew: none of an old one's) */
		vh_graph_devs_add(*exec, vh_graph_devs_copied(g));
	}
	return r;
}

static CUresult instantiate(struct vh_chan *ch, CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!exec)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t est = graph_mem(ch, g);
	if (est == 0)
		return B->cuGraphInstantiateWithFlags(exec, g, flags);
	if (vh_quota_take_begin(ch, dev, est, "cuGraphInstantiate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = B->cuGraphInstantiateWithFlags(exec, g, flags);
	/* the memory is taken when the graph is uploaded: do that now, so it is charged now */
	if (r == CUDA_SUCCESS) {
		r = B->cuGraphUpload(*exec, NULL);
		if (r == CUDA_SUCCESS)
			r = B->cuStreamSynchronize(NULL);
		if (r != CUDA_SUCCESS)
			B->cuGraphExecDestroy(*exec);
	}
	if (r == CUDA_SUCCESS && !vh_alloc_track(ch, (CUdeviceptr)(uintptr_t)*exec, est, dev, VH_GRAPH)) {
		B->cuGraphExecDestroy(*exec);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (vh_quota_take_end(ch, dev, est, r)) {
		vh_alloc_untrack(ch, vh_alloc_find(ch, (CUdeviceptr)(uintptr_t)*exec, 1u << VH_GRAPH));
		B->cuGraphExecDestroy(*exec);
		B->cuDeviceGraphMemTrim(ch->fwd->dev[dev]);
		return vh_quota_take_undo(ch, dev, est, "cuGraphInstantiate");
	}
	return vh_quota_card_full(ch, dev, r, "cuGraphInstantiate", est);
}

CUresult guarded_cuGraphExecDestroy(struct vh_chan *ch, CUgraphExec exec)
{
	const struct vh_backend *B = ch->backend;
	CUresult r = B->cuGraphExecDestroy(exec);
	if (r != CUDA_SUCCESS)
		return r;
	vh_graph_devs_forget(exec);
	struct vh_alloc *a = vh_alloc_find(ch, (CUdeviceptr)(uintptr_t)exec, 1u << VH_GRAPH);
	if (a) {
		B->cuDeviceGraphMemTrim(ch->fwd->dev[a->dev]); /* the graph pool keeps memory until trimmed */
		vh_alloc_release(ch, a);
	}
	return CUDA_SUCCESS;
}

/* An executable graph updated from another graph: its memory was charged when it was made, so a
 * graph whose memory nodes ask for more is refused (the driver refuses changed memory nodes too);
 * the result names nodes, which become the guest's handles, never the host's pointers. */
CUresult guarded_cuGraphExecUpdate_v2(struct vh_chan *ch, CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
	struct vh_alloc *a = vh_alloc_find(ch, (CUdeviceptr)(uintptr_t)exec, 1u << VH_GRAPH);
	uint64_t need = graph_mem(ch, g);
	if (need > (a ? a->size : 0))
		return CUDA_ERROR_NOT_SUPPORTED;
	CUresult r = ch->backend->cuGraphExecUpdate_v2(exec, g, info);
	if (r == CUDA_SUCCESS)
		vh_graph_devs_add(exec, vh_graph_devs_copied(g));
	if (info) {
		if (info->errorNode && vh_handle_new(ch, VG_KIND_GRAPH_NODE, (void **)&info->errorNode, g))
			info->errorNode = NULL;
		/* a node of the graph the executable graph was made from: the guest's handle if it has one */
		if (info->errorFromNode && vh_handle_new(ch, VG_KIND_GRAPH_NODE, (void **)&info->errorFromNode, g))
			info->errorFromNode = NULL;
	}
	return r;
}

CUresult guarded_cuGraphDestroy(struct vh_chan *ch, CUgraph g)
{
	CUresult r = ch->backend->cuGraphDestroy(g);
	if (r == CUDA_SUCCESS)
		vh_graph_devs_forget(g);
	return r;
}

/* A capture's graph reaches the GPUs that work was put on while captures were open (serve.c:
 * vh_capture_devs; with captures on two GPUs at once, each graph gets both). */
CUresult guarded_cuStreamEndCapture(struct vh_chan *ch, CUstream s, CUgraph *g)
{
	CUresult r = ch->backend->cuStreamEndCapture(s, g);
	if (r == CUDA_SUCCESS && g && *g)
		vh_graph_devs_add(*g, vh_capture_devs);
	return r;
}

/* A child graph node holds a copy of its graph: the parent reaches what the child does. */
CUresult guarded_cuGraphAddChildGraphNode(struct vh_chan *ch, CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
					  size_t ndeps, CUgraph child)
{
	CUresult r = ch->backend->cuGraphAddChildGraphNode(node, g, deps, ndeps, child);
	if (r == CUDA_SUCCESS)
		vh_graph_devs_add(g, vh_graph_devs_copied(child));
	return r;
}

CUresult guarded_cuGraphExecChildGraphNodeSetParams(struct vh_chan *ch, CUgraphExec exec, CUgraphNode node, CUgraph child)
{
	CUresult r = ch->backend->cuGraphExecChildGraphNodeSetParams(exec, node, child);
	if (r == CUDA_SUCCESS)
		vh_graph_devs_add(exec, vh_graph_devs_copied(child));
	return r;
}

static CUresult capture_info(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr, int version)
{
	(void)version;
	const struct vh_backend *B = ch->backend;
	uint64_t sraw = vh_get_u64(rd), want_graph = vh_get_u64(rd), want_deps = vh_get_u64(rd);
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	if (rd->bad || bad)
		return bad ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
	__typeof__(B->cuStreamGetCaptureInfo_v3) info =
		(flags & VG_F_PTDS) ? B->cuStreamGetCaptureInfo_v3_ptsz : B->cuStreamGetCaptureInfo_v3;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	cuuint64_t id = 0;
	CUgraph g = NULL;
	const CUgraphNode *deps = NULL;
	size_t ndeps = 0;
	CUresult r = info(s, &st, &id, want_graph ? &g : NULL, want_deps ? &deps : NULL, NULL, want_deps ? &ndeps : NULL);
	if (r != CUDA_SUCCESS)
		return r;
	if (ndeps)
		return CUDA_ERROR_NOT_SUPPORTED; /* node arrays of a capture are not remoted */
	if (g && vh_handle_new(ch, VG_KIND_GRAPH, (void **)&g, NULL))
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t out[3] = {(uint64_t)st, (uint64_t)id, (uint64_t)(uintptr_t)g};
	vh_put(wr, out, sizeof out);
	return CUDA_SUCCESS;
}

/* The three versions answer alike (the node arrays of a capture are not remoted). */
VH_CUSTOM_VARIANT(handwritten_cuStreamGetCaptureInfo, capture_info, 1)
VH_CUSTOM_VARIANT(handwritten_cuStreamGetCaptureInfo_v2, capture_info, 2)
VH_CUSTOM_VARIANT(handwritten_cuStreamGetCaptureInfo_v3, capture_info, 3)
