/*
 * A hostile guest that names addresses: it claims a channel on a running forwarder and, record
 * by record, asks its worker to copy from, copy to, set, map and describe addresses that are not
 * its own: the worker's stack, heap, static data and its own mapping of the region (read from
 * /proc/<worker>/maps), unmapped addresses, a freed allocation, ranges one byte past an
 * allocation, ranges that wrap, ranges across two allocations, another guest process's
 * allocation.  Every one must be refused with CUDA_ERROR_INVALID_VALUE and the worker must go
 * on serving correctly.  It also checks that no reply that carries an address or a handle
 * (allocations, pinned memory's device address, pointer attributes, VMM handles, a module's
 * function tags) holds a host address of the worker.
 *
 *   guest_addresses REGION FORWARDER_PID names|replies [PTX_FILE]
 * names: addresses that are not the guest's are refused; replies: no reply names the worker.
 * Exit 0: all held; 1: a check failed (each failure is one line on stderr); 2: usage/setup.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "raw_guest.h"
#include "worker_maps.h"
#include "vg_ops.h"
#include "vg_wire.h"

enum { BUF_INLINE = 0, BUF_HEAP = 1 };
#define INVALID 1 /* CUDA_ERROR_INVALID_VALUE */

static struct raw_guest G; /* this program, as a guest (G.base: its mapping of the region) */
static int failures, checks;
static pid_t worker;

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	failures++;
}

/* ---- requests ---------------------------------------------------------------------- */

static uint64_t args[8192];
static uint32_t nargs;

static void a0(void) { nargs = 0; }
static const CUmemAccessDesc rw_desc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
static void au(uint64_t v);
/* cuMemSetAccess's descriptor array: a count of one, then the descriptor */
static void adesc(void);
static void au(uint64_t v) { args[nargs++] = v; }
static void adesc(void)
{
	au(1);
	memcpy(&args[nargs], &rw_desc, sizeof rw_desc);
	nargs += (uint32_t)((sizeof rw_desc + 7) / 8);
}
static void abytes(const void *p, uint64_t n)
{
	au(n);
	memcpy(&args[nargs], p, n);
	nargs += (uint32_t)((n + 7) / 8);
}

/* Send the request built in args; wait for its reply.  The CUresult, or -1 if none came. */
static int call(uint32_t op)
{
	return raw_call(&G, op, 0, 0, args, nargs * 8);
}

static void no_worker_address(const char *what, uint64_t v)
{
	checks++;
	const struct map *m = worker_memory(v, G.base);
	if (m)
		fail("%s: 0x%llx is a host address of the worker (%llx-%llx %s %s)", what, (unsigned long long)v,
		     (unsigned long long)m->lo, (unsigned long long)m->hi, m->perms, m->path);
}


/* ---- the checks ------------------------------------------------------------------------ */

static uint64_t a1, a2, freed, hoff;

static void expect(const char *what, int got)
{
	checks++;
	if (got != INVALID)
		fail("%s: got %d, expected CUDA_ERROR_INVALID_VALUE (1)", what, got);
}

static int alloc(uint64_t n, uint64_t *d)
{
	a0(), au(1), au(n);
	int r = call(VG_OP_cuMemAlloc_v2);
	*d = raw_out(&G, 0);
	no_worker_address("cuMemAlloc's address", *d);
	return r;
}

/* The worker still serves, and correctly: bytes written to a1 come back. */
static void healthy(const char *after)
{
	uint8_t pat[64], back[64];
	for (int i = 0; i < 64; i++)
		pat[i] = (uint8_t)(i * 7 + G.seq);
	a0(), au(a1), au(64), au(BUF_INLINE), au(0), abytes(pat, 64);
	int r1 = call(VG_OP_cuMemcpyHtoD_v2);
	a0(), au(a1), au(64), au(BUF_INLINE), au(0);
	int r2 = call(VG_OP_cuMemcpyDtoH_v2);
	if (r2 == 0 && raw_out(&G, 0) == 64)
		memcpy(back, G.rep + sizeof(struct vg_rep_hdr) + 8, 64);
	checks++;
	if (kill(worker, 0) != 0 || r1 != 0 || r2 != 0 || memcmp(pat, back, 64) != 0)
		fail("after %s the worker no longer serves correctly (htod %d, dtoh %d, alive %d)", after, r1, r2,
		     kill(worker, 0) == 0);
}

