/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The protocol's own operations (VG_OP_HELLO and the others that are not CUDA calls), answered by
 * vh_dispatch_proto (protocol.c) through the files that own them.
 */
#ifndef VH_PROTOCOL_H
#define VH_PROTOCOL_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;
struct vh_rd;
struct vh_wr;

/* module.c: a module image arrives (size and hash first, then its chunks in order through the
 * bulk area) or comes from the cache; a module's functions with their tags. */
CUresult vh_proto_image_begin(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr);
CUresult vh_proto_image_chunk(struct vh_chan *ch, struct vh_rd *rd);
CUresult vh_proto_module_functions(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr);
/* The bytes received whole (or the cache's copy of them), with zeros of VH_IMAGE_GUARD after
 * them, and their number; NULL if nothing was received whole.  A module load or a link takes them. */
const uint8_t *vh_module_blob(struct vh_chan *ch, uint64_t *size);
/* Forget the image being received or used. */
void vh_module_image_forget(struct vh_chan *ch);
/* nvml_query.c: what the guest's NVML shows of one of its GPUs (VG_OP_NVML_QUERY). */
CUresult vh_proto_nvml_query(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr);
/* launch.c: a function's parameter layout, as the host's driver has it. */
CUresult vh_proto_function_params(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr);

#endif
