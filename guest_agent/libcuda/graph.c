/* SPDX-License-Identifier: Apache-2.0 */
/* Stream capture state and a graph's nodes: replies whose shape depends on what was asked for. */
#include "call.h"
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
