/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu shared-memory region ABI, version 1.2.
 *
 * This header is the single written definition of the region shared between a
 * guest (VM through an ivshmem BAR, container through a /dev/shm file) and its
 * host forwarder.  It knows nothing of CUDA.
 *
 * Rules of the ABI
 *  - Every field is a little-endian fixed-width integer.  The region holds
 *    offsets from its own base, never pointers, so each side may map it at any
 *    address.
 *  - The first two fields are the magic and the version.  An additive change is
 *    a minor bump plus a feature bit; a breaking change is a major bump, and
 *    both sides refuse a major version they do not speak.
 *  - Ring indices are free-running 32-bit byte counters reduced by a mask.  The
 *    producer and consumer indices live on separate cache lines.
 *  - A ring record is an 8-byte header followed by its payload.  The producer
 *    writes the payload, zeroes the header slot that follows the record, and
 *    then stores the record length with release order: the length commits the
 *    record.  A record never wraps; a padding record fills the end of the ring.
 *  - The host keeps its own private copy of the geometry; it never takes an
 *    offset or a size from shared memory without checking it against that copy.
 *    It re-publishes what it owns in the header (everything but the agent's
 *    line) from that copy, so a scribbled header heals while guests run.
 *  - Liveness of a channel's owner (1.1, VMGPU_FEAT_OWNER_WORD): the owner's
 *    liveness thread registers the descriptor's owner_word as the single entry
 *    of its own robust futex list and stores its thread id there.  When that
 *    thread ends because the process died (kill -9, a crash, exit without a
 *    close), the owner's kernel sets VMGPU_OWNER_DIED in the word; a closing
 *    owner's thread writes VMGPU_OWNER_DIED | VMGPU_OWNER_CLOSED itself.  The host only reads the
 *    word.  The heartbeat stays as the fallback for a frozen owner.  A closing
 *    owner stops its liveness thread first; the host frees a channel it serves
 *    only when the word says the owner is gone (or its heartbeat went silent),
 *    never on a state written into the descriptor alone.
 *
 * Region map (all offsets from the region base, every area 4 KiB aligned):
 *
 *   0                       struct vmgpu_region_header        (4 KiB)
 *   chan_table_off          struct vmgpu_chan_desc[nchannels] (one cache line each)
 *   heap_map_off            struct vmgpu_heap_block[heap_blocks]
 *   chan_area_off           nchannels channel blocks of chan_stride bytes:
 *                             +0                 struct vmgpu_chan_ctl   (4 KiB)
 *                             +req_ring_off      request ring data   (guest -> host)
 *                             +cpl_ring_off      completion ring data (host -> guest)
 *                             +bulk_off          bulk area
 *   heap_off                the pinned-host-memory heap (heap_blocks blocks)
 */
#ifndef VMGPU_SHM_ABI_H
#define VMGPU_SHM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
#define VMGPU_ATOMIC(t) std::atomic<t>
#else
#include <stdatomic.h>
#define VMGPU_ATOMIC(t) _Atomic t
#endif

#define VMGPU_SHM_MAGIC 0x4D48535550474D56ULL /* "VMGPUSHM" in little-endian bytes */
#define VMGPU_SHM_VERSION_MAJOR 1
#define VMGPU_SHM_VERSION_MINOR 2

#define VMGPU_CACHELINE 64u
#define VMGPU_PAGE 4096u

/* Feature bits (header.features), published by the host. */
#define VMGPU_FEAT_NONE 0ULL
#define VMGPU_FEAT_OWNER_WORD (1ULL << 0) /* 1.1: the host reads vmgpu_chan_desc.owner_word */
/* 1.2: the host of this region is a network bridge (vmgpu remote attach), not a forwarder: the
 * GPU is on another machine.  Its heap is not seen by the GPU's host (pinned memory is the
 * guest's own, copied like pageable memory), and the guest notes every bulk allocation in the
 * request ring (a VMGPU_REC_BULK_NOTE record: its position, length and direction) so that the
 * bridge knows which bytes to carry each way.  Set by the bridge, never by a forwarder. */
