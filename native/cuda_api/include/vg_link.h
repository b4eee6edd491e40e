/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA linker on the wire, one copy for both sides (guest_agent/libcuda/link.c builds it,
 * host_forwarder/native/link.c checks and runs it), and which JIT options vmgpu knows: the linker's
 * and those of module and library loads (guest_agent/libcuda/jit_options.c sends them,
 * host_forwarder/native/jit_options.c checks them).
 *
 * A link crosses whole at cuLinkComplete: its package goes first through the bulk area as a module
 * image does (VG_OP_BLOB_BEGIN, VG_OP_BLOB_PUT), then one request VG_OP_cuLinkComplete carries
 * where the cubin goes back: u64 kind (VG_BUF_BULK or VG_BUF_HEAP), u64 position or heap offset,
 * u64 capacity.  The package, every part 8-byte aligned:
 *     struct vg_link_header
 *     noptions * struct vg_jit_opt                 the link's options (cuLinkCreate)
 *     ninputs * {
 *         struct vg_link_input
 *         noptions * struct vg_jit_opt             the input's own options
 *         name_len bytes, NUL last, padded to 8    (the input's name, for log messages)
 *         size bytes, padded to 8                  (the input; PTX has its NUL within them)
 *     }
 * and nothing after.  The reply of a request the host accepted (a refused one carries no values):
 *     u64 the driver's CUresult of the link
 *     u64 the cubin's size (copied back only if it fits the capacity; else the guest asks again
 *         with room for it)
 *     the JIT answer of the link's options:
 *         u64 noptions, then each option's value after the call (the guest writes back those
 *             the driver writes: VG_JIT_OUT_* below)
 *         u64 length, then the info log's bytes (NUL last, or length 0)
 *         u64 length, then the error log's bytes (likewise)
 *
 * cuModuleLoadDataEx (VG_OP_cuModuleLoadDataEx) and cuLibraryLoadData (VG_OP_cuLibraryLoadData)
 * load the image sent before them (as cuModuleLoadData does) with JIT options checked as a link's
 * own: the request is u64 noptions, then noptions * struct vg_jit_opt, and nothing after.  The
 * reply of a request the host accepted, whatever the driver answered (a refused one carries no
 * values): u64 the driver's CUresult, u64 the handle (0 unless loaded), the JIT answer.  Library
 * options never cross (guest_agent/libcuda/module.c says which are taken).
 */
#ifndef VG_LINK_H
#define VG_LINK_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#define VG_LINK_MAGIC 0x4b4e4c56u        /* "VLNK" */
#define VG_LINK_MAX_BYTES (256ull << 20) /* every input's bytes together */
#define VG_LINK_MAX_INPUTS 1024
#define VG_LINK_MAX_OPTIONS 64          /* of the link, or of one input */
#define VG_LINK_MAX_NAME 4096           /* an input's name, its NUL included */
#define VG_LINK_LOG_MAX (16u << 10)      /* a log buffer the worker lends the driver (both fit a reply) */
#define VG_LINK_MAX_OUTPUT (1ull << 30)  /* the cubin copied back */

struct vg_link_header {
	uint32_t magic;
	uint32_t noptions, ninputs, pad;
};

/* One JIT option and its value (the driver's void * slot, as a number: never a pointer). */
struct vg_jit_opt {
	uint32_t option; /* CUjit_option */
	uint32_t pad;
	uint64_t value;
};

struct vg_link_input {
	uint32_t type;     /* CUjitInputType */
	uint32_t noptions;
	uint64_t name_len; /* NUL included: 1 or more */
	uint64_t size;
};

_Static_assert(sizeof(struct vg_link_header) == 16, "wire layout");
_Static_assert(sizeof(struct vg_jit_opt) == 16, "wire layout");
_Static_assert(sizeof(struct vg_link_input) == 24, "wire layout");

/* What a JIT option's value is, as vmgpu serves it. */
enum vg_jit_kind {
	VG_JIT_REFUSED = 0,   /* not known, or its value points at memory (symbol and kernel name
			       * lists): CUDA_ERROR_NOT_SUPPORTED in the guest, refused on the host */
	VG_JIT_VALUE,         /* a 32-bit number or enum the driver only reads */
	VG_JIT_NO_VALUE,      /* CU_JIT_TARGET_FROM_CUCONTEXT: the value is not read */
	VG_JIT_LOG_BUFFER,    /* a char * log buffer: the worker lends its own */
	VG_JIT_OUT_LOG_SIZE,  /* in: the buffer's size (at most VG_LINK_LOG_MAX); out: what was filled */
	VG_JIT_OUT_U32,       /* in and out: CU_JIT_THREADS_PER_BLOCK */
	VG_JIT_OUT_FLOAT,     /* out: CU_JIT_WALL_TIME (a float in the slot's low 4 bytes) */
};

/* The kind of JIT option o (its CUjit_option number). */
static inline enum vg_jit_kind vg_jit_option_kind(uint32_t o)
{
	switch ((CUjit_option)o) {
	case CU_JIT_MAX_REGISTERS:
	case CU_JIT_OPTIMIZATION_LEVEL:
	case CU_JIT_TARGET:
	case CU_JIT_FALLBACK_STRATEGY:
	case CU_JIT_GENERATE_DEBUG_INFO:
	case CU_JIT_LOG_VERBOSE:
	case CU_JIT_GENERATE_LINE_INFO:
	case CU_JIT_CACHE_MODE:
	case CU_JIT_NEW_SM3X_OPT:
	case CU_JIT_FAST_COMPILE:
	case CU_JIT_LTO:
	case CU_JIT_FTZ:
	case CU_JIT_PREC_DIV:
	case CU_JIT_PREC_SQRT:
	case CU_JIT_FMA:
	case CU_JIT_OPTIMIZE_UNUSED_DEVICE_VARIABLES:
	case CU_JIT_POSITION_INDEPENDENT_CODE:
	case CU_JIT_MIN_CTA_PER_SM:
	case CU_JIT_MAX_THREADS_PER_BLOCK:
	case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
	case CU_JIT_SPLIT_COMPILE:
		return VG_JIT_VALUE;
	case CU_JIT_TARGET_FROM_CUCONTEXT:
		return VG_JIT_NO_VALUE;
	case CU_JIT_INFO_LOG_BUFFER:
	case CU_JIT_ERROR_LOG_BUFFER:
		return VG_JIT_LOG_BUFFER;
	case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
	case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
		return VG_JIT_OUT_LOG_SIZE;
	case CU_JIT_THREADS_PER_BLOCK:
		return VG_JIT_OUT_U32;
	case CU_JIT_WALL_TIME:
		return VG_JIT_OUT_FLOAT;
	default: /* global symbols, referenced kernels and variables: arrays of pointers; unknown ones */
		return VG_JIT_REFUSED;
	}
}

/* Which of a link's two logs a log option is about: 0 the info log, 1 the error log. */
static inline int vg_jit_log_slot(uint32_t o)
{
	return o == CU_JIT_ERROR_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
}

/* The input types vmgpu links: cubin and fatbin (checked as module images are) and PTX (its NUL
 * within its bytes).  Host objects, archives and NVVM IR are not served: their containers are not
 * checked on the host. */
static inline int vg_link_input_served(uint32_t type)
{
	return type == CU_JIT_INPUT_CUBIN || type == CU_JIT_INPUT_PTX || type == CU_JIT_INPUT_FATBINARY;
}

#endif /* VG_LINK_H */
