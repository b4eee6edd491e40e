/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel launches: a function's parameter layout is the host's own (from the driver), and the
 * guest's parameter bytes must fill it exactly; a launch configuration's attributes that name
 * events are translated, unknown ones refused.  What a kernel does with the addresses in its
 * parameters is the GPU's business (DESIGN.md: a guest's kernel is confined by its context).
 */
#include <stdlib.h>

#include "protocol.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* Parameter i of a function or kernel as the driver has it. */
static CUresult param_info(const struct vh_backend *B, const struct vh_handle *e, uint32_t i, size_t *off, size_t *sz)
{
	return e->kind == VG_KIND_KERNEL ? B->cuKernelGetParamInfo(e->ptr, i, off, sz)
					 : B->cuFuncGetParamInfo(e->ptr, i, off, sz);
}

static CUresult param_layout(struct vh_chan *ch, struct vh_handle *e)
{
	if (e->params_known)
		return CUDA_SUCCESS;
	const struct vh_backend *B = ch->backend;
	struct vg_param_info tmp[VG_MAX_PARAMS];
	uint32_t n = 0;
	size_t off = 0, sz = 0;
	for (; n < VG_MAX_PARAMS; n++) {
		CUresult r = param_info(B, e, n, &off, &sz);
		if (r == CUDA_ERROR_INVALID_VALUE)
			break;
		if (r != CUDA_SUCCESS)
			return r;
		if (off > UINT32_MAX || sz > 4096)
			return CUDA_ERROR_INVALID_IMAGE;
		tmp[n] = (struct vg_param_info){(uint32_t)off, (uint32_t)sz};
	}
	/* a kernel of more parameters than a launch's argument array holds: the driver would read
	 * pointers past its end */
	if (n == VG_MAX_PARAMS) {
		static unsigned logged; /* a guest launching it again does not flood the log */
		CUresult r = param_info(B, e, n, &off, &sz);
		if (r != CUDA_ERROR_INVALID_VALUE) {
			if (logged < 16 && ++logged)
				vh_log("channel %u: a kernel of more than %u parameters is not served", ch->index,
				       VG_MAX_PARAMS);
			return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : r;
		}
	}
	e->params = n ? malloc(n * sizeof *tmp) : NULL;
	if (n && !e->params)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (n)
		memcpy(e->params, tmp, n * sizeof *tmp);
	e->nparams = n;
	e->params_known = 1;
	return CUDA_SUCCESS;
}

static uint64_t param_bytes(const struct vh_handle *e)
{
	uint64_t end = 0;
	for (uint32_t i = 0; i < e->nparams; i++)
		if ((uint64_t)e->params[i].offset + e->params[i].size > end)
			end = (uint64_t)e->params[i].offset + e->params[i].size;
	return end;
}

/* The guest's parameter bytes against the host's own layout; fills args (graph kernel nodes too). */
CUresult vh_launch_params_in(struct vh_chan *ch, struct vh_handle *e, struct vh_rd *rd, void **args)
{
	uint64_t nblob;
	uint8_t *blob = vh_get_arr(rd, 1, &nblob);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = param_layout(ch, e);
	if (r != CUDA_SUCCESS)
		return r;
	/* the layout is the host's, from the driver; the guest's bytes must fill it exactly */
	if (nblob != param_bytes(e))
		return CUDA_ERROR_INVALID_VALUE;
	for (uint32_t i = 0; i < e->nparams; i++)
		args[i] = blob + e->params[i].offset;
	return CUDA_SUCCESS;
}

