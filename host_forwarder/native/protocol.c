/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The protocol's own operations, those that are not CUDA calls: the guest library's hello (the
 * protocol version, the GPUs it is told of), goodbye, and the operations module.c and launch.c
 * answer (protocol.h).  The wire formats match guest_agent/libcuda.
 */
#include "protocol.h"
#include "vh_dispatch.h"

static CUresult hello(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
	struct vg_hello_req req;
	vh_get(rd, &req, sizeof req);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	struct vh_fwd *f = ch->fwd;
	struct vg_hello_rep rep = {
		.proto_version = VG_PROTO_VERSION,
		.driver_version = f->driver_version,
		.ndev = (uint32_t)f->ndev,
		.flags = ch->backend->simulated ? VG_HELLO_SIMULATED : 0,
		.heap_registered = (uint64_t)f->registered,
	};
	if (req.proto_version != VG_PROTO_VERSION)
		return CUDA_ERROR_NOT_SUPPORTED;
	vh_put(wr, &rep, sizeof rep);
	for (int i = 0; i < f->ndev; i++)
		vh_put(wr, &f->info[i], sizeof f->info[i]);
	return wr->bad ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

CUresult vh_dispatch_proto(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	switch (op) {
	case VG_OP_HELLO:
		return hello(ch, rd, wr);
	case VG_OP_FUNC_PARAMS:
		return vh_proto_function_params(ch, rd, wr);
	case VG_OP_BLOB_BEGIN:
		return vh_proto_image_begin(ch, rd, wr);
	case VG_OP_BLOB_PUT:
		return vh_proto_image_chunk(ch, rd);
	case VG_OP_GOODBYE:
		return CUDA_SUCCESS;
	case VG_OP_MODULE_FUNCS:
		return vh_proto_module_functions(ch, rd, wr);
	case VG_OP_NVML_QUERY:
		return vh_proto_nvml_query(ch, rd, wr);
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}
