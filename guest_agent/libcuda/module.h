/* SPDX-License-Identifier: Apache-2.0 */
/* Bytes that cross as a module image does (module.c): module images, and a link's package (link.c). */
#ifndef VG_MODULE_H
#define VG_MODULE_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

/* Send n bytes to the host's staging blob, where the next load (or link) takes them; under vg_lock(). */
CUresult vg_blob_send(const void *bytes, uint64_t n);
/* A file of the guest read whole (the host never opens a guest's path): its bytes with a NUL after
 * them (a PTX file is text), *size their number without it; or NULL with *r set as the driver would. */
void *vg_read_file(const char *fname, size_t *size, CUresult *r);

#endif
