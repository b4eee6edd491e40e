/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graphs built by hand (cuGraphCreate, cuGraphAdd*Node): empty, kernel, memcpy, memset, child
 * graph and event nodes, their parameters set in a graph or an executable graph, nodes enabled
 * and disabled, an executable graph updated from a graph of the same shape.  A graph launch
 * (sim_graph_run, called by cuGraphLaunch in launch.c) runs the nodes in the order they were
 * added, which is an order their dependencies allow: kernels through cuLaunchKernel, copies and
 * memsets on the simulated memory, so tests see results.  Events complete at once here, so
 * event nodes do nothing.  A captured launch is a kernel node (a node all zero but for it).
 */
#include "sim.h"

static uint64_t next_node_id;

static struct sim_graph *graph_of(CUgraph g)
{
	return sim_is_obj(g, GRAPH_MAGIC) ? (struct sim_graph *)g : NULL;
}

static struct sim_graph *exec_of(CUgraphExec e)
{
	return sim_is_obj(e, EXEC_MAGIC) ? (struct sim_graph *)e : NULL;
}

/* Whether n is one of g's nodes. */
static int node_in(const struct sim_graph *g, CUgraphNode n)
{
	uintptr_t p = (uintptr_t)n, base = (uintptr_t)g->node;
	return p >= base && p < base + (uintptr_t)g->n * sizeof *g->node && (p - base) % sizeof *g->node == 0;
}

/* The executable graph's copy of node n (of the graph it was made from), by the node's id. */
static struct sim_node *exec_node(struct sim_graph *x, CUgraphNode n)
{
	const struct sim_node *want = (const struct sim_node *)n;
	if (!x || !want || want->id == 0) return NULL;
	for (int i = 0; i < x->n; i++)
		if (x->node[i].id == want->id) return &x->node[i];
	return NULL;
}

CUresult sim_graph_clone_children(struct sim_graph *g)
{
	for (int i = 0; i < g->n; i++) {
		struct sim_graph *c = g->node[i].child;
		if (!c) continue;
		struct sim_graph *copy = malloc(sizeof *copy);
		if (!copy) {
			for (int k = i; k < g->n; k++) g->node[k].child = NULL;
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		*copy = *c;
		g->node[i].child = copy;
		CUresult r = sim_graph_clone_children(copy);
		if (r != CUDA_SUCCESS) return r;
	}
	return CUDA_SUCCESS;
}

void sim_graph_free_children(struct sim_graph *g)
{
	for (int i = 0; i < g->n; i++) {
		if (!g->node[i].child) continue;
		sim_graph_free_children(g->node[i].child);
		free(g->node[i].child);
		g->node[i].child = NULL;
	}
}

EXPORT CUresult cuGraphCreate(CUgraph *out, unsigned int flags)
{
	if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
	struct sim_graph *g = calloc(1, sizeof *g);
	if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = GRAPH_MAGIC;
	*out = (CUgraph)g;
	return CUDA_SUCCESS;
}

/* A new node of graph g after deps (each one of g's own nodes). */
static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps, int type,
			 struct sim_node **nd)
{
	struct sim_graph *x = graph_of(g);
	if (!out || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
	if (!x) return CUDA_ERROR_INVALID_HANDLE;
	for (size_t i = 0; i < ndeps; i++)
		if (!node_in(x, deps[i])) return CUDA_ERROR_INVALID_VALUE;
	if (x->n == MAX_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
	*nd = &x->node[x->n];
	memset(*nd, 0, sizeof **nd);
	(*nd)->type = type;
	(*nd)->id = __atomic_add_fetch(&next_node_id, 1, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

/* The node is complete: it is now part of its graph. */
static CUresult added(CUgraphNode *out, CUgraph g, struct sim_node *nd)
{
	((struct sim_graph *)g)->n++;
	*out = (CUgraphNode)nd;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n)
{
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, SIM_NODE_EMPTY, &nd);
	return r != CUDA_SUCCESS ? r : added(out, g, nd);
}

/* A kernel's function, dims and parameter bytes into a node, as the driver copies them. */
static CUresult set_kernel(struct sim_node *nd, const CUDA_KERNEL_NODE_PARAMS *p)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	CUfunction fn = p->func ? p->func : (CUfunction)p->kern;
	struct sim_fn *f = sim_fn_of(fn);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (f->np && !p->kernelParams) return CUDA_ERROR_INVALID_VALUE;
	uint8_t bytes[sizeof nd->params] = {0};
	for (int k = 0; k < f->np; k++) {
		if (f->off[k] > sizeof bytes || f->size[k] > sizeof bytes - f->off[k]) return CUDA_ERROR_INVALID_VALUE;
		memcpy(bytes + f->off[k], p->kernelParams[k], f->size[k]);
	}
	nd->fn = fn;
	const unsigned dims[7] = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
				  p->sharedMemBytes};
	memcpy(nd->dims, dims, sizeof dims);
	memcpy(nd->params, bytes, sizeof bytes);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
					const CUDA_KERNEL_NODE_PARAMS *p)
{
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, SIM_NODE_KERNEL, &nd);
	if (r == CUDA_SUCCESS) r = set_kernel(nd, p);
	return r != CUDA_SUCCESS ? r : added(out, g, nd);
}

