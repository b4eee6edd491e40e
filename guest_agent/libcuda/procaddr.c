/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuGetProcAddress (both ABIs), answered in the guest as the probed driver
 * answers it: the rows (generated/guest_procaddr.c, from driver/procaddr.tsv)
 * map a symbol, stream flag and CUDA version to a function of this library or
 * to the driver's refusal.
 */
#include <string.h>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "vg_procaddr.h"
#include "vg_guest_protos.h"

static CUresult procaddr(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)
{
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	int flag = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 2
		   : (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM)	    ? 1
									    : 0;
	/* rows are sorted by (base, flag, version): find the last row <= (symbol, flag, version) */
	unsigned lo = 0, hi = vg_procaddr_nrows;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		const struct vg_procaddr_row *r = &vg_procaddr_rows[mid];
		int c = strcmp(r->base, symbol);
		if (c == 0)
			c = r->flag - flag;
		if (c == 0)
			c = r->min_version > version ? 1 : -1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0) {
		const struct vg_procaddr_row *r = &vg_procaddr_rows[lo - 1];
		if (!strcmp(r->base, symbol) && r->flag == flag) {
			*status = r->status;
			*pfn = r->fn;
			return (CUresult)r->rc;
		}
		if (!strcmp(r->base, symbol) || (lo < vg_procaddr_nrows && !strcmp(vg_procaddr_rows[lo].base, symbol))) {
			/* asked for a version older than the symbol's first */
			*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
			return CUDA_SUCCESS;
		}
	} else if (vg_procaddr_nrows && !strcmp(vg_procaddr_rows[0].base, symbol)) {
		*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		return CUDA_SUCCESS;
	}
	*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

CUresult handwritten_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *st, unsigned f)
{
	(void)f;
	int status = 0;
	CUresult r = procaddr(symbol, pfn, version, flags, &status);
	if (st)
		*st = (CUdriverProcAddressQueryResult)status;
	return r;
}

CUresult handwritten_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags, unsigned f)
{
	(void)f;
	int status = 0;
	return procaddr(symbol, pfn, version, flags, &status);
}
