/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libvmgpu-simcuda.so: the simulated backend.  A small CUDA driver for hosts
 * without a GPU (CI): device memory is host memory behind made-up device
 * addresses, every address a call names is checked against what was
 * allocated, streams and events are objects that complete at once, and
 * modules are read from PTX text, alone or uncompressed inside a fatbin (entry
 * names and parameter layouts; images checked by the forwarder first).  One
 * kernel really runs: any entry whose name contains "vadd" with (const float*,
 * const float*, float*, int) computes c = a + b, so tests can check results.
 * Other launches are accepted and do nothing.  It is for tests only; the
 * forwarder marks every log line when it runs on it.
 *
 * By API area: devices.c (devices, contexts), memory.c (allocations, host registration, arrays,
 * pointer attributes), copies.c (copies and memsets), streams.c (streams, events, stream
 * capture), modules.c (modules from PTX, functions), launch.c (launches and graphs), pools.c
 * (pools and VMM), knobs.c (what tests set through the environment, and the usage NVML would
 * report), tensormap.c (TMA descriptors), peer.c (peer access and peer copies between the GPUs), graphs_explicit.c (graphs built node by node, and what a graph launch runs), ipc.c (IPC handles between processes: who may open what, no shared bytes), link.c (the linker: one input linked is that input), jit_logs.c (what the linker and module loads write into their JIT options: logs that say SIMULATED, sizes, the wall time), green.c (green contexts: SM partitions, and where launches would run).  This header is what the files share; only the CUDA API is exported (EXPORT).
 */
#ifndef SIM_H
#define SIM_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define SIM_BASE 0x7e0000000000ull

/* ---- device memory (memory.c) ---------------------------------------------------- */

struct range {
	uint64_t dev;  /* device address */
	uint8_t *host; /* backing bytes */
	uint64_t size;
	int registered; /* host memory registered by the forwarder (device address = host address) */
};

extern pthread_mutex_t sim_mu; /* the ranges and the counters below */
extern struct range *sim_ranges;
extern size_t sim_nranges, sim_capranges;
extern uint64_t sim_next_dev;
extern uint64_t sim_used_bytes;

/* The bytes behind [addr, addr+n), or NULL if that is not inside one allocation. */
uint8_t *sim_resolve(uint64_t addr, uint64_t n);
CUresult sim_add_range(uint64_t dev, uint8_t *host, uint64_t size, int registered);
/* An allocation of n bytes as the H100's driver rounds it. */
uint64_t sim_round(uint64_t n);

/* ---- contexts (devices.c) ------------------------------------------------------------- */

/* The device of a primary context, or -1 (a created context, or none). */
int sim_ctx_device(CUcontext c);
/* Green contexts (green.c): the device of one made into a CUcontext (-1: not one), its SMs (0: not
 * one), and the launch log a test reads (VMGPU_SIM_SM_LOG: "launch sms=N", "wait"; sms < 0: none). */
int sim_green_device(CUcontext c);
int sim_green_sms(CUcontext c);
void sim_sm_log(const char *what, int sms);
/* The SMs work on stream s would run on (0: the whole GPU). */
int sim_sms_of(CUstream s);
extern __thread CUcontext sim_current; /* this thread's current context (cuCtxSetCurrent) */

/* ---- the test knobs (knobs.c) ------------------------------------------------------ */

/* VMGPU_SIM_DEVICES: how many GPUs (default 1, at most 8). */
int sim_devices(void);
/* VMGPU_SIM_MEM_MIB: each GPU's memory (default 16 GiB). */
uint64_t sim_total_mem(void);
/* VMGPU_SIM_CTX_MIB: what a context holds (default 0); "@FILE": the number in FILE as the context
 * is made (a test changes it while the forwarder runs, writing it whole: contexts of different
 * sizes; each frees what it held as it was made). */
uint64_t sim_ctx_bytes(void);
/* VMGPU_SIM_REGISTER_US: how long cuMemHostRegister takes (default 0), as the driver takes long
 * to pin a large region. */
uint64_t sim_register_ns(void);
/* A misuse of the driver the real one would not survive (a use after free): said, and the process
 * ends (abort). */
void sim_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* VMGPU_SIM_GREEN_MIB (default 0): what a green context takes. */
uint64_t sim_green_bytes(void);
/* VMGPU_SIM_NVSWITCH set: an HGX board's GPU, whose driver offers multicast objects and fabric
 * handles. */
int sim_hgx(void);
/* VMGPU_SIM_PAGEABLE_ACCESS: whether kernels reach pageable host memory (HMM/ATS). */
int sim_pageable_access(void);
/* VMGPU_SIM_EVENT_LAG_US: an event is reached that long after its record, as if its stream had
 * that much work still ahead of it (default 0: at once). */
uint64_t sim_event_lag_ns(void);
/* VMGPU_SIM_EVENT_LAG_DEV: the lag only for events made in that GPU's context (the others
 * reached at once), as if only that GPU had work queued (default: every GPU's). */
int sim_event_lag_dev(void);
/* VMGPU_SIM_EVENT_FAIL_FIRST=N: the first N cuEventCreate calls of a process fail (out of memory). */
int sim_event_create_fails(void);
/* VMGPU_SIM_CTX_SYNC_US: how long a context's synchronisation takes (default 0: none), as if it
 * had that much work queued. */
uint64_t sim_ctx_sync_ns(void);
/* streams.c: a context is synchronised: it invalidates every capture open while it waits, and
 * any begun then (the driver forbids synchronising a context with a capture open). */
void sim_ctx_synchronized(void);
/* VMGPU_SIM_EXIT_AT_MEMSET=N: the process's Nth cuMemsetD8 exits with status 3. */
void sim_memset_knob(void);
/* What the process holds, as NVML would say, changed by delta (and written to
 * VMGPU_SIM_USAGE_DIR/<pid> if set); vmgpuSimProcessUsage reports it. */
