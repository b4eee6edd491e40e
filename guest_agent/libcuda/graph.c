/* SPDX-License-Identifier: Apache-2.0 */
/* Stream capture state and a graph's nodes: replies whose shape depends on what was asked for;
 * graphs built node by node: memcpy nodes' host memory as region offsets, kernel nodes'
 * parameters laid out as a launch's (host half: host_forwarder/native/graph_nodes.c). */
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "function.h"
#include "hostmem.h"
#include "vg_guest_protos.h"

/* ---- stream capture state ------------------------------------------------------------------- */

/* Status, capture id and graph come from the host's stream.  The dependency list of a
 * capturing stream (driver-owned node arrays) is not remoted: asked for, it is refused. */
static CUresult capture_info(uint32_t op, CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
			     const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps, unsigned fl)
{
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	CUresult r = vg_begin(&c, op, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)(uintptr_t)s);
	vg_put_u64(&c, graph != NULL);
	vg_put_u64(&c, deps || edges || ndeps);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		*status = (CUstreamCaptureStatus)vg_get_u64(&c);
		uint64_t cid = vg_get_u64(&c), g = vg_get_u64(&c);
		if (id)
			*id = cid;
		if (graph)
			*graph = (CUgraph)(uintptr_t)g;
		if (deps)
			*deps = NULL;
		if (edges)
			*edges = NULL;
		if (ndeps)
			*ndeps = 0;
	}
	return vg_end(&c, r);
}

CUresult handwritten_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo, s, status, id, NULL, NULL, NULL, NULL, f);
}

CUresult handwritten_cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
				       const CUgraphNode **deps, size_t *ndeps, unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo_v2, s, status, id, graph, deps, NULL, ndeps, f);
}

CUresult handwritten_cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
				       const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps,
				       unsigned f)
{
	return capture_info(VG_OP_cuStreamGetCaptureInfo_v3, s, status, id, graph, deps, edges, ndeps, f);
}

/* ---- graphs built node by node ---------------------------------------------------------------- */

/* One side of a memcpy node as the host takes it: host memory as its offset in the region's heap
 * (in the host pointer field), which the host can reach whenever the graph runs.  Pageable memory
 * it cannot: refused, CUDA_ERROR_NOT_SUPPORTED, said once.  A unified address in the heap is host
 * memory; any other stays a device address, which the host checks. */
static CUresult copy_side_out(const char *call, CUmemorytype *type, const void **host, CUdeviceptr *dev)
{
	static int said;
	if (*type == CU_MEMORYTYPE_UNIFIED) {
		uint64_t off = vg_heap_offset((const void *)(uintptr_t)*dev, 1);
		if (off != UINT64_MAX) {
			*type = CU_MEMORYTYPE_HOST;
			*host = (const void *)(uintptr_t)off;
			*dev = 0;
		}
		return CUDA_SUCCESS;
	}
	if (*type != CU_MEMORYTYPE_HOST)
		return CUDA_SUCCESS;
	uint64_t off = *host ? vg_heap_offset(*host, 1) : UINT64_MAX;
	if (off == UINT64_MAX) {
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			vg_log("%s: host memory %p is not pinned; a graph's memcpy node takes only memory from "
			       "cuMemHostAlloc/cuMemAllocHost (the host cannot reach pageable memory when the graph "
			       "runs): CUDA_ERROR_NOT_SUPPORTED", call, *host);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	*host = (const void *)(uintptr_t)off;
	return CUDA_SUCCESS;
}

static CUresult copy_params_out(const char *call, const CUDA_MEMCPY3D *in, CUDA_MEMCPY3D *out)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	*out = *in;
	CUresult r = copy_side_out(call, &out->srcMemoryType, &out->srcHost, &out->srcDevice);
	if (r == CUDA_SUCCESS)
		r = copy_side_out(call, &out->dstMemoryType, (const void **)&out->dstHost, &out->dstDevice);
	return r;
}