#define VMGPU_FEAT_REMOTE (1ULL << 1)
#define VMGPU_FEATURES (VMGPU_FEAT_OWNER_WORD)

/* vmgpu_chan_desc.owner_word: the Linux robust futex word (FUTEX_TID_MASK,
 * FUTEX_OWNER_DIED).  0 = not armed; a thread id = armed, owner alive;
 * VMGPU_OWNER_DIED set = the owner's liveness thread has ended. */
#define VMGPU_OWNER_TID_MASK 0x3fffffffu
#define VMGPU_OWNER_DIED 0x40000000u
/* Set with VMGPU_OWNER_DIED by an owner that ends its liveness to close the
 * channel (the kernel never sets it; no Linux thread id reaches bit 29). */
#define VMGPU_OWNER_CLOSED 0x20000000u

/* The most channels the host serves at once to one owner_pid value, unless the
 * host sets another limit (header.chans_per_owner). */
#define VMGPU_CHANS_PER_OWNER_DEFAULT 4u

/* How a side waits for the other (header.wait_mode), chosen by the creator. */
enum vmgpu_wait_mode {
	VMGPU_WAIT_FUTEX = 1, /* same kernel (processes, containers): futex on the region */
	VMGPU_WAIT_POLL = 2,  /* across a VM boundary: spin, then sleep with bounded back-off */
};

/* header.region_state */
enum vmgpu_region_state {
	VMGPU_REGION_INIT = 0,   /* being written by the host */
	VMGPU_REGION_READY = 1,  /* geometry valid; channels may be claimed */
	VMGPU_REGION_CLOSED = 2, /* host is shutting the region down */
};

/* Channel states (low 32 bits of vmgpu_chan_desc.ctl; generation in the high 32). */
enum vmgpu_chan_state {
	VMGPU_CHAN_FREE = 0,     /* may be claimed by a guest process */
	VMGPU_CHAN_CLAIMING = 1, /* claimed, owner fields being written */
	VMGPU_CHAN_ACTIVE = 2,   /* owned by a live guest process */
	VMGPU_CHAN_CLOSING = 3,  /* the owner released it; the host reclaims it */
	VMGPU_CHAN_DEAD = 4,     /* the owner is gone (host timeout or guest agent); the host reclaims it */
};

/* vmgpu_chan_desc.host_status, written by the host when it acknowledges a claim. */
enum vmgpu_chan_host_status {
	VMGPU_HOST_PENDING = 0,
	VMGPU_HOST_ACCEPTED = 1,
	VMGPU_HOST_REFUSED_VERSION = 2, /* guest speaks another major ABI version */
	VMGPU_HOST_REFUSED_BROKEN = 3,  /* reserved: a protocol breaker is fenced out by reclaim instead */
	VMGPU_HOST_REFUSED_LIMIT = 4,   /* 1.1: this owner_pid already holds chans_per_owner channels */
};

/* Ring record header.  type 0 is padding; other types belong to the user. */
#define VMGPU_REC_PAD 0u
/* Transport records (types 0xff00 and up belong to the transport, never to its users). */
#define VMGPU_REC_BULK_NOTE 0xff01u /* struct vmgpu_bulk_note, regions with VMGPU_FEAT_REMOTE */
#define VMGPU_REC_HDR 8u
#define VMGPU_REC_ALIGN 8u

struct vmgpu_rec_hdr {
	VMGPU_ATOMIC(uint32_t) len; /* header + payload bytes; stored last (release) */
	uint16_t type;
	uint16_t flags;
};

