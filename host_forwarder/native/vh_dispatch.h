/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host forwarder's executor: one thread per guest channel decodes requests
 * (generated/host_dispatch.c and the hand-written vhc_* / vhx_* functions),
 * runs them on the backend (the real libcuda.so.1, or the simulated backend),
 * and replies.  Everything read from the channel is untrusted: decoding is
 * bounds-checked (vh_rd), handles go through the channel's table, device
 * pointers and host buffers are checked against what this channel owns.
 */
#ifndef VH_DISPATCH_H
#define VH_DISPATCH_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vg_wire.h"
#include "vg_kinds.h"
#include "vg_ops.h"
#include "vh_backend_fns.h"
#include "vh_stats.h"
#include "vh_sched.h"
#include "vmgpu/shm.h"

struct vh_backend {
#define X(n) __typeof__(&n) n;
	VH_BACKEND_FNS(X)
#undef X
#define P(n, v) __typeof__(&v) n##_pt;
	VH_BACKEND_PT_FNS(P)
#undef P
	int simulated;
	void *dl;
};

/* Load the backend: "cuda" (libcuda.so.1) or "sim" (libvmgpu-simcuda.so next
 * to the forwarder, or $VMGPU_SIMCUDA).  Returns 0 or -1 with a sentence in err. */
int vh_backend_load(struct vh_backend *b, const char *which, char *err, size_t errlen);

/* ---- the forwarder (one per guest) ------------------------------------------- */

/* What the workers of one guest share besides the books (context.c). */
struct vh_shared {
	pthread_mutex_t ctx_mu;                  /* contexts are made one at a time (robust) */
	_Atomic uint64_t ctx_bytes[VG_MAX_DEVICES]; /* the largest context measured on each GPU */
};

struct vh_fwd {
	const struct vh_backend *backend;
	struct vmgpu_host *host;
	uint8_t *region;
	uint64_t region_size;
	int registered;     /* this worker registered the region with the driver (pinned DMA) */
	int registered_dev; /* in its context on this GPU */
	int ndev;
	CUdevice dev[VG_MAX_DEVICES];
	int ordinal[VG_MAX_DEVICES];     /* host device index of each guest device */
	uint64_t quota[VG_MAX_DEVICES];
	_Atomic uint64_t *used;          /* per device, shared by all of this guest's workers (in stats) */
	_Atomic uint64_t (*charged)[VG_MAX_DEVICES]; /* per channel's worker, shared (books.c) */
	/* per channel: its worker is counted in the GPU's scheduler slot; whoever clears it (the
	 * worker leaving, or the supervisor reaping it) counts it out, once */
	_Atomic uint32_t (*sched_joined)[VG_MAX_DEVICES];
	struct vh_shared *shared;
	uint64_t ctx_reserve;            /* a context's charge where the driver cannot be measured */
	const char *oom_script;          /* run with the guest's identity when it is refused memory */
	struct vh_stats *stats;          /* shared by the workers; a file if --stats is given */
	struct vg_dev_info info[VG_MAX_DEVICES];
	int driver_version;
	const char *guest;
	int verbose;
	char image_dir[256];      /* module images by content, shared by the workers (images.c) */
	struct vh_sched sched[VG_MAX_DEVICES]; /* each GPU's compute scheduler (vh_vh_sched.c) */
};

struct vh_image;
struct vh_image *vh_image_find(struct vh_fwd *f, uint64_t size, const uint64_t hash[2]);
/* Take bytes (malloc'd, size + VH_IMAGE_GUARD, the guard zeroed) as an image; kept for others if their
 * hash is `claimed`.  NULL if the claim was false (the caller keeps the bytes). */
struct vh_image *vh_image_add(struct vh_fwd *f, uint8_t *bytes, uint64_t size, const uint64_t claimed[2]);
void vh_image_put(struct vh_fwd *f, struct vh_image *img);
const uint8_t *vh_image_bytes(const struct vh_image *img);

/* ---- a channel being served ------------------------------------------------------ */

struct vh_handle {
	void *ptr;    /* the host object */
	void *parent; /* host object it belongs to (a function's module), or NULL */
	struct vg_param_info *params; /* launch layout, for functions and kernels */
	uint32_t nparams, gen;
	uint8_t kind, params_known;
};

