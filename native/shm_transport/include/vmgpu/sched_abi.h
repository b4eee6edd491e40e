/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu scheduler page ABI, version 1: one page per physical GPU through which every forwarder on
 * that GPU takes turns (host_forwarder/native/vh_sched.h says how), and through which vmgpud and
 * `vmgpu weight` / `vmgpu policy` set the policy and each guest's weight.  Host-only: guests never
 * see it.  Its path is <dir>/vmgpu-sched-<GPU UUID>, dir $VMGPU_SCHED_DIR or VMGPU_SCHED_DIR.
 *
 * Rules of the page
 *  - This header is the single written definition of the layout.  vmgpu/abi.py mirrors it for
 *    Python; tests/native/test_abi_layouts.py compiles offsetof/sizeof of every field here and
 *    compares them with the mirror, so a field moved on one side only fails a test.
 *  - magic first, then the version: a reader refuses a page whose magic or version it does not
 *    speak.  The creator stores the magic last (release), after every other field is written.
 *  - Every field is a little-endian fixed-width integer; writers outside the forwarders (Python)
 *    store only whole aligned 32-bit control words: policy, slice_us, period_us, idle_us, caps_ms and a
 *    slot's weight, cap, priority, guarantee, hold, depth, sm_part and cap_pm.
 *  - cap, priority, guarantee and hold sit where version 1 had padding, and zero means what a slot
 *    without them did (no cap, normal priority, no guarantee, never held): a forwarder that does not know them
 *    leaves them zero, so the page stays version 1.  So do the header's idle_us (zero: the
 *    forwarders' default), sm_groups and caps_ms, and a slot's depth, active_ms, sm_part, whole_ms and cap_pm (zero:
 *    the forwarder's depth, never seen at work, the whole GPU, never off its span, cap% of the time).
 *    turn_start too: a forwarder that does not know it leaves it zero, and a turn it gave ends its
 *    slice as soon as another waits (the holder's slice counted from then).  And a slot's time_seq:
 *    a forwarder that does not know it never moves it, and a reader's look at what it charges is
 *    then only as good as its order of stores (below) makes it.
 *  - The forwarders change the rest under the page's mutex (process-shared, robust), except the
 *    counters marked atomic.
 *
 * Reading a guest's GPU time (vmgpu/sched.py Page.gpu_time), without the lock
 *   A member's GPU time at now is its used_ns, plus now - hold_start while it is the page's owner
 *   (the stretch of its turn not yet charged).  A charge adds to used_ns and moves hold_start; a
 *   hand-over moves owner and hold_start; so a look that saw a change half made would count a
 *   stretch twice (or to two guests), and the next look, whole, would be smaller: a counter that
 *   steps back.  So the forwarders, under the lock, make a slot's time_seq odd before they change
 *   any of them for that slot and even again after (a seqlock), and a reader
 *      0. reads its clock (now) before the look, so that it does not carry the holder's turn
 *         past where a change it did not see ends it,
 *      1. loads every slot's time_seq (acquire) and looks again later while one is odd,
 *      2. loads owner, then the slots' used_ns, then hold_start,
 *      3. loads every time_seq again (after an acquire fence) and looks again if one moved,
 *   and takes the owner's stretch as now - hold_start where that is positive.  Looks so taken
 *   never count a stretch twice; one may still exceed the next by as long as the forwarder took
 *   from reading its clock to its change (its time stamps the change).
 *   The stores go in the order that makes a look without time_seq (step 2 alone, a forwarder that
 *   predates it) count too little, never too much: hold_start is moved before the charge is added
 *   to used_ns, and before owner names the next holder, each of these stores a release; a look
 *   that sees the new used_ns or owner sees the new hold_start.  A forwarder that dies in a change
 *   leaves time_seq odd: the lock's next holder (EOWNERDEAD) makes it even, the change whole but
 *   for a charge whose stretch was passed over (hold_start moved, used_ns not added): lost, not
 *   counted twice.  A look may still count more than is later charged: sched_rest takes back the
 *   idle stretch at the end of a turn that it had counted (its time is nobody's), so a reader that
 *   exports a counter keeps it from stepping back itself (vmgpu/metrics.py).
 *
 * Page map:
 *   0      header (128 bytes): magic, version, policy, turn lengths, owner, futex word, mutex
 *   128    struct vmgpu_sched_slot[VMGPU_SCHED_SLOTS], 256 bytes each: one per member forwarder
 */
#ifndef VMGPU_SCHED_ABI_H
#define VMGPU_SCHED_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "shm_abi.h" /* VMGPU_ATOMIC */

#define VMGPU_SCHED_MAGIC 0x3144454843534756ull /* "VGSCHED1" in little-endian bytes */
#define VMGPU_SCHED_VERSION 1
#define VMGPU_SCHED_SLOTS 64
#define VMGPU_SCHED_CAPS_FRESH_MS 2000 /* a cap controller's parts (slot.cap_pm) hold this long after its last look */
#define VMGPU_SCHED_PROBE_FRESH_MS 1000 /* and a part of 1000 (a probe: the cap lifted) this long */
#define VMGPU_SCHED_NAME 64
#define VMGPU_SCHED_DIR "/dev/shm/vmgpu" /* the default directory of the pages (root's, 0700) */

/* page.policy */
enum vmgpu_sched_policy {
	VMGPU_SCHED_NATIVE = 0,     /* no control: calls pass at once */
	VMGPU_SCHED_EQUAL = 1,      /* 1/N of the time each, even when the others are idle */
	VMGPU_SCHED_PREEMPTIVE = 2, /* equal shares, work-conserving */
	VMGPU_SCHED_WEIGHTED = 3,   /* work-conserving, shares by weight */
	VMGPU_SCHED_FIXED = 4,      /* a hard cap of weight% per period, even on an idle card */
	VMGPU_SCHED_SHARED = 5,     /* no turns: guests run side by side (their workers clients of one
	                             * MPS server), each held back slot.hold per mille of every period,
	                             * as vmgpud's share controller sets it (vmgpu/share_control.py) */
};

/* slot.priority: a waiting guest of a higher priority has the GPU before any lower one, and the
 * turn of a lower holder ends as soon as a higher one waits.  Zero is normal. */
enum vmgpu_sched_priority {
	VMGPU_SCHED_PRIO_NORMAL = 0,
	VMGPU_SCHED_PRIO_HIGH = 1,
	VMGPU_SCHED_PRIO_LOW = 2,
};

/* One member: a guest's forwarder on this GPU.  256 bytes. */
struct vmgpu_sched_slot {
	VMGPU_ATOMIC(uint32_t) pid;     /*   0: the forwarder; 0: free */
	VMGPU_ATOMIC(uint32_t) weight;  /*   4: 1..100: relative share weight, or the cap in % under fixed */
	VMGPU_ATOMIC(uint32_t) waiters; /*   8: worker threads waiting to put work on the GPU */
	uint32_t pad0;                        /*  12 */
	char name[VMGPU_SCHED_NAME];          /*  16: the guest, NUL padded */
	uint64_t vtime;                       /*  80: held ns * 100 / weight: who is furthest behind goes next */
	VMGPU_ATOMIC(uint64_t) used_ns; /*  88: all held time */
	uint64_t period_start;                /*  96: when its cap period began */
	uint64_t period_used;                 /* 104: held in that period */
	uint64_t joined_ns;                   /* 112 */
	VMGPU_ATOMIC(uint64_t) turns;   /* 120: times it was given the GPU */
	uint64_t last_active;                 /* 128: when its last turn began or ended */
	/* the guest's worker processes (one per guest process) share its turn: */
	VMGPU_ATOMIC(uint32_t) inflight;   /* 136: unused (layout kept): each worker counts its own */
	VMGPU_ATOMIC(uint32_t) draining;   /* 140: handing over: no new work passes */
	VMGPU_ATOMIC(uint64_t) work_calls; /* 144: work calls that passed the gate, as the workers'
	                                          * scheduler threads publish them (idle: it stops moving) */
	VMGPU_ATOMIC(uint32_t) nworkers;   /* 152: worker processes */
	VMGPU_ATOMIC(uint32_t) drained;    /* 156: workers that finished their queued work this hand-over */
	VMGPU_ATOMIC(uint32_t) drain_gen;  /* 160: hand-overs begun */
	VMGPU_ATOMIC(uint32_t) rejoin;     /* 164: back from idle: starts level with the others at its next pick */
	VMGPU_ATOMIC(uint32_t) cap;        /* 168: 0: none; 1..100: at most cap% of each period, whatever the policy */
	VMGPU_ATOMIC(uint32_t) priority;   /* 172: enum vmgpu_sched_priority */
	VMGPU_ATOMIC(uint32_t) guarantee;  /* 176: 0..100: % reserved at admission, given first under weighted */
	VMGPU_ATOMIC(uint32_t) hold;       /* 180: under shared: per mille of each period its work does not
	                                          * pass (the period's first part); 0: never held */
	VMGPU_ATOMIC(uint32_t) depth;      /* 184: under shared: at most this many of each of its workers'
	                                          * work calls unfinished on the GPU, where that is fewer than
	                                          * its forwarder's --sched-depth; 0: the forwarder's */
	VMGPU_ATOMIC(uint32_t) active_ms;  /* 188: the monotonic clock in ms (low 32 bits) when one of its
	                                          * workers was last seen serving a call (in the driver, or
	                                          * waiting at its depth or gate) or passing the gate, as
	                                          * their scheduler threads publish it under shared; 0: never */
	VMGPU_ATOMIC(uint32_t) sm_part;    /* 192: under shared, while another guest of its priority or
	                                          * above is at work: the SMs its work runs on, as a span of the
	                                          * page's sm_groups groups, [lo, hi) in sixteenths of a group
	                                          * (lo << 16 | hi; a fractional end takes the next group the
	                                          * first part of each period: host_forwarder/native/partition.h);
	                                          * 0: the whole GPU */
	VMGPU_ATOMIC(uint32_t) whole_ms;   /* 196: the monotonic clock in ms (low 32 bits) when one of its
	                                          * workers last had work on the whole GPU beside another at
	                                          * work though its span said otherwise (a process that is not
	                                          * partitioned, or one whose work a stream capture keeps where
	                                          * it was): the share controller then holds by time; 0: never */
	VMGPU_ATOMIC(uint32_t) cap_pm;     /* 200: where it is capped (its cap, or its weight under fixed):
	                                          * the part of each period its work may have, per mille, as
	                                          * vmgpud's cap controller sets it so that its progress is
	                                          * cap% of its rate alone (vmgpu/cap_control.py); 1000
	                                          * while its rate alone is measured; 0: cap% itself */
	VMGPU_ATOMIC(uint32_t) time_seq;   /* 204: odd while the forwarders change what its GPU time is
	                                          * made of (its used_ns, and the page's owner and
	                                          * hold_start while it holds the GPU, is given it or gives
	                                          * it up); bumped before and after, so that a reader
	                                          * without the lock takes a look again where it was odd
	                                          * or moved (see "Reading a guest's GPU time" above) */
	uint8_t pad[256 - 208];                  /* 208 */
};

/* The page: a 128-byte header, then the slots. */
struct vmgpu_sched_page {
	uint64_t magic;                         /*   0: VMGPU_SCHED_MAGIC, stored last */
	uint32_t version;                       /*   8: VMGPU_SCHED_VERSION */
	uint32_t nslots;                        /*  12: VMGPU_SCHED_SLOTS */
	VMGPU_ATOMIC(uint32_t) policy;    /*  16: enum vmgpu_sched_policy */
	VMGPU_ATOMIC(uint32_t) slice_us;  /*  20: longest turn while another guest waits */
	VMGPU_ATOMIC(uint32_t) period_us; /*  24: the accounting period of caps */
	VMGPU_ATOMIC(int32_t) owner;      /*  28: slot holding the GPU, -1 none */
	VMGPU_ATOMIC(uint32_t) gen;       /*  32: futex word, bumped at every hand-over */
	VMGPU_ATOMIC(uint32_t) idle_us;   /*  36: a holder with no work for this long, while another
	                                         *      waits, gives the GPU up; 0: 2000 (SCHED_IDLE_NS) */
	uint64_t hold_start;                    /*  40: the owner's turn is charged up to here (its start,
	                                         *      or where it was charged as it went: sched_rest) */
	uint8_t mu_space[64];                   /*  48: pthread_mutex_t (process-shared, robust) */
	VMGPU_ATOMIC(uint32_t) sm_groups; /* 112: the groups of SMs a span (slot.sm_part) counts in, as
	                                         *      the forwarders found the GPU; 0: they cannot partition it */
	VMGPU_ATOMIC(uint32_t) caps_ms;   /* 116: the monotonic clock in ms (low 32 bits) at the cap
	                                         *      controller's last look; a slot's cap_pm counts only
	                                         *      while this is at most VMGPU_SCHED_CAPS_FRESH_MS old (a
	                                         *      vmgpud that died in a probe leaves nobody uncapped);
	                                         *      0: never */
	uint64_t turn_start;                    /* 120: when the owner's turn began (its slice counts from
	                                         *      here; 0 where a forwarder that predates it gave the
	                                         *      turn: then a slice is over as soon as another waits) */
	struct vmgpu_sched_slot slot[VMGPU_SCHED_SLOTS]; /* 128 */
};

#define VMGPU_SCHED_PAGE_SIZE (128u + VMGPU_SCHED_SLOTS * 256u)

#ifndef __cplusplus
_Static_assert(offsetof(struct vmgpu_sched_slot, weight) == 4, "slot weight");
_Static_assert(offsetof(struct vmgpu_sched_slot, name) == 16, "slot name");
_Static_assert(offsetof(struct vmgpu_sched_slot, vtime) == 80, "slot vtime");
_Static_assert(offsetof(struct vmgpu_sched_slot, used_ns) == 88, "slot used_ns");
_Static_assert(offsetof(struct vmgpu_sched_slot, turns) == 120, "slot turns");
_Static_assert(offsetof(struct vmgpu_sched_slot, inflight) == 136, "slot workers' words");
_Static_assert(offsetof(struct vmgpu_sched_slot, work_calls) == 144, "slot work_calls");
_Static_assert(offsetof(struct vmgpu_sched_slot, nworkers) == 152, "slot nworkers");
_Static_assert(offsetof(struct vmgpu_sched_slot, rejoin) == 164, "slot rejoin");
_Static_assert(offsetof(struct vmgpu_sched_slot, cap) == 168, "slot cap");
_Static_assert(offsetof(struct vmgpu_sched_slot, priority) == 172, "slot priority");
_Static_assert(offsetof(struct vmgpu_sched_slot, guarantee) == 176, "slot guarantee");
_Static_assert(offsetof(struct vmgpu_sched_slot, hold) == 180, "slot hold");
_Static_assert(offsetof(struct vmgpu_sched_slot, depth) == 184, "slot depth");
_Static_assert(offsetof(struct vmgpu_sched_slot, active_ms) == 188, "slot active_ms");
_Static_assert(offsetof(struct vmgpu_sched_slot, sm_part) == 192, "slot sm_part");
_Static_assert(offsetof(struct vmgpu_sched_slot, whole_ms) == 196, "slot whole_ms");
_Static_assert(offsetof(struct vmgpu_sched_slot, cap_pm) == 200, "slot cap_pm");
_Static_assert(offsetof(struct vmgpu_sched_slot, time_seq) == 204, "slot time_seq");
_Static_assert(offsetof(struct vmgpu_sched_slot, pad) == 208, "slot padding");
_Static_assert(sizeof(struct vmgpu_sched_slot) == 256, "slot size");
_Static_assert(offsetof(struct vmgpu_sched_page, magic) == 0, "magic first");
_Static_assert(offsetof(struct vmgpu_sched_page, version) == 8, "version second");
_Static_assert(offsetof(struct vmgpu_sched_page, policy) == 16, "page policy");
_Static_assert(offsetof(struct vmgpu_sched_page, owner) == 28, "page owner");
_Static_assert(offsetof(struct vmgpu_sched_page, gen) == 32, "page futex word");
_Static_assert(offsetof(struct vmgpu_sched_page, idle_us) == 36, "page idle_us");
_Static_assert(offsetof(struct vmgpu_sched_page, hold_start) == 40, "page hold_start");
_Static_assert(offsetof(struct vmgpu_sched_page, mu_space) == 48, "page mutex");
_Static_assert(offsetof(struct vmgpu_sched_page, sm_groups) == 112, "page sm_groups");
_Static_assert(offsetof(struct vmgpu_sched_page, turn_start) == 120, "page turn_start");
_Static_assert(offsetof(struct vmgpu_sched_page, caps_ms) == 116, "page caps_ms");
_Static_assert(offsetof(struct vmgpu_sched_page, slot) == 128, "page slots");
_Static_assert(sizeof(struct vmgpu_sched_page) == VMGPU_SCHED_PAGE_SIZE, "page size");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the vmgpu scheduler page is little-endian"
#endif
#endif

#endif /* VMGPU_SCHED_ABI_H */
