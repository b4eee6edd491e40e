/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pointer attributes: the queried address is resolved as a copy's would be, and the answer is
 * given in the guest's terms.  No host address of the worker, no host handle or token, leaves
 * the host.
 */
#include "addresses.h"
#include "host_memory.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

/* What the driver says of memory it does not know: asked of this unregistered object of the
 * worker, never of an address the guest chose. */
static const uint64_t unknown_memory[8];

/* The queried address in the host's terms: a heap offset (or the guest's own address of pinned
 * memory) becomes the region's mapping; a device address must be this process's own.  0, 1 if
 * the address is none of these (*p is then an unregistered object of the worker), -1 if the
 * request is malformed. */
static int pointer_in(struct vh_chan *ch, struct vh_rd *rd, uint64_t *p)
{
	uint64_t kind = vh_get_u64(rd);
	*p = vh_get_u64(rd);
	if (rd->bad || (kind != VG_BUF_HEAP && kind != VG_BUF_INLINE))
		return -1;
	if (kind == VG_BUF_INLINE && vh_addr_ok(ch, *p, 1) == 0)
		return 0;
	uint64_t off = kind == VG_BUF_HEAP ? *p : vh_alias_offset(ch, *p);
	void *hp = off == UINT64_MAX ? NULL : vmgpu_host_heap(ch->fwd->host, off, 1);
	if (hp) {
		*p = (uint64_t)(uintptr_t)hp;
		return 0;
	}
	if (kind == VG_BUF_HEAP)
		return -1;
	*p = (uint64_t)(uintptr_t)unknown_memory;
	return 1;
}

static int attr_is_address(CUpointer_attribute attr)
{
	return attr == CU_POINTER_ATTRIBUTE_HOST_POINTER || attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
	       attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attr == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR;
}

/* One attribute's value as the guest may see it (vg_wire.h): a context becomes a device index
 * (VG_ANSWER_DEVICE; UINT64_MAX for none or not the guest's), an address in the region a region
 * offset (VG_ANSWER_REGION, which the guest turns into its own pointer), an address of this
 * process's device memory stays; any other address, host handle or token is withheld (0): no
 * host address of the worker leaves the host. */
static void pointer_out(struct vh_chan *ch, CUpointer_attribute attr, const uint64_t *v, struct vg_attr_answer *out)
{
	out->kind = VG_ANSWER_VALUE;
	out->value[0] = v[0];
	out->value[1] = v[1];
	if (attr == CU_POINTER_ATTRIBUTE_CONTEXT) {
		out->kind = VG_ANSWER_DEVICE;
		out->value[0] = UINT64_MAX;
		for (int d = 0; v[0] && d < ch->fwd->ndev; d++)
			if (ch->ctx[d] && (uint64_t)(uintptr_t)ch->ctx[d] == v[0])
				out->value[0] = (uint64_t)d;
	} else if (attr_is_address(attr)) {
		uint64_t region = (uint64_t)(uintptr_t)ch->fwd->region, off = vh_alias_offset(ch, v[0]);
		if (v[0] >= region && v[0] - region < ch->fwd->region_size)
			off = v[0] - region;
		out->value[1] = 0;
		if (off != UINT64_MAX) {
			out->kind = VG_ANSWER_REGION;
			out->value[0] = off;
		} else if (v[0] && !vh_addr_owned(ch, v[0])) {
			out->value[0] = 0;
		}
	} else if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE || attr == CU_POINTER_ATTRIBUTE_P2P_TOKENS) {
		out->value[0] = out->value[1] = 0;
	}
}

CUresult handwritten_cuPointerGetAttribute(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	CUpointer_attribute attr = (CUpointer_attribute)vh_get_u64(rd);
	uint64_t p;
	if (pointer_in(ch, rd, &p))
		return CUDA_ERROR_INVALID_VALUE; /* as the driver says of memory it does not know */
	if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE || attr == CU_POINTER_ATTRIBUTE_P2P_TOKENS)
		return CUDA_ERROR_NOT_SUPPORTED; /* host handles and tokens the guest has no name for */
	uint64_t v[4] = {0};
	struct vg_attr_answer out;
	CUresult r = ch->backend->cuPointerGetAttribute(v, attr, p);
	if (r != CUDA_SUCCESS)
		return r;
	pointer_out(ch, attr, v, &out);
	/* alone, a context or address the guest cannot name is an error, as for a bad pointer */
	if ((out.kind == VG_ANSWER_DEVICE && out.value[0] == UINT64_MAX) ||
	    (attr == CU_POINTER_ATTRIBUTE_HOST_POINTER && out.kind != VG_ANSWER_REGION) ||
	    (attr_is_address(attr) && out.kind == VG_ANSWER_VALUE && out.value[0] == 0))
		return CUDA_ERROR_INVALID_VALUE;
	vh_put(wr, &out, sizeof out);
	return CUDA_SUCCESS;
}

CUresult handwritten_cuPointerGetAttributes(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	uint64_t n = vh_get_u64(rd), p;
	if (rd->bad || n == 0 || n > VG_MAX_POINTER_ATTRS)
		return CUDA_ERROR_INVALID_VALUE;
	CUpointer_attribute attrs[VG_MAX_POINTER_ATTRS];
	uint64_t v[VG_MAX_POINTER_ATTRS][4];
	void *data[VG_MAX_POINTER_ATTRS];
	for (uint64_t i = 0; i < n; i++) {
		uint64_t a = vh_get_u64(rd);
		if (a > INT32_MAX)
			return CUDA_ERROR_INVALID_VALUE;
		attrs[i] = (CUpointer_attribute)a;
		memset(v[i], 0, sizeof v[i]);
		data[i] = v[i];
	}
	/* an address that is none of the guest's gets what the driver says of unknown memory (as
	 * natively for a pageable pointer): its answer for an unregistered object of the worker */
	if (pointer_in(ch, rd, &p) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuPointerGetAttributes((unsigned)n, attrs, data, p);
	if (r != CUDA_SUCCESS)
		return r;
	for (uint64_t i = 0; i < n; i++) {
		struct vg_attr_answer out;
		pointer_out(ch, attrs[i], v[i], &out);
		vh_put(wr, &out, sizeof out);
	}
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
