/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The driver's private export tables (cuGetExportTable), served in the guest (their layouts and
 * UUIDs: native/cuda_api/export_tables.toml):
 * export_tables.c (the lookup by UUID, the runtime, hooks, TLS, context-storage
 * and context-check tables), export_integrity.c (the integrity check),
 * export_tools.c (the tools-context, tools-module and cuBLASLt tables).
 */
#ifndef VG_EXPORT_TABLES_H
#define VG_EXPORT_TABLES_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

typedef void (*vg_slot)(void);

/* A slot nobody has explained: logs its first call's register arguments (they are how a
 * slot's meaning is found) and returns CUDA_ERROR_NOT_SUPPORTED. */
CUresult vg_unknown_slot(const char *table, int tid, int slot, const uint64_t a[4]);

#define VG_UNKNOWN_SLOT(table, tid, n)                                                         \
	static CUresult unknown_##table##_##n(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) \
	{                                                                                      \
		const uint64_t a[4] = {a0, a1, a2, a3};                                        \
		return vg_unknown_slot(#table, tid, n, a);                                     \
	}

/* Each table's layout and UUID (export_tables.toml): the tables, VG_EXPORT_TABLE_<NAME>, the
 * lookup's rows, VG_EXPORT_TABLES. */
#include "vg_export_layouts.h"

#endif
