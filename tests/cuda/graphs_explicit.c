/*
 * A graph built by hand, as XLA's command buffers build them, natively and through vmgpu:
 *   graphs_explicit VADD_PTX [OTHER_ADDR FOREIGN_NODE]
 * memset node (a = 1.0) and a copy from pinned memory (b = i) -> kernel node (vadd: c = a + b)
 * -> copy of c into pinned memory -> empty node; instantiated, launched, checked; the executable
 * graph's kernel node given new parameters (c = b + b) and launched again; the executable graph
 * updated from another graph (a = 2.0), and refused one of another shape; a child graph; node
 * types and enabled flags.  Then what a hostile program tries, each answered when the node is
 * added or its parameters set: ranges past its allocation or at OTHER_ADDR (another process's
 * allocation), pageable host memory, a function, a node or a graph that is not its own (a
 * forged handle, FOREIGN_NODE: another process's node).  Each line is "what: results".
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "read_file.h"

#define N 256

static CUDA_MEMSET_NODE_PARAMS memset_of(CUdeviceptr dst, unsigned value, size_t width)
{
	CUDA_MEMSET_NODE_PARAMS p;
	memset(&p, 0, sizeof p);
	p.dst = dst;
	p.value = value;
	p.elementSize = 4;
	p.width = width;
	p.height = 1;
	return p;
}

/* A 1D copy; a NULL host side is device memory. */
static CUDA_MEMCPY3D copy_of(CUdeviceptr dst, void *dst_host, CUdeviceptr src, const void *src_host, size_t n)
{
	CUDA_MEMCPY3D p;
	memset(&p, 0, sizeof p);
	p.srcMemoryType = src_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
	p.srcHost = src_host;
	p.srcDevice = src;
	p.dstMemoryType = dst_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
	p.dstHost = dst_host;
	p.dstDevice = dst;
	p.WidthInBytes = n;
	p.Height = 1;
	p.Depth = 1;
	return p;
}

static CUDA_KERNEL_NODE_PARAMS vadd_of(CUfunction fn, void **args)
{
	CUDA_KERNEL_NODE_PARAMS p;
	memset(&p, 0, sizeof p);
	p.func = fn;
	p.gridDimX = p.gridDimY = p.gridDimZ = 1;
	p.blockDimX = N;
	p.blockDimY = p.blockDimZ = 1;
	p.kernelParams = args;
	return p;
}

/* How many of out[i] differ from want(i). */
static int wrong(const float *out, float scale, float plus)
{
	int bad = 0;
	for (int i = 0; i < N; i++)
		bad += out[i] != scale * (float)i + plus;
	return bad;
}

static CUcontext ctx;
static CUfunction fn;
static CUdeviceptr a, b, c;
static float *hin, *hout;

/* memset (a = value) and a copy of hin into b -> vadd(args) -> a copy of c into hout -> empty */
static CUresult build(CUgraph *g, CUgraphNode *n[5], unsigned value, void **args)
{
	CUDA_MEMSET_NODE_PARAMS ms = memset_of(a, value, N);
	CUDA_MEMCPY3D in = copy_of(b, NULL, 0, hin, N * 4), out = copy_of(0, hout, c, NULL, N * 4);
	CUDA_KERNEL_NODE_PARAMS kp = vadd_of(fn, args);
	CUresult r = cuGraphCreate(g, 0);
	if (!r)
		r = cuGraphAddMemsetNode(n[0], *g, NULL, 0, &ms, ctx);
	if (!r)
		r = cuGraphAddMemcpyNode(n[1], *g, NULL, 0, &in, ctx);
	CUgraphNode deps[2] = {*n[0], *n[1]};
	if (!r)
		r = cuGraphAddKernelNode(n[2], *g, deps, 2, &kp);
	if (!r)
		r = cuGraphAddMemcpyNode(n[3], *g, n[2], 1, &out, ctx);
	if (!r)
		r = cuGraphAddEmptyNode(n[4], *g, n[3], 1);
	return r;
}

