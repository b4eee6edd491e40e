/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The handle table (native/handles.c) without a GPU: a guest gets table values, never host
 * pointers; a value names only a live entry of its kind; a value kept after its object was
 * destroyed is refused, also once its slot holds a new object (the slot's generation went up);
 * forged values name nothing; destroying a module takes its functions and its globals' addresses
 * (native/addresses.c) with it.
 */
#include <stdlib.h>
#include <string.h>

#include "addresses.h"
#include "channel.h"
#include "check.h"
#include "log.h"
#include "partition.h"
#include "vg_kinds.h"

static int log_lines; /* what the address checks logged (VMGPU_TRACE_ERRORS=1) */
void vh_log(const char *fmt, ...)
{
	(void)fmt;
	log_lines++;
}

static struct vh_fwd f;

/* (no SM partitions here: a stream's work stays on the stream; partition.c is t_partition's) */
CUstream vh_part_stream(struct vh_chan *ch, struct vh_handle *e, int work)
{
	(void)ch;
	(void)work;
	return e->ptr;
}
void vh_part_default(struct vh_chan *ch, int work)
{
	(void)ch;
	(void)work;
}
void vh_part_stream_made(struct vh_chan *ch, struct vh_handle *e)
{
	(void)ch;
	(void)e;
}
void vh_part_stream_ends(struct vh_chan *ch, struct vh_handle *e)
{
	(void)ch;
	(void)e;
}
void vh_part_forget(struct vh_chan *ch, struct vh_handle *e)
{
	(void)ch;
	(void)e;
}

static struct vh_chan fresh(void)
{
	return (struct vh_chan){.fwd = &f, .cur_dev = -1};
}

static void release(struct vh_chan *ch)
{
	vh_handles_clear(ch);
	free(ch->spans);
}

/* A host object's guest value. */
static uint64_t give(struct vh_chan *ch, int kind, void *obj, void *parent)
{
	void *v = obj;
	CHECK_EQ(vh_handle_new(ch, kind, &v, parent), 0);
	CHECK(v != obj); /* never the host pointer */
	return (uint64_t)(uintptr_t)v;
}

/* The host object a guest value names, or NULL if it names none of that kind. */
static void *take(struct vh_chan *ch, int kind, uint64_t value)
{
	void *v = (void *)(uintptr_t)value;
	return vh_handle_in(ch, kind, &v) == 0 ? v : NULL;
}

static int objects[16];

static void a_value_names_its_object_and_only_as_its_kind(void)
{
	struct vh_chan ch = fresh();
	uint64_t s = give(&ch, VG_KIND_STREAM, &objects[0], NULL);
	uint64_t e = give(&ch, VG_KIND_EVENT, &objects[1], NULL);
	CHECK(take(&ch, VG_KIND_STREAM, s) == &objects[0]);
	CHECK(take(&ch, VG_KIND_EVENT, e) == &objects[1]);
	CHECK(take(&ch, VG_KIND_EVENT, s) == NULL);
	CHECK(take(&ch, VG_KIND_STREAM, e) == NULL);
	CHECK_EQ(give(&ch, VG_KIND_STREAM, &objects[0], NULL), s); /* the same object: the same value */
	/* a kernel passes wherever a function is asked for, not the other way round */
	uint64_t k = give(&ch, VG_KIND_KERNEL, &objects[2], NULL);
	CHECK(vh_handle_entry(&ch, k, VG_KIND_FUNCTION) != NULL);
	uint64_t fn = give(&ch, VG_KIND_FUNCTION, &objects[3], NULL);
	CHECK(vh_handle_entry(&ch, fn, VG_KIND_KERNEL) == NULL);
	release(&ch);
}

static void a_stale_value_is_refused_after_its_slot_is_reused(void)
{
	struct vh_chan ch = fresh();
	uint64_t a = give(&ch, VG_KIND_STREAM, &objects[0], NULL);
	give(&ch, VG_KIND_STREAM, &objects[1], NULL);
	vh_handle_drop(&ch, VG_KIND_STREAM, &objects[0]);
	CHECK(take(&ch, VG_KIND_STREAM, a) == NULL); /* destroyed: names nothing */
	uint64_t b = give(&ch, VG_KIND_STREAM, &objects[2], NULL);
	CHECK_EQ((b >> 8) & 0xFFFFFF, (a >> 8) & 0xFFFFFF); /* the freed slot, reused */
	CHECK(b >> 32 > a >> 32);                           /* with a new generation */
	CHECK(take(&ch, VG_KIND_STREAM, a) == NULL);        /* the old value still names nothing */
	CHECK(take(&ch, VG_KIND_STREAM, b) == &objects[2]);
	/* the same object made again gets a value of its own, not the stale one */
	vh_handle_drop(&ch, VG_KIND_STREAM, &objects[2]);
	uint64_t c = give(&ch, VG_KIND_STREAM, &objects[0], NULL);
	CHECK(c != a && c != b);
	CHECK(take(&ch, VG_KIND_STREAM, a) == NULL);
	CHECK(take(&ch, VG_KIND_STREAM, b) == NULL);
	CHECK(take(&ch, VG_KIND_STREAM, c) == &objects[0]);
	release(&ch);
}

static void forged_values_name_nothing(void)
{
	struct vh_chan ch = fresh();
	uint64_t s = give(&ch, VG_KIND_STREAM, &objects[0], NULL);
	CHECK(take(&ch, VG_KIND_STREAM, s ^ (1ull << 32)) == NULL);  /* another generation */
	CHECK(take(&ch, VG_KIND_STREAM, s + (1ull << 8)) == NULL);   /* a slot never used */
	CHECK(take(&ch, VG_KIND_STREAM, s & ~0xFFFFFF00ull) == NULL); /* slot 0 */
	CHECK(take(&ch, VG_KIND_STREAM, (uint64_t)(uintptr_t)&objects[0]) == NULL); /* a host pointer */
	CHECK(take(&ch, VG_KIND_STREAM, ~0ull) == NULL);
	/* 0 and the special streams pass as they are */
	CHECK(take(&ch, VG_KIND_STREAM, 0) == NULL);
	void *v = CU_STREAM_PER_THREAD;
	CHECK_EQ(vh_handle_in(&ch, VG_KIND_STREAM, &v), 0);
	CHECK(v == CU_STREAM_PER_THREAD);
	v = (void *)(uintptr_t)1; /* a small number is no special value for an event */
	CHECK_EQ(vh_handle_in(&ch, VG_KIND_EVENT, &v), -1);
	release(&ch);
}

static void a_module_takes_its_functions_and_globals_with_it(void)
{
	struct vh_chan ch = fresh();
	uint64_t mod = give(&ch, VG_KIND_MODULE, &objects[0], NULL);
	uint64_t fn = give(&ch, VG_KIND_FUNCTION, &objects[1], &objects[0]);
	uint64_t other = give(&ch, VG_KIND_FUNCTION, &objects[2], NULL);
	CHECK_EQ(vh_addr_add(&ch, 0x10000, 256, VH_SPAN_GLOBAL, &objects[0]), 0);
	CHECK_EQ(vh_addr_add(&ch, 0x20000, 4096, VH_SPAN_MEM, NULL), 0);
	CHECK_EQ(vh_addr_ok(&ch, 0x10000, 256), 0);
	vh_handle_drop(&ch, VG_KIND_MODULE, &objects[0]);
	CHECK(take(&ch, VG_KIND_MODULE, mod) == NULL);
	CHECK(vh_handle_entry(&ch, fn, VG_KIND_FUNCTION) == NULL);
	CHECK(vh_handle_entry(&ch, other, VG_KIND_FUNCTION) != NULL);
	int before = log_lines;
	CHECK_EQ(vh_addr_ok(&ch, 0x10000, 1), -1); /* the global's address names nothing now */
	CHECK_EQ(log_lines, before + 1);          /* and, traced, the refusal is logged */
	CHECK_EQ(vh_addr_ok(&ch, 0x20000, 4096), 0);
	release(&ch);
}

int main(void)
{
	setenv("VMGPU_TRACE_ERRORS", "1", 1);
	a_value_names_its_object_and_only_as_its_kind();
	a_stale_value_is_refused_after_its_slot_is_reused();
	forged_values_name_nothing();
	a_module_takes_its_functions_and_globals_with_it();
	printf("ok\n");
	return 0;
}
