/* A validating host: one thread per channel, as a forwarder serves them.
 * Guest records carry {seq, checksum, want_reply} and random bytes; the host
 * checks every one and answers when asked.  Used by t_stress and t_kill. */
#ifndef VMGPU_SHM_TEST_SINK_H
#define VMGPU_SHM_TEST_SINK_H
#include "common.h"

struct rec_head {
	uint64_t seq, sum;
	uint32_t want_reply, len;
};

struct sink_chan {
	struct vmgpu_host *h;
	uint32_t idx;
	pthread_t t;
	_Atomic int stop;
	_Atomic long received, bad, replies, opened, reclaimed, generations_seen;
	_Atomic long bulk_bytes;
	uint32_t gen;
	uint64_t next_seq;
};

static void *sink_main(void *arg)
{
	struct sink_chan *s = arg;
	struct vmgpu_hchan *c = vmgpu_host_chan(s->h, s->idx);
	uint8_t *buf = malloc(1 << 20);
	while (!s->stop) {
		int ev = vmgpu_hchan_poll(c, vmgpu_now_ns());
		if (ev == VMGPU_HC_CLOSED || ev == VMGPU_HC_LOST) {
			if (vmgpu_hchan_reclaim(c) == 0)
				s->reclaimed++;
			continue;
		}
		if (ev == VMGPU_HC_OPENED) {
			s->opened++;
			s->next_seq = 0;
			if (vmgpu_hchan_generation(c) != s->gen)
				s->generations_seen++;
			s->gen = vmgpu_hchan_generation(c);
		}
		if (ev != VMGPU_HC_OPENED && ev != VMGPU_HC_SERVING) {
			usleep(200);
			continue;
		}
		uint16_t type;
		int n = vmgpu_hchan_recv(c, buf, 1 << 20, &type, 20 * MS);
		if (n == -ETIMEDOUT || n == -EAGAIN)
			continue;
		if (n < 0) { /* protocol broken: the next poll reports LOST */
			s->bad++;
			continue;
		}
		struct rec_head rh;
		if ((size_t)n < sizeof rh) {
			s->bad++;
			continue;
		}
		memcpy(&rh, buf, sizeof rh);
		uint64_t sum;
		if (type == 2) { /* bulk chunk: payload is {pos, len} after the head */
			uint64_t ref[2];
			memcpy(ref, buf + sizeof rh, sizeof ref);
			uint8_t *p = vmgpu_hchan_bulk(c, ref[0], ref[1]);
			sum = p ? fnv1a(p, ref[1]) : 0;
			vmgpu_hchan_bulk_release(c, ref[0] + ref[1]);
			s->bulk_bytes += (long)ref[1];
		} else {
			sum = fnv1a(buf + sizeof rh, (size_t)n - sizeof rh);
		}
		if (rh.seq != s->next_seq || rh.sum != sum || rh.len != (uint32_t)n)
			s->bad++;
		s->next_seq = rh.seq + 1;
		s->received++;
		if (rh.want_reply) {
			uint64_t ack[2] = {rh.seq, (uint64_t)s->bad};
			if (vmgpu_hchan_send(c, 9, ack, sizeof ack, 2 * SEC) == 0)
				s->replies++;
		}
	}
	free(buf);
	return NULL;
}

/* Guest producer: n records of random sizes (and some bulk chunks), replies every `every`. */
static int produce(struct vmgpu_gchan *c, long n, uint64_t seed, int every, int use_bulk)
{
	uint32_t maxp = vmgpu_gchan_max_payload(c, 0);
	uint32_t cap = maxp < 4096 ? maxp : 4096;
	for (long i = 0; i < n; i++) {
		uint64_t x = xorshift(&seed);
		int bulk = use_bulk && (x % 64 == 0);
		struct rec_head rh = {.seq = (uint64_t)i, .want_reply = (every && (i % every == every - 1)) || i == n - 1};
		if (bulk) {
			uint64_t len = 1 + (x >> 8) % 16384, pos;
			void *p;
			int e = vmgpu_gchan_bulk_alloc(c, len, 10 * SEC, &pos, &p);
			if (e)
				return e;
			for (uint64_t k = 0; k < len; k += 8)
				((uint8_t *)p)[k] = (uint8_t)xorshift(&seed);
			uint64_t ref[2] = {pos, len};
			rh.sum = fnv1a(p, len);
			rh.len = sizeof rh + sizeof ref;
			int err = 0;
			uint8_t *slot = vmgpu_gchan_reserve(c, rh.len, 10 * SEC, &err);
			if (!slot)
				return err;
			memcpy(slot, &rh, sizeof rh);
			memcpy(slot + sizeof rh, ref, sizeof ref);
			if ((e = vmgpu_gchan_commit(c, 2)))
				return e;
		} else {
			uint32_t plen = (uint32_t)((x >> 16) % (cap - sizeof rh + 1));
			rh.len = (uint32_t)(sizeof rh + plen);
			int err = 0;
			uint8_t *slot = vmgpu_gchan_reserve(c, rh.len, 10 * SEC, &err);
			if (!slot)
				return err;
			uint8_t *d = slot + sizeof rh;
			for (uint32_t k = 0; k < plen; k++)
				d[k] = (uint8_t)(x >> (k & 31)) ^ (uint8_t)k;
			rh.sum = fnv1a(d, plen);
			memcpy(slot, &rh, sizeof rh);
			int e = vmgpu_gchan_commit(c, 1);
			if (e)
				return e;
		}
		if (rh.want_reply) {
			uint64_t ack[2];
			uint16_t t;
			int r = vmgpu_gchan_recv(c, ack, sizeof ack, &t, 10 * SEC);
			if (r != sizeof ack)
				return r < 0 ? r : -EPROTO;
			if (ack[0] != (uint64_t)i || ack[1] != 0)
				return -EPROTO;
		}
	}
	return 0;
}
#endif
