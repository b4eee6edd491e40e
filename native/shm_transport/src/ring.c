/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single-producer single-consumer rings of variable-length records, and the
 * spin-then-block waits both sides use.
 *
 * No lost wake-ups.  A sleeper and a publisher follow the Dekker pattern:
 *   consumer: s = data_seq; cons_waiting = 1; fence; look at the ring; sleep while data_seq == s
 *   producer: commit record;                  fence; if cons_waiting: data_seq++, wake
 * With both fences sequentially consistent, either the consumer sees the record
 * or the producer sees the flag; and because the producer changes data_seq
 * before waking, a consumer that reads s before the change cannot sleep on it.
 * The same pattern guards "producer waits for space" with space_seq.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread char errbuf[256];

int vmgpu_seterr(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
	return -err;
}

VMGPU_EXPORT const char *vmgpu_shm_errmsg(void)
{
	return errbuf;
}

VMGPU_EXPORT uint64_t vmgpu_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

VMGPU_EXPORT void vmgpu_wait_opts_default(struct vmgpu_wait_opts *o)
{
	memset(o, 0, sizeof *o);
	o->spin_ns = 50000;
	o->sleep_max_ns = 200000;
	o->peer_timeout_ns = 5000000000ull;
}

/* Poll mode, a host's request ring that has been empty this long (the guest process is idle) is
 * looked at less often: every POLL_IDLE_SLEEP_NS instead of sleep_max_ns, so that an idle guest
 * costs the host little CPU; its next call after such a pause waits up to that long more. */
#define POLL_IDLE_AFTER_NS 100000000ull
#define POLL_IDLE_SLEEP_NS 1000000ull

void shm_wait_word(uint32_t wait_mode, VMGPU_ATOMIC(uint32_t) *word, uint32_t expect, uint64_t timeout_ns,
		   uint64_t *backoff, const struct vmgpu_wait_opts *wo, uint64_t cap_ns)
{
	if (timeout_ns == 0)
		return;
	if (wait_mode == VMGPU_WAIT_FUTEX) {
		struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull),
				      .tv_nsec = (long)(timeout_ns % 1000000000ull)};
		/* Shared (not PRIVATE) futex: the word lives in a MAP_SHARED region. */
		syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
		return;
	}
	/* Poll mode: nobody can wake us across the VM boundary; sleep with back-off.  The kernel's
	 * default timer slack (50 us) would stretch every short sleep to 50 us and more: a thread that
	 * polls takes 1 us, so that a reply is seen within about one back-off step. */
	static __thread int slack_set;
	if (!slack_set) {
		prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
		slack_set = 1;
	}
	uint64_t cap = cap_ns ? cap_ns : wo->sleep_max_ns;
	uint64_t d = *backoff ? *backoff : 1000;
	if (d > timeout_ns)
		d = timeout_ns;
	struct timespec ts = {.tv_sec = (time_t)(d / 1000000000ull), .tv_nsec = (long)(d % 1000000000ull)};
	nanosleep(&ts, NULL);
	uint64_t next = *backoff ? *backoff * 2 : 2000;
	*backoff = next > cap ? cap : next;
}

void shm_wake_word(uint32_t wait_mode, VMGPU_ATOMIC(uint32_t) *word, const struct vmgpu_wait_opts *wo,
		   uint32_t chan, int which)
{
	atomic_fetch_add_explicit(word, 1, memory_order_seq_cst);
	if (wait_mode == VMGPU_WAIT_FUTEX)
		syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
	else if (wo && wo->doorbell)
		wo->doorbell(wo->doorbell_ctx, chan, which);
}

void ring_init(struct ring *r, uint8_t *data, struct vmgpu_ring_ctl *ctl, uint32_t size,
	       const struct vmgpu_wait_opts *wo, uint32_t wait_mode, uint32_t chan, int which)
{
	memset(r, 0, sizeof *r);
	r->data = data;
	r->ctl = ctl;
	r->size = size;
	r->mask = size - 1;
	/* A record must leave room for a padding record and the zeroed next header. */
	r->max_rec = size / 2;
	r->wo = wo;
	r->wait_mode = wait_mode;
	r->chan = chan;
	r->which = which;
}

static inline VMGPU_ATOMIC(uint32_t) *hdr_len(struct ring *r, uint32_t pos)
{
	return &((struct vmgpu_rec_hdr *)(r->data + (pos & r->mask)))->len;
}

/* Refresh the cached consumer index; a head the consumer could not have
 * written (ahead of us, or more than a ring behind) breaks the ring. */
static int prod_refresh(struct ring *r)
{
	uint32_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
	uint32_t used = r->pos - head;
	if (used > r->size) {
		r->broken = true;
		return vmgpu_seterr(EPROTO, "ring %d of channel %u: consumer index %u is impossible (producer at %u)",
				    r->which, r->chan, head, r->pos);
	}
	r->other = head;
	return 0;
}

