/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The driver's private export tables (cuGetExportTable), served in the guest:
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

/* The tables whose unexplained slots log their first call. */
enum export_table_id { TABLE_CUDART, TABLE_TLS, TABLE_CHECKS, TABLE_TOOLS_CONTEXT, TABLE_TOOLS_MODULE, TABLE_LT_AUX, TABLE_COUNT };

/* A slot nobody has explained: logs its first call's register arguments (they are how a
 * slot's meaning is found) and returns CUDA_ERROR_NOT_SUPPORTED. */
CUresult vg_unknown_slot(const char *table, int tid, int slot, const uint64_t a[4]);

#define UNKNOWN_SLOT(table, tid, n)                                                            \
	static CUresult unknown_##table##_##n(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) \
	{                                                                                      \
		const uint64_t a[4] = {a0, a1, a2, a3};                                        \
		return vg_unknown_slot(#table, tid, n, a);                                     \
	}

/* A large table is one list of its slots, KNOWN(n, function) or UNKNOWN(n), expanded twice:
 * once to define the unknown slots' functions, once as the table's initialiser. */
#define SLOT_NO_DEFINITION(n, fn)
#define SLOT_ENTRY(n, fn) [n] = (vg_slot)fn,
#define SLOT_COUNT(table) (sizeof(table) / sizeof((table)[0]))

extern const vg_slot vg_cudart_interface[13];
extern const vg_slot vg_integrity_check_table[3];
extern const vg_slot vg_tools_context[93];
extern const vg_slot vg_tools_module[99];
extern const vg_slot vg_cublaslt_aux[17];

#endif
