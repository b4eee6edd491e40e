/* SPDX-License-Identifier: Apache-2.0 */
#ifndef VMGPU_SHM_INTERNAL_H
#define VMGPU_SHM_INTERNAL_H

#include "vmgpu/shm.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#define VMGPU_EXPORT __attribute__((visibility("default")))
#define ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))

int vmgpu_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* Liveness of the other side, checked during long waits.  Returns true while alive. */
struct peer_check {
	bool (*alive)(void *ctx);
	void *ctx;
};

/* One side's private view of a ring.  Nothing here lives in shared memory. */
struct ring {
	uint8_t *data;
	struct vmgpu_ring_ctl *ctl;
	uint32_t size, mask;
	uint32_t max_rec;   /* largest record (header included) */
	uint32_t pos;       /* producer: tail; consumer: head */
	uint32_t other;     /* producer: cached head; consumer: head at last producer notify */
	uint32_t pending;   /* producer: stride of the reserved record, 0 if none */
	uint32_t pending_len;
	bool broken;
	const struct vmgpu_wait_opts *wo;
	uint32_t wait_mode;
	uint32_t chan;      /* for the doorbell */
	int which;          /* 0 request, 1 completion */
	uint64_t empty_since; /* consumer, poll mode: when it was last found empty after a record, 0 since */
};

void ring_init(struct ring *r, uint8_t *data, struct vmgpu_ring_ctl *ctl, uint32_t size,
	       const struct vmgpu_wait_opts *wo, uint32_t wait_mode, uint32_t chan, int which);
/* producer */
void *ring_reserve(struct ring *r, uint32_t len, uint64_t timeout_ns, const struct peer_check *pc, int *err);
int ring_commit(struct ring *r, uint16_t type);
/* consumer */
int ring_recv(struct ring *r, void *buf, uint32_t cap, uint16_t *type, uint64_t timeout_ns,
	      const struct peer_check *pc);

/* Block on a 32-bit word while it equals `expect`, at most timeout_ns. */
void shm_wait_word(uint32_t wait_mode, VMGPU_ATOMIC(uint32_t) *word, uint32_t expect, uint64_t timeout_ns,
		   uint64_t *backoff, const struct vmgpu_wait_opts *wo, uint64_t cap_ns);
void shm_wake_word(uint32_t wait_mode, VMGPU_ATOMIC(uint32_t) *word, const struct vmgpu_wait_opts *wo,
		   uint32_t chan, int which);

void region_header_fill(struct vmgpu_region_header *h, const struct vmgpu_layout *l, const char *name);
void chan_zero(uint8_t *base, const struct vmgpu_layout *l, uint32_t i);
int layout_check_header(const struct vmgpu_region_header *hdr, uint64_t size, const struct vmgpu_layout *want);

static inline struct vmgpu_chan_desc *chan_desc(uint8_t *base, const struct vmgpu_layout *l, uint32_t i)
{
	return (struct vmgpu_chan_desc *)(base + l->chan_table_off) + i;
}
static inline uint8_t *chan_block(uint8_t *base, const struct vmgpu_layout *l, uint32_t i)
{
	return base + l->chan_area_off + (uint64_t)i * l->chan_stride;
}
static inline struct vmgpu_heap_block *heap_map(uint8_t *base, const struct vmgpu_layout *l)
{
	return (struct vmgpu_heap_block *)(base + l->heap_map_off);
}

/* Plain fields of the region that another party may write at any time: read
 * and written whole, with relaxed atomics, never torn and never a data race. */
#define SHM_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define SHM_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

#define CTL_STATE(v) ((uint32_t)(v))
#define CTL_GEN(v) ((uint32_t)((v) >> 32))
#define CTL_MAKE(state, gen) ((uint64_t)(state) | ((uint64_t)(gen) << 32))

#endif