static CUresult set_copy(struct sim_node *nd, const CUDA_MEMCPY3D *p)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	nd->copy = *p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
				     const CUDA_MEMCPY3D *p, CUcontext ctx)
{
	(void)ctx;
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, SIM_NODE_MEMCPY, &nd);
	if (r == CUDA_SUCCESS) r = set_copy(nd, p);
	return r != CUDA_SUCCESS ? r : added(out, g, nd);
}

static CUresult set_memset(struct sim_node *nd, const CUDA_MEMSET_NODE_PARAMS *p)
{
	if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4)) return CUDA_ERROR_INVALID_VALUE;
	nd->set = *p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
				     const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx)
{
	(void)ctx;
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, SIM_NODE_MEMSET, &nd);
	if (r == CUDA_SUCCESS) r = set_memset(nd, p);
	return r != CUDA_SUCCESS ? r : added(out, g, nd);
}

/* The node holds its own copy of the child graph, as the driver clones it. */
static CUresult set_child(struct sim_node *nd, CUgraph child)
{
	struct sim_graph *c = graph_of(child);
	if (!c) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *copy = malloc(sizeof *copy);
	if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
	*copy = *c;
	CUresult r = sim_graph_clone_children(copy);
	if (r != CUDA_SUCCESS) {
		sim_graph_free_children(copy);
		free(copy);
		return r;
	}
	if (nd->child) {
		sim_graph_free_children(nd->child);
		free(nd->child);
	}
	nd->child = copy;
	return CUDA_SUCCESS;
}

/* Called by cuGraphLaunch: a graph launched on a capturing stream is recorded in the graph being
 * captured as a child-graph node holding a copy of it (as the driver records it), not run. */
int sim_capture_graph_launch(CUstream s, CUgraphExec e, CUresult *r)
{
	struct sim_obj *o = sim_stream_obj(s);
	struct sim_graph *x = exec_of(e);
	if (!o || !o->capturing)
		return 0;
	CUgraphNode unused;
	struct sim_node *nd;
	if (!x) {
		*r = CUDA_ERROR_INVALID_HANDLE;
		return 1;
	}
	if ((*r = add_node(&unused, (CUgraph)o->capturing, NULL, 0, SIM_NODE_CHILD, &nd)) != CUDA_SUCCESS)
		return 1;
	struct sim_graph *copy = malloc(sizeof *copy);
	if (!copy) {
		*r = CUDA_ERROR_OUT_OF_MEMORY;
		return 1;
	}
	*copy = *x;
	copy->magic = GRAPH_MAGIC;
	if ((*r = sim_graph_clone_children(copy)) != CUDA_SUCCESS) {
		sim_graph_free_children(copy);
		free(copy);
		return 1;
	}
	nd->child = copy;
	*r = added(&unused, (CUgraph)o->capturing, nd);
	return 1;
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraph child)
{
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, SIM_NODE_CHILD, &nd);
	if (r == CUDA_SUCCESS && child == g) r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) r = set_child(nd, child);
	return r != CUDA_SUCCESS ? r : added(out, g, nd);
}

static CUresult event_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent ev, int type)
{
	if (!sim_is_obj(ev, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_node *nd;
	CUresult r = add_node(out, g, deps, n, type, &nd);
	if (r != CUDA_SUCCESS) return r;
	nd->event = ev;
	return added(out, g, nd);
}

EXPORT CUresult cuGraphAddEventRecordNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent ev)
{
	return event_node(out, g, deps, n, ev, SIM_NODE_EVENT_RECORD);
}

EXPORT CUresult cuGraphAddEventWaitNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent ev)
{
	return event_node(out, g, deps, n, ev, SIM_NODE_EVENT_WAIT);
}