CUresult handwritten_cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
					  const CUDA_MEMCPY3D *params, CUcontext ctx, unsigned fl)
{
	CUDA_MEMCPY3D p;
	CUresult r = copy_params_out("cuGraphAddMemcpyNode", params, &p);
	return r != CUDA_SUCCESS ? r : forward_cuGraphAddMemcpyNode(node, g, deps, ndeps, &p, ctx, fl);
}

CUresult handwritten_cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D *params,
						    CUcontext ctx, unsigned fl)
{
	CUDA_MEMCPY3D p;
	CUresult r = copy_params_out("cuGraphExecMemcpyNodeSetParams", params, &p);
	return r != CUDA_SUCCESS ? r : forward_cuGraphExecMemcpyNodeSetParams(exec, node, &p, ctx, fl);
}

/* A failed update's reply carries no values: its reason is the generic one, naming no node. */
CUresult handwritten_cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo *info, unsigned fl)
{
	CUresult r = forward_cuGraphExecUpdate_v2(exec, g, info, fl);
	if (r != CUDA_SUCCESS && info) {
		memset(info, 0, sizeof *info);
		info->result = CU_GRAPH_EXEC_UPDATE_ERROR;
	}
	return r;
}

/* A kernel node: its handles (graph and dependencies, or [graph exec and] node), then what a
 * launch carries: the function, dims and shared memory, the parameters at the host's offsets. */
struct node_target {
	uint32_t op;
	CUgraph graph;
	const CUgraphNode *deps;
	size_t ndeps;
	CUgraphExec exec;
	CUgraphNode node;
};

static CUresult kernel_node(const struct node_target *t, const CUDA_KERNEL_NODE_PARAMS *p, CUgraphNode *out, unsigned fl)
{
	if (!p || (t->op == VG_OP_cuGraphAddKernelNode_v2 && !out))
		return CUDA_ERROR_INVALID_VALUE;
	CUfunction f = p->func ? p->func : (CUfunction)p->kern;
	if (!f)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_param_layout *fi;
	CUresult r = vg_param_layout(vg_function_handle(f), &fi);
	if (r != CUDA_SUCCESS)
		return r;
	struct vg_call c;
	if ((r = vg_begin(&c, t->op, fl)) != CUDA_SUCCESS)
		return r;
	if (t->op == VG_OP_cuGraphAddKernelNode_v2) {
		vg_put_u64(&c, (uint64_t)(uintptr_t)t->graph);
		vg_put_arr(&c, t->deps, t->ndeps, sizeof *t->deps);
		vg_put_u64(&c, t->ndeps);
	} else {
		if (t->op == VG_OP_cuGraphExecKernelNodeSetParams_v2)
			vg_put_u64(&c, (uint64_t)(uintptr_t)t->exec);
		vg_put_u64(&c, (uint64_t)(uintptr_t)t->node);
	}
	vg_put_u64(&c, vg_function_handle(f));
	uint32_t dims[8] = {p->gridDimX,  p->gridDimY,	p->gridDimZ,	     p->blockDimX,
			    p->blockDimY, p->blockDimZ, p->sharedMemBytes, 0};
	vg_put(&c, dims, sizeof dims);
	if ((r = vg_put_params(&c, fi, p->kernelParams, p->extra)) != CUDA_SUCCESS)
		return vg_end(&c, r);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS && out)
		*out = (CUgraphNode)(uintptr_t)vg_get_u64(&c);
	return vg_end(&c, r);
}

CUresult handwritten_cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
					     const CUDA_KERNEL_NODE_PARAMS *params, unsigned fl)
{
	struct node_target t = {.op = VG_OP_cuGraphAddKernelNode_v2, .graph = g, .deps = deps, .ndeps = ndeps};
	return kernel_node(&t, params, node, fl);
}