/* What a guest process holds that the books follow. */
enum vh_alloc_kind {
	VH_MEM,          /* cuMemAlloc, cuMemAllocPitch: base is the address */
	VH_MEM_ASYNC,    /* stream-ordered, from a pool */
	VH_VMM,          /* cuMemCreate: base is the handle */
	VH_VMM_RELEASED, /* released but still mapped: its memory stays */
	VH_VMM_MAP,      /* a mapping at base of size bytes of handle ref */
	VH_ARRAY,        /* base is the host CUarray */
	VH_GRAPH,        /* an executable graph with memory nodes: base is the host CUgraphExec */
	VH_VA,           /* a virtual address range reserved for VMM mappings: base, size bytes */
};
struct vh_alloc {
	CUdeviceptr base;
	uint64_t size; /* what it is charged where the driver cannot be measured (VH_VA: its length) */
	uint64_t ref;
	uint64_t guest; /* VH_VMM, VH_VMM_RELEASED: the value the guest knows the handle by */
	int dev, kind;
};

/* A device address range this guest process may name in a copy, a memset or a query
 * (memory.c): its allocations, its VMM mappings and the globals of its modules.  Kept sorted
 * by base and never overlapping, so an address is found in O(log n). */
enum vh_span_kind { VH_SPAN_MEM, VH_SPAN_MAP, VH_SPAN_GLOBAL };
struct vh_span {
	uint64_t base, end; /* [base, end) */
	void *owner;        /* a global's module or library (host object); NULL otherwise */
	int kind;
};

struct vh_chan {
	struct vh_fwd *fwd;
	const struct vh_backend *backend;
	struct vmgpu_hchan *hc;
	uint32_t index;
	int cur_dev;       /* guest ordinal current on this thread, -1 none */
	/* The process's own context per device, made at first use, as a native process has:
	 * a kernel fault poisons only this context, and destroying it frees what it held. */
	CUcontext ctx[VG_MAX_DEVICES];
	CUresult latched;  /* first error of an async call, not yet reported */
	struct vh_handle *h;
	uint32_t nh, caph, free_hint;
	struct vh_alloc *allocs;
	size_t nallocs, capallocs;
	struct vh_span *spans;        /* device addresses it may name, sorted (memory.c) */
	size_t nspans, capspans;
	uint64_t vmm_ids;             /* VMM handles given out (the guest never sees the driver's) */
	uint64_t *fn_tags;            /* driver function tags seen, by the guest-side value's index */
	uint32_t nfn_tags;
	uint8_t *alias;               /* the region mapped again at the guest's own address, or NULL */
	int alias_tried;
	_Atomic uint64_t *charged;    /* this worker's row of the books, per device */
	pthread_mutex_t books_mu;     /* held across a call that takes or gives memory, and a refresh */
	uint8_t *blob;                /* a module image being received */
	uint64_t blob_size, blob_filled, blob_hash[2];
	struct vh_image *image;       /* or the cached image this load uses */
	uint64_t images_sent, images_cached;
	void *scratch;
	size_t scratch_cap;
	uint64_t ncalls, nasync;
	int end_event; /* the channel's state (VMGPU_HC_*) that ended serving */
};

/* Bounds-checked reader over a request's arguments (a private copy). */
struct vh_rd {
	const uint8_t *p;
	uint32_t len, pos;
	int bad;
};
/* Writer for a reply's out values. */
struct vh_wr {
	uint8_t *p;
	uint32_t cap, len;
	int bad;
};

static inline uint32_t vh_pad8(uint64_t n)
{
	return (uint32_t)((n + 7) & ~7ull);
}

static inline void vh_get(struct vh_rd *rd, void *dst, size_t n)
{
	if (rd->bad || n > rd->len - rd->pos || vh_pad8(n) > rd->len - rd->pos) {
		rd->bad = 1;
		memset(dst, 0, n);
		return;
	}
	memcpy(dst, rd->p + rd->pos, n);
	rd->pos += vh_pad8(n);
}

static inline uint64_t vh_get_u64(struct vh_rd *rd)
{
	uint64_t v;
	vh_get(rd, &v, sizeof v);
	return v;
}

static inline void *vh_get_opt(struct vh_rd *rd, void *dst, size_t n)
{
	if (!vh_get_u64(rd))
		return NULL;
	vh_get(rd, dst, n);
	return dst;
}

/* A pointer to count * elsz bytes inside the request, 8-byte aligned. */
static inline void *vh_get_arr(struct vh_rd *rd, size_t elsz, uint64_t *count)
{
	uint64_t n = vh_get_u64(rd);
	*count = 0;
	if (rd->bad || (elsz && n > (rd->len - rd->pos) / elsz)) {
		rd->bad = 1;
		return NULL;
	}
	uint64_t bytes = n * elsz;
	if (vh_pad8(bytes) > rd->len - rd->pos) {
		rd->bad = 1;
		return NULL;
	}
	void *p = (void *)(rd->p + rd->pos);
	rd->pos += vh_pad8(bytes);
	*count = n;
	return n ? p : NULL;
}

/* A NUL-terminated string inside the request. */
static inline const char *vh_get_str(struct vh_rd *rd)
{
	uint64_t n;
	const char *s = vh_get_arr(rd, 1, &n);
	if (rd->bad || n == 0 || s[n - 1] != '\0') {
		rd->bad = 1;
		return NULL;
	}
	return s;
}

