/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Serving one channel, in a worker: each request is copied out of the ring, its guest device
 * made current (with the process's context, charged at its first use), passed through the
 * GPU's compute gate if it puts work on the GPU (the time it waits there is counted on the
 * statistics page), dispatched, and answered; an async call's first failure is kept for the
 * next synchronising call, as CUDA does.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>

#include "context.h"
#include "graph_devs.h"
#include "partition.h"
#include "process.h"
#include "quota.h"

/* Make the guest device a call names current, with the process's context on it (made, and
 * charged, at its first use: CUDA_ERROR_OUT_OF_MEMORY if it does not fit). */
static CUresult set_device(struct vh_chan *ch, uint16_t dev)
{
	int want = dev == VG_NO_DEVICE ? -1 : dev;
	if (want == ch->cur_dev)
		return CUDA_SUCCESS;
	if (want >= ch->fwd->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	CUcontext c = NULL;
	CUresult r = want >= 0 ? vh_chan_context(ch, want, &c) : CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		return r;
	if (ch->backend->cuCtxSetCurrent(c) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	ch->cur_dev = want;
	return CUDA_SUCCESS;
}

/* Stream captures the guest process has open: a context-wide synchronisation then would end
 * them with an error, and their launches put nothing on the GPU anyway. */
_Atomic int open_captures, capture_beginning, ctx_draining;
_Atomic int ctx_draining_on[VG_MAX_DEVICES];

_Static_assert(VG_MAX_DEVICES <= VMGPU_STATS_GPUS, "the statistics page counts every guest GPU");


/* Time a call waited at guest GPU dev's gate, counted as throttled on that GPU. */
static void throttled(struct vh_chan *ch, int dev, uint64_t waited)
{
	if (waited)
		atomic_fetch_add_explicit(&ch->fwd->stats->throttled_ns[dev], waited, memory_order_relaxed);
}

/* Pass the compute gate of guest GPU dev for the call being served: no deeper into the GPU's
 * queue than the others on it allow, then this guest's turn. */
static void gate_enter(struct vh_chan *ch, int dev)
{
	ch->gate_dev = dev;
	ch->fwd->sched[dev].whole_call = ch->part_home; /* (a cooperative launch: partition.h) */
	throttled(ch, dev, vh_depth_wait(ch) + vh_sched_enter(&ch->fwd->sched[dev]));
}

/* The gates of several GPUs for one call (a graph's launch: dev, its stream's, with its depth, and
 * more): each waited for while none of the others is held (vh_sched_try_enter), the rest then
 * entered only if they can be at once, else all let go and the one refused waited for.  A gate
 * held while another GPU's turn is waited for would hold up that GPU's hand-over, whose drain
 * waits for it, and every guest there with it: without end beside a guest of a higher priority
 * that keeps the other GPU busy. */
static void gates_enter(struct vh_chan *ch, int dev, vh_devs more)
{
	ch->gate_dev = dev;
	throttled(ch, dev, vh_depth_wait(ch));
	vh_devs want = more | (vh_devs)1 << dev, held = 0;
	for (int d = 0; d < ch->fwd->ndev; d++) /* (a graph's launch is no cooperative launch) */
		if (want & ((vh_devs)1 << d))
			ch->fwd->sched[d].whole_call = 0;
	for (int wait_on = -1;;) {
		if (wait_on >= 0) {
			throttled(ch, wait_on, vh_sched_enter(&ch->fwd->sched[wait_on]));
			held = (vh_devs)1 << wait_on;
		}
		wait_on = -1;
		for (int d = 0; d < ch->fwd->ndev && wait_on < 0; d++)
			if ((want & ~held) & ((vh_devs)1 << d)) {
				if (vh_sched_try_enter(&ch->fwd->sched[d]))
					held |= (vh_devs)1 << d;
				else
					wait_on = d;
			}
		if (wait_on < 0)
			break;
		for (int d = 0; d < ch->fwd->ndev; d++)
			if (held & ((vh_devs)1 << d))
				vh_sched_exit(&ch->fwd->sched[d]);
		held = 0;
	}
	ch->gates_more = held & ~((vh_devs)1 << dev);
}

/* A work call that names a stream (vh_op_gpu_stream) passes the gate of that stream's GPU, entered
 * as its stream is decoded (handles.c calls this through ch->stream_gate): the work goes there
 * (the driver lets a copy go to a stream of another device), and the current GPU, which the call
 * may not touch at all, is neither waited for nor held.  dev: the GPU the stream was made on, or
 * -1 for a default stream (the current GPU's).  -1 refuses the stream: a default one with no
 * context current names no GPU. */
#define GATE_AT_STREAM (-2)
static int gate_stream(struct vh_chan *ch, int dev)
{
	if (dev < 0 || dev >= ch->fwd->ndev)
		dev = ch->cur_dev;
	if (ch->gate_dev == GATE_AT_STREAM) {
		if (dev < 0)
			return -1;
		/* a graph's nodes run each on its own GPU: their gates too */
		vh_devs more = ch->cur_op == VG_OP_cuGraphLaunch ? vh_graph_devs(ch->work_exec) & ~((vh_devs)1 << dev) : 0;
		if (more)
			gates_enter(ch, dev, more);
		else
			gate_enter(ch, dev);
	} else if (ch->gate_dev >= 0 && dev >= 0 && dev != ch->gate_dev) {
		/* (a second stream, of another GPU, in one call: none of the calls served has two) */
		vh_sched_exit(&ch->fwd->sched[ch->gate_dev]);
		gate_enter(ch, dev);
	}
	return 0;
}

static const char *op_name(uint32_t op)
{
	switch (op) {
#define N(num, name) \
	case num:    \
		return #name;
		VG_OP_NAMES(N)
#undef N
#define P(op, name) \
	case op:    \
		return name;
		VG_PROTO_OP_NAMES(P)
#undef P
	default: return "unknown operation";
	}
}

int vh_serve(struct vh_chan *ch)
{
	int ended = 0;
	ch->gate_dev = -1;
	ch->stream_gate = gate_stream;
	const struct vmgpu_layout *L = vmgpu_host_layout(ch->fwd->host);
	uint32_t rcap = L->req_ring_size, wcap = L->cpl_ring_size;
	uint64_t *rbuf = malloc(rcap), *wbuf = malloc(wcap);
	if (!rbuf || !wbuf) {
		free(rbuf);
		free(wbuf);
		return 3;
	}
	uint64_t last_poll = vmgpu_now_ns();
	for (;;) {
		uint16_t type = 0;
		int n = vmgpu_hchan_recv(ch->hc, rbuf, rcap, &type, 20 * 1000000ull);
		uint64_t now = vmgpu_now_ns();
		if (n == -EAGAIN || n == -ETIMEDOUT || now - last_poll > 100 * 1000000ull) {
			last_poll = now;
			if (ch->nkept && n < 0) { /* quiet: blocks kept over a second go back to the driver */
				vh_quota_call_begin(ch); /* (memory given back: as a call that frees) */
				vh_kept_expire(ch, now);
				vh_quota_call_end(ch);
			}
			int ev = vmgpu_hchan_poll(ch->hc, now);
			if (ev != VMGPU_HC_SERVING && ev != VMGPU_HC_OPENED) {
				ch->end_event = ev;
				break;
			}
			if (stopping)
				break;
			if (n == -EAGAIN || n == -ETIMEDOUT)
				continue;
		}
		if (n < 0 || region_broken) {
			ended = VH_EXIT_PROTOCOL; /* the guest broke the ring protocol, or its region */
			break;
		}
		if (type != VG_REC_REQUEST || (uint32_t)n < sizeof(struct vg_req_hdr)) {
			vh_log("channel %u: malformed record (type %u, %d bytes); cutting the guest process off", ch->index,
			       type, n);
			ended = VH_EXIT_PROTOCOL;
			break;
		}
		struct vg_req_hdr hdr;
		memcpy(&hdr, rbuf, sizeof hdr);
		struct vh_rd rd = {(const uint8_t *)rbuf + sizeof hdr, (uint32_t)n - sizeof hdr, 0, 0};
		struct vh_wr wr = {(uint8_t *)wbuf + sizeof(struct vg_rep_hdr), wcap - sizeof(struct vg_rep_hdr) - 64, 0, 0};
		uint64_t t0 = vmgpu_now_ns();
		CUresult r;
		if (vh_op_gpu_work(hdr.op) || vh_op_reports_async(hdr.op)) /* (work, or a wait for the GPU's) */
			atomic_store_explicit(&ch->in_call, ch->cur_dev + 1, memory_order_relaxed);
		/* calls that may take or give memory keep the worker's quota row to themselves (work for
		 * the GPU may make a context, or a span's green context: each its own call, if not in one) */
		int may_take_memory = !vh_op_gpu_work(hdr.op);
		if (hdr.op != VG_OP_cuMemAlloc_v2 && hdr.op != VG_OP_cuMemFree_v2)
			ch->work_seq++; /* any other call may have queued work (alloc.c's kept blocks wait for it) */
		if (may_take_memory)
			vh_quota_call_begin(ch);
		ch->cur_op = hdr.op;
		ch->cur_flags = hdr.flags;
		ch->part_work = ch->part_home = 0; /* (set for this call's work alone, below and in launch.c) */
		if ((r = set_device(ch, hdr.dev)) != CUDA_SUCCESS) {
			/* no device, or its context does not fit the quota */
		} else if (vh_op_gpu_work(hdr.op) && ch->cur_dev < 0 && !vh_op_gpu_stream(hdr.op)) {
			r = CUDA_ERROR_INVALID_CONTEXT; /* work for no GPU: no context is current */
		} else if (vh_op_gpu_work(hdr.op)) {
			/* the gate of the GPU the work goes to: the current one, or, for a call that names
			 * a stream, that stream's (entered as it is decoded: gate_stream) */
			if (vh_op_gpu_stream(hdr.op))
				ch->gate_dev = GATE_AT_STREAM;
			else
				gate_enter(ch, ch->cur_dev);
			ch->work_stream = NULL; /* a call that names no stream works on the default one */
			ch->work_stream_id = 0;
			ch->work_exec = NULL;
			/* its work may move to the SMs the GPU's scheduler gives now (partition.h): a
			 * stream's as it is decoded, the legacy stream's (no stream named) here */
			ch->part_work = 1;
			if (!vh_op_gpu_stream(hdr.op))
				vh_part_default(ch, 1);
			r = vh_dispatch(ch, hdr.op, hdr.flags, &rd, &wr);
			if (ch->gates_more && atomic_load(&open_captures) > 0)
				/* a graph launched into a capture reaches its other GPUs from the graph
				 * captured, too (a child-graph node of it) */
				vh_capture_devs |= ch->gates_more;
			vh_work_marks(ch, hdr.flags, r); /* (a graph's on its other GPUs: before their gates go) */
			for (int d = 0; ch->gates_more; d++)
				if (ch->gates_more & ((vh_devs)1 << d)) {
					vh_sched_exit(&ch->fwd->sched[d]);
					ch->gates_more &= ~((vh_devs)1 << d);
				}
			if (ch->gate_dev >= 0) {
				if (atomic_load(&open_captures) > 0) /* (the GPU a capture's graph will reach) */
					vh_capture_devs |= (vh_devs)1 << ch->gate_dev;
				vh_sched_exit(&ch->fwd->sched[ch->gate_dev]);
			} else if (r == CUDA_SUCCESS) {
				vh_log("channel %u: %s passed no scheduler (its stream was not decoded)", ch->index,
				       op_name(hdr.op));
			}
			ch->gate_dev = -1;
		} else if (vh_op_begins_capture(hdr.op)) {
			/* the work queued so far is waited for first (the marks cover only what comes after,
			 * and a drain while the capture begins waits by marks: a deep queue must not run on
			 * into another guest's turn under cover of a begin); then no context-wide drain may
			 * overlap the begin (it would invalidate the capture): the drains from here on wait
			 * by marks, and one under way is waited for */
			vh_capture_opening(ch);
			atomic_store(&capture_beginning, 1);
			while (atomic_load(&ctx_draining))
				sched_yield();
			r = vh_dispatch(ch, hdr.op, hdr.flags, &rd, &wr);
			if (r == CUDA_SUCCESS)
				atomic_fetch_add(&open_captures, 1);
			atomic_store(&capture_beginning, 0);
		} else {
			r = vh_dispatch(ch, hdr.op, hdr.flags, &rd, &wr);
		}
		vh_part_after(ch); /* (the process's own context current again, if a span's was) */
		if (may_take_memory)
			vh_quota_call_end(ch);
		if (hdr.op == VG_OP_cuStreamEndCapture && atomic_load(&open_captures) > 0 &&
			 (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
			  r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED))
			/* a capture ends here, with or without a graph; one refused (a stream not being
			 * captured, another thread's) goes on.  A capture whose stream is destroyed keeps the
			 * count up: the drain marks then cost a little, and the drains stay whole. */
			if (atomic_fetch_sub(&open_captures, 1) == 1)
				vh_capture_devs = 0;
		atomic_store_explicit(&ch->in_call, 0, memory_order_relaxed);
		uint64_t spent = vmgpu_now_ns() - t0;
		atomic_store_explicit(&ch->ncalls, atomic_load_explicit(&ch->ncalls, memory_order_relaxed) + 1,
				      memory_order_relaxed);
		struct vmgpu_stats_page *st = ch->fwd->stats;
		atomic_fetch_add_explicit(&st->busy_ns, spent, memory_order_relaxed);
		atomic_fetch_add_explicit((hdr.flags & VG_F_NOREPLY) ? &st->async_calls : &st->sync_calls, 1,
					  memory_order_relaxed);
		if (hdr.op < VMGPU_STATS_OPS) {
			atomic_fetch_add_explicit(&st->op[hdr.op].count, 1, memory_order_relaxed);
			atomic_fetch_add_explicit(&st->op[hdr.op].ns, spent, memory_order_relaxed);
		}
		if (r != CUDA_SUCCESS && vh_tracing_errors())
			vh_log("channel %u: %s%s -> %s (%d)", ch->index, op_name(hdr.op),
			       (hdr.flags & VG_F_NOREPLY) ? " (async)" : "", vh_error_name(r), r);
		if (vh_host_func_timed_out() && ch->latched == CUDA_SUCCESS)
			ch->latched = CUDA_ERROR_LAUNCH_TIMEOUT; /* a host function given up on (host_func.c) */
		if (hdr.flags & VG_F_NOREPLY) {
			ch->nasync++;
			if (r != CUDA_SUCCESS && ch->latched == CUDA_SUCCESS)
				ch->latched = r;
			continue;
		}
		if (r == CUDA_SUCCESS && ch->latched != CUDA_SUCCESS && vh_op_reports_async(hdr.op)) {
			r = ch->latched;
			ch->latched = CUDA_SUCCESS;
		}
		if (wr.bad && r == CUDA_SUCCESS)
			r = CUDA_ERROR_INVALID_VALUE;
		struct vg_rep_hdr rep = {(int32_t)r, hdr.op, hdr.seq};
		memcpy(wbuf, &rep, sizeof rep);
		uint32_t len = sizeof rep + (r == CUDA_SUCCESS ? wr.len : 0);
		if (vmgpu_hchan_send(ch->hc, VG_REC_REPLY, wbuf, len, 5ull * 1000000000ull) < 0)
			break;
	}
	free(rbuf);
	free(wbuf);
	return ended;
}

