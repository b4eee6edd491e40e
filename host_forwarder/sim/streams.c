/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Streams and events: objects that complete at once (an event keeps the time it was recorded).
 * A stream being captured collects its launches into a graph (launch.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <time.h>

#include "sim.h"

uint64_t sim_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sim_sleep_ns(uint64_t ns)
{
	struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	while (ns && nanosleep(&t, &t) != 0 && errno == EINTR)
		;
}

CUresult sim_new_obj(void **out, uint32_t magic, int flags)
{
	if (!out) return CUDA_ERROR_INVALID_VALUE;
	struct sim_obj *o = calloc(1, sizeof *o);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	o->magic = magic;
	o->flags = flags;
	*out = o;
	return CUDA_SUCCESS;
}

/* Special stream values (legacy, per-thread) reach us as small integers, never objects. */
int sim_is_obj(const void *p, uint32_t magic)
{
	return (uintptr_t)p >= 4096 && *(const uint32_t *)p == magic;
}

CUresult sim_del_obj(void *p, uint32_t magic)
{
	struct sim_obj *o = p;
	if (!sim_is_obj(o, magic)) return CUDA_ERROR_INVALID_HANDLE;
	o->magic = 0;
	free(o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int f) { return sim_new_obj((void **)s, STREAM_MAGIC, (int)f); }
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int f, int p) { (void)p; return sim_new_obj((void **)s, STREAM_MAGIC, (int)f); }
static _Atomic int global_captures, any_captures;
/* Synchronisations of a whole context while a capture of any mode was open: each invalidates
 * every capture open then (the programming guide: a context or device handle that encompasses
 * an active capture may not be synchronised). */
static _Atomic uint64_t ctx_syncs_in_capture;
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (o && o->capturing) {
		atomic_fetch_sub(&any_captures, 1); /* its capture goes with it */
		if (o->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
			atomic_fetch_sub(&global_captures, 1);
	}
	return sim_del_obj(s, STREAM_MAGIC);
}

static _Atomic int ctx_syncing;
void sim_ctx_synchronized(void)
{
	atomic_fetch_add(&ctx_syncing, 1);
	if (atomic_load(&any_captures))
		atomic_fetch_add(&ctx_syncs_in_capture, 1);
	sim_sleep_ns(sim_ctx_sync_ns());
	if (atomic_load(&any_captures)) /* (one begun while it waited) */
		atomic_fetch_add(&ctx_syncs_in_capture, 1);
	atomic_fetch_sub(&ctx_syncing, 1);
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamQuery(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int *f)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (!f) return CUDA_ERROR_INVALID_VALUE;
	if (!o) return s ? CUDA_ERROR_INVALID_HANDLE : (*f = 0, CUDA_SUCCESS);
	*f = (unsigned int)o->flags;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f)
{
	(void)s; (void)e; (void)f;
	sim_sm_log("wait", -1);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int f)
{
	if (sim_event_create_fails())
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = sim_new_obj((void **)e, EVENT_MAGIC, (int)f);
	if (r == CUDA_SUCCESS) {
		((struct sim_obj *)*e)->ctx_dev = sim_current ? sim_ctx_device(sim_current) : -1;
		if (f & CU_EVENT_INTERPROCESS)
			sim_ipc_event_made();
	}
	return r;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
	int ipc = sim_is_obj(e, EVENT_MAGIC) && (((struct sim_obj *)e)->flags & CU_EVENT_INTERPROCESS);
	CUresult r = sim_del_obj(e, EVENT_MAGIC);
	if (r == CUDA_SUCCESS && ipc)
		sim_ipc_event_gone();
	return r;
}
/* Stream capture as the driver checks it, in part: while a capture begun in the global mode is
 * open (global_captures), a query or synchronisation of an event by a thread whose capture mode is not relaxed is
 * "potentially unsafe" and invalidates it (its cuStreamEndCapture says so), and an event recorded
 * in a capture cannot be queried at all. */
static _Atomic uint64_t sim_unsafe_calls;
static __thread CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static CUresult unsafe_event_call(struct sim_obj *o)
{
	if (capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && atomic_load(&global_captures))
		atomic_fetch_add(&sim_unsafe_calls, 1);
	if (o->captured) {
		atomic_fetch_add(&sim_unsafe_calls, 1);
		return CUDA_ERROR_CAPTURED_EVENT;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
	struct sim_obj *o = (struct sim_obj *)e, *so = sim_stream_obj(s);
	if (!sim_is_obj(o, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	o->t_ns = sim_now_ns();
	o->captured = so && so->capturing;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int f) { (void)f; return cuEventRecord(e, s); }
/* An event is reached sim_event_lag_ns() after its record (tests of how far ahead of the GPU a
 * guest may run). */
static uint64_t event_due(struct sim_obj *o)
{
	int only = sim_event_lag_dev();
	return o->t_ns + (only < 0 || only == o->ctx_dev ? sim_event_lag_ns() : 0);
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
	struct sim_obj *o = (struct sim_obj *)e;
	if (!sim_is_obj(o, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = unsafe_event_call(o);
	if (r != CUDA_SUCCESS) return r;
	for (uint64_t due = event_due(o); sim_now_ns() < due;) {
		struct timespec t = {0, 50000};
		nanosleep(&t, NULL);
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
	struct sim_obj *o = (struct sim_obj *)e;
	if (!sim_is_obj(o, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = unsafe_event_call(o);
	if (r != CUDA_SUCCESS) return r;
	return sim_now_ns() < event_due(o) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
	struct sim_obj *x = (struct sim_obj *)a, *y = (struct sim_obj *)b;
	if (!ms) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(x, EVENT_MAGIC) || !sim_is_obj(y, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*ms = (float)((double)(y->t_ns - x->t_ns) / 1e6);
	return CUDA_SUCCESS;
}

/* ---- stream capture ---- */

struct sim_obj *sim_stream_obj(CUstream s)
{
	return sim_is_obj(s, STREAM_MAGIC) ? (struct sim_obj *)s : NULL;
}

void sim_capture_begin(struct sim_obj *o, struct sim_graph *g, CUstreamCaptureMode mode)
{
	o->capturing = g;
	o->capture_mode = (int)mode;
	o->capture_made = 0;
	o->capture_unsafe = atomic_load(&sim_unsafe_calls);
	/* begun while a context's synchronisation waits: invalidated (its end says so) */
	o->capture_ctx_syncs = atomic_load(&ctx_syncs_in_capture) - (atomic_load(&ctx_syncing) ? 1 : 0);
	atomic_fetch_add(&any_captures, 1);
	if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
		atomic_fetch_add(&global_captures, 1);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (!o) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (o->capturing) return CUDA_ERROR_ILLEGAL_STATE;
	struct sim_graph *g = calloc(1, sizeof *g);
	if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = GRAPH_MAGIC;
	sim_capture_begin(o, g, mode);
	o->capture_made = 1;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (!g) return CUDA_ERROR_INVALID_VALUE;
	if (!o || !o->capturing) return CUDA_ERROR_ILLEGAL_STATE;
	int global = o->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
	if (global)
		atomic_fetch_sub(&global_captures, 1);
	struct sim_graph *x = o->capturing;
	o->capturing = NULL;
	atomic_fetch_sub(&any_captures, 1);
	if ((global && atomic_load(&sim_unsafe_calls) != o->capture_unsafe) ||
	    atomic_load(&ctx_syncs_in_capture) != o->capture_ctx_syncs) {
		*g = NULL; /* no graph of an invalidated capture (one it was made into stays the caller's) */
		if (o->capture_made)
			cuGraphDestroy((CUgraph)x);
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	*g = (CUgraph)x;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (!st) return CUDA_ERROR_INVALID_VALUE;
	*st = o && o->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
					  const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n)
{
	struct sim_obj *o = sim_stream_obj(s);
	if (!st) return CUDA_ERROR_INVALID_VALUE;
	*st = o && o->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	if (id) *id = o && o->capturing ? (cuuint64_t)(uintptr_t)o->capturing : 0;
	if (g) *g = o && o->capturing ? (CUgraph)o->capturing : NULL;
	if (deps) *deps = NULL;
	if (edges) *edges = NULL;
	if (n) *n = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	if (!mode) return CUDA_ERROR_INVALID_VALUE;
	CUstreamCaptureMode old = capture_mode;
	capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* Stream memory operations on host memory the driver can reach (a registered region): the
 * simulated streams run at once, so a wait spins here until the value comes (at most a minute). */
EXPORT CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	(void)s;
	if (addr % 4 || flags & ~CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER || !sim_resolve(addr, 4))
		return CUDA_ERROR_INVALID_VALUE;
	__atomic_store_n((cuuint32_t *)(uintptr_t)addr, value, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	(void)s;
	if (addr % 4 || flags != CU_STREAM_WAIT_VALUE_GEQ || !sim_resolve(addr, 4))
		return CUDA_ERROR_INVALID_VALUE; /* the one condition the forwarder uses */
	for (int i = 0; i < 60 * 20000; i++) {
		cuuint32_t v = __atomic_load_n((cuuint32_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE);
		if ((int32_t)(v - value) >= 0)
			return CUDA_SUCCESS;
		struct timespec t = {0, 50000};
		nanosleep(&t, NULL);
	}
	return CUDA_ERROR_LAUNCH_TIMEOUT;
}