static inline uint32_t prod_need(const struct ring *r, uint32_t stride)
{
	uint32_t contig = r->size - (r->pos & r->mask);
	/* + one header: the slot after the record is zeroed before the commit */
	return (stride <= contig ? stride : contig + stride) + VMGPU_REC_HDR;
}

void *ring_reserve(struct ring *r, uint32_t len, uint64_t timeout_ns, const struct peer_check *pc, int *err)
{
	int e;
	if (r->broken) {
		*err = vmgpu_seterr(EPROTO, "ring %d of channel %u is broken", r->which, r->chan);
		return NULL;
	}
	if (r->pending) {
		*err = vmgpu_seterr(EINVAL, "a record is already reserved on ring %d", r->which);
		return NULL;
	}
	if (len > r->max_rec - VMGPU_REC_HDR) {
		*err = vmgpu_seterr(EMSGSIZE, "record of %u bytes exceeds the ring's limit of %u", len,
				    r->max_rec - VMGPU_REC_HDR);
		return NULL;
	}
	uint32_t stride = ALIGN_UP(len + VMGPU_REC_HDR, VMGPU_REC_ALIGN);
	uint32_t need = prod_need(r, stride);
	if (r->size - (r->pos - r->other) < need) {
		if ((e = prod_refresh(r)) < 0) {
			*err = e;
			return NULL;
		}
		uint64_t t0 = 0, backoff = 0;
		while (r->size - (r->pos - r->other) < need) {
			/* full: spin, then sleep on space_seq */
			uint64_t now = vmgpu_now_ns();
			if (!t0)
				t0 = now;
			uint64_t spent = now - t0;
			if (spent >= timeout_ns) {
				*err = vmgpu_seterr(EAGAIN, "ring %d of channel %u is full", r->which, r->chan);
				return NULL;
			}
			if (pc && pc->alive && !pc->alive(pc->ctx)) {
				*err = vmgpu_seterr(EPIPE, "the peer of channel %u stopped its heartbeat", r->chan);
				return NULL;
			}
			if (spent < r->wo->spin_ns) {
				for (int i = 0; i < 64; i++)
					cpu_relax();
			} else {
				uint32_t s = atomic_load_explicit(&r->ctl->space_seq, memory_order_acquire);
				atomic_store_explicit(&r->ctl->prod_waiting, 1, memory_order_seq_cst);
				atomic_thread_fence(memory_order_seq_cst);
				if ((e = prod_refresh(r)) < 0) {
					*err = e;
					return NULL;
				}
				if (r->size - (r->pos - r->other) < need) {
					uint64_t slice = timeout_ns - spent;
					if (slice > 100000000ull)
						slice = 100000000ull; /* wake to check the peer */
					shm_wait_word(r->wait_mode, &r->ctl->space_seq, s, slice, &backoff, r->wo, 0);
				}
				atomic_store_explicit(&r->ctl->prod_waiting, 0, memory_order_relaxed);
			}
			if ((e = prod_refresh(r)) < 0) {
				*err = e;
				return NULL;
			}
		}
	}
	uint32_t contig = r->size - (r->pos & r->mask);
	if (stride > contig) {
		/* padding record to the end of the ring; the record goes at 0 */
		struct vmgpu_rec_hdr *pad = (struct vmgpu_rec_hdr *)(r->data + (r->pos & r->mask));
		atomic_store_explicit(hdr_len(r, r->pos + contig), 0, memory_order_relaxed);
		pad->type = VMGPU_REC_PAD;
		pad->flags = 0;
		atomic_store_explicit(&pad->len, contig, memory_order_release);
		r->pos += contig;
	}
	r->pending = stride;
	r->pending_len = len;
	return r->data + (r->pos & r->mask) + VMGPU_REC_HDR;
}

int ring_commit(struct ring *r, uint16_t type)
{
	if (!r->pending)
		return vmgpu_seterr(EINVAL, "nothing reserved on ring %d", r->which);
	if (type == VMGPU_REC_PAD) {
		r->pending = 0; /* the reservation is dropped; nothing was published */
		return vmgpu_seterr(EINVAL, "record type 0 is reserved for padding");
	}
	struct vmgpu_rec_hdr *h = (struct vmgpu_rec_hdr *)(r->data + (r->pos & r->mask));
	atomic_store_explicit(hdr_len(r, r->pos + r->pending), 0, memory_order_relaxed);
	h->type = type;
	h->flags = 0;
	atomic_store_explicit(&h->len, r->pending_len + VMGPU_REC_HDR, memory_order_release);
	r->pos += r->pending;
	r->pending = 0;
	atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->ctl->cons_waiting, memory_order_relaxed))
		shm_wake_word(r->wait_mode, &r->ctl->data_seq, r->wo, r->chan, r->which);
	return 0;
}