/* Every call that takes a device address, with [t, t+n) as that address. */
/* which: QUERIES adds the single-address queries (the first byte is not the guest's either),
 * VMM the calls on reserved ranges (the range is in no reservation of the guest's). */
enum { QUERIES = 1, VMM = 2 };
static void refuse_everywhere_at(const char *name, uint64_t t, uint64_t n, int which)
{
	char what[160];
	uint8_t junk[64] = {0};
	uint64_t k = n < 64 ? n : 64;
#define E(op_desc, op)                                                      \
	do {                                                                \
		snprintf(what, sizeof what, "%s: %s", name, op_desc);       \
		expect(what, call(op));                                     \
	} while (0)
	a0(), au(BUF_INLINE), au(a1), au(BUF_INLINE), au(t), au(n);
	E("cuMemcpy from it", VG_OP_cuMemcpy);
	a0(), au(BUF_INLINE), au(t), au(BUF_INLINE), au(a1), au(n);
	E("cuMemcpy to it", VG_OP_cuMemcpy);
	a0(), au(BUF_INLINE), au(a1), au(BUF_INLINE), au(t), au(n), au(0);
	E("cuMemcpyAsync from it", VG_OP_cuMemcpyAsync);
	a0(), au(BUF_INLINE), au(t), au(BUF_HEAP), au(hoff), au(n), au(0);
	E("cuMemcpyAsync to it from pinned memory", VG_OP_cuMemcpyAsync);
	if (n == k) {
		a0(), au(t), au(k), au(BUF_INLINE), au(0), abytes(junk, k);
		E("cuMemcpyHtoD", VG_OP_cuMemcpyHtoD_v2);
	}
	a0(), au(t), au(0), au(n), au(BUF_HEAP), au(hoff);
	E("cuMemcpyHtoDAsync", VG_OP_cuMemcpyHtoDAsync_v2);
	a0(), au(t), au(n), au(BUF_INLINE), au(0);
	E("cuMemcpyDtoH", VG_OP_cuMemcpyDtoH_v2);
	a0(), au(t), au(0), au(n), au(BUF_HEAP), au(hoff);
	E("cuMemcpyDtoHAsync", VG_OP_cuMemcpyDtoHAsync_v2);
	a0(), au(t), au(a1), au(n);
	E("cuMemcpyDtoD to it", VG_OP_cuMemcpyDtoD_v2);
	a0(), au(a1), au(t), au(n);
	E("cuMemcpyDtoD from it", VG_OP_cuMemcpyDtoD_v2);
	a0(), au(t), au(a1), au(n), au(0);
	E("cuMemcpyDtoDAsync to it", VG_OP_cuMemcpyDtoDAsync_v2);
	a0(), au(a1), au(t), au(n), au(0);
	E("cuMemcpyDtoDAsync from it", VG_OP_cuMemcpyDtoDAsync_v2);
	a0(), au(t), au(0x41), au(n);
	E("cuMemsetD8", VG_OP_cuMemsetD8_v2);
	a0(), au(t), au(0x4141), au((n + 1) / 2);
	E("cuMemsetD16", VG_OP_cuMemsetD16_v2);
	a0(), au(t), au(0x41414141), au((n + 3) / 4);
	E("cuMemsetD32", VG_OP_cuMemsetD32_v2);
	a0(), au(t), au(0x41), au(n), au(0);
	E("cuMemsetD8Async", VG_OP_cuMemsetD8Async);
	a0(), au(t), au(0x4141), au((n + 1) / 2), au(0);
	E("cuMemsetD16Async", VG_OP_cuMemsetD16Async);
	a0(), au(t), au(0x41414141), au((n + 3) / 4), au(0);
	E("cuMemsetD32Async", VG_OP_cuMemsetD32Async);
	if (which & QUERIES) {
		a0(), au(1), au(1), au(t);
		E("cuMemGetAddressRange", VG_OP_cuMemGetAddressRange_v2);
		a0(), au(CU_POINTER_ATTRIBUTE_DEVICE_POINTER), au(BUF_INLINE), au(t);
		E("cuPointerGetAttribute", VG_OP_cuPointerGetAttribute);
	}
	if (which & VMM) {
		a0(), au(t), au(n), adesc(), au(1);
		E("cuMemSetAccess", VG_OP_cuMemSetAccess);
		a0(), au(t), au(n);
		E("cuMemAddressFree", VG_OP_cuMemAddressFree);
	}
#undef E
	/* an async refusal is also latched and reported by the next synchronising call */
	a0();
	int r = call(VG_OP_cuCtxSynchronize);
	checks++;
	if (r != 0 && r != INVALID)
		fail("%s: cuCtxSynchronize after the refusals returned %d", name, r);
	healthy(name);
}

