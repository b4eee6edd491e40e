/* SPDX-License-Identifier: Apache-2.0 */
/* cuGetExportTable: the driver's private tables, served in the guest. */
#include <stdio.h>
#include <string.h>

#include "vg_guest.h"

CUresult vgc_cuGetExportTable(const void **table, const CUuuid *id, unsigned f)
{
	(void)f;
	if (!table || !id)
		return CUDA_ERROR_INVALID_VALUE;
	*table = NULL;
	/* an unknown table fails closed: never success with a pointer nobody filled */
	char hex[33];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->bytes[i]);
	vg_log("export table %s is not provided; CUDA_ERROR_INVALID_VALUE", hex);
	return CUDA_ERROR_INVALID_VALUE;
}