/* The region header: one page at offset 0. */
struct vmgpu_region_header {
	uint64_t magic;          /* VMGPU_SHM_MAGIC */
	uint16_t version_major;  /* VMGPU_SHM_VERSION_MAJOR */
	uint16_t version_minor;  /* VMGPU_SHM_VERSION_MINOR */
	uint32_t header_size;    /* sizeof(struct vmgpu_region_header) */
	uint64_t region_size;    /* bytes */
	uint64_t features;       /* VMGPU_FEAT_* */
	uint32_t wait_mode;      /* enum vmgpu_wait_mode */
	uint32_t nchannels;
	uint64_t chan_table_off;
	uint64_t chan_area_off;
	uint64_t chan_stride;
	uint32_t req_ring_size;  /* power of two */
	uint32_t cpl_ring_size;  /* power of two */
	uint64_t bulk_size;      /* per channel, multiple of 4 KiB */
	uint64_t heap_off;
	uint64_t heap_size;
	uint64_t heap_block_size; /* power of two, >= 4 KiB */
	uint64_t heap_map_off;
	uint32_t heap_blocks;
	VMGPU_ATOMIC(uint32_t) region_state; /* enum vmgpu_region_state (release after geometry) */
	uint64_t host_epoch;      /* changes each time a host side attaches */
	char name[64];            /* the guest's name, NUL padded, informational */
	uint32_t chans_per_owner; /* 1.1: channels served at once to one owner_pid value */
	uint32_t pad0;
	uint8_t reserved0[256 - 200];

	/* liveness, one line per writer */
	VMGPU_ATOMIC(uint64_t) host_heartbeat; /* bumped by the host while it serves */
	uint32_t host_pid;
	uint8_t reserved1[VMGPU_CACHELINE - 12];
	VMGPU_ATOMIC(uint64_t) agent_heartbeat; /* bumped by the guest agent (VMs), 0 if none */
	uint8_t reserved2[VMGPU_CACHELINE - 8];

	uint8_t reserved3[VMGPU_PAGE - 256 - 2 * VMGPU_CACHELINE];
};

/* One channel descriptor: one cache line, written by the owner (guest) except
 * host_ack_gen/host_status, which the host writes once per claim, and
 * owner_word, which the owner's kernel also writes (see the top of this file). */
struct vmgpu_chan_desc {
	VMGPU_ATOMIC(uint64_t) ctl;       /* state | (uint64_t)generation << 32 */
	VMGPU_ATOMIC(uint64_t) heartbeat; /* bumped by the owner process */
	uint64_t owner_nonce;             /* random per claim */
	uint32_t owner_pid;               /* pid as the guest sees it */
	uint32_t guest_version;           /* (major << 16) | minor of the owner's library */
	char owner_comm[16];              /* process name, NUL padded */
	VMGPU_ATOMIC(uint32_t) host_ack_gen; /* generation the host acknowledged */
	VMGPU_ATOMIC(uint32_t) host_status;  /* enum vmgpu_chan_host_status */
	VMGPU_ATOMIC(uint32_t) owner_word;   /* 1.1: robust futex word of the owner's liveness thread */
	uint8_t reserved[4];
};

/* Control block of one ring.  The consumer writes line c, the producer line p. */
struct vmgpu_ring_ctl {
	/* written by the consumer */
	VMGPU_ATOMIC(uint32_t) head;          /* bytes consumed, free running */
	VMGPU_ATOMIC(uint32_t) cons_waiting;  /* consumer is (about to be) asleep */
	VMGPU_ATOMIC(uint32_t) space_seq;     /* futex word the producer sleeps on */
	uint8_t pad_c[VMGPU_CACHELINE - 12];
	/* written by the producer */
	VMGPU_ATOMIC(uint32_t) tail;          /* bytes produced, informational */
	VMGPU_ATOMIC(uint32_t) prod_waiting;  /* producer waits for space */
	VMGPU_ATOMIC(uint32_t) data_seq;      /* futex word the consumer sleeps on */
	uint8_t pad_p[VMGPU_CACHELINE - 12];
};

/* Bulk area control: the guest allocates, the host releases in order. */
struct vmgpu_bulk_ctl {
	/* written by the host */
	VMGPU_ATOMIC(uint64_t) released;     /* bytes released by the host, free running */
	VMGPU_ATOMIC(uint32_t) release_seq;  /* futex word the guest sleeps on for space */
	uint8_t pad_h[VMGPU_CACHELINE - 12];
	/* written by the guest */
	VMGPU_ATOMIC(uint64_t) allocated;    /* bytes handed out by the guest, informational */
	VMGPU_ATOMIC(uint32_t) guest_waiting; /* guest waits for space */
	uint8_t pad_g[VMGPU_CACHELINE - 12];
};