static void refuse_everywhere(const char *name, uint64_t t, uint64_t n)
{
	refuse_everywhere_at(name, t, n, QUERIES | VMM);
}

/* Another guest process with an allocation of its own: its address, and it waits until told. */
static pid_t other_process(const char *region, uint64_t *addr, int *go)
{
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		return -1;
	pid_t p = fork();
	if (p == 0) {
		close(up[0]);
		close(down[1]);
		uint64_t d = 0;
		int opened = raw_guest_open(&G, region, 1) == 0; /* a process of its own, with a channel of its own */
		if (opened) {
			struct vg_hello_req hello = {VG_PROTO_VERSION, (uint32_t)getpid()};
			a0();
			memcpy(args, &hello, sizeof hello);
			nargs = sizeof hello / 8;
			/* several, so that the last lies past what the first process holds (the simulated
			 * backend numbers each worker's allocations alike) */
			if (call(VG_OP_HELLO) == 0)
				for (int i = 0; i < 8; i++) {
					a0(), au(1), au(65536);
					if (call(VG_OP_cuMemAlloc_v2) == 0)
						d = raw_out(&G, 0);
				}
		}
		if (write(up[1], &d, 8) != 8)
			_exit(1);
		char c;
		if (read(down[0], &c, 1) < 0)
			_exit(1);
		if (opened) {
			a0();
			call(VG_OP_GOODBYE);
			vmgpu_gchan_close(G.ch);
		}
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	*go = down[1];
	if (read(up[0], addr, 8) != 8)
		*addr = 0;
	close(up[0]);
	return p;
}

static void load_module(const char *ptx_path, uint64_t *mod)
{
	*mod = 0;
	FILE *f = ptx_path ? fopen(ptx_path, "rb") : NULL;
	if (!f)
		return;
	static char text[1 << 20];
	size_t n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[n++] = 0;
	uint64_t pos;
	void *bulk;
	a0(), au(n), au(0x1234), au(0x5678);
	if (call(VG_OP_BLOB_BEGIN) != 0 || vmgpu_gchan_bulk_alloc(G.ch, n, 5000000000ull, &pos, &bulk) < 0)
		return;
	memcpy(bulk, text, n);
	a0(), au(0), au(pos), au(n);
	raw_call(&G, VG_OP_BLOB_PUT, 0, VG_F_NOREPLY, args, 24);
	a0();
	if (call(VG_OP_cuModuleLoadData) == 0)
		*mod = raw_out(&G, 0);
}

int main(int argc, char **argv)
{
	if (argc < 4 || (strcmp(argv[3], "names") && strcmp(argv[3], "replies"))) {
		fprintf(stderr, "usage: guest_addresses REGION FORWARDER_PID names|replies [PTX_FILE]\n");
		return 2;
	}
	int names = !strcmp(argv[3], "names"), r;
	const char *ptx = argc > 4 ? argv[4] : NULL;
	G.reply_timeout_ns = 20000000000ull;
	if (raw_guest_open(&G, argv[1], 1))
		return 2;
	struct vg_hello_req hello = {VG_PROTO_VERSION, (uint32_t)getpid()};
	a0();
	memcpy(args, &hello, sizeof hello);
	nargs = sizeof hello / 8;
	if (call(VG_OP_HELLO) != 0) {
		fprintf(stderr, "hello refused\n");
		return 2;
	}
	worker = worker_find((pid_t)atoi(argv[2]));
	if (!worker) {
		fprintf(stderr, "cannot find the worker of forwarder %s\n", argv[2]);
		return 2;
	}
	worker_maps_read(worker);
	char region_path[PATH_MAX];
	if (!realpath(argv[1], region_path))
		return 2;

	/* this process's own objects: two allocations back to back, a freed one, pinned memory */
	if (alloc(65536, &a1) || alloc(65536, &a2) || alloc(4096, &freed)) {
		fprintf(stderr, "cannot allocate device memory\n");
		return 2;
	}
	a0(), au(freed);
	if (call(VG_OP_cuMemFree_v2) != 0)
		return 2;
	if (vmgpu_guest_heap_alloc(G.ch, 65536, &hoff) < 0) {
		fprintf(stderr, "cannot allocate pinned memory: %s\n", vmgpu_shm_errmsg());
		return 2;
	}
	uint8_t *pinned = G.base + hoff;
	memset(pinned, 0x5a, 65536);
	healthy("setting up");

	/* the worker's own memory, as its maps show it */
	const struct map *stack = worker_map_named("[stack]", NULL), *heap = worker_map_named("[heap]", NULL);
	const struct map *region = worker_map_named(region_path, "rw-s");
	const struct map *libc = worker_map_containing("libc", "rw-p");
	const struct map *self = worker_map_containing("vmgpu-forwarder", "rw-p");
	if (!stack || !region || !libc) {
		fprintf(stderr, "the worker's maps lack a stack, the region or libc's data\n");
		return 2;
	}
	if (names) {
	refuse_everywhere("the worker's stack", stack->hi - 4096, 64);
	if (heap)
		refuse_everywhere("the worker's heap", heap->lo + 64, 64);
	refuse_everywhere("libc's static data in the worker", libc->lo, 64);
	if (self)
		refuse_everywhere("the forwarder's static data in the worker", self->lo, 64);
	/* the worker's mapping of this process's pinned memory, not named as pinned memory */
	refuse_everywhere("the worker's own address of pinned memory", region->lo + hoff, 64);
	refuse_everywhere("the worker's mapping of the region header", region->lo, 64);
	checks++;
	for (int i = 0; i < 65536; i++)
		if (pinned[i] != 0x5a) {
			fail("pinned memory was written through the worker's own address of it (byte %d is 0x%02x)", i,
			     pinned[i]);
			break;
		}
	refuse_everywhere("an unmapped low address", 0x1000, 64);
	refuse_everywhere("an address in no mapping of the worker", worker_unmapped_address(), 64);
	refuse_everywhere("a freed allocation", freed, 64);
	refuse_everywhere_at("a range one byte past an allocation", a1 + 65536 - 63, 64, 0);
	refuse_everywhere_at("a range that wraps", a1 + 64, UINT64_MAX - 63, 0);
	refuse_everywhere_at("a range across two allocations", a1 + 65536 - 32, 64, 0);
	if (a2 != a1 + 65536)
		fprintf(stderr, "note: the two allocations are not back to back (%llx, %llx)\n", (unsigned long long)a1,
			(unsigned long long)a2);
	/* memsets whose element count overflows the byte count */
	a0(), au(a1), au(0x41414141), au(UINT64_MAX / 4 + 2);
	expect("cuMemsetD32 whose count overflows", call(VG_OP_cuMemsetD32_v2));
	a0(), au(a1), au(0x4141), au(UINT64_MAX / 2 + 2), au(0);
	expect("cuMemsetD16Async whose count overflows", call(VG_OP_cuMemsetD16Async));
	healthy("overflowing counts");

	/* another guest process's allocation is not this one's */
	int go = -1;
	uint64_t theirs = 0;
	pid_t other = other_process(argv[1], &theirs, &go);
	if (other > 0 && theirs)
		refuse_everywhere("another guest process's allocation", theirs, 64);
	else
		fail("could not set up a second guest process");
	if (go >= 0) {
		if (write(go, "x", 1) != 1)
			fail("cannot release the second guest process");
		close(go);
	}
	if (other > 0)
		waitpid(other, NULL, 0);

	/* the same calls on this process's own memory work */
	a0(), au(BUF_INLINE), au(a2), au(BUF_INLINE), au(a1), au(65536);
	checks++;
	if (call(VG_OP_cuMemcpy) != 0)
		fail("cuMemcpy between two allocations of this process was refused");
	a0(), au(BUF_INLINE), au(a1), au(BUF_HEAP), au(hoff), au(65536);
	checks++;
	if (call(VG_OP_cuMemcpy) != 0)
		fail("cuMemcpy from pinned memory to an allocation was refused");
	a0(), au(a1 + 65536 - 64), au(0x41), au(64);
	checks++;
	if (call(VG_OP_cuMemsetD8_v2) != 0)
		fail("cuMemsetD8 of the last 64 bytes of an allocation was refused");
	a0(), au(1), au(1), au(a1 + 100);
	checks++;
	if (call(VG_OP_cuMemGetAddressRange_v2) != 0 || raw_out(&G, 0) != a1 || raw_out(&G, 1) != 65536)
		fail("cuMemGetAddressRange of an allocation: base %llx size %llu", (unsigned long long)raw_out(&G, 0),
		     (unsigned long long)raw_out(&G, 1));

	}

	/* pinned memory's device address: this process's own pointer, never the worker's */
	if (!names) {
	worker_maps_read(worker);
	a0(), au(hoff), au(0), au((uint64_t)(uintptr_t)G.base);
	r = call(VG_OP_cuMemHostGetDevicePointer_v2);
	checks++;
	if (r == 0 && G.rlen == 8) /* a bare address, as the driver gave it */
		no_worker_address("cuMemHostGetDevicePointer", raw_out(&G, 0));
	if (r != 0 || G.rlen != 16)
		fail("cuMemHostGetDevicePointer: result %d, %u reply bytes (expected kind and value)", r, G.rlen);
	else {
		uint64_t kind = raw_out(&G, 0), d = kind == 2 ? (uint64_t)(uintptr_t)(G.base + raw_out(&G, 1)) : raw_out(&G, 1);
		no_worker_address("cuMemHostGetDevicePointer", raw_out(&G, 1));
		checks++;
		if (d != (uint64_t)(uintptr_t)pinned)
			fail("cuMemHostGetDevicePointer gave 0x%llx, not this process's own pointer %p", (unsigned long long)d,
			     (void *)pinned);
		worker_maps_read(worker); /* the worker may have mapped the region at our address now */
		/* what it gave is usable as a copy address, as natively */
		a0(), au(BUF_INLINE), au(a1), au(BUF_INLINE), au(d), au(64);
		checks++;
		if (kind == 0 && call(VG_OP_cuMemcpy) != 0)
			fail("cuMemcpy from the device address of pinned memory was refused");
	}

	/* pointer attributes of pinned memory and of an allocation carry no worker address */
	static const CUpointer_attribute addr_attrs[] = {
		CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
		CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
		CU_POINTER_ATTRIBUTE_P2P_TOKENS,     CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
		CU_POINTER_ATTRIBUTE_CONTEXT,
	};
	const unsigned nattr = sizeof addr_attrs / sizeof *addr_attrs;
	uint64_t where[3][2] = {{BUF_HEAP, hoff + 128}, {BUF_INLINE, a1 + 128}, {BUF_INLINE, stack->hi - 4096}};
	for (int w = 0; w < 3; w++) {
		a0(), au(nattr);
		for (unsigned i = 0; i < nattr; i++)
			au(addr_attrs[i]);
		au(where[w][0]), au(where[w][1]);
		r = call(VG_OP_cuPointerGetAttributes);
		checks++;
		if (r != 0) /* a refusal carries no value (the real driver refuses some of these sets) */
			continue;
		for (unsigned i = 0; i < nattr; i++) {
			char what[96];
			snprintf(what, sizeof what, "cuPointerGetAttributes (%d) attribute %d", w, addr_attrs[i]);
			if (raw_out(&G, 3 * i) != 2) /* kind 2 is a region offset */
				no_worker_address(what, raw_out(&G, 3 * i + 1)), no_worker_address(what, raw_out(&G, 3 * i + 2));
		}
	}
	for (unsigned i = 0; i < 4; i++) {
		a0(), au(addr_attrs[i]), au(BUF_HEAP), au(hoff);
		if (call(VG_OP_cuPointerGetAttribute) == 0 && raw_out(&G, 0) != 2)
			no_worker_address("cuPointerGetAttribute of pinned memory", raw_out(&G, 1));
	}

	}

	/* VMM: the handle is the guest's own number; mappings only inside its own reservation */
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	a0(), au(1), au(2u << 20), au(1); /* out handle; size; prop: present, then its bytes */
	memcpy(&args[nargs], &prop, sizeof prop);
	nargs += (sizeof prop + 7) / 8;
	au(0);
	r = call(VG_OP_cuMemCreate);
	uint64_t handle = raw_out(&G, 0);
	checks++;
	if (r != 0)
		fail("cuMemCreate returned %d", r);
	else
		no_worker_address("cuMemCreate's handle", handle);
	a0(), au(1), au(4u << 20), au(0), au(stack->hi - (8u << 20)), au(0);
	r = call(VG_OP_cuMemAddressReserve);
	uint64_t va = raw_out(&G, 0);
	checks++;
	if (r != 0)
		fail("cuMemAddressReserve returned %d", r);
	no_worker_address("cuMemAddressReserve's range (asked at the worker's stack)", va);
	a0(), au(stack->hi - (2u << 20)), au(2u << 20), au(0), au(handle), au(0);
	expect("cuMemMap at the worker's stack", call(VG_OP_cuMemMap));
	a0(), au(region->lo), au(2u << 20), au(0), au(handle), au(0);
	expect("cuMemMap over the worker's mapping of the region", call(VG_OP_cuMemMap));
	a0(), au(va), au(2u << 20), au(0), au(handle), au(0);
	checks++;
	if (call(VG_OP_cuMemMap) != 0)
		fail("cuMemMap inside this process's own reservation was refused");
	a0(), au(va), au(2u << 20), adesc(), au(1);
	checks++;
	if (call(VG_OP_cuMemSetAccess) != 0)
		fail("cuMemSetAccess of this process's own mapping was refused");
	a0(), au(va + 4096), au(0x41), au(4096);
	checks++;
	if (call(VG_OP_cuMemsetD8_v2) != 0)
		fail("cuMemsetD8 inside a VMM mapping was refused");
	refuse_everywhere_at("a range past a VMM mapping", va + (2u << 20) - 32, 64, 0);
	a0(), au(va), au(2u << 20);
	checks++;
	if (call(VG_OP_cuMemUnmap) != 0)
		fail("cuMemUnmap of this process's mapping was refused");
	refuse_everywhere_at("an unmapped VMM range", va, 64, QUERIES);
	a0(), au(handle);
	checks++;
	if (call(VG_OP_cuMemRelease) != 0)
		fail("cuMemRelease of this process's handle was refused");
	a0(), au(va), au(4u << 20);
	checks++;
	if (call(VG_OP_cuMemAddressFree) != 0)
		fail("cuMemAddressFree of this process's reservation was refused");

	/* a module's functions: handles and tags, none of them a worker address */
	uint64_t mod = 0;
	if (!names)
		load_module(ptx, &mod);
	if (mod) {
		a0(), au(mod);
		r = call(VG_OP_MODULE_FUNCS);
		checks++;
		if (r != 0 || raw_out(&G, 0) == 0)
			fail("the module's functions: result %d, %llu functions", r, (unsigned long long)raw_out(&G, 0));
		for (uint64_t i = 0; r == 0 && i < raw_out(&G, 0) && i < 64; i++) {
			no_worker_address("a module function's handle", raw_out(&G, 1 + 2 * i));
			no_worker_address("a module function's tag", raw_out(&G, 2 + 2 * i));
			checks++;
			if (raw_out(&G, 2 + 2 * i) >= 65536)
				fail("a module function's tag 0x%llx is not a small guest-side number",
				     (unsigned long long)raw_out(&G, 2 + 2 * i));
		}
	} else if (!names && ptx) {
		fail("cannot load the module %s", ptx);
	}

	healthy("everything");
	a0();
	call(VG_OP_GOODBYE);
	raw_guest_close(&G);
	printf("guest_addresses: %d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