/* Consumer: tell a producer that waits for space. */
static void cons_notify(struct ring *r)
{
	r->other = r->pos;
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->ctl->prod_waiting, memory_order_relaxed))
		shm_wake_word(r->wait_mode, &r->ctl->space_seq, r->wo, r->chan, r->which);
}

/* Take one record if one is committed.  Returns payload length, -EAGAIN if
 * empty, -EPROTO if the producer wrote something impossible. */
static int ring_try_recv(struct ring *r, void *buf, uint32_t cap, uint16_t *type)
{
	for (uint32_t pads = 0; pads < 2; pads++) {
		uint32_t off = r->pos & r->mask;
		struct vmgpu_rec_hdr *h = (struct vmgpu_rec_hdr *)(r->data + off);
		uint32_t len = atomic_load_explicit(&h->len, memory_order_acquire);
		if (len == 0)
			return -EAGAIN;
		/* copy the header, then validate it */
		uint16_t t = h->type;
		if (len < VMGPU_REC_HDR || len > r->size - off || (t != VMGPU_REC_PAD && len > r->max_rec)) {
			r->broken = true;
			return vmgpu_seterr(EPROTO, "ring %d of channel %u: record length %u at offset %u is invalid",
					    r->which, r->chan, len, off);
		}
		uint32_t stride = ALIGN_UP(len, VMGPU_REC_ALIGN);
		if (t == VMGPU_REC_PAD) {
			if (off + stride != r->size) {
				r->broken = true;
				return vmgpu_seterr(EPROTO, "ring %d of channel %u: padding record does not end the ring",
						    r->which, r->chan);
			}
			r->pos += stride;
			atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
			continue;
		}
		uint32_t plen = len - VMGPU_REC_HDR;
		if (plen > cap) {
			r->broken = true;
			return vmgpu_seterr(EPROTO, "ring %d of channel %u: record of %u bytes exceeds the buffer (%u)",
					    r->which, r->chan, plen, cap);
		}
		memcpy(buf, r->data + off + VMGPU_REC_HDR, plen);
		if (type)
			*type = t;
		r->pos += stride;
		atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
		if (r->pos - r->other >= r->size / 4)
			cons_notify(r);
		return (int)plen;
	}
	return -EAGAIN; /* two pads in a row cannot happen honestly; look again later */
}

int ring_recv(struct ring *r, void *buf, uint32_t cap, uint16_t *type, uint64_t timeout_ns,
	      const struct peer_check *pc)
{
	if (r->broken)
		return vmgpu_seterr(EPROTO, "ring %d of channel %u is broken", r->which, r->chan);
	int n = ring_try_recv(r, buf, cap, type);
	if (n != -EAGAIN) {
		r->empty_since = 0;
		return n;
	}
	if (r->pos != r->other)
		cons_notify(r);
	if (timeout_ns == 0)
		return n;
	uint64_t t0 = vmgpu_now_ns(), backoff = 0, sleep_cap = 0;
	if (!r->empty_since)
		r->empty_since = t0;
	for (;;) {
		uint64_t now = vmgpu_now_ns(), spent = now - t0;
		if (spent >= timeout_ns)
			return vmgpu_seterr(ETIMEDOUT, "nothing received on ring %d of channel %u", r->which, r->chan);
		if (r->wait_mode == VMGPU_WAIT_POLL && r->which == 0 && now - r->empty_since > POLL_IDLE_AFTER_NS)
			sleep_cap = POLL_IDLE_SLEEP_NS > r->wo->sleep_max_ns ? POLL_IDLE_SLEEP_NS : 0;
		if (spent < r->wo->spin_ns && !sleep_cap) { /* (an idle guest's ring is not spun on) */
			for (int i = 0; i < 32; i++) {
				cpu_relax();
				if (atomic_load_explicit(hdr_len(r, r->pos), memory_order_relaxed))
					break;
			}
		} else {
			if (pc && pc->alive && !pc->alive(pc->ctx))
				return vmgpu_seterr(EPIPE, "the peer of channel %u stopped its heartbeat", r->chan);
			uint32_t s = atomic_load_explicit(&r->ctl->data_seq, memory_order_acquire);
			atomic_store_explicit(&r->ctl->cons_waiting, 1, memory_order_seq_cst);
			atomic_thread_fence(memory_order_seq_cst);
			if (!atomic_load_explicit(hdr_len(r, r->pos), memory_order_relaxed)) {
				uint64_t slice = timeout_ns - spent;
				if (slice > 100000000ull)
					slice = 100000000ull; /* wake to check the peer */
				shm_wait_word(r->wait_mode, &r->ctl->data_seq, s, slice, &backoff, r->wo, sleep_cap);
			}
			atomic_store_explicit(&r->ctl->cons_waiting, 0, memory_order_relaxed);
		}
		n = ring_try_recv(r, buf, cap, type);
		if (n != -EAGAIN) {
			r->empty_since = 0;
			return n;
		}
	}
}
