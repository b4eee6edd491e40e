/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every way a guest can take device memory, each charged to its quota through the books
 * (books.c): cuMemAlloc, pitched allocations, arrays, stream-ordered and pool allocations,
 * VMM (cuMemCreate / cuMemMap), graph memory nodes, and (in exec.c and handles.c) module
 * images with their globals and the context itself.
 *
 * The pattern is the same for each: reserve an estimate or refuse, make the call, let the
 * books take the truth, and undo a call that left the guest over its quota.  What a guest
 * names (a pointer to free, a VMM handle to map, a pool) must be something this guest
 * process made; descriptions it sends are checked and their device numbers translated,
 * and nothing that could be shared with another process (exportable handle types, IPC)
 * is let through.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vh_dispatch.h"

#define VH_MAX_ACCESS_DESCS 16

/* ---- what this guest process holds ----------------------------------------------- */

static struct vh_alloc *track(struct vh_chan *ch, CUdeviceptr base, uint64_t size, int dev, int kind)
{
	if (ch->nallocs == ch->capallocs) {
		size_t cap = ch->capallocs ? ch->capallocs * 2 : 64;
		struct vh_alloc *a = realloc(ch->allocs, cap * sizeof *a);
		if (!a)
			return NULL;
		ch->allocs = a;
		ch->capallocs = cap;
	}
	struct vh_alloc *a = &ch->allocs[ch->nallocs++];
	*a = (struct vh_alloc){.base = base, .size = size, .dev = dev, .kind = kind};
	return a;
}

/* The record of base among the kinds in the mask (1 << kind), or NULL. */
static struct vh_alloc *find(struct vh_chan *ch, uint64_t base, unsigned kinds)
{
	for (size_t i = 0; i < ch->nallocs; i++)
		if (ch->allocs[i].base == base && (kinds >> ch->allocs[i].kind & 1))
			return &ch->allocs[i];
	return NULL;
}

/* A VMM handle by the value the guest knows it by. */
static struct vh_alloc *find_vmm(struct vh_chan *ch, uint64_t guest, unsigned kinds)
{
	for (size_t i = 0; guest && i < ch->nallocs; i++)
		if (ch->allocs[i].guest == guest && (kinds >> ch->allocs[i].kind & 1))
			return &ch->allocs[i];
	return NULL;
}

/* Whether [p, p+n) lies inside one virtual address range this process reserved. */
static int va_inside(struct vh_chan *ch, uint64_t p, uint64_t n)
{
	for (size_t i = 0; i < ch->nallocs; i++) {
		const struct vh_alloc *a = &ch->allocs[i];
		if (a->kind == VH_VA && p >= a->base && n <= a->size && p - a->base <= a->size - n)
			return 1;
	}
	return 0;
}

static void untrack(struct vh_chan *ch, struct vh_alloc *a)
{
	*a = ch->allocs[--ch->nallocs];
}

/* ---- the device addresses it may name ---------------------------------------------
 *
 * Every address a guest gives is resolved here before the driver sees it (DESIGN.md, the
 * trust boundary, rule 2).  With unified addressing the driver takes any address of the
 * worker for host memory, so an address that is not one of this process's own objects
 * would be a read or write of the worker itself.  The table is per guest process (one
 * worker each), sorted by base; a lookup is a binary search, so the check on every copy
 * and memset costs O(log n) however many allocations a program holds. */