/* A stream captured into a graph that exists, after deps: its launches become the graph's kernel
 * nodes (sim_capture_launch), and cuStreamEndCapture gives the same graph back. */
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
					    size_t ndeps, CUstreamCaptureMode mode)
{
	(void)data;
	struct sim_obj *o = sim_stream_obj(s);
	struct sim_graph *x = graph_of(g);
	if (!o) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (!x) return CUDA_ERROR_INVALID_HANDLE;
	if (o->capturing) return CUDA_ERROR_ILLEGAL_STATE;
	if (ndeps && !deps) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < ndeps; i++)
		if (!node_in(x, deps[i])) return CUDA_ERROR_INVALID_VALUE;
	sim_capture_begin(o, x, mode);
	return CUDA_SUCCESS;
}

/* ---- parameters set later ------------------------------------------------------------------ */

EXPORT CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p)
{
	struct sim_node *nd = (struct sim_node *)n;
	if (!nd || nd->type != SIM_NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
	return set_kernel(nd, p);
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p)
{
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || nd->type != SIM_NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
	return set_kernel(nd, p);
}

EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext ctx)
{
	(void)ctx;
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || nd->type != SIM_NODE_MEMCPY) return CUDA_ERROR_INVALID_VALUE;
	return set_copy(nd, p);
}

EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p,
					       CUcontext ctx)
{
	(void)ctx;
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || nd->type != SIM_NODE_MEMSET) return CUDA_ERROR_INVALID_VALUE;
	return set_memset(nd, p);
}

EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child)
{
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || nd->type != SIM_NODE_CHILD) return CUDA_ERROR_INVALID_VALUE;
	return set_child(nd, child);
}

static CUresult exec_event(CUgraphExec e, CUgraphNode n, CUevent ev, int type)
{
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || nd->type != type) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(ev, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	nd->event = ev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
	return exec_event(e, n, ev, SIM_NODE_EVENT_RECORD);
}

EXPORT CUresult cuGraphExecEventWaitNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
	return exec_event(e, n, ev, SIM_NODE_EVENT_WAIT);
}

/* The graph must have the executable graph's shape (the same node types in the same order); its
 * nodes' parameters are taken, the executable graph's nodes keep their identity. */
EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
	struct sim_graph *x = exec_of(e), *src = graph_of(g);
	if (!x || !src) return CUDA_ERROR_INVALID_HANDLE;
	if (!info) return CUDA_ERROR_INVALID_VALUE;
	memset(info, 0, sizeof *info);
	int same = x->n == src->n;
	for (int i = 0; same && i < x->n; i++)
		same = x->node[i].type == src->node[i].type;
	if (!same) {
		info->result = x->n == src->n ? CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED
					      : CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
		return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
	}
	struct sim_graph *copy = malloc(sizeof *copy);
	if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
	*copy = *src;
	CUresult r = sim_graph_clone_children(copy);
	if (r != CUDA_SUCCESS) {
		sim_graph_free_children(copy);
		free(copy);
		return r;
	}
	sim_graph_free_children(x);
	for (int i = 0; i < x->n; i++) {
		uint64_t id = x->node[i].id;
		int disabled = x->node[i].disabled;
		x->node[i] = copy->node[i];
		x->node[i].id = id;
		x->node[i].disabled = disabled;
	}
	free(copy);
	info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *type)
{
	static const CUgraphNodeType types[] = {
		[SIM_NODE_KERNEL] = CU_GRAPH_NODE_TYPE_KERNEL,	       [SIM_NODE_EMPTY] = CU_GRAPH_NODE_TYPE_EMPTY,
		[SIM_NODE_MEMCPY] = CU_GRAPH_NODE_TYPE_MEMCPY,	       [SIM_NODE_MEMSET] = CU_GRAPH_NODE_TYPE_MEMSET,
		[SIM_NODE_CHILD] = CU_GRAPH_NODE_TYPE_GRAPH,	       [SIM_NODE_EVENT_RECORD] = CU_GRAPH_NODE_TYPE_EVENT_RECORD,
		[SIM_NODE_EVENT_WAIT] = CU_GRAPH_NODE_TYPE_WAIT_EVENT,
	};
	const struct sim_node *nd = (const struct sim_node *)n;
	if (!nd || !type) return CUDA_ERROR_INVALID_VALUE;
	if (nd->type < 0 || nd->type > SIM_NODE_EVENT_WAIT) return CUDA_ERROR_INVALID_VALUE;
	*type = types[nd->type];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned int on)
{
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd) return CUDA_ERROR_INVALID_VALUE;
	nd->disabled = !on;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetEnabled(CUgraphExec e, CUgraphNode n, unsigned int *on)
{
	struct sim_node *nd = exec_node(exec_of(e), n);
	if (!nd || !on) return CUDA_ERROR_INVALID_VALUE;
	*on = !nd->disabled;
	return CUDA_SUCCESS;
}

/* ---- a launch ---------------------------------------------------------------------------- */

