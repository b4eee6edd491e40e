/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Liveness, both ways: the guest's view of the host (its heartbeat, the region's
 * state, the channel's descriptor) and the channel's liveness thread, which
 * holds the owner word in its robust futex list and beats the heartbeat.
 */
#define _GNU_SOURCE
#include "guest_internal.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Static_assert(VMGPU_OWNER_DIED == FUTEX_OWNER_DIED && VMGPU_OWNER_TID_MASK == FUTEX_TID_MASK,
	       "the owner word is the kernel's robust futex word");

static struct vmgpu_region_header *region_header_of(struct vmgpu_guest *g)
{
	return (struct vmgpu_region_header *)g->base;
}

VMGPU_EXPORT int vmgpu_guest_host_alive(struct vmgpu_guest *g)
{
	struct vmgpu_region_header *h = region_header_of(g);
	uint64_t now = vmgpu_now_ns();
	if (atomic_load_explicit(&h->region_state, memory_order_acquire) != VMGPU_REGION_READY) {
		uint64_t since = atomic_load_explicit(&g->not_ready_ns, memory_order_relaxed);
		if (!since)
			atomic_store_explicit(&g->not_ready_ns, since = now, memory_order_relaxed);
		if (now - since >= NOT_READY_GRACE_NS)
			return 0;
	} else {
		atomic_store_explicit(&g->not_ready_ns, 0, memory_order_relaxed);
	}
	uint64_t beat = atomic_load_explicit(&h->host_heartbeat, memory_order_acquire);
	if (beat != atomic_load_explicit(&g->host_beat, memory_order_relaxed)) {
		atomic_store_explicit(&g->host_beat, beat, memory_order_relaxed);
		atomic_store_explicit(&g->host_beat_ns, now, memory_order_relaxed);
		return 1;
	}
	return now - atomic_load_explicit(&g->host_beat_ns, memory_order_relaxed) < g->wo.peer_timeout_ns;
}

/* The host is alive and still considers this channel ours.  DEAD with our
 * generation is the host's fence: believed at once.  Any other state is either
 * the host's reclaim (FREE follows DEAD) or a sibling's scribble, which the host
 * undoes within a tick: believed when it lasts. */
bool gchan_peer_alive(void *ctx)
{
	struct vmgpu_gchan *c = ctx;
	uint64_t ctl = atomic_load_explicit(&gchan_desc(c)->ctl, memory_order_acquire);
	if (ctl != CTL_MAKE(VMGPU_CHAN_ACTIVE, c->gen)) {
		if (ctl == CTL_MAKE(VMGPU_CHAN_DEAD, c->gen))
			return false;
		uint64_t now = vmgpu_now_ns(), since = atomic_load_explicit(&c->odd_since_ns, memory_order_relaxed);
		if (!since)
			atomic_store_explicit(&c->odd_since_ns, since = now, memory_order_relaxed);
		if (now - since >= NOT_READY_GRACE_NS)
			return false;
	} else {
		atomic_store_explicit(&c->odd_since_ns, 0, memory_order_relaxed);
	}
	return vmgpu_guest_host_alive(c->g);
}

static long futex_op(VMGPU_ATOMIC(uint32_t) *w, int op, uint32_t val, uint64_t timeout_ns)
{
	struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull), .tv_nsec = (long)(timeout_ns % 1000000000ull)};
	return syscall(SYS_futex, (uint32_t *)w, op, val, timeout_ns ? &ts : NULL, NULL, 0);
}

/* The channel's liveness thread.  It makes the owner word the one entry of its
 * own robust futex list (the kernel's list is per thread; this thread holds no
 * robust mutex of glibc's) and stores its thread id there: when the thread ends,
 * however the process ends, the kernel sets VMGPU_OWNER_DIED in the word.  Then
 * it beats the heartbeat until told to stop, while the channel is still ours. */