/* A launch configuration; attributes naming events are translated, unknown ones refused. */
CUresult vh_launch_config_in(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, CUlaunchConfig *cfg,
			     CUlaunchAttribute *attrs)
{
	uint32_t dims[8];
	vh_get(rd, dims, sizeof dims);
	uint64_t sraw = vh_get_u64(rd), n;
	const CUlaunchAttribute *in = vh_get_arr(rd, sizeof *in, &n);
	if (rd->bad || n != dims[7] || n > VG_MAX_LAUNCH_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	int bad = 0;
	memset(cfg, 0, sizeof *cfg);
	cfg->gridDimX = dims[0];
	cfg->gridDimY = dims[1];
	cfg->gridDimZ = dims[2];
	cfg->blockDimX = dims[3];
	cfg->blockDimY = dims[4];
	cfg->blockDimZ = dims[5];
	cfg->sharedMemBytes = dims[6];
	/* a cooperative launch is sized for the whole GPU: its stream goes there (partition.h); a query
	 * of a configuration (occupancy) puts no work anywhere and moves nothing */
	for (uint64_t i = 0; i < n && ch->part_work; i++)
		if (in[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && in[i].value.cooperative)
			ch->part_home = 1;
	cfg->hStream = vh_stream_in(ch, flags, sraw, &bad);
	if (bad)
		return CUDA_ERROR_INVALID_HANDLE;
	for (uint64_t i = 0; i < n; i++) {
		attrs[i] = in[i];
		void **ev = NULL;
		switch (attrs[i].id) {
		case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
			ev = (void **)&attrs[i].value.programmaticEvent.event;
			break;
		case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
			ev = (void **)&attrs[i].value.launchCompletionEvent.event;
			break;
		case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
			return CUDA_ERROR_NOT_SUPPORTED; /* graphs only; holds a pointer back to the caller */
		default:
			if (attrs[i].id > CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING)
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (ev && vh_handle_in(ch, VG_KIND_EVENT, ev))
			return CUDA_ERROR_INVALID_HANDLE;
	}
	cfg->attrs = n ? attrs : NULL;
	cfg->numAttrs = (unsigned int)n;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuLaunchKernel(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	uint64_t fraw = vh_get_u64(rd);
	uint32_t dims[8];
	vh_get(rd, dims, sizeof dims);
	uint64_t sraw = vh_get_u64(rd);
	struct vh_handle *e = vh_handle_entry(ch, fraw, VG_KIND_FUNCTION);
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	if (!e || bad)
		return rd->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	void *args[VG_MAX_PARAMS];
	CUresult r = vh_launch_params_in(ch, e, rd, args);
	if (r != CUDA_SUCCESS)
		return r;
	return ch->backend->cuLaunchKernel(e->ptr, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s,
					   e->nparams ? args : NULL, NULL);
}

/* The function a request names and its launch configuration, read in this order. */
struct launch_target {
	struct vh_handle *e;
	CUlaunchConfig cfg;
	CUlaunchAttribute attrs[VG_MAX_LAUNCH_ATTRS];
};

static CUresult function_and_config(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct launch_target *t)
{
	t->e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	CUresult r = vh_launch_config_in(ch, flags, rd, &t->cfg, t->attrs);
	if (r != CUDA_SUCCESS)
		return r;
	return t->e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult handwritten_cuLaunchKernelEx(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	struct launch_target t;
	CUresult r = function_and_config(ch, flags, rd, &t);
	void *args[VG_MAX_PARAMS];
	if (r != CUDA_SUCCESS || (r = vh_launch_params_in(ch, t.e, rd, args)) != CUDA_SUCCESS)
		return r;
	return ch->backend->cuLaunchKernelEx(&t.cfg, t.e->ptr, t.e->nparams ? args : NULL, NULL);
}

CUresult handwritten_cuFuncGetName(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	if (rd->bad || !e)
		return CUDA_ERROR_INVALID_HANDLE;
	const char *name = NULL;
	CUresult r = e->kind == VG_KIND_KERNEL ? ch->backend->cuKernelGetName(&name, e->ptr)
					       : ch->backend->cuFuncGetName(&name, e->ptr);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t n = strlen(name) + 1;
	vh_put(wr, &n, 8);
	vh_put(wr, name, n);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* A function's parameter layout, as the host's driver has it (the guest library lays out a
 * launch's parameters by it). */
CUresult vh_proto_function_params(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
	struct vh_handle *e = vh_handle_entry(ch, vh_get_u64(rd), VG_KIND_FUNCTION);
	if (rd->bad || !e)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = param_layout(ch, e);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t n = e->nparams;
	vh_put(wr, &n, 8);
	vh_put(wr, e->params, n * sizeof *e->params);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
