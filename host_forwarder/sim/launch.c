/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Launches (the one kernel that runs: a "vadd" entry computes c = a + b) and graphs: launches
 * captured on a stream, replayed by cuGraphLaunch (which runs every kind of node: graphs_explicit.c).
 */
#include "sim.h"

EXPORT CUresult cuLaunchKernel(CUfunction func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			       unsigned bz, unsigned shmem, CUstream s, void **args, void **extra)
{
	(void)extra;
	struct sim_fn *f = sim_fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
	const unsigned dims[7] = {gx, gy, gz, bx, by, bz, shmem};
	CUresult cr;
	if (sim_capture_launch(s, func, dims, args, &cr))
		return cr;
	/* where it would run: its stream's green context's SMs, or, on a default stream, the current
	 * context's (0: the whole GPU) */
	sim_sm_log("launch", sim_sms_of(s));
	/* the driver copies every parameter's bytes into the launch, through args[0..np) */
	if (f->np && !args) return CUDA_ERROR_INVALID_VALUE;
	static _Thread_local uint8_t launched[MAX_PARAM_BYTES];
	for (int k = 0; k < f->np; k++)
		memcpy(launched + f->off[k], args[k], f->size[k]);
	if (strstr(f->name, "vadd") && f->np == 4 && f->size[0] == 8 && f->size[3] == 4) {
		uint64_t a, b, c;
		int n;
		memcpy(&a, args[0], 8);
		memcpy(&b, args[1], 8);
		memcpy(&c, args[2], 8);
		memcpy(&n, args[3], 4);
		uint64_t threads = (uint64_t)gx * gy * gz * bx * by * bz;
		uint64_t count = n < 0 ? 0 : ((uint64_t)n < threads ? (uint64_t)n : threads);
		float *pa = (float *)sim_resolve(a, count * 4), *pb = (float *)sim_resolve(b, count * 4);
		float *pc = (float *)sim_resolve(c, count * 4);
		if (count && (!pa || !pb || !pc)) return CUDA_ERROR_ILLEGAL_ADDRESS;
		for (uint64_t i = 0; i < count; i++) pc[i] = pa[i] + pb[i];
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **args, void **extra)
{
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
			      c->sharedMemBytes, c->hStream, args, extra);
}

EXPORT CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c)
{
	if (!n || !c) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_fn_of(f)) return CUDA_ERROR_INVALID_HANDLE;
	*n = 8; /* one cluster per simulated multiprocessor */
	return CUDA_SUCCESS;
}

/* ---- graphs: launches captured on a stream, replayed by cuGraphLaunch ---- */

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)flags;
	if (!e) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *x = malloc(sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	*x = *(struct sim_graph *)g;
	x->magic = EXEC_MAGIC;
	if (sim_graph_clone_children(x) != CUDA_SUCCESS) {
		sim_graph_free_children(x);
		free(x);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*e = (CUgraphExec)x;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	CUresult cr;
	if (sim_capture_graph_launch(s, e, &cr)) /* (a capturing stream records it) */
		return cr;
	if (!sim_is_obj(e, EXEC_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	return sim_graph_run((struct sim_graph *)e); /* graphs_explicit.c */
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
	(void)s;
	return sim_is_obj(e, EXEC_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
	if (!sim_is_obj(e, EXEC_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	((struct sim_graph *)e)->magic = 0;
	sim_graph_free_children((struct sim_graph *)e);
	free(e);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
	if (!sim_is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	((struct sim_graph *)g)->magic = 0;
	sim_graph_free_children((struct sim_graph *)g);
	free(g);
	return CUDA_SUCCESS;
}

/* Called by cuLaunchKernel: a launch on a capturing stream is recorded, not run. */
int sim_capture_launch(CUstream s, CUfunction func, const unsigned dims[7], void **args, CUresult *r)
{
	struct sim_obj *o = sim_stream_obj(s);
	struct sim_fn *f = sim_fn_of(func);
	if (!o || !o->capturing)
		return 0;
	struct sim_graph *g = o->capturing;
	if (!f || g->n == MAX_NODES) {
		*r = f ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_HANDLE;
		return 1;
	}
	struct sim_node *nd = &g->node[g->n];
	nd->fn = func;
	memcpy(nd->dims, dims, sizeof nd->dims);
	for (int k = 0; k < f->np; k++) {
		if (f->off[k] > sizeof nd->params || f->size[k] > sizeof nd->params - f->off[k]) {
			*r = CUDA_ERROR_INVALID_VALUE;
			return 1;
		}
		memcpy(nd->params + f->off[k], args[k], f->size[k]);
	}
	g->n++;
	*r = CUDA_SUCCESS;
	return 1;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
	if (!num) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *x = (struct sim_graph *)g;
	if (!nodes) {
		*num = (size_t)x->n;
		return CUDA_SUCCESS;
	}
	size_t n = *num < (size_t)x->n ? *num : (size_t)x->n;
	for (size_t i = 0; i < n; i++)
		nodes[i] = (CUgraphNode)&x->node[i];
	*num = n;
	return CUDA_SUCCESS;
}
