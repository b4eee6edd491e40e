/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The channel's handle table (handles.c): the guest only ever sees table values, never a host
 * pointer.  A guest value is (generation << 32) | ((index + 1) << 8) | kind; a slot's generation
 * goes up each time it is reused, so a handle kept after its object was destroyed names nothing.
 */
#ifndef VH_HANDLES_H
#define VH_HANDLES_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

struct vh_chan;
struct vg_param_info;

struct vh_handle {
	void *ptr;    /* the host object */
	void *parent; /* host object it belongs to (a function's module), or NULL */
	struct vg_param_info *params; /* launch layout, for functions and kernels */
	uint32_t nparams, gen;
	uint8_t kind, params_known;
	int8_t dev; /* the guest GPU whose context was current when it was made (-1: none); a module's
		     * function: its module's */
	/* a stream's twin on an SM partition (partition.c): the stream of the green context of span
	 * twin_span that stands for it there, and the span its work last went to (0: itself) */
	void *twin;
	uint32_t twin_span, on_span;
	/* a blocking stream's implicit order with the legacy stream where they run in different
	 * contexts (partition.c): the legacy stream's work count it last waited for, and whether it
	 * has work since that the legacy stream has not waited for */
	uint64_t legacy_seen;
	uint8_t blocking, unfenced, twin_work; /* (twin_work: some of that work went to its twin) */
};

/* The entry a guest value names, if it is live and of that kind (a kernel passes for a
 * function), else NULL. */
struct vh_handle *vh_handle_entry(struct vh_chan *ch, uint64_t guest_value, int kind);
/* *v, a guest value (0, or a special stream, passes as is), becomes its host object; -1 if it
 * names none of that kind. */
int vh_handle_in(struct vh_chan *ch, int kind, void **v);
/* *v, a host object, becomes the guest value of its entry (the same entry for the same object);
 * -1 if the table is full. */
int vh_handle_new(struct vh_chan *ch, int kind, void **v, void *parent);
/* *v, a host object, becomes the guest value of its live entry; -1 (and *v untouched) if it has
 * none: an object the driver names that this process no longer holds gets no entry anew. */
int vh_handle_find(struct vh_chan *ch, int kind, void **v);
/* The object is gone: its entry and those of what was derived from it (a module's functions). */
void vh_handle_drop(struct vh_chan *ch, int kind, void *host_ptr);
/* Forget every entry (the process ended). */
void vh_handles_clear(struct vh_chan *ch);

/* A stream the guest names (0 is the per-thread default stream with VG_F_PTDS); *bad set if it
 * names none. */
CUstream vh_stream_in(struct vh_chan *ch, uint32_t flags, uint64_t raw, int *bad);
/* A guest device index becomes the host's CUdevice; -1 if the guest has no such GPU. */
int vh_device_in(struct vh_chan *ch, CUdevice *d);
/* A memory location must be one of this guest's GPUs; its id becomes the host's number. */
int vh_location_in(struct vh_chan *ch, CUmemLocation *loc);

#endif
