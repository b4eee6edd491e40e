/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How far ahead of the GPU a guest's work may run while other guests share the GPU.
 *
 * A guest's calls are queued on the GPU as fast as it makes them: a trainer may have a whole
 * step (tens of milliseconds of kernels) in its streams.  A hand-over waits for that to finish
 * (vh_sched_tick's drain), so a guest of a higher priority that wants the GPU would wait behind
 * all of it.  While a guest of a higher priority is on the GPU's page, and under the shared policy
 * (where the calls through the gate must be the guest's progress on the GPU: vh_sched.h, bounded),
 * each call that puts work on the GPU is followed by a marker (an event recorded on the call's
 * stream, or on the default stream for a call that names none: cuMemsetD8 and cuMemcpyDtoD,
 * too, return before their work is done), and a call passes only while fewer than
 * --sched-depth of the markers are still to come: the rest of the guest's work waits in its
 * ring, where the forwarder, not the GPU, decides whose goes next.  Otherwise a guest is not
 * held back at all.  Under shared the share controller may hold a guest to less (its slot's
 * depth word on the page): how much of its work the GPU has at once is how much of the GPU it
 * takes beside the others.
 *
 * A stream capture the guest has open (serve.c: open_captures) does not lift the depth (it would
 * be a way round it for as long as the guest liked), and is neither joined nor broken by it: no
 * marker goes on a stream being captured (a record there would join the capture, and a query of
 * it would end it), and the markers are recorded and queried in the relaxed capture mode (a
 * query is one of the calls a global-mode capture forbids), the guest's own mode set back after.
 */
#include <time.h>

#include "process.h"
#include "graph_devs.h"

/* The markers of one worker on one guest GPU: a ring of events, oldest at head.  A marker stands
 * for the calls on its stream up to it: while the guest's calls stay on one stream, its newest
 * marker is recorded again after each (a record replaces the event's last), until it stands for
 * `stride` of them, so that VH_DEPTH_MARKS events can hold a depth of up to VH_DEPTH_MAX calls.
 * Streams are told apart by the guest's value (with its handle's generation: a stream made where
 * a destroyed one was is another), never by the driver's pointer. */
struct depth {
	CUevent ev[VH_DEPTH_MARKS];
	uint64_t on[VH_DEPTH_MARKS];    /* the guest's value of the stream each marker was recorded on */
	uint32_t cover[VH_DEPTH_MARKS]; /* the calls each stands for */
	uint32_t head, n;
	uint32_t calls; /* the calls the markers stand for: those not known to be done */
	int made;       /* 1: ev[] created in the process's context */
	uint64_t retry_at; /* they could not all be: not before then again (meanwhile not held) */
};
static struct depth depth[VG_MAX_DEVICES];

/* How many calls one marker may stand for at depth limit: one each up to half the ring, then as
 * many as keep the ring half full (the rest of it for streams the guest switches between). */
static uint32_t stride(uint32_t limit)
{
	uint32_t half = VH_DEPTH_MARKS / 2;
	return limit <= half ? 1 : (limit + half - 1) / half;
}

static int on(struct vh_chan *ch)
{
	int d = ch->gate_dev;
	return d >= 0 && ch->fwd->sched_depth > 0 && atomic_load(&ch->fwd->sched[d].bounded);
}

/* While the guest has a capture open: this thread's capture mode relaxed (the guest's, to give
 * back with relent), and whether stream s is being captured (or cannot be told). */
static CUstreamCaptureMode relax(const struct vh_backend *B)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
	B->cuThreadExchangeStreamCaptureMode(&m);
	return m;
}

static void relent(const struct vh_backend *B, CUstreamCaptureMode m)
{
	B->cuThreadExchangeStreamCaptureMode(&m);
}

static int captured(const struct vh_backend *B, CUstream s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	return B->cuStreamIsCapturing(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The process's context on guest GPU d made current for a moment (not necessarily the current
 * one: a call may name a stream of another of its GPUs): 1 pushed, 0 already current, -1 none. */
static int enter_ctx(struct vh_chan *ch, int d)
{
	if (!ch->ctx[d])
		return -1;
	if (d == ch->cur_dev)
		return 0;
	return ch->backend->cuCtxPushCurrent_v2(ch->ctx[d]) == CUDA_SUCCESS ? 1 : -1;
}

static void leave_ctx(struct vh_chan *ch, int pushed)
{
	if (pushed > 0) {
		CUcontext was;
		ch->backend->cuCtxPopCurrent_v2(&was);
	}
}

/* An event of the process's context on guest GPU d. */
static int make_event(struct vh_chan *ch, int d, CUevent *ev)
{
	int pushed = enter_ctx(ch, d);
	if (pushed < 0)
		return -1;
	CUresult r = ch->backend->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
	leave_ctx(ch, pushed);
	return r == CUDA_SUCCESS ? 0 : -1;
}

/* Destroy n events of the process's context on guest GPU d (made by make_event). */
static void destroy_events(struct vh_chan *ch, int d, CUevent *ev, int n)
{
	int pushed = n > 0 ? enter_ctx(ch, d) : -1;
	if (pushed < 0)
		return; /* (they go with the context) */
	for (int i = 0; i < n; i++)
		ch->backend->cuEventDestroy_v2(ev[i]);
	leave_ctx(ch, pushed);
}

/* The oldest marker is forgotten, and the calls it stood for with it. */
static void drop_oldest(struct depth *q)
{
	q->calls -= q->cover[q->head];
	q->head = (q->head + 1) % VH_DEPTH_MARKS;
	q->n--;
}

/* Forget markers that have passed (or whose stream failed: the guest sees that error itself). */
static void retire(struct vh_chan *ch, struct depth *q)
{
	while (q->n && ch->backend->cuEventQuery(q->ev[q->head]) != CUDA_ERROR_NOT_READY)
		drop_oldest(q);
}

/* The depth a call is held to: the forwarder's, or under shared the share controller's for this
 * guest where that is less (its slot's depth word; 0: none), and --yield-depth where that is less
 * while a guest of a higher priority is near (vh_sched.h, near_higher). */
static uint32_t limit_of(struct vh_chan *ch)
{
	uint32_t limit = (uint32_t)ch->fwd->sched_depth;
	struct vh_sched *s = &ch->fwd->sched[ch->gate_dev];
	if (s->pg && atomic_load(&s->pg->policy) == VMGPU_SCHED_SHARED) {
		uint32_t mine = atomic_load(&s->pg->slot[s->me].depth);
		if (mine && mine < limit)
			limit = mine;
		uint32_t near = (uint32_t)ch->fwd->yield_depth;
		if (near && near < limit && atomic_load(&s->near_higher))
			limit = near;
	}
	return limit;
}

uint64_t vh_depth_wait(struct vh_chan *ch)
{
	if (!on(ch))
		return 0;
	struct depth *q = &depth[ch->gate_dev];
	uint32_t limit = limit_of(ch);
	/* (a full ring holds the guest too: one that switches stream at every call has a marker per
	 * call, and is held to VH_DEPTH_MARKS of them rather than let through unmarked) */
#define DEPTH_FULL(q) ((q)->calls >= limit || (q)->n == VH_DEPTH_MARKS)
	if (!DEPTH_FULL(q))
		return 0;
	int capturing = atomic_load(&open_captures) > 0;
	CUstreamCaptureMode mode = capturing ? relax(ch->backend) : CU_STREAM_CAPTURE_MODE_RELAXED;
	retire(ch, q);
	uint64_t t0 = DEPTH_FULL(q) ? vmgpu_now_ns() : 0, stuck = t0, spins = 0;
	while (DEPTH_FULL(q)) {
		/* a stream held up for a second (a host function, a wait on a value) is the guest's
		 * own business: the oldest marker is let go rather than its other streams held back,
		 * one a second (letting go of them all let a guest that held a stream for a second
		 * queue its depth again each second: events 3 s late on the simulated GPU, depth 256,
		 * 250 calls a second passed where 85 may) */
		if (vmgpu_now_ns() - stuck > 1000000000ull) {
			drop_oldest(q);
			stuck = vmgpu_now_ns();
			continue;
		}
		if (++spins > 64) {
			struct timespec t = {0, 10000};
			nanosleep(&t, NULL);
		}
		retire(ch, q);
	}
	if (capturing)
		relent(ch->backend, mode);
#undef DEPTH_FULL
	return t0 ? vmgpu_now_ns() - t0 : 0;
}

/* A marker after a call whose work went on stream s (not one being captured), whose guest value
 * is id: the newest marker recorded again, if it is on s and stands for fewer than stride calls,
 * else the next one (vh_depth_wait left one free).  A call whose marker cannot be recorded is not
 * counted: it is not held back. */
static void depth_mark(struct vh_chan *ch, CUstream s, uint64_t id)
{
	struct depth *q = &depth[ch->gate_dev];
	if (!q->made) {
		/* events the process's context could not make (its driver memory, say) leave it unheld
		 * for a second, not for good: a guest must not escape the depth by failing one create */
		uint64_t now = vmgpu_now_ns();
		if (now < q->retry_at)
			return;
		int i = 0;
		while (i < VH_DEPTH_MARKS && !make_event(ch, ch->gate_dev, &q->ev[i]))
			i++;
		if (i < VH_DEPTH_MARKS) {
			destroy_events(ch, ch->gate_dev, q->ev, i);
			q->retry_at = now + 1000000000ull;
			return;
		}
		q->made = 1;
	}
	uint32_t last = (q->head + q->n + VH_DEPTH_MARKS - 1) % VH_DEPTH_MARKS;
	if (q->n && q->on[last] == id && q->cover[last] < stride((uint32_t)ch->fwd->sched_depth)) {
		if (ch->backend->cuEventRecord(q->ev[last], s) == CUDA_SUCCESS)
			q->cover[last]++, q->calls++;
		return;
	}
	if (q->n == VH_DEPTH_MARKS)
		return;
	uint32_t i = (q->head + q->n) % VH_DEPTH_MARKS;
	if (ch->backend->cuEventRecord(q->ev[i], s) == CUDA_SUCCESS) {
		q->on[i] = id, q->cover[i] = 1;
		q->n++, q->calls++;
	}
}

/* ---- the drain marks of a process with a capture open ---------------------------------- */

/* One mark per stream that was given work since the last drain, on each guest GPU.  Written by
 * the serving thread (inside the scheduler's gate, and when the context goes), read by the
 * scheduler thread's drain (the gate closed): the lock keeps a mark's event alive while waited for.
 * A mark's event is of its stream's context, which for a graph's other GPUs is not the table's
 * GPU's (drain_mark). */
#define CAPTURE_MARKS 64
struct capture_marks {
	pthread_mutex_t mu;
	struct {
		CUstream s;
		CUevent ev;
		int dev; /* the guest GPU whose context made ev */
	} m[CAPTURE_MARKS];
	uint32_t n, made, next; /* marks in use; events created; the one a full table gives up next */
};
static struct capture_marks cmarks[VG_MAX_DEVICES] = {[0 ... VG_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER}};

/* A drain mark in GPU d's table after a call whose work went on stream s of GPU sdev (not one
 * being captured): d's hand-over waits for it. */
static void drain_mark(struct vh_chan *ch, int d, int sdev, CUstream s)
{
	const struct vh_backend *B = ch->backend;
	struct capture_marks *c = &cmarks[d];
	pthread_mutex_lock(&c->mu);
	/* a stream's slot: its handle and its GPU (a default stream, NULL or the legacy or per-thread
	 * one, is a stream of each context: GPU 1's and a graph's from GPU 0's are two marks) */
	uint32_t i = 0;
	while (i < c->n && (c->m[i].s != s || c->m[i].dev != sdev))
		i++;
	if (i == c->n && c->n == CAPTURE_MARKS) {
		/* more streams with work than marks: this process waits for one of them itself */
		i = c->next;
		c->next = (c->next + 1) % CAPTURE_MARKS;
		B->cuEventSynchronize(c->m[i].ev);
	} else if (i == c->n && c->n == c->made) {
		if (!make_event(ch, sdev, &c->m[i].ev))
			c->m[i].dev = sdev, c->made++, c->n++;
		else
			i = CAPTURE_MARKS; /* no event: this call's work goes unmarked */
	} else if (i == c->n) {
		c->n++;
	}
	if (i < CAPTURE_MARKS && c->m[i].dev != sdev) {
		/* the slot (one free, or the one a full table gave up, waited for) has an event of
		 * another GPU's context, and an event is recorded only on a stream of its own: one of
		 * the stream's instead */
		CUevent ev;
		if (!make_event(ch, sdev, &ev)) {
			B->cuEventDestroy_v2(c->m[i].ev);
			c->m[i].ev = ev;
			c->m[i].dev = sdev;
		} else {
			c->m[i].s = (CUstream)(uintptr_t)-1; /* the old record stays: names no stream */
			i = CAPTURE_MARKS;
		}
	}
	if (i < CAPTURE_MARKS) {
		c->m[i].s = s;
		if (B->cuEventRecord(c->m[i].ev, s) != CUDA_SUCCESS)
			c->m[i].s = (CUstream)(uintptr_t)-1; /* stays, reached: names no stream */
	}
	pthread_mutex_unlock(&c->mu);
}

static CUstream work_stream(struct vh_chan *ch, uint32_t flags)
{
	CUstream s = ch->work_stream; /* (a call that names none: the default stream its work went to) */
	return !s && (flags & VG_F_PTDS) ? CU_STREAM_PER_THREAD : s;
}

void vh_work_marks(struct vh_chan *ch, uint32_t flags, CUresult r)
{
	if (r != CUDA_SUCCESS || ch->gate_dev < 0)
		return;
	int capturing = atomic_load(&open_captures) > 0, bounded = on(ch);
	if (!capturing && !bounded && !ch->gates_more)
		return;
	const struct vh_backend *B = ch->backend;
	CUstream s = work_stream(ch, flags);
	CUstreamCaptureMode mode = capturing ? relax(B) : CU_STREAM_CAPTURE_MODE_RELAXED;
	if (!capturing || !captured(B, s)) { /* (a captured call put nothing on the GPU) */
		if (bounded)
			depth_mark(ch, s, s == ch->work_stream ? ch->work_stream_id : (uint64_t)(uintptr_t)s);
		if (capturing)
			drain_mark(ch, ch->gate_dev, ch->gate_dev, s);
		/* a graph's other GPUs (their gates still held): their hand-overs wait for its work there,
		 * with or without a capture open */
		for (int d = 0; ch->gates_more && d < ch->fwd->ndev; d++)
			if (ch->gates_more & ((vh_devs)1 << d))
				drain_mark(ch, d, ch->gate_dev, s);
	}
	if (capturing)
		relent(B, mode);
}

void vh_capture_drain(const struct vh_backend *B, int dev)
{
	struct capture_marks *c = &cmarks[dev];
	pthread_mutex_lock(&c->mu);
	for (uint32_t i = 0; i < c->n; i++)
		B->cuEventSynchronize(c->m[i].ev); /* (its stream's fault is the guest's to see) */
	c->n = 0;
	pthread_mutex_unlock(&c->mu);
}

void vh_capture_opening(struct vh_chan *ch)
{
	for (int d = 0; atomic_load(&open_captures) == 0 && d < ch->fwd->ndev; d++)
		if (ch->ctx[d])
			ch->backend->cuCtxSynchronize_v2(ch->ctx[d]); /* (an error stays for the guest's next call) */
}

void vh_depth_forget(const struct vh_backend *B, int dev)
{
	/* the process's context on dev goes, and its events with it; the drain marks of a graph's
	 * other GPUs put dev's events in their tables too (vh_work_marks), and theirs in dev's: every
	 * table starts again, its events of the contexts that stay destroyed */
	if (dev < 0 || dev >= VG_MAX_DEVICES)
		return;
	depth[dev] = (struct depth){0};
	for (int t = 0; t < VG_MAX_DEVICES; t++) {
		struct capture_marks *c = &cmarks[t];
		pthread_mutex_lock(&c->mu);
		int mixed = t == dev;
		for (uint32_t i = 0; i < c->made && !mixed; i++)
			mixed = c->m[i].dev == dev;
		if (mixed) {
			for (uint32_t i = 0; i < c->made; i++)
				if (c->m[i].dev != dev)
					B->cuEventDestroy_v2(c->m[i].ev);
			c->n = c->made = c->next = 0;
		}
		pthread_mutex_unlock(&c->mu);
	}
}