static inline void vh_put(struct vh_wr *wr, const void *src, size_t n)
{
	if (wr->bad || n > wr->cap - wr->len || vh_pad8(n) > wr->cap - wr->len) {
		wr->bad = 1;
		return;
	}
	memcpy(wr->p + wr->len, src, n);
	memset(wr->p + wr->len + n, 0, vh_pad8(n) - n);
	wr->len += vh_pad8(n);
}

/* Handles: guest values are (gen << 32) | ((index + 1) << 8) | kind. */
int vh_handle_in(struct vh_chan *ch, int kind, void **v);
int vh_handle_new(struct vh_chan *ch, int kind, void **v, void *parent);
void vh_handle_drop(struct vh_chan *ch, int kind, void *host_ptr);
struct vh_handle *vh_handle_entry(struct vh_chan *ch, uint64_t guest_value, int kind);
int vh_device_in(struct vh_chan *ch, CUdevice *d);
int vh_context_in(struct vh_chan *ch, CUcontext *c);
/* The process's context on dev, made at its first use after its charge was reserved
 * (context.c); CUDA_ERROR_OUT_OF_MEMORY, with nothing left on the GPU, if it does not fit. */
CUresult vh_chan_context(struct vh_chan *ch, int dev, CUcontext *out);
/* Destroy every context the process has (at its end); nonzero if it had any. */
int vh_chan_contexts_drop(struct vh_chan *ch);
void *vh_scratch(struct vh_chan *ch, uint64_t n, size_t elsz);
void vh_chan_release_all(struct vh_chan *ch);
void vh_blob_drop(struct vh_chan *ch); /* forget the image being received or used */
void vh_uuid_str(const uint8_t uuid[16], char *out, size_t len); /* "GPU-xxxxxxxx-..." */

/* A line in the forwarder's log, marked as the others are (supervisor.c). */
void vh_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The memory books (books.c).  reserve: -1 if n more bytes would pass the quota.  settle:
 * replace this worker's charge by what the driver says it holds (where it can say);
 * nonzero if the guest is then over its quota. */
int vh_books_reserve(struct vh_chan *ch, int dev, uint64_t n);
void vh_books_release(struct vh_chan *ch, int dev, uint64_t n);
int vh_books_settle(struct vh_chan *ch, int dev);
int vh_books_metered(struct vh_chan *ch);
int vh_books_metered_dev(struct vh_chan *ch, int dev);
uint64_t vh_round_charge(uint64_t n);
int vh_books_after_load(struct vh_chan *ch); /* nonzero: the load left the guest over its quota */
/* From the worker's second thread now and then: the books take what the driver says now
 * (memory given back at a synchronisation, module code loaded at a launch). */
void vh_books_refresh(struct vh_chan *ch);
/* Tell the operator's script (if any) that the guest was refused `want` bytes by `call`. */
void vh_oom(struct vh_chan *ch, int dev, const char *call, uint64_t want);

/* Guest addresses (memory.c).  vh_addr_ok: 0 if [addr, addr+n) lies inside this process's
 * own device memory (one allocation or module global, or VMM mappings back to back); -1
 * otherwise, and for a range that wraps.  n == 0 names nothing: only 0 or an address inside
 * (or just past) one of its objects.  vh_dev_range: the same for count elements of elsz
 * bytes.  vh_addr_forget_owner: a module or library went, and its globals with it. */
int vh_addr_ok(struct vh_chan *ch, uint64_t addr, uint64_t n);
int vh_dev_range(struct vh_chan *ch, uint64_t addr, uint64_t count, uint64_t elsz);
int vh_addr_owned(struct vh_chan *ch, uint64_t addr); /* an address inside one of its objects */
void vh_addr_forget_owner(struct vh_chan *ch, void *owner);

/* Host memory a guest names: region heap or channel bulk, checked. */
enum vg_buf_kind { VG_BUF_INLINE = 0, VG_BUF_HEAP = 1, VG_BUF_BULK = 2 };

/* What the guest's NVML shows of one of its GPUs (nvml_query.c). */
CUresult vh_nvml_query(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr);

CUresult vh_dispatch(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr);
CUresult vh_dispatch_proto(struct vh_chan *ch, uint32_t op, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr);
int vh_op_reports_async(uint32_t op);
int vh_op_gpu_work(uint32_t op);

/* Serve one channel until its owner closes it or is lost.  Returns 0, or
 * VH_EXIT_PROTOCOL if the guest broke the protocol (it must be cut off). */
#define VH_EXIT_PROTOCOL 4
int vh_serve(struct vh_chan *ch);

#endif
