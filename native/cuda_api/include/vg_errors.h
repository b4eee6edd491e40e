/* SPDX-License-Identifier: Apache-2.0 */
/* CUresult names, generated from cuda.h (generated/vg_errors.c). */
#ifndef VG_ERRORS_H
#define VG_ERRORS_H

struct vg_error_name {
	int code;
	const char *name, *text;
};
extern const struct vg_error_name vg_error_names[];
extern const unsigned vg_error_nnames;

#endif
