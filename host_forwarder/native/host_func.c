/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host functions on a stream (cuLaunchHostFunc, cuStreamAddCallback): the function is the
 * guest's, so it runs in the guest process; the stream only waits for it.  The guest names two
 * 32-bit words of its region's heap (which the host has registered with the driver) and a
 * sequence number; the host queues on the guest's stream a write of the number to the first
 * word ("reached") and a wait until the second word is at least the number ("done").  The guest
 * library's callback thread sees "reached", runs the function, and writes "done".
 *
 * What a hostile guest can do with this: the words are its own, so a wrong value releases or
 * holds only its own stream.  A guest that never writes "done" holds its stream, and with it the
 * compute scheduler's hand-over, which waits for the guest's work as it waits for a long
 * kernel: so a function that has not returned within VMGPU_HOST_FUNC_TIMEOUT_S seconds (in the
 * forwarder's environment, default 10; its --help says so) of its stream reaching it is given up
 * on: the forwarder writes "done" itself, and the guest's next call that reports asynchronous
 * errors returns CUDA_ERROR_LAUNCH_TIMEOUT.  The watch has a thread of its own (started with
 * the process's first host function): the serving thread may be waiting in the driver for the
 * very stream, and the scheduler's thread draining the GPU for a hand-over.
 * A stream being captured into a graph is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED):
 * a graph would replay the same number, which the wait has already seen.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "channel.h"
#include "host_memory.h"
#include "log.h"
#include "protocol.h"
#include "vh_dispatch.h"
#include "vh_protos.h"

#define PENDING_MAX 512 /* the guest library keeps at most 256 in flight */

struct pending {
	uint64_t off;      /* of the word pair in the region */
	uint32_t seq;
	uint64_t since_ns; /* when the stream was first seen to have reached it; 0 not yet */
};

/* A worker serves one channel: this is its process's table (the serving thread adds, the
 * watching thread sweeps). */
static struct pending pending[PENDING_MAX];
static uint32_t npending;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int timed_out, watch_stop;
static uint64_t timeout_ns;
static pthread_t watcher;
static int watching;

static uint64_t host_func_timeout_ns(void)
{
	if (!timeout_ns) {
		const char *e = getenv("VMGPU_HOST_FUNC_TIMEOUT_S");
		double s = e ? atof(e) : 0;
		timeout_ns = (uint64_t)((s > 0 && s < 86400 ? s : 10.0) * 1e9);
	}
	return timeout_ns;
}

static _Atomic uint32_t *words_of(struct vh_chan *ch, uint64_t off)
{
	return (_Atomic uint32_t *)(ch->fwd->region + off);
}

/* Drop finished entries; give up on those overdue.  Under mu. */
static void sweep(struct vh_chan *ch, uint64_t now)
{
	for (uint32_t i = 0; i < npending;) {
		struct pending *p = &pending[i];
		_Atomic uint32_t *w = words_of(ch, p->off);
		int done = (int32_t)(atomic_load_explicit(&w[1], memory_order_acquire) - p->seq) >= 0;
		if (!done && (int32_t)(atomic_load_explicit(&w[0], memory_order_acquire) - p->seq) >= 0) {
			if (!p->since_ns)
				p->since_ns = now;
			else if (now - p->since_ns > host_func_timeout_ns()) {
				vh_log("channel %u: a host function has not returned %.0f s after its stream reached it; "
				       "its stream is released and the guest's next call gets CUDA_ERROR_LAUNCH_TIMEOUT",
				       ch->index, (double)host_func_timeout_ns() / 1e9);
				atomic_store_explicit(&w[1], p->seq, memory_order_release);
				atomic_store(&timed_out, 1);
				done = 1;
			}
		}
		if (done)
			*p = pending[--npending];
		else
			i++;
	}
}

static void *watch_thread(void *arg)
{
	struct vh_chan *ch = arg;
	while (!atomic_load(&watch_stop)) {
		pthread_mutex_lock(&mu);
		sweep(ch, vmgpu_now_ns());
		int idle = npending == 0;
		pthread_mutex_unlock(&mu);
		/* every 2 ms while functions are in flight, every 50 ms while none are (a new one waits
		 * for its stream at first anyway, and the timeout is seconds) */
		struct timespec t = {0, (idle ? 50 : 2) * 1000 * 1000};
		nanosleep(&t, NULL);
	}
	return NULL;
}

/* The watching thread, once; under mu.  0, or -1 if it cannot be started. */
static int watch_start(struct vh_chan *ch)
{
	if (watching)
		return 0;
	host_func_timeout_ns(); /* read once, before another thread reads it */
	if (pthread_create(&watcher, NULL, watch_thread, ch))
		return -1;
	watching = 1;
	return 0;
}

void vh_host_func_release_all(struct vh_chan *ch)
{
	if (watching) {
		atomic_store(&watch_stop, 1);
		pthread_join(watcher, NULL);
		watching = 0;
	}
	pthread_mutex_lock(&mu);
	for (uint32_t i = 0; i < npending; i++)
		atomic_store_explicit(&words_of(ch, pending[i].off)[1], pending[i].seq, memory_order_release);
	npending = 0;
	pthread_mutex_unlock(&mu);
}

int vh_host_func_timed_out(void)
{
	/* asked before every reply: a plain read, the exchange only when one was given up on */
	return atomic_load_explicit(&timed_out, memory_order_relaxed) && atomic_exchange(&timed_out, 0);
}

static CUresult queue_wait(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd)
{
	const struct vh_backend *B = ch->backend;
	uint64_t sraw = vh_get_u64(rd), off = vh_get_u64(rd), seq64 = vh_get_u64(rd);
	if (rd->bad || off % 4 || seq64 == 0 || seq64 > UINT32_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	int bad = 0;
	CUstream s = vh_stream_in(ch, flags, sraw, &bad);
	if (bad)
		return CUDA_ERROR_INVALID_HANDLE;
	void *words = vh_host_buf(ch, VG_BUF_HEAP, off, 8);
	if (!words)
		return CUDA_ERROR_INVALID_VALUE; /* not two words of the heap */
	if (!ch->fwd->registered)
		return CUDA_ERROR_NOT_SUPPORTED; /* the driver cannot reach the region */
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult r = B->cuStreamIsCapturing(s, &st);
	if (r != CUDA_SUCCESS)
		return r;
	if (st != CU_STREAM_CAPTURE_STATUS_NONE)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	CUdeviceptr d;
	if ((r = B->cuMemHostGetDevicePointer_v2(&d, words, 0)) != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	if (npending == PENDING_MAX)
		sweep(ch, vmgpu_now_ns());
	int full = npending == PENDING_MAX, unwatched = watch_start(ch);
	pthread_mutex_unlock(&mu);
	if (full)
		return CUDA_ERROR_OUT_OF_MEMORY; /* more in flight than the guest library ever has */
	if (unwatched)
		return CUDA_ERROR_OUT_OF_MEMORY; /* no thread to give up on a function that never returns */
	/* the wait comes after the write on the same stream; a wait that could not be queued would let
	 * the stream run on before the function, so it is an error the guest hears */
	r = B->cuStreamWriteValue32_v2(s, d, (cuuint32_t)seq64, CU_STREAM_WRITE_VALUE_DEFAULT);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu); /* the guest runs the function now: watched until it is done */
	pending[npending++] = (struct pending){off, (uint32_t)seq64, 0};
	pthread_mutex_unlock(&mu);
	return B->cuStreamWaitValue32_v2(s, d + 4, (cuuint32_t)seq64, CU_STREAM_WAIT_VALUE_GEQ);
}

CUresult handwritten_cuLaunchHostFunc(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return queue_wait(ch, flags, rd);
}

CUresult handwritten_cuStreamAddCallback(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)wr;
	return queue_wait(ch, flags, rd);
}