CUresult handwritten_cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *params, unsigned fl)
{
	struct node_target t = {.op = VG_OP_cuGraphKernelNodeSetParams_v2, .node = node};
	return kernel_node(&t, params, NULL, fl);
}

CUresult handwritten_cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
						       const CUDA_KERNEL_NODE_PARAMS *params, unsigned fl)
{
	struct node_target t = {.op = VG_OP_cuGraphExecKernelNodeSetParams_v2, .exec = exec, .node = node};
	return kernel_node(&t, params, NULL, fl);
}

/* ---- cuGraphAddNode: the generic form, by the node's type ------------------------------------ */

/* Each type the typed calls serve goes through its typed call, and so through the same checks;
 * the rest (host, conditional, memory, semaphore and batch nodes) are not served. */
static CUresult add_node(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
			 size_t ndeps, CUgraphNodeParams *p, unsigned f)
{
	if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
		return CUDA_ERROR_INVALID_VALUE;
	static const CUgraphEdgeData plain;
	int plain_edges = 1;
	for (size_t i = 0; edges && i < ndeps; i++)
		plain_edges &= !memcmp(&edges[i], &plain, sizeof plain);
	if (!plain_edges) {
		/* edges with ports or types (programmatic launches): the node first, then its edges */
		CUgraphNode *to = node && ndeps <= (1u << 20) ? malloc(ndeps * sizeof *to) : NULL;
		if (!to)
			return node ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
		CUresult r = add_node(node, g, NULL, NULL, 0, p, f);
		for (size_t i = 0; r == CUDA_SUCCESS && i < ndeps; i++)
			to[i] = *node;
		if (r == CUDA_SUCCESS && (r = cuGraphAddDependencies_v2(g, deps, to, edges, ndeps)) != CUDA_SUCCESS)
			cuGraphDestroyNode(*node);
		free(to);
		return r;
	}
	switch (p->type) {
	case CU_GRAPH_NODE_TYPE_KERNEL:
		return handwritten_cuGraphAddKernelNode_v2(node, g, deps, ndeps, (const CUDA_KERNEL_NODE_PARAMS *)&p->kernel,
							   f);
	case CU_GRAPH_NODE_TYPE_MEMCPY:
		if (p->memcpy.flags || p->memcpy.reserved)
			return CUDA_ERROR_INVALID_VALUE;
		return handwritten_cuGraphAddMemcpyNode(node, g, deps, ndeps, &p->memcpy.copyParams, p->memcpy.copyCtx, f);
	case CU_GRAPH_NODE_TYPE_MEMSET:
		/* the v2 parameters are the v1 ones with the context after them */
		return cuGraphAddMemsetNode(node, g, deps, ndeps, (const CUDA_MEMSET_NODE_PARAMS *)&p->memset, p->memset.ctx);
	case CU_GRAPH_NODE_TYPE_EMPTY:
		return cuGraphAddEmptyNode(node, g, deps, ndeps);
	case CU_GRAPH_NODE_TYPE_GRAPH:
		if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE)
			break;
		return cuGraphAddChildGraphNode(node, g, deps, ndeps, p->graph.graph);
	case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
		return cuGraphAddEventRecordNode(node, g, deps, ndeps, p->eventRecord.event);
	case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
		return cuGraphAddEventWaitNode(node, g, deps, ndeps, p->eventWait.event);
	default:
		break;
	}
	static int logged;
	if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
		vg_log("cuGraphAddNode: a node of type %d is not served (kernel, memcpy, memset, empty, child graph "
		       "and event nodes are): CUDA_ERROR_NOT_SUPPORTED",
		       (int)p->type);
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult handwritten_cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				    CUgraphNodeParams *p, unsigned f)
{
	return add_node(node, g, deps, NULL, ndeps, p, f);
}

CUresult handwritten_cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				       const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *p, unsigned f)
{
	return add_node(node, g, deps, edges, ndeps, p, f);
}
