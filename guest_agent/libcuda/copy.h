/* SPDX-License-Identifier: Apache-2.0 */
/* How a buffer's bytes cross (copy.c): inline in the request, in the pinned heap, or in bulk chunks. */
#ifndef VG_COPY_H
#define VG_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "call.h"

/* A bulk chunk: a quarter of the channel's bulk area, so several are in flight. */
uint64_t vg_bulk_chunk_size(void);

/* A unified address: pinned heap memory as its region offset, anything else as a device address. */
void vg_put_unified_address(struct vg_call *c, CUdeviceptr p, size_t n);

/* The stream's earlier work done, where the copy is asynchronous (a pageable copy is done when it
 * returns, as the driver's is). */
CUresult vg_stream_wait(int async, CUstream s, unsigned fl);

#endif
