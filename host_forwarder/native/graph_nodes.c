/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graphs built node by node (XLA's command buffers).  A node is work the GPU does later, when
 * the graph is launched, with no further check then; so everything a node names is checked now,
 * when it is added or its parameters are set, exactly as for the immediate call:
 *   - a memcpy node's two sides: device memory inside this process's own objects (addresses.c),
 *     host memory only as an offset into its region's heap (pinned memory the host can reach
 *     whenever the graph runs; the guest library turns the program's pointer into it), an array
 *     the process's own (its handle);
 *   - a memset node's rows: inside this process's own device memory;
 *   - a kernel node: the process's own function, its parameter bytes checked against the host's
 *     layout of it as a launch's are (launch.c, vh_launch_params_in);
 *   - graph, node, event and dependency handles: through the handle table (the generated halves
 *     translate the others' dependencies; a node is a child of its graph and goes with it).
 * Every pointer field the driver would read is rewritten from what was checked; none is taken
 * from the request as it came.
 */
#include <string.h>

#include "addresses.h"
#include "copy.h"
#include "graph_devs.h"
#include "handles.h"
#include "host_memory.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* A node made or set to run on guest GPU d (-1: none known): its graph reaches that GPU. */
static void node_on(const void *graph, int d)
{
	if (d >= 0 && d < VG_MAX_DEVICES)
		vh_graph_devs_add(graph, (vh_devs)1 << d);
}

/* A node made or set for context ctx (NULL: the current one). */
static void node_dev(struct vh_chan *ch, const void *graph, CUcontext ctx)
{
	node_on(graph, vh_ctx_dev(ch, ctx));
}

/* ---- memcpy nodes ---------------------------------------------------------------------- */

CUresult guarded_cuGraphAddMemcpyNode(struct vh_chan *ch, CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				      size_t ndeps, const CUDA_MEMCPY3D *params, CUcontext ctx)
{
	CUDA_MEMCPY3D p;
	CUresult r = vh_copy3d_in(ch, params, &p);
	if (r == CUDA_SUCCESS && (r = ch->backend->cuGraphAddMemcpyNode(node, g, deps, ndeps, &p, ctx)) == CUDA_SUCCESS)
		node_dev(ch, g, ctx);
	return r;
}

CUresult guarded_cuGraphExecMemcpyNodeSetParams(struct vh_chan *ch, CUgraphExec exec, CUgraphNode node,
						const CUDA_MEMCPY3D *params, CUcontext ctx)
{
	CUDA_MEMCPY3D p;
	CUresult r = vh_copy3d_in(ch, params, &p);
	if (r == CUDA_SUCCESS && (r = ch->backend->cuGraphExecMemcpyNodeSetParams(exec, node, &p, ctx)) == CUDA_SUCCESS)
		node_dev(ch, exec, ctx);
	return r;
}

/* ---- memset nodes ---------------------------------------------------------------------- */

/* The rows a memset node writes: height rows of width elements, pitch bytes apart. */
static CUresult memset_range_ok(struct vh_chan *ch, const CUDA_MEMSET_NODE_PARAMS *p)
{
	if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4))
		return CUDA_ERROR_INVALID_VALUE;
	return vh_rows_ok(ch, p->dst, p->pitch, p->width, p->height, p->elementSize);
}

CUresult guarded_cuGraphAddMemsetNode(struct vh_chan *ch, CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				      size_t ndeps, const CUDA_MEMSET_NODE_PARAMS *params, CUcontext ctx)
{
	CUresult r = memset_range_ok(ch, params);
	if (r == CUDA_SUCCESS && (r = ch->backend->cuGraphAddMemsetNode(node, g, deps, ndeps, params, ctx)) == CUDA_SUCCESS)
		node_dev(ch, g, ctx);
	return r;
}

CUresult guarded_cuGraphExecMemsetNodeSetParams(struct vh_chan *ch, CUgraphExec exec, CUgraphNode node,
						const CUDA_MEMSET_NODE_PARAMS *params, CUcontext ctx)
{
	CUresult r = memset_range_ok(ch, params);
	if (r == CUDA_SUCCESS && (r = ch->backend->cuGraphExecMemsetNodeSetParams(exec, node, params, ctx)) == CUDA_SUCCESS)
		node_dev(ch, exec, ctx);
	return r;
}

/* ---- kernel nodes: the request is a launch's, after the node's handles ---------------------- */

enum kernel_node_call { ADD_NODE, SET_NODE, SET_EXEC_NODE };

/* A request's dependencies (u64 count, the guest's node handles, u64 count again), translated
 * into the channel's scratch. */
