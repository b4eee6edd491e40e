/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host functions on a stream (cuLaunchHostFunc, cuStreamAddCallback) run here, in the guest
 * process, on a callback thread of this library: the host queues on the stream a write of a
 * sequence number to a word of the region's heap and a wait for a second word
 * (host_forwarder/native/host_func.c); this thread sees the first, runs the function, and writes
 * the second.  At most SLOTS functions are in flight; a further one waits for a slot.  As the
 * driver says, a host function must not call CUDA.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "connection.h"
#include "vg_guest.h"
#include "vg_guest_protos.h"

#define SLOTS 256

struct slot {
	CUhostFn fn;             /* cuLaunchHostFunc's, or */
	CUstreamCallback cb;     /* cuStreamAddCallback's, called with its stream */
	CUstream stream;
	void *data;
	uint32_t seq;
	int busy;
};

static struct slot slots[SLOTS];
static _Atomic uint32_t *words; /* SLOTS pairs {reached, done} in the region's heap */
static uint64_t words_off;
static uint32_t next_seq, nbusy, next_slot;
static int started;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER, freed = PTHREAD_COND_INITIALIZER;

static void *callback_thread(void *arg)
{
	(void)arg;
	unsigned idle = 0;
	static struct slot due[SLOTS];
	static uint32_t due_at[SLOTS];
	for (;;) {
		/* the functions whose streams have reached them, taken in one look at the table */
		pthread_mutex_lock(&mu);
		while (!nbusy)
			pthread_cond_wait(&work, &mu);
		uint32_t ndue = 0;
		for (uint32_t k = 0; k < SLOTS; k++)
			if (slots[k].busy &&
			    (int32_t)(atomic_load_explicit(&words[2 * k], memory_order_acquire) - slots[k].seq) >= 0) {
				due[ndue] = slots[k];
				due_at[ndue++] = k;
			}
		pthread_mutex_unlock(&mu);
		for (uint32_t i = 0; i < ndue; i++) {
			struct slot *s = &due[i];
			if (s->fn)
				s->fn(s->data);
			else
				s->cb(s->stream, CUDA_SUCCESS, s->data);
			atomic_store_explicit(&words[2 * due_at[i] + 1], s->seq, memory_order_release);
			pthread_mutex_lock(&mu);
			struct slot *t = &slots[due_at[i]];
			if (t->busy && t->seq == s->seq) { /* (queue() frees a slot whose call failed itself) */
				t->busy = 0;
				nbusy--;
				pthread_cond_signal(&freed);
			}
			pthread_mutex_unlock(&mu);
		}
		int ran = ndue > 0;
		/* waiting on the GPU: spin a little, then look every 20 us */
		if (ran) {
			idle = 0;
		} else if (++idle < 64) {
			sched_yield();
		} else {
			struct timespec t = {0, 20000};
			nanosleep(&t, NULL);
		}
	}
	return NULL;
}

/* A forked child connects afresh (connection.c): the callback thread is not in it and the heap
 * words are its parent's channel's, so it starts its own at its first host function.  The lock
 * is held across the fork so that the child finds the table whole. */
static void before_fork(void)
{
	pthread_mutex_lock(&mu);
}

static void parent_after_fork(void)
{
	pthread_mutex_unlock(&mu);
}

static void child_after_fork(void)
{
	memset(slots, 0, sizeof slots);
	words = NULL;
	words_off = 0;
	nbusy = next_slot = 0;
	started = 0;
	pthread_cond_init(&work, NULL);
	pthread_cond_init(&freed, NULL);
	pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void host_func_ctor(void)
{
	pthread_atfork(before_fork, parent_after_fork, child_after_fork);
}

/* The heap words and the thread, once; under mu. */
static CUresult start(void)
{
	if (started)
		return CUDA_SUCCESS;
	if (vmgpu_guest_remote(vg_conn.guest))
		return CUDA_ERROR_NOT_SUPPORTED; /* the GPU's host cannot see this machine's heap words */
	if (!words) {
		uint64_t off;
		vg_lock();
		int e = vmgpu_guest_heap_alloc(vg_conn.chan, SLOTS * 2 * sizeof(uint32_t), &off);
		vg_unlock();
		if (e < 0)
			return CUDA_ERROR_OUT_OF_MEMORY;
		words = vmgpu_guest_ptr(vg_conn.guest, off);
		for (uint32_t i = 0; i < 2 * SLOTS; i++)
			atomic_store(&words[i], 0);
		words_off = off;
	}
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int e = pthread_create(&t, &a, callback_thread, NULL);
	pthread_attr_destroy(&a);
	if (e)
		return CUDA_ERROR_OUT_OF_MEMORY; /* the heap words stay for the next try */
	started = 1;
	return CUDA_SUCCESS;
}

static CUresult queue(uint32_t op, CUstream stream, CUhostFn fn, CUstreamCallback cb, void *data, unsigned f)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	if ((r = start()) != CUDA_SUCCESS) {
		pthread_mutex_unlock(&mu);
		return r;
	}
	while (nbusy == SLOTS)
		pthread_cond_wait(&freed, &mu);
	uint32_t k = next_slot;
	while (slots[k].busy)
		k = (k + 1) % SLOTS;
	next_slot = (k + 1) % SLOTS;
	if (++next_seq == 0) /* the comparisons, here, on the host and the GPU's, are cyclic */
		next_seq = 1;
	uint32_t seq = next_seq;
	/* a slot's words hold the number of its last use: both now say "one before this one", which
	 * is at or past that number, so a stream still waiting on the last use is released (never
	 * held back as a reset to 0 would hold it, were the GPU to look only after the reset) */
	atomic_store(&words[2 * k], seq - 1);
	atomic_store(&words[2 * k + 1], seq - 1);
	slots[k] = (struct slot){fn, cb, stream, data, seq, 1};
	nbusy++;
	pthread_cond_signal(&work); /* it may run before the call returns (a host that queues synchronously) */
	pthread_mutex_unlock(&mu);

	struct vg_call c;
	if ((r = vg_begin(&c, op, f)) == CUDA_SUCCESS) {
		vg_put_u64(&c, (uint64_t)(uintptr_t)stream);
		vg_put_u64(&c, words_off + 2 * k * sizeof(uint32_t));
		vg_put_u64(&c, seq);
		r = vg_end(&c, vg_call_sync(&c));
	}
	pthread_mutex_lock(&mu);
	if (r != CUDA_SUCCESS && slots[k].busy && slots[k].seq == seq) { /* never queued: it will not run */
		slots[k].busy = 0;
		nbusy--;
		pthread_cond_signal(&freed);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult handwritten_cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData, unsigned f)
{
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return queue(VG_OP_cuLaunchHostFunc, hStream, fn, NULL, userData, f);
}

CUresult handwritten_cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
					 unsigned int flags, unsigned f)
{
	if (!callback || flags)
		return CUDA_ERROR_INVALID_VALUE;
	return queue(VG_OP_cuStreamAddCallback, hStream, NULL, callback, userData, f);
}