/* The index of the last span whose base is <= addr, or -1. */
static ptrdiff_t span_at(const struct vh_chan *ch, uint64_t addr)
{
	size_t lo = 0, hi = ch->nspans;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ch->spans[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (ptrdiff_t)lo - 1;
}

static int span_add(struct vh_chan *ch, uint64_t base, uint64_t size, int kind, void *owner)
{
	uint64_t end;
	if (size == 0 || __builtin_add_overflow(base, size, &end))
		return -1;
	ptrdiff_t i = span_at(ch, base);
	if (i >= 0 && ch->spans[i].base == base && ch->spans[i].end == end && ch->spans[i].kind == kind &&
	    ch->spans[i].owner == owner)
		return 0; /* the same global asked for again */
	/* the driver never hands out overlapping live objects; refuse rather than trust it */
	if ((i >= 0 && ch->spans[i].end > base) || ((size_t)(i + 1) < ch->nspans && ch->spans[i + 1].base < end))
		return -1;
	if (ch->nspans == ch->capspans) {
		size_t cap = ch->capspans ? ch->capspans * 2 : 64;
		struct vh_span *p = realloc(ch->spans, cap * sizeof *p);
		if (!p)
			return -1;
		ch->spans = p;
		ch->capspans = cap;
	}
	size_t at = (size_t)(i + 1);
	memmove(&ch->spans[at + 1], &ch->spans[at], (ch->nspans - at) * sizeof *ch->spans);
	ch->spans[at] = (struct vh_span){.base = base, .end = end, .owner = owner, .kind = kind};
	ch->nspans++;
	return 0;
}

static void span_del(struct vh_chan *ch, uint64_t base, int kind)
{
	ptrdiff_t i = span_at(ch, base);
	if (i < 0 || ch->spans[i].base != base || ch->spans[i].kind != kind)
		return;
	memmove(&ch->spans[i], &ch->spans[i + 1], (ch->nspans - (size_t)i - 1) * sizeof *ch->spans);
	ch->nspans--;
}

void vh_addr_forget_owner(struct vh_chan *ch, void *owner)
{
	size_t k = 0;
	for (size_t i = 0; i < ch->nspans; i++)
		if (ch->spans[i].kind != VH_SPAN_GLOBAL || ch->spans[i].owner != owner)
			ch->spans[k++] = ch->spans[i];
	ch->nspans = k;
}

int vh_addr_owned(struct vh_chan *ch, uint64_t addr)
{
	ptrdiff_t i = span_at(ch, addr);
	return i >= 0 && addr < ch->spans[i].end;
}

int vh_addr_ok(struct vh_chan *ch, uint64_t addr, uint64_t n)
{
	uint64_t end;
	if (__builtin_add_overflow(addr, n, &end))
		return -1; /* a range that wraps names nothing of anyone's */
	ptrdiff_t i = span_at(ch, addr);
	if (n == 0)
		return addr == 0 || (i >= 0 && addr <= ch->spans[i].end) ? 0 : -1;
	if (i < 0 || addr >= ch->spans[i].end)
		return -1;
	/* inside one object; VMM mappings placed back to back (an expandable segment) count as one */
	while (end > ch->spans[i].end) {
		if (ch->spans[i].kind != VH_SPAN_MAP || (size_t)(i + 1) >= ch->nspans ||
		    ch->spans[i + 1].kind != VH_SPAN_MAP || ch->spans[i + 1].base != ch->spans[i].end)
			return -1;
		i++;
	}
	return 0;
}

int vh_dev_range(struct vh_chan *ch, uint64_t addr, uint64_t count, uint64_t elsz)
{
	uint64_t n;
	if (__builtin_mul_overflow(count, elsz, &n))
		return -1;
	return vh_addr_ok(ch, addr, n);
}

/* ---- the charging pattern -------------------------------------------------------- */

/* Before a call that may take memory: reserve est, or refuse (and tell the operator). */
static int take_begin(struct vh_chan *ch, int dev, uint64_t est, const char *call)
{
	if (vh_books_reserve(ch, dev, est) == 0)
		return 0;
	vh_oom(ch, dev, call, est);
	return -1;
}

/* After it: the books take the truth, or keep the estimate as the charge (a failed call's
 * is returned).  Nonzero if the call succeeded but left the guest over its quota: the
 * caller undoes it and calls undone(). */
static int take_end(struct vh_chan *ch, int dev, uint64_t est, CUresult r)
{
	if (vh_books_metered(ch))
		return vh_books_settle(ch, dev) && r == CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		vh_books_release(ch, dev, est);
	return 0;
}

static CUresult undone(struct vh_chan *ch, int dev, uint64_t est, const char *call)
{
	if (vh_books_metered(ch))
		vh_books_settle(ch, dev);
	else
		vh_books_release(ch, dev, est);
	vh_oom(ch, dev, call, est);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Memory went back to the driver: the books follow (the truth, or the charge it had). */
static void given_back(struct vh_chan *ch, int dev, uint64_t charge)
{
	if (vh_books_metered(ch))
		vh_books_settle(ch, dev);
	else
		vh_books_release(ch, dev, charge);
}

/* A record whose memory the driver has taken back: forget it, and the books follow. */
static void let_go(struct vh_chan *ch, struct vh_alloc *a)
{
	int dev = a->dev;
	uint64_t charge = a->size;
	untrack(ch, a);
	given_back(ch, dev, charge);
}

static CUresult oom_if(struct vh_chan *ch, int dev, CUresult r, const char *call, uint64_t want)
{
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		vh_oom(ch, dev, call, want); /* the card itself is full */
	return r;
}

/* ---- the operator's script -------------------------------------------------------- */

void vh_oom(struct vh_chan *ch, int dev, const char *call, uint64_t want)
{
	static uint64_t last_ns;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if (last_ns && now - last_ns < 1000000000ull)
		return; /* a program that retries in a loop is told about once a second */
	last_ns = now;
	struct vh_fwd *f = ch->fwd;
	uint64_t used = atomic_load(&f->used[dev]);
	vh_log("channel %u: out of memory on GPU %d: %s wanted %llu bytes; the guest holds %llu of its %llu", ch->index,
	       dev, call, (unsigned long long)want, (unsigned long long)used, (unsigned long long)f->quota[dev]);
	if (!f->oom_script || !*f->oom_script)
		return;
	pid_t child = fork();
	if (child == 0) {
		/* the script runs apart from this worker: it outlives nothing and waits for nothing */
		if (fork() != 0)
			_exit(0);
		char uuid[64], v[6][32];
		vh_uuid_str(f->info[dev].uuid, uuid, sizeof uuid);
		snprintf(v[0], sizeof v[0], "%d", dev);
		snprintf(v[1], sizeof v[1], "%llu", (unsigned long long)f->quota[dev]);
		snprintf(v[2], sizeof v[2], "%llu", (unsigned long long)used);
		snprintf(v[3], sizeof v[3], "%llu", (unsigned long long)want);
		snprintf(v[4], sizeof v[4], "%u", ch->index);
		snprintf(v[5], sizeof v[5], "%d", (int)getppid());
		setenv("VMGPU_GUEST", f->guest, 1);
		setenv("VMGPU_GPU", uuid, 1);
		setenv("VMGPU_GPU_INDEX", v[0], 1);
		setenv("VMGPU_QUOTA", v[1], 1);
		setenv("VMGPU_USED", v[2], 1);
		setenv("VMGPU_REQUEST", v[3], 1);
		setenv("VMGPU_CHANNEL", v[4], 1);
		setenv("VMGPU_WORKER_PID", v[5], 1);
		setenv("VMGPU_CALL", call, 1);
		signal(SIGPIPE, SIG_DFL);
		execl(f->oom_script, f->oom_script, f->guest, (char *)NULL);
		vh_log("cannot run the OOM script %s", f->oom_script);
		_exit(127);
	}
	if (child > 0)
		waitpid(child, NULL, 0);
}

/* ---- cuMemAlloc, pitched, free, info ---------------------------------------------- */

static CUresult alloc_common(struct vh_chan *ch, CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
			     unsigned elsz, const char *call)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t n = width, padded = width;
	if (pitch) {
		padded = (width + 511) & ~511ull; /* the H100's pitch; the books take the truth after */
		if (!height || padded < width || __builtin_mul_overflow(padded, height, &n))
			return CUDA_ERROR_INVALID_VALUE;
	}
	if (!dptr || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t est = vh_round_charge(n);
	if (take_begin(ch, dev, est, call))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pitch ? B->cuMemAllocPitch_v2(dptr, pitch, width, height, elsz) : B->cuMemAlloc_v2(dptr, n);
	if (r == CUDA_SUCCESS && pitch && !vh_books_metered(ch)) {
		/* the driver's pitch was wider than guessed: charge the difference, or undo */
		uint64_t real = vh_round_charge((uint64_t)*pitch * height);
		if (real > est && vh_books_reserve(ch, dev, real - est) == 0)
			est = real;
		else if (real > est)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		if (r != CUDA_SUCCESS)
			B->cuMemFree_v2(*dptr);
	}
	if (r == CUDA_SUCCESS && !track(ch, *dptr, est, dev, VH_MEM)) {
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (r == CUDA_SUCCESS && span_add(ch, *dptr, pitch ? (uint64_t)*pitch * height : n, VH_SPAN_MEM, NULL)) {
		untrack(ch, find(ch, *dptr, 1u << VH_MEM));
		B->cuMemFree_v2(*dptr);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (take_end(ch, dev, est, r)) {
		B->cuMemFree_v2(*dptr);
		untrack(ch, find(ch, *dptr, 1u << VH_MEM));
		span_del(ch, *dptr, VH_SPAN_MEM);
		return undone(ch, dev, est, call);
	}
	return oom_if(ch, dev, r, call, est);
}

CUresult vhx_cuMemAlloc_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize)
{
	return alloc_common(ch, dptr, NULL, bytesize, 1, 0, "cuMemAlloc");
}

CUresult vhx_cuMemAllocPitch_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
				size_t Height, unsigned int ElementSizeBytes)
{
	if (!pPitch)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_common(ch, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, "cuMemAllocPitch");
}

CUresult vhx_cuMemFree_v2(struct vh_chan *ch, CUdeviceptr dptr)
{
	if (dptr == 0)
		return CUDA_SUCCESS; /* freeing NULL is a no-op, as in the driver */
	struct vh_alloc *a = find(ch, dptr, 1u << VH_MEM | 1u << VH_MEM_ASYNC);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE; /* not an allocation of this process: the driver would say the same */
	CUresult r = ch->backend->cuMemFree_v2(dptr);
	if (r != CUDA_SUCCESS)
		return r;
	span_del(ch, dptr, VH_SPAN_MEM); /* from now on the address names nothing */
	let_go(ch, a);
	return CUDA_SUCCESS;
}

CUresult vhx_cuMemGetInfo_v2(struct vh_chan *ch, size_t *free_b, size_t *total_b)
{
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	size_t hw_free = 0, hw_total = 0;
	CUresult r = ch->backend->cuMemGetInfo_v2(&hw_free, &hw_total);
	if (r != CUDA_SUCCESS)
		return r;
	vh_books_settle(ch, dev);
	uint64_t quota = ch->fwd->quota[dev];
	uint64_t used = atomic_load(&ch->fwd->used[dev]);
	uint64_t left = used < quota ? quota - used : 0;
	if (free_b)
		*free_b = left < hw_free ? left : hw_free;
	if (total_b)
		*total_b = quota;
	return CUDA_SUCCESS;
}

/* ---- arrays ------------------------------------------------------------------------ */

static uint64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
	default: return 16; /* block-compressed and packed formats: at most this per element */
	}
}

