/* SPDX-License-Identifier: Apache-2.0 */
/* Error names and strings, from the table generated out of cuda.h (generated/vg_errors.c). */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>

#include "vg_errors.h"
#include "vg_guest_protos.h"

static const struct vg_error_name *error_entry(CUresult e)
{
	for (unsigned i = 0; i < vg_error_nnames; i++)
		if (vg_error_names[i].code == (int)e)
			return &vg_error_names[i];
	return NULL;
}

/* An error's name or text; an unknown code is refused, as the driver does. */
static CUresult describe(CUresult e, const char **s, int want_name)
{
	const struct vg_error_name *n = error_entry(e);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = n ? (want_name ? n->name : n->text) : NULL;
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult handwritten_cuGetErrorName(CUresult e, const char **s, unsigned f)
{
	(void)f;
	return describe(e, s, 1);
}

CUresult handwritten_cuGetErrorString(CUresult e, const char **s, unsigned f)
{
	(void)f;
	return describe(e, s, 0);
}
