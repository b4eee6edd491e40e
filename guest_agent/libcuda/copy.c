/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Copies that name host memory, the guest half (host half: host_forwarder/native/
 * copy.c): pinned heap memory is zero-copy (the host DMAs straight into the
 * region), small pageable buffers travel inline in the request, large ones are
 * pipelined through the channel's bulk area in chunks.  Unified copies say for
 * each address whether it is heap memory or a device address; one naming the process's own
 * pageable memory is done as the copy of that direction (or by the CPU, host to host).
 */
#include <emmintrin.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "call.h"
#include "connection.h"
#include "copy.h"
#include "hostmem.h"
#include "vg_guest_protos.h"

#define INLINE_MAX (16u << 10)

/* Copy a staged chunk with non-temporal stores: the bytes are not read again soon (the
 * GPU reads the bulk area; the program reads its buffer later), so they need not
 * displace the cache, and the destination's lines are not read first. */
static void copy_stream(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	if (n < 4096 || head > n) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t body = n & ~(size_t)63;
	for (size_t i = 0; i < body; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	_mm_sfence();
	memcpy(d + body, s + body, n - body);
}

#define DTOH_DEPTH 3 /* chunks requested ahead; at most 4 (the bulk area holds 4 chunks) */

uint64_t vg_bulk_chunk_size(void)
{
	uint64_t c = vg_conn.bulk_size / 4;
	return c ? c : 4096;
}

static void put_stream(struct vg_call *c, int async, CUstream s)
{
	if (async)
		vg_put_u64(c, (uint64_t)(uintptr_t)s);
}

/* A copy between a device address and host bytes: the call, and its stream if async. */
struct copy_call {
	uint32_t op;
	unsigned flags;
	int async;
	CUstream stream;
};

/* A copy request: the device address, the stream, the length, and where the host bytes are
 * (VG_BUF_INLINE: in the request or the reply; VG_BUF_HEAP: at a region offset;
 * VG_BUF_BULK: at a bulk position).  The channel is held on success. */
static CUresult begin_copy(struct vg_call *c, const struct copy_call *k, CUdeviceptr dev, uint64_t n,
			   enum vg_buf_kind kind, uint64_t where)
{
	CUresult r = vg_begin(c, k->op, k->flags);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(c, dev);
	put_stream(c, k->async, k->stream);
	vg_put_u64(c, n);
	vg_put_u64(c, kind);
	vg_put_u64(c, where);
	return CUDA_SUCCESS;
}

/* An async request goes without a reply; a sync one waits for it and releases the channel. */
static CUresult finish(struct vg_call *c, int async)
{
	return async ? vg_send_async(c) : vg_end(c, vg_call_sync(c));
}

/* What a copy of host bytes checks first; an empty copy is done (CUDA_SUCCESS with n == 0). */
static CUresult check_copy(const void *host, size_t n)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS || n == 0)
		return r;
	return host ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- host to device --------------------------------------------------------------- */

static CUresult htod(const struct copy_call *k, CUdeviceptr dst, const void *src, size_t n)
{
	CUresult r = check_copy(src, n);
	if (r != CUDA_SUCCESS || n == 0)
		return r;
	struct vg_call c;
	uint64_t off = vg_heap_offset(src, n);
	if (off != UINT64_MAX || n <= INLINE_MAX) {
		enum vg_buf_kind kind = off != UINT64_MAX ? VG_BUF_HEAP : VG_BUF_INLINE;
		if ((r = begin_copy(&c, k, dst, n, kind, off != UINT64_MAX ? off : 0)) != CUDA_SUCCESS)
			return r;
		if (off == UINT64_MAX)
			vg_put_arr(&c, src, n, 1);
		return finish(&c, k->async);
	}
	/* pageable and large: stage through bulk; the host copies chunk k while we fill k+1 */
	vg_lock();
	const uint8_t *p = src;
	uint64_t step = vg_bulk_chunk_size();
	for (size_t done = 0; done < n && r == CUDA_SUCCESS;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		int e = vmgpu_gchan_bulk_alloc_dir(vg_conn.chan, len, VMGPU_BULK_TO_HOST, VG_WAIT_FOREVER_NS, &pos, &bulk);
		if (e < 0) {
			r = VG_ERROR_LOST;
			break;
		}
		copy_stream(bulk, p + done, len);
		int last = done + len == n;
		if ((r = begin_copy(&c, k, dst + done, len, VG_BUF_BULK, pos)) != CUDA_SUCCESS)
			break;
		done += len;
		r = finish(&c, k->async || !last);
	}
	vg_unlock();
	return r;
}