void sim_usage_add(int64_t delta);
extern uint64_t sim_proc_bytes;

/* ---- objects: streams, events, pools (streams.c) ------------------------------------ */

struct sim_graph;
struct sim_obj {
	uint32_t magic;
	int flags;
	uint64_t t_ns;
	struct sim_graph *capturing; /* streams: the graph being captured */
	/* streams: the capture's mode, whether its graph was made for it, and sim_unsafe_calls
	 * when it began (a global-mode capture ends invalidated if an unsafe call came since);
	 * events: recorded in a capture */
	int capture_mode, capture_made;
	uint64_t capture_unsafe;
	uint64_t capture_ctx_syncs; /* streams.c: sim_ctx_synchronized's count when the capture began */
	int captured;
	int ctx_dev; /* events: the GPU of the context current when it was made (-1: none) */
	void *green; /* streams: the green context it was made in (green.c), or NULL */
};
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u
#define POOL_MAGIC 0x504f4f4cu

uint64_t sim_now_ns(void);
/* Sleep ns nanoseconds (a knob's time), whole even if a signal comes. */
void sim_sleep_ns(uint64_t ns);
CUresult sim_new_obj(void **out, uint32_t magic, int flags);
/* Special stream values (legacy, per-thread) reach us as small integers, never objects. */
int sim_is_obj(const void *p, uint32_t magic);
CUresult sim_del_obj(void *p, uint32_t magic);
struct sim_obj *sim_stream_obj(CUstream s);
/* An interprocess event made (or opened) and destroyed: the driver's file for them (ipc.c). */
void sim_ipc_event_made(void);
void sim_ipc_event_gone(void);
/* A capture begins on stream o into graph g (cuStreamBeginCapture_v2, cuStreamBeginCaptureToGraph). */
void sim_capture_begin(struct sim_obj *o, struct sim_graph *g, CUstreamCaptureMode mode);

/* ---- functions (modules.c) and graphs (launch.c) ------------------------------------- */

#define MAX_FN 64
#define MAX_P 2048 /* more than vmgpu lays out (VG_MAX_PARAMS): the driver has no such bound */
#define MAX_PARAM_BYTES 32764 /* the most a launch can pass */
struct sim_fn {
	uint32_t magic;
	char name[128];
	int max_dynamic_smem;
	int np;
	uint32_t off[MAX_P], size[MAX_P]; /* each within MAX_PARAM_BYTES */
};
struct sim_fn *sim_fn_of(const void *h);

#define GRAPH_MAGIC 0x47525048u
#define EXEC_MAGIC 0x47455845u
#define MAX_NODES 64
/* A graph's node.  A captured launch is a kernel node and nothing more (all else zero); graphs
 * built by hand have every kind (graphs_explicit.c). */
enum sim_node_type {
	SIM_NODE_KERNEL = 0,
	SIM_NODE_EMPTY,
	SIM_NODE_MEMCPY,
	SIM_NODE_MEMSET,
	SIM_NODE_CHILD,
	SIM_NODE_EVENT_RECORD,
	SIM_NODE_EVENT_WAIT,
};
struct sim_node {
	CUfunction fn;
	unsigned dims[7];
	uint8_t params[256];
	int type, disabled;
	uint64_t id; /* an executable graph's node is found by the id of the node it was made from */
	CUDA_MEMCPY3D copy;
	CUDA_MEMSET_NODE_PARAMS set;
	struct sim_graph *child; /* the node's own copy of its child graph */
	CUevent event;
};
struct sim_graph {
	uint32_t magic;
	int n;
	struct sim_node node[MAX_NODES];
};
/* Called by cuLaunchKernel: a launch on a capturing stream is recorded, not run (nonzero, with
 * the launch's result in *r). */
int sim_capture_launch(CUstream s, CUfunction func, const unsigned dims[7], void **args, CUresult *r);
int sim_capture_graph_launch(CUstream s, CUgraphExec e, CUresult *r);
/* graphs_explicit.c: run a graph's nodes (cuGraphLaunch); a graph copied by value gets its own
 * copies of its child graphs, and a graph that goes frees them. */
CUresult sim_graph_run(struct sim_graph *x);
/* A 3D copy (host and device sides; arrays are not simulated) and a 2D memset, row by row. */
CUresult sim_copy3d(const CUDA_MEMCPY3D *p);
CUresult sim_memset2d(const CUDA_MEMSET_NODE_PARAMS *p);
CUresult sim_graph_clone_children(struct sim_graph *g);
void sim_graph_free_children(struct sim_graph *g);

/* ---- JIT options' logs (jit_logs.c): the linker's (link.c) and module loads' (modules.c) ---- */

#define SIM_MAX_JIT_OPTIONS (CU_JIT_NUM_OPTIONS * 2)
/* A call's JIT options, as the simulated driver writes into them. */
struct sim_jit {
	unsigned n;
	CUjit_option opt[SIM_MAX_JIT_OPTIONS];
	void **values;     /* the caller's slots: the sizes filled and the wall time go there */
	size_t log_cap[2]; /* the info and error log buffers' sizes (0: no log) */
};
/* n options o with values v taken into j (CUDA_ERROR_INVALID_VALUE for n > 0 without both arrays,
 * or more than SIM_MAX_JIT_OPTIONS): each log starts empty, its size filled 0; the wall time 0.0. */
CUresult sim_jit_begin(struct sim_jit *j, unsigned n, CUjit_option *o, void **v);
/* A line into the info (error 0) or error log, if there is one, and the size filled (NUL
 * included) written back. */
void sim_jit_say(struct sim_jit *j, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