/* A bulk allocation as the guest notes it (VMGPU_FEAT_REMOTE): the guest writes the bytes
 * (VMGPU_BULK_TO_HOST, before the request that names them) or the host does (FROM_HOST,
 * before it releases them), or both (BOTH). */
#define VMGPU_BULK_TO_HOST 1u
#define VMGPU_BULK_FROM_HOST 2u
#define VMGPU_BULK_BOTH 3u
struct vmgpu_bulk_note {
	uint64_t pos; /* free-running position, as vmgpu_gchan_bulk_alloc returned it */
	uint64_t len; /* bytes taken (rounded up to a cache line) */
	uint32_t dir; /* VMGPU_BULK_* */
	uint32_t pad;
};

/* The control page at the start of each channel block. */
struct vmgpu_chan_ctl {
	struct vmgpu_ring_ctl req; /* guest -> host */
	struct vmgpu_ring_ctl cpl; /* host -> guest */
	struct vmgpu_bulk_ctl bulk;
	uint8_t reserved[VMGPU_PAGE - 6 * VMGPU_CACHELINE];
};

/* One entry per heap block.  owner: 0 = free, else heap tag of the channel
 * (index + 1) | (generation & 0xffff) << 16.  run: length in blocks of the
 * allocation starting at this block (meaningful on its first block only). */
struct vmgpu_heap_block {
	VMGPU_ATOMIC(uint32_t) owner;
	uint32_t run;
};

#define VMGPU_HEAP_TAG(idx, gen) ((uint32_t)((idx) + 1u) | ((uint32_t)((gen) & 0xffffu) << 16))
#define VMGPU_HEAP_TAG_CHAN(tag) (((tag) & 0xffffu) - 1u)

#define VMGPU_MAX_CHANNELS 4096u

#ifndef __cplusplus
_Static_assert(sizeof(struct vmgpu_rec_hdr) == VMGPU_REC_HDR, "record header");
_Static_assert(offsetof(struct vmgpu_region_header, magic) == 0, "magic first");
_Static_assert(offsetof(struct vmgpu_region_header, version_major) == 8, "version second");
_Static_assert(offsetof(struct vmgpu_region_header, name) == 128, "header name");
_Static_assert(offsetof(struct vmgpu_region_header, chans_per_owner) == 192, "header 1.1 fields");
_Static_assert(offsetof(struct vmgpu_region_header, host_heartbeat) == 256, "host liveness line");
_Static_assert(offsetof(struct vmgpu_chan_desc, owner_word) == 56, "owner word");
_Static_assert(offsetof(struct vmgpu_region_header, agent_heartbeat) == 320, "agent liveness line");
_Static_assert(sizeof(struct vmgpu_region_header) == VMGPU_PAGE, "header is one page");
_Static_assert(sizeof(struct vmgpu_chan_desc) == VMGPU_CACHELINE, "channel descriptor is one line");
_Static_assert(offsetof(struct vmgpu_ring_ctl, tail) == VMGPU_CACHELINE, "producer line separate");
_Static_assert(sizeof(struct vmgpu_ring_ctl) == 2 * VMGPU_CACHELINE, "ring ctl");
_Static_assert(sizeof(struct vmgpu_bulk_ctl) == 2 * VMGPU_CACHELINE, "bulk ctl");
_Static_assert(sizeof(struct vmgpu_chan_ctl) == VMGPU_PAGE, "channel ctl page");
_Static_assert(sizeof(struct vmgpu_heap_block) == 8, "heap block entry");
_Static_assert(sizeof(VMGPU_ATOMIC(uint64_t)) == 8 && sizeof(VMGPU_ATOMIC(uint32_t)) == 4, "lock-free sizes");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the vmgpu region ABI is little-endian"
#endif
#endif

#endif /* VMGPU_SHM_ABI_H */