CUresult handwritten_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n, unsigned fl)
{
	return htod(&(struct copy_call){VG_OP_cuMemcpyHtoD_v2, fl, 0, NULL}, dst, src, n);
}

CUresult handwritten_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s, unsigned fl)
{
	return htod(&(struct copy_call){VG_OP_cuMemcpyHtoDAsync_v2, fl, 1, s}, dst, src, n);
}

/* ---- device to host --------------------------------------------------------------- */

static CUresult dtoh(const struct copy_call *k, void *dst, CUdeviceptr src, size_t n)
{
	CUresult r = check_copy(dst, n);
	if (r != CUDA_SUCCESS || n == 0)
		return r;
	struct vg_call c;
	uint64_t off = vg_heap_offset(dst, n);
	if (off != UINT64_MAX) {
		/* pinned: the host DMAs straight into the heap; async stays async */
		if ((r = begin_copy(&c, k, src, n, VG_BUF_HEAP, off)) != CUDA_SUCCESS)
			return r;
		return finish(&c, k->async);
	}
	if (n <= INLINE_MAX) {
		if ((r = begin_copy(&c, k, src, n, VG_BUF_INLINE, 0)) != CUDA_SUCCESS)
			return r;
		r = vg_call_sync(&c);
		if (r == CUDA_SUCCESS) {
			const void *bytes = vg_get_u64(&c) == n ? vg_get_ref(&c, n) : NULL;
			if (bytes)
				memcpy(dst, bytes, n);
			else
				r = VG_ERROR_LOST;
		}
		return vg_end(&c, r);
	}
	/* pageable and large: the host fills bulk chunks ahead of the one we copy out.  Chunks
	 * are a quarter of the bulk area and allocated in order, so a new chunk only ever takes
	 * the place of one already copied out (the host releases a chunk once it has filled it). */
	vg_lock();
	uint8_t *p = dst;
	uint64_t step = vg_bulk_chunk_size(), sent = 0, taken = 0;
	struct inflight {
		void *bulk;
		uint64_t len;
		struct vg_call c;
	} q[DTOH_DEPTH];
	unsigned head = 0, count = 0;
	while (r == CUDA_SUCCESS && taken < n) {
		while (r == CUDA_SUCCESS && count < DTOH_DEPTH && sent < n) {
			struct inflight *f = &q[(head + count) % DTOH_DEPTH];
			uint64_t pos;
			f->len = n - sent < step ? n - sent : step;
			if (vmgpu_gchan_bulk_alloc_dir(vg_conn.chan, f->len, VMGPU_BULK_FROM_HOST, VG_WAIT_FOREVER_NS, &pos, &f->bulk) < 0) {
				r = VG_ERROR_LOST;
				break;
			}
			if ((r = begin_copy(&f->c, k, src + sent, f->len, VG_BUF_BULK, pos)) != CUDA_SUCCESS)
				break;
			r = vg_send_request(&f->c);
			vg_end(&f->c, r); /* the outer vg_lock keeps the channel */
			sent += f->len;
			count++;
		}
		if (count == 0)
			break;
		struct inflight *f = &q[head];
		CUresult rr = vg_wait_reply(&f->c);
		if (rr == CUDA_SUCCESS && r == CUDA_SUCCESS)
			copy_stream(p + taken, f->bulk, f->len);
		if (r == CUDA_SUCCESS)
			r = rr;
		taken += f->len;
		head = (head + 1) % DTOH_DEPTH;
		count--;
		if (r != CUDA_SUCCESS) {
			/* collect the replies still owed, so the next call reads its own */
			while (count > 0 && r != VG_ERROR_LOST) {
				if (vg_wait_reply(&q[head].c) == VG_ERROR_LOST)
					r = VG_ERROR_LOST;
				head = (head + 1) % DTOH_DEPTH;
				count--;
			}
		}
	}
	vg_unlock();
	return r;
}

CUresult handwritten_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n, unsigned fl)
{
	return dtoh(&(struct copy_call){VG_OP_cuMemcpyDtoH_v2, fl, 0, NULL}, dst, src, n);
}