static CUresult deps_in(struct vh_chan *ch, struct vh_rd *rd, CUgraphNode **deps, uint64_t *n)
{
	const uint64_t *raw = vh_get_arr(rd, sizeof *raw, n);
	uint64_t again = vh_get_u64(rd);
	if (rd->bad || again != *n)
		return CUDA_ERROR_INVALID_VALUE;
	*deps = *n ? vh_scratch(ch, *n, sizeof **deps) : NULL;
	if (*n && !*deps)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (uint64_t i = 0; i < *n; i++) {
		(*deps)[i] = (CUgraphNode)(uintptr_t)raw[i];
		if (!(*deps)[i] || vh_handle_in(ch, VG_KIND_GRAPH_NODE, (void **)&(*deps)[i]))
			return CUDA_ERROR_INVALID_HANDLE;
	}
	return CUDA_SUCCESS;
}

/* A handle the request names, which may not be NULL. */
static int handle_in(struct vh_chan *ch, struct vh_rd *rd, int kind, void **out)
{
	*out = (void *)(uintptr_t)vh_get_u64(rd);
	return rd->bad || !*out || vh_handle_in(ch, kind, out);
}

static CUresult kernel_node(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr,
			    enum kernel_node_call call)
{
	(void)flags;
	const struct vh_backend *B = ch->backend;
	void *graph = NULL, *exec = NULL, *node = NULL;
	CUgraphNode *deps = NULL;
	uint64_t ndeps = 0;
	CUresult r = CUDA_SUCCESS;
	if (call == ADD_NODE) {
		if (handle_in(ch, rd, VG_KIND_GRAPH, &graph))
			return CUDA_ERROR_INVALID_HANDLE;
		if ((r = deps_in(ch, rd, &deps, &ndeps)) != CUDA_SUCCESS)
			return r;
	} else {
		if (call == SET_EXEC_NODE && handle_in(ch, rd, VG_KIND_GRAPH_EXEC, &exec))
			return CUDA_ERROR_INVALID_HANDLE;
		uint64_t raw = vh_get_u64(rd);
		struct vh_handle *ne = vh_handle_entry(ch, raw, VG_KIND_GRAPH_NODE);
		if (rd->bad || !ne)
			return CUDA_ERROR_INVALID_HANDLE;
		node = ne->ptr;
		if (call == SET_NODE)
			graph = ne->parent; /* the graph the node is in */
	}
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	uint32_t dims[8];
	vh_get(rd, dims, sizeof dims);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE; /* not a function of this process */
	void *args[VG_MAX_PARAMS];
	if ((r = vh_launch_params_in(ch, e, rd, args)) != CUDA_SUCCESS)
		return r;
	CUDA_KERNEL_NODE_PARAMS p;
	memset(&p, 0, sizeof p);
	if (e->kind == VG_KIND_KERNEL)
		p.kern = e->ptr; /* run in the current context: the guest's own */
	else
		p.func = e->ptr;
	p.gridDimX = dims[0];
	p.gridDimY = dims[1];
	p.gridDimZ = dims[2];
	p.blockDimX = dims[3];
	p.blockDimY = dims[4];
	p.blockDimZ = dims[5];
	p.sharedMemBytes = dims[6];
	p.kernelParams = e->nparams ? args : NULL; /* the driver copies the bytes now */
	/* a kernel node runs a function in the function's context (its module's, whichever is current:
	 * the driver ignores the node's context then), a kernel in the current one */
	int dev = e->kind == VG_KIND_KERNEL ? ch->cur_dev : e->dev;
	if (call == SET_NODE && (r = B->cuGraphKernelNodeSetParams_v2(node, &p)) == CUDA_SUCCESS)
		node_on(graph, dev);
	if (call == SET_EXEC_NODE && (r = B->cuGraphExecKernelNodeSetParams_v2(exec, node, &p)) == CUDA_SUCCESS)
		node_on(exec, dev);
	if (call != ADD_NODE)
		return r;
	CUgraphNode out = NULL;
	r = B->cuGraphAddKernelNode_v2(&out, graph, deps, ndeps, &p);
	if (r != CUDA_SUCCESS)
		return r;
	node_on(graph, dev);
	if (vh_handle_new(ch, VG_KIND_GRAPH_NODE, (void **)&out, graph))
		return CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t h = (uint64_t)(uintptr_t)out;
	vh_put(wr, &h, sizeof h);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VH_CUSTOM_VARIANT(handwritten_cuGraphAddKernelNode_v2, kernel_node, ADD_NODE)
VH_CUSTOM_VARIANT(handwritten_cuGraphKernelNodeSetParams_v2, kernel_node, SET_NODE)
VH_CUSTOM_VARIANT(handwritten_cuGraphExecKernelNodeSetParams_v2, kernel_node, SET_EXEC_NODE)
