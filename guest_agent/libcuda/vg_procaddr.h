/* SPDX-License-Identifier: Apache-2.0 */
/* cuGetProcAddress answers, generated from a probe of the real driver. */
#ifndef VG_PROCADDR_H
#define VG_PROCADDR_H

#include <stddef.h>

struct vg_procaddr_row {
	const char *base; /* symbol as asked for ("" for the empty name) */
	int flag;         /* 0 default, 1 legacy stream, 2 per-thread stream */
	int min_version;  /* this answer from this CUDA version on (rows sorted) */
	void *fn;         /* NULL: the call returns rc with status */
	int rc, status;
};
extern const struct vg_procaddr_row vg_procaddr_rows[];
extern const unsigned vg_procaddr_nrows;
extern const int vg_probed_driver_version;

#endif
