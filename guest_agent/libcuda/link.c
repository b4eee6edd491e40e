/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA linker, the guest half (host half: host_forwarder/native/link.c; the wire:
 * native/cuda_api/include/vg_link.h).  A link's state lives here: cuLinkCreate keeps the JIT
 * options vmgpu knows, cuLinkAddData copies each input (cuLinkAddFile reads the file here: the
 * host never opens a guest's path) into the package being built, and cuLinkComplete sends the
 * package whole and makes one request, in which the host links it and answers the cubin, the
 * logs and the options the driver writes.  The cubin is kept here until cuLinkDestroy, as the
 * driver keeps it.  A state is this library's own object, found in a list: a destroyed or made-up
 * one is CUDA_ERROR_INVALID_HANDLE, never followed.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "copy.h"
#include "jit_options.h"
#include "module.h"
#include "vg_guest_protos.h"
#include "vg_link.h"

struct link {
	struct link *next; /* the live links (links, under links_mu) */
	struct vg_jit jit; /* the link's own options, its log buffers and option slots */
	uint8_t *pkg;      /* the package: header, options, inputs so far */
	size_t len, cap;
	uint32_t ninputs;
	uint64_t input_bytes;
	void *cubin; /* the last cuLinkComplete's, until cuLinkDestroy */
	size_t cubin_size;
};

static pthread_mutex_t links_mu = PTHREAD_MUTEX_INITIALIZER;
static struct link *links;

/* The live link that state is, or NULL; under links_mu. */
static struct link *link_find(CUlinkState state)
{
	for (struct link *l = links; l; l = l->next)
		if ((CUlinkState)l == state)
			return l;
	return NULL;
}

/* The package grown by n bytes (zeroed, whole 8-byte words): where they start, or NULL. */
static void *pkg_grow(struct link *l, size_t n)
{
	n = (n + 7) & ~(size_t)7;
	if (n > l->cap - l->len) {
		size_t cap = l->cap ? l->cap : 4096;
		while (n > cap - l->len)
			cap *= 2;
		uint8_t *p = realloc(l->pkg, cap);
		if (!p)
			return NULL;
		l->pkg = p;
		l->cap = cap;
	}
	void *at = l->pkg + l->len;
	memset(at, 0, n);
	l->len += n;
	return at;
}

static CUresult link_create(unsigned n, CUjit_option *o, void **v, CUlinkState *out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	struct link *l = calloc(1, sizeof *l);
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = vg_jit_take(&l->jit, "cuLinkCreate", n, o, v);
	if (r != CUDA_SUCCESS) {
		free(l);
		return r;
	}
	struct vg_link_header h = {VG_LINK_MAGIC, l->jit.nopt, 0, 0};
	void *at = pkg_grow(l, sizeof h + l->jit.nopt * sizeof(struct vg_jit_opt));
	if (!at) {
		free(l);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memcpy(at, &h, sizeof h);
	memcpy((uint8_t *)at + sizeof h, l->jit.opt, l->jit.nopt * sizeof(struct vg_jit_opt));
	pthread_mutex_lock(&links_mu);
	l->next = links;
	links = l;
	pthread_mutex_unlock(&links_mu);
	*out = (CUlinkState)l;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuLinkCreate_v2(unsigned int n, CUjit_option *o, void **v, CUlinkState *out, unsigned fl)
{
	(void)fl;
	return link_create(n, o, v, out);
}

CUresult handwritten_cuLinkCreate(unsigned int n, CUjit_option *o, void **v, CUlinkState *out, unsigned fl)
{
	(void)fl;
	return link_create(n, o, v, out);
}

/* One input appended to the package: its header, options, name and bytes (PTX given without its
 * NUL gets one, as the driver reads it up to one). */
static CUresult add_input(CUlinkState state, CUjitInputType type, const void *data, size_t size, const char *name,
			  unsigned n, CUjit_option *o, void **v)
{
	static int once;
	if (!data || size == 0 || (unsigned)type >= CU_JIT_NUM_INPUT_TYPES)
		return CUDA_ERROR_INVALID_VALUE;
	if (!vg_link_input_served(type)) {
		if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
			vg_log("cuLinkAddData: input type %d (host object, archive or NVVM IR) is not served; "
			       "CUDA_ERROR_NOT_SUPPORTED", (int)type);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	struct vg_jit_opt opt[VG_LINK_MAX_OPTIONS];
	unsigned index[VG_LINK_MAX_OPTIONS], nopt;
	CUresult r = vg_jit_pack("cuLinkAddData", n, o, v, opt, index, &nopt, 1);
	if (r != CUDA_SUCCESS)
		return r;
	size_t name_len = name ? strnlen(name, VG_LINK_MAX_NAME - 1) + 1 : 1;
	size_t bytes = size + (type == CU_JIT_INPUT_PTX && !memchr(data, 0, size));
	pthread_mutex_lock(&links_mu);
	struct link *l = link_find(state);
	if (!l) {
		pthread_mutex_unlock(&links_mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (l->ninputs == VG_LINK_MAX_INPUTS || bytes > VG_LINK_MAX_BYTES - l->input_bytes) {
		pthread_mutex_unlock(&links_mu);
		return CUDA_ERROR_OUT_OF_MEMORY; /* more than the host links at once */
	}
	struct vg_link_input in = {(uint32_t)type, nopt, name_len, bytes};
	uint8_t *at = pkg_grow(l, sizeof in + nopt * sizeof *opt + ((name_len + 7) & ~(size_t)7) + bytes);
	if (!at) {
		pthread_mutex_unlock(&links_mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memcpy(at, &in, sizeof in);
	at += sizeof in;
	memcpy(at, opt, nopt * sizeof *opt);
	at += nopt * sizeof *opt;
	if (name)
		memcpy(at, name, name_len - 1); /* the NUL is the zeroed byte after it */
	at += (name_len + 7) & ~(size_t)7;
	memcpy(at, data, size);
	l->ninputs++;
	l->input_bytes += bytes;
	pthread_mutex_unlock(&links_mu);
	return CUDA_SUCCESS;
}

CUresult handwritten_cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
				      const char *name, unsigned int n, CUjit_option *o, void **v, unsigned fl)
{
	(void)fl;
	return add_input(state, type, data, size, name, n, o, v);
}

CUresult handwritten_cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
				   unsigned int n, CUjit_option *o, void **v, unsigned fl)
{
	(void)fl;
	return add_input(state, type, data, size, name, n, o, v);
}

/* The file read here and added as its bytes, named by its path as the driver names it. */
static CUresult add_file(CUlinkState state, CUjitInputType type, const char *path, unsigned n, CUjit_option *o,
			 void **v)
{
	pthread_mutex_lock(&links_mu);
	int known = link_find(state) != NULL;
	pthread_mutex_unlock(&links_mu);
	if (!known)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = CUDA_SUCCESS;
	size_t size;
	void *bytes = vg_read_file(path, &size, &r);
	if (!bytes)
		return r;
	r = add_input(state, type, bytes, size, path, n, o, v);
	free(bytes);
	return r;
}

CUresult handwritten_cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int n,
				      CUjit_option *o, void **v, unsigned fl)
{
	(void)fl;
	return add_file(state, type, path, n, o, v);
}

CUresult handwritten_cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path, unsigned int n,
				   CUjit_option *o, void **v, unsigned fl)
{
	(void)fl;
	return add_file(state, type, path, n, o, v);
}

/* What the host answered of a link it ran: the driver's result, the cubin's size, and where the
 * cubin was put (if it fit). */
struct link_answer {
	CUresult result;
	uint64_t cubin_size;
	const void *cubin;
};

/* The package sent, then the one request: the cubin into cap bytes of pinned memory at region
 * offset heap_off, or (heap_off UINT64_MAX) of the bulk area; the logs and the options the driver
 * writes into the program's buffers.  Under vg_lock. */
static CUresult link_call(struct link *l, unsigned fl, uint64_t heap_off, uint64_t cap, struct link_answer *a)
{
	struct vg_call c;
	CUresult r = vg_blob_send(l->pkg, l->len);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t where = heap_off;
	void *out = NULL;
	if (heap_off != UINT64_MAX)
		out = vmgpu_guest_ptr(vg_conn.guest, heap_off);
	else if (vmgpu_gchan_bulk_alloc_dir(vg_conn.chan, cap, VMGPU_BULK_FROM_HOST, VG_WAIT_FOREVER_NS, &where, &out) < 0)
		return VG_ERROR_LOST; /* (allocated after the package's chunks, which the host releases) */
	if ((r = vg_begin(&c, VG_OP_cuLinkComplete, fl)) != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, heap_off != UINT64_MAX ? VG_BUF_HEAP : VG_BUF_BULK);
	vg_put_u64(&c, where);
	vg_put_u64(&c, cap);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		a->result = (CUresult)vg_get_u64(&c);
		a->cubin_size = vg_get_u64(&c);
		a->cubin = a->cubin_size <= cap ? out : NULL;
		r = vg_jit_answer(&l->jit, &c);
	}
	return vg_end(&c, r);
}

CUresult handwritten_cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut, unsigned fl)
{
	if (!cubinOut || !sizeOut)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&links_mu); /* a link is completed by one thread at a time, as it is built */
	struct link *l = link_find(state);
	if (!l) {
		pthread_mutex_unlock(&links_mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	memcpy(l->pkg + offsetof(struct vg_link_header, ninputs), &l->ninputs, sizeof l->ninputs);
	free(l->cubin);
	l->cubin = NULL;
	l->cubin_size = 0;
	struct link_answer a = {CUDA_SUCCESS, 0, NULL};
	uint64_t off = UINT64_MAX;
	vg_lock();
	/* the cubin comes back in half the bulk area (the most that is always free once the package's
	 * chunks are released, wherever they ended); one larger is asked for again into pinned memory */
	r = link_call(l, fl, UINT64_MAX, vg_conn.bulk_size / 2, &a);
	if (r == CUDA_SUCCESS && a.result == CUDA_SUCCESS && !a.cubin) {
		uint64_t want = a.cubin_size;
		if (vmgpu_guest_remote(vg_conn.guest) || vmgpu_guest_heap_alloc(vg_conn.chan, want, &off) < 0) {
			vg_log("cuLinkComplete: no room for a cubin of %llu bytes", (unsigned long long)want);
			r = CUDA_ERROR_OUT_OF_MEMORY;
			off = UINT64_MAX;
		} else if ((r = link_call(l, fl, off, want, &a)) == CUDA_SUCCESS && a.result == CUDA_SUCCESS && !a.cubin) {
			r = VG_ERROR_LOST; /* the same link, a different answer */
		}
	}
	if (r == CUDA_SUCCESS && a.result == CUDA_SUCCESS) {
		l->cubin = malloc(a.cubin_size ? a.cubin_size : 1);
		if (l->cubin) {
			memcpy(l->cubin, a.cubin, a.cubin_size);
			l->cubin_size = a.cubin_size;
		} else {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	if (off != UINT64_MAX)
		vmgpu_guest_heap_free(vg_conn.chan, off);
	vg_unlock();
	pthread_mutex_unlock(&links_mu);
	if (r != CUDA_SUCCESS)
		return r;
	if (a.result == CUDA_SUCCESS) {
		*cubinOut = l->cubin;
		*sizeOut = l->cubin_size;
	}
	return a.result;
}

CUresult handwritten_cuLinkDestroy(CUlinkState state, unsigned fl)
{
	(void)fl;
	pthread_mutex_lock(&links_mu);
	struct link **at = &links;
	while (*at && (CUlinkState)*at != state)
		at = &(*at)->next;
	struct link *l = *at;
	if (l)
		*at = l->next;
	pthread_mutex_unlock(&links_mu);
	if (!l)
		return CUDA_ERROR_INVALID_HANDLE;
	free(l->cubin);
	free(l->pkg);
	free(l);
	return CUDA_SUCCESS;
}