/* The bytes of one row of a copy's side: host memory as given (the forwarder gives only its
 * region's), device memory through the simulated allocations. */
static uint8_t *copy_row(CUmemorytype type, const void *host, CUdeviceptr dev, uint64_t off, uint64_t n)
{
	if (type == CU_MEMORYTYPE_HOST) return host ? (uint8_t *)host + off : NULL;
	if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED) return sim_resolve(dev + off, n);
	return NULL; /* arrays are not simulated in graphs */
}

CUresult sim_copy3d(const CUDA_MEMCPY3D *p)
{
	for (size_t z = 0; z < p->Depth; z++)
		for (size_t y = 0; y < p->Height; y++) {
			uint64_t so = p->srcXInBytes + (p->srcY + y) * p->srcPitch + (p->srcZ + z) * p->srcPitch * p->srcHeight;
			uint64_t d = p->dstXInBytes + (p->dstY + y) * p->dstPitch + (p->dstZ + z) * p->dstPitch * p->dstHeight;
			uint8_t *s = copy_row(p->srcMemoryType, p->srcHost, p->srcDevice, so, p->WidthInBytes);
			uint8_t *t = copy_row(p->dstMemoryType, p->dstHost, p->dstDevice, d, p->WidthInBytes);
			if (!s || !t) return CUDA_ERROR_ILLEGAL_ADDRESS;
			memmove(t, s, p->WidthInBytes);
		}
	return CUDA_SUCCESS;
}

CUresult sim_memset2d(const CUDA_MEMSET_NODE_PARAMS *p)
{
	for (size_t y = 0; y < p->height; y++) {
		uint8_t *row = sim_resolve(p->dst + y * p->pitch, p->width * p->elementSize);
		if (!row) return CUDA_ERROR_ILLEGAL_ADDRESS;
		for (size_t i = 0; i < p->width; i++) memcpy(row + i * p->elementSize, &p->value, p->elementSize);
	}
	return CUDA_SUCCESS;
}

CUresult sim_graph_run(struct sim_graph *x)
{
	for (int i = 0; i < x->n; i++) {
		struct sim_node *nd = &x->node[i];
		CUresult r = CUDA_SUCCESS;
		if (nd->disabled) continue;
		if (nd->type == SIM_NODE_KERNEL) {
			struct sim_fn *f = sim_fn_of(nd->fn);
			void *args[MAX_P];
			for (int k = 0; f && k < f->np; k++) args[k] = nd->params + f->off[k];
			r = cuLaunchKernel(nd->fn, nd->dims[0], nd->dims[1], nd->dims[2], nd->dims[3], nd->dims[4],
					   nd->dims[5], nd->dims[6], NULL, args, NULL);
		} else if (nd->type == SIM_NODE_MEMCPY) {
			r = sim_copy3d(&nd->copy);
		} else if (nd->type == SIM_NODE_MEMSET) {
			r = sim_memset2d(&nd->set);
		} else if (nd->type == SIM_NODE_CHILD) {
			r = sim_graph_run(nd->child);
		}
		if (r != CUDA_SUCCESS) return r;
	}
	return CUDA_SUCCESS;
}

/* Edges after the fact: the simulated graph runs its nodes in the order they were added, so an
 * edge only has to name two nodes of the graph (and a type the driver has). */
EXPORT CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
					  const CUgraphEdgeData *edges, size_t n)
{
	struct sim_graph *x = graph_of(g);
	if (!x) return CUDA_ERROR_INVALID_HANDLE;
	if (n && (!from || !to)) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++) {
		if (!node_in(x, from[i]) || !node_in(x, to[i]) || from[i] == to[i]) return CUDA_ERROR_INVALID_VALUE;
		if (edges && edges[i].type > CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC) return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* A destroyed node stays in place (its handle names it still) but does nothing. */
EXPORT CUresult cuGraphDestroyNode(CUgraphNode n)
{
	struct sim_node *nd = (struct sim_node *)n;
	if (!nd) return CUDA_ERROR_INVALID_VALUE;
	nd->type = SIM_NODE_EMPTY;
	return CUDA_SUCCESS;
}

/* The simulated graph keeps no edges: its first node is its one root. */
EXPORT CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
	struct sim_graph *x = graph_of(g);
	if (!num) return CUDA_ERROR_INVALID_VALUE;
	if (!x) return CUDA_ERROR_INVALID_HANDLE;
	size_t roots = x->n ? 1 : 0;
	if (nodes) {
		roots = *num < roots ? *num : roots;
		if (roots)
			nodes[0] = (CUgraphNode)&x->node[0];
	}
	*num = roots;
	return CUDA_SUCCESS;
}