int main(int argc, char **argv)
{
	CUdevice dev;
	CUmodule mod;
	char *ptx = argc > 1 ? read_file(argv[1]) : NULL;
	CUdeviceptr other = argc > 2 ? (CUdeviceptr)strtoull(argv[2], NULL, 0) : 0x1000;
	CUgraphNode foreign = (CUgraphNode)(uintptr_t)(argc > 3 ? strtoull(argv[3], NULL, 0) : 0x7777777700);
	if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
	    cuModuleLoadData(&mod, ptx) || cuModuleGetFunction(&fn, mod, "vadd") || cuMemAlloc(&a, N * 4) ||
	    cuMemAlloc(&b, N * 4) || cuMemAlloc(&c, N * 4) || cuMemAllocHost((void **)&hin, N * 4) ||
	    cuMemAllocHost((void **)&hout, N * 4)) {
		printf("setup failed\n");
		return 1;
	}
	for (int i = 0; i < N; i++)
		hin[i] = (float)i;
	int n = N;
	void *args[] = {&a, &b, &c, &n};

	/* ---- the graph ---- */
	CUgraph g;
	CUgraphNode m1, c0, k, c1, e;
	CUgraphExec exec;
	CUDA_MEMSET_NODE_PARAMS ms = memset_of(a, 0x3f800000u, N); /* 1.0f */
	CUDA_MEMCPY3D out = copy_of(0, hout, c, NULL, N * 4);
	CUDA_KERNEL_NODE_PARAMS kp = vadd_of(fn, args);
	CUresult r = build(&g, (CUgraphNode *[]){&m1, &c0, &k, &c1, &e}, 0x3f800000u, args);
	if (!r)
		r = cuGraphInstantiate(&exec, g, 0);
	memset(hout, 0xff, N * 4);
	if (!r)
		r = cuGraphLaunch(exec, 0);
	if (!r)
		r = cuStreamSynchronize(0);
	printf("built and launched: %d %d\n", r, r ? -1 : wrong(hout, 1, 1));

	/* the executable graph's kernel node given new parameters: c = b + b */
	void *args2[] = {&b, &b, &c, &n};
	CUDA_KERNEL_NODE_PARAMS kp2 = vadd_of(fn, args2);
	memset(hout, 0xff, N * 4);
	r = cuGraphExecKernelNodeSetParams(exec, k, &kp2);
	if (!r)
		r = cuGraphLaunch(exec, 0);
	if (!r)
		r = cuStreamSynchronize(0);
	printf("kernel node updated: %d %d\n", r, r ? -1 : wrong(hout, 2, 0));

	/* the executable graph updated from another graph of its shape (a = 2.0), and from one that is not */
	CUgraph g2, g3;
	CUgraphNode n2[5], lone;
	CUgraphExecUpdateResultInfo info;
	memset(&info, 0xff, sizeof info);
	memset(hout, 0xff, N * 4);
	r = build(&g2, (CUgraphNode *[]){&n2[0], &n2[1], &n2[2], &n2[3], &n2[4]}, 0x40000000u, args);
	if (!r)
		r = cuGraphExecUpdate(exec, g2, &info);
	if (!r)
		r = cuGraphLaunch(exec, 0);
	if (!r)
		r = cuStreamSynchronize(0);
	printf("updated from a graph: %d %d %d\n", r, (int)info.result, r ? -1 : wrong(hout, 1, 2));
	r = cuGraphCreate(&g3, 0);
	if (!r)
		r = cuGraphAddEmptyNode(&lone, g3, NULL, 0);
	if (!r)
		r = cuGraphExecUpdate(exec, g3, &info);
	printf("updated from another shape: %d %d\n", r, info.result != CU_GRAPH_EXEC_UPDATE_SUCCESS);
	cuGraphDestroy(g2);
	cuGraphDestroy(g3);

	/* a node disabled in the executable graph, and enabled again */
	unsigned on = 7;
	r = cuGraphNodeSetEnabled(exec, m1, 0);
	CUresult r2 = cuGraphNodeGetEnabled(exec, m1, &on);
	printf("enabled flag: %d %d %u\n", r, r2, on);
	cuGraphNodeSetEnabled(exec, m1, 1);

	CUgraphNodeType t[5] = {0};
	CUgraphNode nodes[5] = {m1, c0, k, c1, e};
	int types_ok = 1;
	for (int i = 0; i < 5; i++)
		types_ok &= cuGraphNodeGetType(nodes[i], &t[i]) == CUDA_SUCCESS;
	printf("node types: %d %d %d %d %d %d\n", types_ok, t[0], t[1], t[2], t[3], t[4]);

	/* a child graph: c = 3.0 after the parent's copy of c */
	CUgraph child, parent;
	CUgraphNode cm, cn, cc;
	CUgraphExec pexec;
	CUDA_MEMSET_NODE_PARAMS three = memset_of(c, 0x40400000u, N);
	r = cuGraphCreate(&child, 0);
	if (!r)
		r = cuGraphAddMemsetNode(&cm, child, NULL, 0, &three, ctx);
	if (!r)
		r = cuGraphCreate(&parent, 0);
	if (!r)
		r = cuGraphAddChildGraphNode(&cn, parent, NULL, 0, child);
	if (!r)
		r = cuGraphAddMemcpyNode(&cc, parent, &cn, 1, &out, ctx);
	if (!r)
		r = cuGraphInstantiate(&pexec, parent, 0);
	memset(hout, 0, N * 4);
	if (!r)
		r = cuGraphLaunch(pexec, 0);
	if (!r)
		r = cuStreamSynchronize(0);
	printf("child graph: %d %d\n", r, r ? -1 : wrong(hout, 0, 3));

	/* a launch captured into a graph that exists, after its memset node (c = 3.0 + i) */
	CUstream s;
	CUgraph gt, got = NULL;
	CUgraphNode tm;
	CUgraphExec texec;
	void *args3[] = {&c, &b, &a, &n};
	CUDA_MEMSET_NODE_PARAMS three_c = memset_of(c, 0x40400000u, N);
	r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	if (!r)
		r = cuGraphCreate(&gt, 0);
	if (!r)
		r = cuGraphAddMemsetNode(&tm, gt, NULL, 0, &three_c, ctx);
	if (!r)
		r = cuStreamBeginCaptureToGraph(s, gt, &tm, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
	if (!r)
		r = cuLaunchKernel(fn, 1, 1, 1, N, 1, 1, 0, s, args3, NULL);
	if (!r)
		r = cuStreamEndCapture(s, &got);
	if (!r)
		r = cuGraphInstantiate(&texec, gt, 0);
	if (!r)
		r = cuGraphLaunch(texec, s);
	if (!r)
		r = cuStreamSynchronize(s);
	if (!r)
		r = cuMemcpyDtoH(hout, a, N * 4);
	CUresult rf = cuStreamBeginCaptureToGraph(s, gt, &foreign, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
	printf("captured into a graph: %d %d %d %d\n", r, got == gt, r ? -1 : wrong(hout, 1, 3), rf);

	/* ---- what a hostile program tries: each refused when the node is added or set ---- */
	CUgraphNode x;
	CUDA_MEMSET_NODE_PARAMS past = memset_of(a, 0, N + 1), shifted = memset_of(a + 4, 0, N),
				theirs = memset_of(other, 0, 4);
	CUDA_MEMSET_NODE_PARAMS rows = memset_of(a, 0, N);
	rows.height = 2;
	rows.pitch = N * 4;
	printf("memset nodes: %d %d %d %d %d\n", cuGraphAddMemsetNode(&x, g, NULL, 0, &past, ctx),
	       cuGraphAddMemsetNode(&x, g, NULL, 0, &shifted, ctx), cuGraphAddMemsetNode(&x, g, NULL, 0, &theirs, ctx),
	       cuGraphAddMemsetNode(&x, g, NULL, 0, &rows, ctx), cuGraphExecMemsetNodeSetParams(exec, m1, &past, ctx));

	CUDA_MEMCPY3D long_copy = copy_of(a, NULL, b, NULL, N * 4 + 1), to_theirs = copy_of(other, NULL, b, NULL, 4),
		      from_theirs = copy_of(a, NULL, other, NULL, 4), tall = copy_of(a, NULL, b, NULL, N * 4);
	tall.Height = 2;
	tall.srcPitch = tall.dstPitch = N * 4;
	char *pageable = malloc(N * 4);
	CUDA_MEMCPY3D from_pageable = copy_of(a, NULL, 0, pageable, N * 4), to_pageable = copy_of(0, pageable, a, NULL, 4),
		      heap_past = copy_of(a, NULL, 0, hin, N * 4);
	heap_past.srcXInBytes = 1u << 30; /* from pinned memory, but far past the heap */
	printf("memcpy nodes: %d %d %d %d %d %d %d %d %d\n", cuGraphAddMemcpyNode(&x, g, NULL, 0, &long_copy, ctx),
	       cuGraphAddMemcpyNode(&x, g, NULL, 0, &to_theirs, ctx), cuGraphAddMemcpyNode(&x, g, NULL, 0, &from_theirs, ctx),
	       cuGraphAddMemcpyNode(&x, g, NULL, 0, &tall, ctx), cuGraphAddMemcpyNode(&x, g, NULL, 0, &from_pageable, ctx),
	       cuGraphAddMemcpyNode(&x, g, NULL, 0, &to_pageable, ctx), cuGraphAddMemcpyNode(&x, g, NULL, 0, &heap_past, ctx),
	       cuGraphExecMemcpyNodeSetParams(exec, c1, &from_pageable, ctx),
	       cuGraphExecMemcpyNodeSetParams(exec, c1, &to_theirs, ctx));

	/* a function not its own: a forged handle (its own with another generation) */
	CUDA_KERNEL_NODE_PARAMS forged_fn = vadd_of((CUfunction)((uintptr_t)fn ^ (1ull << 32)), args);
	CUgraphNode forged_node = (CUgraphNode)((uintptr_t)k ^ (1ull << 32));
	printf("kernel nodes: %d %d %d %d %d\n", cuGraphAddKernelNode(&x, g, NULL, 0, &forged_fn),
	       cuGraphAddKernelNode(&x, g, &foreign, 1, &kp), cuGraphAddKernelNode(&x, g, &forged_node, 1, &kp),
	       cuGraphExecKernelNodeSetParams(exec, foreign, &kp), cuGraphKernelNodeSetParams(forged_node, &kp));
	CUgraph forged_graph = (CUgraph)((uintptr_t)g ^ (1ull << 32));
	printf("handles: %d %d %d %d %d\n", cuGraphAddEmptyNode(&x, g, &foreign, 1),
	       cuGraphAddMemsetNode(&x, g, &foreign, 1, &ms, ctx), cuGraphAddChildGraphNode(&x, g, NULL, 0, forged_graph),
	       cuGraphAddEmptyNode(&x, forged_graph, NULL, 0), cuGraphNodeGetType(foreign, &t[0]));

	/* the generic cuGraphAddNode: each type through its typed call's checks */
	{
		CUgraph g2;
		CUgraphNode gm, gc0, gk, gc1;
		CUgraphExec e2;
		CUgraphNodeParams np;
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_MEMSET;
		CUDA_MEMSET_NODE_PARAMS three = memset_of(a, 0x40400000u, N); /* 3.0f */
		memcpy(&np.memset, &three, sizeof three);
		np.memset.ctx = ctx;
		r = cuGraphCreate(&g2, 0);
		if (!r)
			r = cuGraphAddNode(&gm, g2, NULL, NULL, 0, &np);
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_MEMCPY;
		np.memcpy.copyParams = copy_of(b, NULL, 0, hin, N * 4);
		np.memcpy.copyCtx = ctx;
		if (!r)
			r = cuGraphAddNode(&gc0, g2, NULL, NULL, 0, &np);
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_KERNEL;
		memcpy(&np.kernel, &kp, sizeof kp);
		CUgraphNode kdeps[2] = {gm, gc0};
		if (!r)
			r = cuGraphAddNode(&gk, g2, kdeps, NULL, 2, &np);
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_MEMCPY;
		np.memcpy.copyParams = out;
		np.memcpy.copyCtx = ctx;
		if (!r)
			r = cuGraphAddNode(&gc1, g2, &gk, NULL, 1, &np);
		if (!r)
			r = cuGraphInstantiate(&e2, g2, 0);
		memset(hout, 0xff, N * 4);
		if (!r)
			r = cuGraphLaunch(e2, 0);
		if (!r)
			r = cuStreamSynchronize(0);
		printf("generic nodes: %d %d\n", r, r ? -1 : wrong(hout, 1, 3));
		/* refused as the typed calls refuse, or not served */
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_MEMSET;
		memcpy(&np.memset, &past, sizeof past);
		CUresult bad_range = cuGraphAddNode(&x, g2, NULL, NULL, 0, &np);
		np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
		CUresult conditional = cuGraphAddNode(&x, g2, NULL, NULL, 0, &np);
		memset(&np, 0, sizeof np);
		np.type = CU_GRAPH_NODE_TYPE_EMPTY;
		np.reserved0[1] = 1;
		CUresult reserved = cuGraphAddNode(&x, g2, NULL, NULL, 0, &np);
		np.reserved0[1] = 0;
		CUgraphEdgeData edge;
		memset(&edge, 0, sizeof edge);
		edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
		CUresult edged = cuGraphAddNode(&x, g2, &gk, &edge, 1, &np);
		printf("generic refusals: %d %d %d\n", bad_range, conditional, reserved);
		/* edges with a type: the node, then its edges (cuGraphAddDependencies), each end checked */
		printf("edges: %d %d %d\n", edged, cuGraphAddDependencies(g2, &gk, &foreign, &edge, 1),
		       cuGraphAddDependencies(g2, &foreign, &gc1, NULL, 1));
		size_t nroots = 0;
		CUgraphNode root = NULL;
		CUresult rc = cuGraphGetRootNodes(g2, NULL, &nroots);
		size_t one = 1;
		CUresult rr = rc ? rc : cuGraphGetRootNodes(g2, &root, &one);
		CUgraphNodeType rt = CU_GRAPH_NODE_TYPE_EMPTY;
		printf("roots: %d %zu %d %d\n", rc, nroots, rr, rr ? -1 : (int)cuGraphNodeGetType(root, &rt) || rt != CU_GRAPH_NODE_TYPE_MEMSET);
		cuGraphExecDestroy(e2);
		cuGraphDestroy(g2);
	}

	/* the graph's nodes go with it */
	cuGraphExecDestroy(exec);
	r = cuGraphDestroy(g);
	printf("destroyed: %d %d\n", r, cuGraphNodeGetType(k, &t[0]));
	return 0;
}