CUresult handwritten_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s, unsigned fl)
{
	return dtoh(&(struct copy_call){VG_OP_cuMemcpyDtoHAsync_v2, fl, 1, s}, dst, src, n);
}

/* ---- unified addresses: device memory, pinned heap memory or the process's own memory -------- */

void vg_put_unified_address(struct vg_call *c, CUdeviceptr p, size_t n)
{
	uint64_t off = vg_heap_offset((const void *)(uintptr_t)p, n);
	vg_put_u64(c, off != UINT64_MAX ? VG_BUF_HEAP : VG_BUF_INLINE);
	vg_put_u64(c, off != UINT64_MAX ? off : p);
}

CUresult vg_stream_wait(int async, CUstream s, unsigned fl)
{
	if (!async)
		return CUDA_SUCCESS;
	return cuStreamSynchronize((fl & VG_F_PTDS) && !s ? CU_STREAM_PER_THREAD : s);
}

/* Whether the pages of [p, p + n) that hold its first and last bytes are mapped in this process
 * (msync on an unmapped page fails with ENOMEM, and touches nothing). */
static int mapped_here(uint64_t p, size_t n)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), last = p + n - 1;
	if (last < p)
		return 0;
	return msync((void *)(uintptr_t)(p & ~(page - 1)), page, MS_ASYNC) == 0 &&
	       msync((void *)(uintptr_t)(last & ~(page - 1)), page, MS_ASYNC) == 0;
}

/* Where one side of a unified copy lies: the region's heap, device memory, or host memory this
 * process reads itself (its pageable memory; with unified addressing a program may name it, as
 * NCCL does with a variable on its stack).  A device address comes from the host, so it may by
 * chance also be mapped here: an address mapped here is the process's own only when the host does
 * not know it as device memory of this process's.  -1 with *r: the question could not be asked. */
enum side { SIDE_HEAP, SIDE_DEVICE, SIDE_HOST };

static int side_of(CUdeviceptr p, size_t n, CUresult *r)
{
	if (vg_heap_offset((const void *)(uintptr_t)p, n) != UINT64_MAX)
		return SIDE_HEAP;
	if (!mapped_here(p, n))
		return SIDE_DEVICE;
	unsigned type = 0;
	*r = handwritten_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, 0);
	if (*r == CUDA_SUCCESS)
		return type == CU_MEMORYTYPE_HOST ? SIDE_HOST : SIDE_DEVICE;
	if (*r != CUDA_ERROR_INVALID_VALUE)
		return -1; /* the channel lost, or not ready: that error, not a guess */
	*r = CUDA_SUCCESS;
	return SIDE_HOST;
}

static CUresult unified(uint32_t op, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async, unsigned fl)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	int to = SIDE_DEVICE, from = SIDE_DEVICE;
	if (n && ((to = side_of(dst, n, &r)) < 0 || (from = side_of(src, n, &r)) < 0))
		return r;
	if ((to == SIDE_HOST && from != SIDE_DEVICE) || (from == SIDE_HOST && to != SIDE_DEVICE)) {
		/* host memory on both sides: the CPU copies, once the stream's earlier work is done */
		if ((r = vg_stream_wait(async, s, fl)) == CUDA_SUCCESS)
			memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
		return r;
	}
	if (from == SIDE_HOST)
		return async ? handwritten_cuMemcpyHtoDAsync_v2(dst, (const void *)(uintptr_t)src, n, s, fl)
			     : handwritten_cuMemcpyHtoD_v2(dst, (const void *)(uintptr_t)src, n, fl);
	if (to == SIDE_HOST)
		return async ? handwritten_cuMemcpyDtoHAsync_v2((void *)(uintptr_t)dst, src, n, s, fl)
			     : handwritten_cuMemcpyDtoH_v2((void *)(uintptr_t)dst, src, n, fl);
	struct vg_call c;
	r = vg_begin(&c, op, fl);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_unified_address(&c, dst, n);
	vg_put_unified_address(&c, src, n);
	vg_put_u64(&c, n);
	put_stream(&c, async, s);
	return finish(&c, async);
}

CUresult handwritten_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned fl)
{
	return unified(VG_OP_cuMemcpy, dst, src, n, NULL, 0, fl);
}

CUresult handwritten_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, unsigned fl)
{
	return unified(VG_OP_cuMemcpyAsync, dst, src, n, s, 1, fl);
}
