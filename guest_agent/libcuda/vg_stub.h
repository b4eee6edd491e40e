/* SPDX-License-Identifier: Apache-2.0 */
/* A driver export vmgpu does not serve.  Declared without parameters on purpose:
 * on x86-64 a caller's arguments are simply ignored and the result is returned. */
#ifndef VG_STUB_H
#define VG_STUB_H

int vg_unsupported(const char *name, int *once);

#define VG_STUB(name)                                                        \
	__attribute__((visibility("default"))) int name(void);               \
	int name(void)                                                       \
	{                                                                    \
		static int once;                                             \
		return vg_unsupported(#name, &once);                         \
	}

#endif
