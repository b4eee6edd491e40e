/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forwarder's statistics page.  Its layout is an ABI of its own, shared with vmgpu/stats.py:
 * native/shm_transport/include/vmgpu/stats_abi.h.  Below: the names the forwarder's files use
 * for it.
 */
#ifndef VH_STATS_H
#define VH_STATS_H

#include <vmgpu/stats_abi.h>

#define VH_STATS_MAGIC VMGPU_STATS_MAGIC
#define VH_STATS_VERSION VMGPU_STATS_VERSION
#define VH_STATS_OPS VMGPU_STATS_OPS
#define vh_stats vmgpu_stats_page /* struct vh_stats */

#endif