static CUresult array_create(struct vh_chan *ch, CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d, int three)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!out || !d)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = format_bytes(d->Format) * d->NumChannels, t;
	size_t dims[3] = {d->Width, d->Height ? d->Height : 1, d->Depth ? d->Depth : 1};
	for (int i = 0; i < 3; i++) {
		if (__builtin_mul_overflow(n, dims[i], &t))
			return CUDA_ERROR_INVALID_VALUE;
		n = t;
	}
	uint64_t est = vh_round_charge(n);
	if (take_begin(ch, dev, est, "cuArrayCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r;
	if (three) {
		r = B->cuArray3DCreate_v2(out, d);
	} else {
		CUDA_ARRAY_DESCRIPTOR d2 = {d->Width, d->Height, d->Format, d->NumChannels};
		r = B->cuArrayCreate_v2(out, &d2);
	}
	if (r == CUDA_SUCCESS && !track(ch, (CUdeviceptr)(uintptr_t)*out, est, dev, VH_ARRAY)) {
		B->cuArrayDestroy(*out);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (take_end(ch, dev, est, r)) {
		untrack(ch, find(ch, (CUdeviceptr)(uintptr_t)*out, 1u << VH_ARRAY));
		B->cuArrayDestroy(*out);
		return undone(ch, dev, est, "cuArrayCreate");
	}
	return oom_if(ch, dev, r, "cuArrayCreate", est);
}

CUresult vhx_cuArrayCreate_v2(struct vh_chan *ch, CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR d = {p->Width, p->Height, 0, p->Format, p->NumChannels, 0};
	return array_create(ch, pHandle, &d, 0);
}

CUresult vhx_cuArray3DCreate_v2(struct vh_chan *ch, CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *p)
{
	return array_create(ch, pHandle, p, 1);
}

CUresult vhx_cuArrayDestroy(struct vh_chan *ch, CUarray hArray)
{
	struct vh_alloc *a = find(ch, (CUdeviceptr)(uintptr_t)hArray, 1u << VH_ARRAY);
	if (!a)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = ch->backend->cuArrayDestroy(hArray);
	if (r != CUDA_SUCCESS)
		return r;
	let_go(ch, a);
	return CUDA_SUCCESS;
}

/* ---- stream-ordered allocation and pools ------------------------------------------ */

static int capturing(struct vh_chan *ch, CUstream s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	return ch->backend->cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult alloc_async(struct vh_chan *ch, CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s,
			    const char *call)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!dptr || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* under capture this makes a graph memory node: charged when the graph is instantiated */
	uint64_t est = capturing(ch, s) ? 0 : vh_round_charge(n);
	if (take_begin(ch, dev, est, call))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pool ? B->cuMemAllocFromPoolAsync(dptr, n, pool, s) : B->cuMemAllocAsync(dptr, n, s);
	if (r == CUDA_SUCCESS && !track(ch, *dptr, est, dev, VH_MEM_ASYNC)) {
		B->cuMemFreeAsync(*dptr, s);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (r == CUDA_SUCCESS && span_add(ch, *dptr, n, VH_SPAN_MEM, NULL)) {
		untrack(ch, find(ch, *dptr, 1u << VH_MEM_ASYNC));
		B->cuMemFreeAsync(*dptr, s);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (take_end(ch, dev, est, r)) {
		untrack(ch, find(ch, *dptr, 1u << VH_MEM_ASYNC));
		span_del(ch, *dptr, VH_SPAN_MEM);
		/* give the pool's growth back now: free, wait, trim */
		B->cuMemFreeAsync(*dptr, s);
		B->cuStreamSynchronize(s);
		CUmemoryPool p = pool;
		if (p || B->cuDeviceGetMemPool(&p, ch->fwd->dev[dev]) == CUDA_SUCCESS)
			B->cuMemPoolTrimTo(p, 0);
		return undone(ch, dev, est, call);
	}
	return oom_if(ch, dev, r, call, est);
}

CUresult vhx_cuMemAllocAsync(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(ch, dptr, bytesize, NULL, hStream, "cuMemAllocAsync");
}

CUresult vhx_cuMemAllocFromPoolAsync(struct vh_chan *ch, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				     CUstream hStream)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_async(ch, dptr, bytesize, pool, hStream, "cuMemAllocFromPoolAsync");
}

CUresult vhx_cuMemFreeAsync(struct vh_chan *ch, CUdeviceptr dptr, CUstream hStream)
{
	struct vh_alloc *a = find(ch, dptr, 1u << VH_MEM_ASYNC | 1u << VH_MEM);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemFreeAsync(dptr, hStream);
	if (r != CUDA_SUCCESS)
		return r;
	span_del(ch, dptr, VH_SPAN_MEM);
	int dev = a->dev;
	uint64_t charge = a->size;
	untrack(ch, a);
	/* the pool gives memory back at a later synchronisation: measured at the next call that
	 * takes memory; the estimate, where nothing is measured, goes now */
	if (!vh_books_metered(ch))
		vh_books_release(ch, dev, charge);
	return CUDA_SUCCESS;
}

/* A description of where memory lives: on one of this guest's GPUs, by its host number. */
static int location_in(struct vh_chan *ch, CUmemLocation *loc)
{
	if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return -1;
	CUdevice d = loc->id;
	if (vh_device_in(ch, &d))
		return -1;
	loc->id = d;
	return 0;
}

CUresult vhx_cuMemPoolCreate(struct vh_chan *ch, CUmemoryPool *pool, const CUmemPoolProps *props)
{
	if (!pool || !props)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemPoolProps p = *props;
	/* no exportable handles: a pool's memory is this guest process's alone */
	if (p.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || p.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (location_in(ch, &p.location))
		return CUDA_ERROR_INVALID_DEVICE;
	p.win32SecurityAttributes = NULL;
	return ch->backend->cuMemPoolCreate(pool, &p);
}

/* The guest GPU whose books a pool's change goes to: the current one (pools are per GPU). */
static int pool_dev(struct vh_chan *ch, CUmemoryPool pool)
{
	(void)pool;
	return ch->cur_dev >= 0 ? ch->cur_dev : 0;
}

CUresult vhx_cuMemPoolDestroy(struct vh_chan *ch, CUmemoryPool pool)
{
	CUresult r = ch->backend->cuMemPoolDestroy(pool);
	if (r == CUDA_SUCCESS)
		given_back(ch, pool_dev(ch, pool), 0);
	return r;
}

CUresult vhx_cuMemPoolTrimTo(struct vh_chan *ch, CUmemoryPool pool, size_t keep)
{
	CUresult r = ch->backend->cuMemPoolTrimTo(pool, keep);
	if (r == CUDA_SUCCESS)
		given_back(ch, pool_dev(ch, pool), 0);
	return r;
}

/* Pool attributes: the three reuse switches are ints, the rest 64-bit. */
static int pool_attr_size(CUmemPool_attribute a)
{
	switch (a) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		return 4;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		return 8;
	default:
		return 0;
	}
}

static CUresult pool_attr(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr, int set)
{
	void *pool = (void *)(uintptr_t)vh_get_u64(rd);
	CUmemPool_attribute attr = (CUmemPool_attribute)vh_get_u64(rd);
	uint64_t v = vh_get_u64(rd);
	if (rd->bad)
		return CUDA_ERROR_INVALID_VALUE;
	if (!pool || vh_handle_in(ch, VG_KIND_MEMPOOL, &pool))
		return CUDA_ERROR_INVALID_HANDLE;
	int size = pool_attr_size(attr);
	if (!size)
		return CUDA_ERROR_NOT_SUPPORTED;
	union {
		int i;
		cuuint64_t u;
	} val = {0};
	if (size == 4)
		val.i = (int)v;
	else
		val.u = v;
	CUresult r = set ? ch->backend->cuMemPoolSetAttribute(pool, attr, &val)
			 : ch->backend->cuMemPoolGetAttribute(pool, attr, &val);
	if (r != CUDA_SUCCESS)
		return r;
	if (set) {
		given_back(ch, pool_dev(ch, pool), 0); /* a lower threshold can free memory */
		return CUDA_SUCCESS;
	}
	v = size == 4 ? (uint64_t)(int64_t)val.i : val.u;
	vh_put(wr, &v, sizeof v);
	return CUDA_SUCCESS;
}

CUresult vhc_cuMemPoolSetAttribute(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	return pool_attr(ch, rd, wr, 1);
}

CUresult vhc_cuMemPoolGetAttribute(struct vh_chan *ch, uint32_t flags, struct vh_rd *rd, struct vh_wr *wr)
{
	(void)flags;
	return pool_attr(ch, rd, wr, 0);
}

/* ---- virtual memory management (VMM) ---------------------------------------------- */

static CUresult prop_in(struct vh_chan *ch, const CUmemAllocationProp *in, CUmemAllocationProp *out)
{
	if (!in)
		return CUDA_ERROR_INVALID_VALUE;
	*out = *in;
	if (out->type != CU_MEM_ALLOCATION_TYPE_PINNED || out->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED; /* nothing exportable: no memory shared across processes */
	if (location_in(ch, &out->location))
		return CUDA_ERROR_INVALID_DEVICE;
	out->win32HandleMetaData = NULL;
	return CUDA_SUCCESS;
}

/* The guest's number of the GPU a (translated) location names. */
static int guest_dev(struct vh_chan *ch, int host_dev)
{
	for (int d = 0; d < ch->fwd->ndev; d++)
		if (ch->fwd->dev[d] == host_dev)
			return d;
	return 0;
}

CUresult vhx_cuMemGetAllocationGranularity(struct vh_chan *ch, size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags option)
{
	CUmemAllocationProp p;
	CUresult r = prop_in(ch, prop, &p);
	return r != CUDA_SUCCESS ? r : ch->backend->cuMemGetAllocationGranularity(g, &p, option);
}

CUresult vhx_cuMemCreate(struct vh_chan *ch, CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	const struct vh_backend *B = ch->backend;
	CUmemAllocationProp p;
	CUresult r = prop_in(ch, prop, &p);
	if (r != CUDA_SUCCESS)
		return r;
	if (!handle || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = guest_dev(ch, p.location.id);
	if (take_begin(ch, dev, size, "cuMemCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = B->cuMemCreate(handle, size, &p, flags);
	if (r == CUDA_SUCCESS && !track(ch, *handle, size, dev, VH_VMM)) {
		B->cuMemRelease(*handle);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (take_end(ch, dev, size, r)) {
		untrack(ch, find(ch, *handle, 1u << VH_VMM));
		B->cuMemRelease(*handle);
		return undone(ch, dev, size, "cuMemCreate");
	}
	if (r == CUDA_SUCCESS) {
		/* the driver's handle is its own (a host pointer): the guest gets a number of its own */
		struct vh_alloc *a = find(ch, *handle, 1u << VH_VMM);
		a->guest = (uint64_t)0x766d6d << 40 | ++ch->vmm_ids;
		*handle = a->guest;
	}
	return oom_if(ch, dev, r, "cuMemCreate", size);
}

/* A handle's memory goes when it is released and no longer mapped. */
static void vmm_maybe_gone(struct vh_chan *ch, uint64_t handle)
{
	struct vh_alloc *h = find(ch, handle, 1u << VH_VMM_RELEASED);
	if (!h)
		return;
	for (size_t i = 0; i < ch->nallocs; i++)
		if (ch->allocs[i].kind == VH_VMM_MAP && ch->allocs[i].ref == handle)
			return;
	let_go(ch, h);
}

CUresult vhx_cuMemRelease(struct vh_chan *ch, CUmemGenericAllocationHandle guest)
{
	struct vh_alloc *a = find_vmm(ch, guest, 1u << VH_VMM);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t handle = a->base;
	CUresult r = ch->backend->cuMemRelease(handle);
	if (r != CUDA_SUCCESS)
		return r;
	a->kind = VH_VMM_RELEASED;
	a->guest = 0;
	vmm_maybe_gone(ch, handle);
	return CUDA_SUCCESS;
}

CUresult vhx_cuMemMap(struct vh_chan *ch, CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle guest, unsigned long long flags)
{
	struct vh_alloc *a = find_vmm(ch, guest, 1u << VH_VMM);
	if (!a)
		return CUDA_ERROR_INVALID_HANDLE; /* only a handle this guest process made and holds */
	if (size == 0 || !va_inside(ch, ptr, size))
		return CUDA_ERROR_INVALID_VALUE; /* only inside a range this guest process reserved */
	int dev = a->dev;
	uint64_t handle = a->base;
	CUresult r = ch->backend->cuMemMap(ptr, size, offset, handle, flags);
	if (r != CUDA_SUCCESS)
		return r;
	struct vh_alloc *m = track(ch, ptr, size, dev, VH_VMM_MAP);
	if (!m || span_add(ch, ptr, size, VH_SPAN_MAP, NULL)) {
		if (m)
			untrack(ch, m);
		ch->backend->cuMemUnmap(ptr, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->ref = handle;
	return CUDA_SUCCESS;
}

CUresult vhx_cuMemUnmap(struct vh_chan *ch, CUdeviceptr ptr, size_t size)
{
	struct vh_alloc *m = find(ch, ptr, 1u << VH_VMM_MAP);
	if (!m || m->size != size)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemUnmap(ptr, size);
	if (r != CUDA_SUCCESS)
		return r;
	span_del(ch, ptr, VH_SPAN_MAP);
	uint64_t handle = m->ref;
	int dev = m->dev;
	untrack(ch, m);
	vmm_maybe_gone(ch, handle);
	if (vh_books_metered(ch))
		vh_books_settle(ch, dev);
	return CUDA_SUCCESS;
}

CUresult vhx_cuMemSetAccess(struct vh_chan *ch, CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
			    size_t count)
{
	if (!desc || count == 0 || count > VH_MAX_ACCESS_DESCS || size == 0 || !va_inside(ch, ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	CUmemAccessDesc d[VH_MAX_ACCESS_DESCS];
	for (size_t i = 0; i < count; i++) {
		d[i] = desc[i];
		if (location_in(ch, &d[i].location))
			return CUDA_ERROR_INVALID_DEVICE;
	}
	return ch->backend->cuMemSetAccess(ptr, size, d, count);
}

/* A virtual address range for VMM mappings.  The guest's address hint is not passed on: the
 * driver may place a reservation anywhere (a hint is only a wish), and a hint is a guest's
 * choice of a worker address. */
CUresult vhx_cuMemAddressReserve(struct vh_chan *ch, CUdeviceptr *ptr, size_t size, size_t alignment,
				 CUdeviceptr addr, unsigned long long flags)
{
	(void)addr;
	if (!ptr || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ch->backend->cuMemAddressReserve(ptr, size, alignment, 0, flags);
	if (r != CUDA_SUCCESS)
		return r;
	if (!track(ch, *ptr, size, ch->cur_dev >= 0 ? ch->cur_dev : 0, VH_VA)) {
		ch->backend->cuMemAddressFree(*ptr, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

CUresult vhx_cuMemAddressFree(struct vh_chan *ch, CUdeviceptr ptr, size_t size)
{
	struct vh_alloc *a = find(ch, ptr, 1u << VH_VA);
	if (!a || a->size != size)
		return CUDA_ERROR_INVALID_VALUE; /* only a whole range this guest process reserved */
	CUresult r = ch->backend->cuMemAddressFree(ptr, size);
	if (r == CUDA_SUCCESS)
		untrack(ch, a); /* an address range holds no memory: nothing to give back */
	return r;
}

/* ---- module globals: device memory a program names by symbol ------------------------ */

static CUresult global_common(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, void *owner, CUresult r,
			      CUdeviceptr d, size_t n)
{
	if (r != CUDA_SUCCESS)
		return r;
	/* copies to and from it (cudaMemcpyToSymbol) must resolve: it is this process's until the
	 * module goes */
	if (n && span_add(ch, d, n, VH_SPAN_GLOBAL, owner) && vh_addr_ok(ch, d, n) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY; /* (already known: a library's global through its module) */
	if (dptr)
		*dptr = d;
	if (bytes)
		*bytes = n;
	return CUDA_SUCCESS;
}

CUresult vhx_cuModuleGetGlobal_v2(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
				  const char *name)
{
	CUdeviceptr d = 0;
	size_t n = 0;
	CUresult r = ch->backend->cuModuleGetGlobal_v2(&d, &n, hmod, name);
	return global_common(ch, dptr, bytes, hmod, r, d, n);
}

CUresult vhx_cuLibraryGetGlobal(struct vh_chan *ch, CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
				const char *name)
{
	CUdeviceptr d = 0;
	size_t n = 0;
	CUresult r = ch->backend->cuLibraryGetGlobal(&d, &n, library, name);
	return global_common(ch, dptr, bytes, library, r, d, n);
}

/* ---- graph memory nodes ------------------------------------------------------------ */

/* What a graph's memory nodes ask for, in whole 2 MiB pages. */
static uint64_t graph_mem(struct vh_chan *ch, CUgraph g)
{
	const struct vh_backend *B = ch->backend;
	size_t n = 0;
	if (B->cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0)
		return 0;
	CUgraphNode *nodes = calloc(n, sizeof *nodes);
	uint64_t total = 0;
	if (nodes && B->cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
		for (size_t i = 0; i < n; i++) {
			CUgraphNodeType t;
			CUDA_MEM_ALLOC_NODE_PARAMS p;
			if (B->cuGraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
			    B->cuGraphMemAllocNodeGetParams(nodes[i], &p) == CUDA_SUCCESS)
				total += vh_round_charge(p.bytesize > (1u << 20) ? p.bytesize : (2u << 20));
		}
	}
	free(nodes);
	return total;
}

CUresult vhx_cuGraphInstantiateWithFlags(struct vh_chan *ch, CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
	const struct vh_backend *B = ch->backend;
	int dev = ch->cur_dev;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!exec)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t est = graph_mem(ch, g);
	if (est == 0)
		return B->cuGraphInstantiateWithFlags(exec, g, flags);
	if (take_begin(ch, dev, est, "cuGraphInstantiate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = B->cuGraphInstantiateWithFlags(exec, g, flags);
	/* the memory is taken when the graph is uploaded: do that now, so it is charged now */
	if (r == CUDA_SUCCESS) {
		r = B->cuGraphUpload(*exec, NULL);
		if (r == CUDA_SUCCESS)
			r = B->cuStreamSynchronize(NULL);
		if (r != CUDA_SUCCESS)
			B->cuGraphExecDestroy(*exec);
	}
	if (r == CUDA_SUCCESS && !track(ch, (CUdeviceptr)(uintptr_t)*exec, est, dev, VH_GRAPH)) {
		B->cuGraphExecDestroy(*exec);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (take_end(ch, dev, est, r)) {
		untrack(ch, find(ch, (CUdeviceptr)(uintptr_t)*exec, 1u << VH_GRAPH));
		B->cuGraphExecDestroy(*exec);
		B->cuDeviceGraphMemTrim(ch->fwd->dev[dev]);
		return undone(ch, dev, est, "cuGraphInstantiate");
	}
	return oom_if(ch, dev, r, "cuGraphInstantiate", est);
}

CUresult vhx_cuGraphExecDestroy(struct vh_chan *ch, CUgraphExec exec)
{
	const struct vh_backend *B = ch->backend;
	CUresult r = B->cuGraphExecDestroy(exec);
	if (r != CUDA_SUCCESS)
		return r;
	struct vh_alloc *a = find(ch, (CUdeviceptr)(uintptr_t)exec, 1u << VH_GRAPH);
	if (a) {
		B->cuDeviceGraphMemTrim(ch->fwd->dev[a->dev]); /* the graph pool keeps memory until trimmed */
		let_go(ch, a);
	}
	return CUDA_SUCCESS;
}

/* ---- module images and contexts: taken by the driver, measured after ---------------- */

int vh_books_after_load(struct vh_chan *ch)
{
	int dev = ch->cur_dev >= 0 ? ch->cur_dev : 0;
	return vh_books_metered(ch) && vh_books_settle(ch, dev);
}