static void *beat_main(void *arg)
{
	struct vmgpu_gchan *c = arg;
	struct vmgpu_chan_desc *d = gchan_desc(c);
	uint32_t ready = 1;
	if (c->arm) {
		c->robust_entry.next = &c->robust_head.list;
		c->robust_head.list.next = &c->robust_entry;
		c->robust_head.futex_offset = (long)((uint8_t *)&d->owner_word - (uint8_t *)&c->robust_entry);
		c->robust_head.list_op_pending = NULL;
		if (syscall(SYS_set_robust_list, &c->robust_head, sizeof c->robust_head) != 0)
			ready = 2;
		else
			atomic_store_explicit(&d->owner_word, (uint32_t)syscall(SYS_gettid) & VMGPU_OWNER_TID_MASK,
					      memory_order_release);
	}
	atomic_store_explicit(&c->beat_ready, ready, memory_order_release);
	futex_op(&c->beat_ready, FUTEX_WAKE_PRIVATE, 1, 0);
	if (ready != 1)
		return NULL;
	while (!atomic_load_explicit(&c->beat_stop, memory_order_acquire)) {
		uint64_t v = atomic_load_explicit(&d->ctl, memory_order_acquire);
		if (CTL_GEN(v) == c->gen && (CTL_STATE(v) == VMGPU_CHAN_ACTIVE || CTL_STATE(v) == VMGPU_CHAN_CLAIMING))
			atomic_fetch_add_explicit(&d->heartbeat, 1, memory_order_relaxed);
		futex_op(&c->beat_stop, FUTEX_WAIT_PRIVATE, 0,
			 atomic_load_explicit(&c->beat_interval_ns, memory_order_relaxed));
	}
	if (c->arm && atomic_load(&c->beat_closing)) {
		/* a close, not a death: say so in the word (then the kernel leaves it alone) */
		uint32_t tid = (uint32_t)syscall(SYS_gettid) & VMGPU_OWNER_TID_MASK;
		atomic_compare_exchange_strong(&d->owner_word, &tid, VMGPU_OWNER_DIED | VMGPU_OWNER_CLOSED);
	}
	return NULL; /* else the kernel marks the owner word died as this thread ends */
}

int gchan_start_beat(struct vmgpu_gchan *c, uint64_t interval_ns)
{
	atomic_store(&c->beat_interval_ns, interval_ns);
	atomic_store(&c->beat_stop, 0);
	atomic_store(&c->beat_ready, 0);
	int e = pthread_create(&c->beat_thread, NULL, beat_main, c);
	if (e)
		return vmgpu_seterr(e, "cannot start the liveness thread of channel %u", c->idx);
	c->beating = true;
	while (atomic_load_explicit(&c->beat_ready, memory_order_acquire) == 0)
		futex_op(&c->beat_ready, FUTEX_WAIT_PRIVATE, 0, 0);
	return 0;
}

void gchan_stop_beat(struct vmgpu_gchan *c, bool closing)
{
	if (!c->beating)
		return;
	atomic_store(&c->beat_closing, closing);
	atomic_store_explicit(&c->beat_stop, 1, memory_order_release);
	futex_op(&c->beat_stop, FUTEX_WAKE_PRIVATE, 1, 0);
	pthread_join(c->beat_thread, NULL); /* its robust list was walked before the join returns */
	c->beating = false;
}

/* Channels of the region that this process (by pid) holds or is claiming. */
VMGPU_EXPORT void vmgpu_gchan_beat(struct vmgpu_gchan *c)
{
	atomic_fetch_add_explicit(&gchan_desc(c)->heartbeat, 1, memory_order_relaxed);
}

VMGPU_EXPORT int vmgpu_gchan_autobeat(struct vmgpu_gchan *c, uint64_t interval_ns)
{
	interval_ns = interval_ns ? interval_ns : 100000000ull;
	if (c->beating) { /* the claim's liveness thread takes the new interval */
		atomic_store(&c->beat_interval_ns, interval_ns);
		return 0;
	}
	return gchan_start_beat(c, interval_ns);
}

