/* SPDX-License-Identifier: Apache-2.0 */
/* The guest's connection to its host forwarder, and the call helpers the generated entries use. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vg_guest.h"
#include "ivshmem.h"

struct vg_conn vg;

static pthread_mutex_t mu;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static uint8_t *sbuf, *rbuf;
static uint32_t scap, rcap;
static uint64_t seq;
static int lost;
static void *region;
static uint64_t region_size;

#define FOREVER (24ull * 3600 * 1000000000ull) /* a dead host is noticed by its heartbeat, not this */

void vg_log(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	const char *q = getenv("VMGPU_QUIET");
	if (!q || strcmp(q, "1"))
		fprintf(stderr, "vmgpu: %s\n", msg);
}

CUresult vg_unsupported(const char *name, int *once_flag)
{
	const char *strict = getenv("VMGPU_STRICT");
	if (strict && !strcmp(strict, "1")) {
		vg_log("%s is not supported (VMGPU_STRICT=1: aborting)", name);
		abort();
	}
	if (!__atomic_exchange_n(once_flag, 1, __ATOMIC_RELAXED))
		vg_log("%s is not supported; it returns CUDA_ERROR_NOT_SUPPORTED", name);
	return CUDA_ERROR_NOT_SUPPORTED;
}

void vg_lock(void)
{
	pthread_mutex_lock(&mu);
}

void vg_unlock(void)
{
	pthread_mutex_unlock(&mu);
}

static void child_after_fork(void)
{
	/* the parent's channel is not ours: a CUDA call in the child connects afresh */
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&mu, &a);
	memset(&vg, 0, sizeof vg);
	once = (pthread_once_t)PTHREAD_ONCE_INIT;
	lost = 0;
}

__attribute__((constructor)) static void vg_ctor(void)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&mu, &a);
	pthread_atfork(NULL, NULL, child_after_fork);
}

__attribute__((destructor)) static void vg_dtor(void)
{
	/* runs after the program's own exit handlers (cudart's teardown included) */
	if (vg.chan && !lost) {
		pthread_mutex_lock(&mu);
		vmgpu_gchan_close(vg.chan);
		vg.chan = NULL;
		pthread_mutex_unlock(&mu);
	}
}

static CUresult fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult fail(CUresult r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	vg_log("%s", msg);
	return r;
}

static CUresult hello(void)
{
	struct vg_call c;
	vg.ready = 1; /* vg_begin needs it; undone on failure */
	CUresult r = vg_begin(&c, VG_OP_HELLO, 0);
	if (r != CUDA_SUCCESS)
		return r;
	struct vg_hello_req req = {VG_PROTO_VERSION, (uint32_t)getpid()};
	vg_put(&c, &req, sizeof req);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		vg_get(&c, &vg.hello, sizeof vg.hello);
		if (vg.hello.ndev > VG_MAX_DEVICES)
			vg.hello.ndev = VG_MAX_DEVICES;
		for (uint32_t i = 0; i < vg.hello.ndev; i++)
			vg_get(&c, &vg.dev[i], sizeof vg.dev[i]);
		if (c.bad)
			r = CUDA_ERROR_UNKNOWN;
	}
	return vg_end(&c, r);
}

static void connect_once(void)
{
	char path[512];
	vg_region_path(path, sizeof path);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0 && (errno == EACCES || errno == EPERM)) {
		vg.init_result = fail(CUDA_ERROR_NO_DEVICE,
				      "the GPU region %s is not this user's (%s): the host gives it to the container's "
				      "user and group (docker run --user) or, in a VM, to the group of vmgpu-guest-agent "
				      "--gid; run as that user, or ask the host's operator",
				      path, strerror(errno));
		return;
	}
	if (fd < 0) {
		vg.init_result = fail(CUDA_ERROR_NO_DEVICE, "no GPU region at %s (%s); set VMGPU_REGION", path,
				      strerror(errno));
		return;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size <= 0) {
		close(fd);
		vg.init_result = fail(CUDA_ERROR_NO_DEVICE, "the GPU region %s is empty", path);
		return;
	}
	region_size = (uint64_t)st.st_size;
	region = mmap(NULL, region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (region == MAP_FAILED) {
		vg.init_result = fail(CUDA_ERROR_NO_DEVICE, "cannot map the GPU region %s: %s", path, strerror(errno));
		return;
	}
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	int e = vmgpu_guest_attach(region, region_size, &wo, &vg.guest);
	if (e == 0)
		e = vmgpu_guest_claim(vg.guest, 5000000000ull, &vg.chan);
	if (e != 0) {
		vg.init_result = fail(CUDA_ERROR_NO_DEVICE, "GPU region %s: %s", path, vmgpu_shm_errmsg());
		return;
	}
	vmgpu_gchan_autobeat(vg.chan, 200000000ull);
	scap = vmgpu_gchan_max_payload(vg.chan, 0);
	rcap = vmgpu_gchan_max_payload(vg.chan, 1);
	sbuf = aligned_alloc(64, scap);
	rbuf = aligned_alloc(64, rcap + 64);
	vg.bulk_size = vmgpu_gchan_bulk_size(vg.chan);
	if (!sbuf || !rbuf) {
		vg.init_result = fail(CUDA_ERROR_OUT_OF_MEMORY, "out of memory");
		return;
	}
	CUresult r = hello();
	if (r != CUDA_SUCCESS) {
		vg.ready = 0;
		vg.init_result = fail(r == VG_ERROR_LOST ? CUDA_ERROR_NO_DEVICE : r,
				      "the host forwarder refused this guest library (CUresult %d)", r);
		return;
	}
	if (vg.hello.flags & VG_HELLO_SIMULATED)
		vg_log("the host runs the SIMULATED backend (no GPU): results are for testing only");
	vg.init_result = CUDA_SUCCESS;
}

CUresult vg_connect(void)
{
	pthread_once(&once, connect_once);
	return vg.init_result;
}

CUresult vg_check_ready(void)
{
	if (!vg.ready)
		return vg.init_result ? vg.init_result : CUDA_ERROR_NOT_INITIALIZED;
	if (__atomic_load_n(&lost, __ATOMIC_RELAXED))
		return VG_ERROR_LOST;
	return CUDA_SUCCESS;
}

uint64_t vg_heap_offset(const void *p, size_t n)
{
	if (!vg.guest || !p)
		return UINT64_MAX;
	uint64_t off = vmgpu_guest_offset(vg.guest, p);
	const struct vmgpu_layout *L = vmgpu_guest_layout(vg.guest);
	if (off == UINT64_MAX || off < L->heap_off || n > L->heap_off + L->heap_size - off)
		return UINT64_MAX;
	return off;
}

/* ---- calls --------------------------------------------------------------------- */

static CUresult lose(const char *what, int e)
{
	if (!__atomic_exchange_n(&lost, 1, __ATOMIC_RELAXED))
		vg_log("lost the host forwarder (%s: %s); CUDA calls now return CUDA_ERROR_DEVICE_UNAVAILABLE", what,
		       e ? vmgpu_shm_errmsg() : "protocol error");
	return VG_ERROR_LOST;
}

CUresult vg_begin(struct vg_call *c, uint32_t op, unsigned flags)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	int dev = vg_current_device();
	struct vg_req_hdr h = {op, dev < 0 ? VG_NO_DEVICE : (uint16_t)dev, (uint16_t)flags, ++seq};
	memcpy(sbuf, &h, sizeof h);
	*c = (struct vg_call){.buf = sbuf, .len = sizeof h, .cap = scap};
	return CUDA_SUCCESS;
}

void vg_put(struct vg_call *c, const void *p, size_t n)
{
	size_t padded = (n + 7) & ~(size_t)7;
	if (c->bad || padded > c->cap - c->len) {
		c->bad = 1;
		return;
	}
	if (n)
		memcpy(c->buf + c->len, p, n);
	memset(c->buf + c->len + n, 0, padded - n);
	c->len += (uint32_t)padded;
}

void vg_put_u64(struct vg_call *c, uint64_t v)
{
	vg_put(c, &v, 8);
}

void vg_put_opt(struct vg_call *c, const void *p, size_t n)
{
	vg_put_u64(c, p != NULL);
	if (p)
		vg_put(c, p, n);
}

void vg_put_arr(struct vg_call *c, const void *p, uint64_t count, size_t elsz)
{
	if (!p)
		count = 0;
	if (elsz && count > c->cap / elsz) {
		c->bad = 1;
		return;
	}
	vg_put_u64(c, count);
	vg_put(c, p, count * elsz);
}

void vg_put_str(struct vg_call *c, const char *s)
{
	if (!s) {
		c->bad = 1;
		return;
	}
	vg_put_arr(c, s, strlen(s) + 1, 1);
}

void vg_put_ctx(struct vg_call *c, CUcontext ctx)
{
	extern int vg_ctx_ordinal(CUcontext);
	int o = vg_ctx_ordinal(ctx);
	vg_put_u64(c, o < 0 ? UINT64_MAX : (uint64_t)o + 1);
}

static CUresult send_req(struct vg_call *c)
{
	int e = vmgpu_gchan_send(vg.chan, VG_REC_REQUEST, c->buf, c->len, FOREVER);
	return e < 0 ? lose("send", e) : CUDA_SUCCESS;
}

CUresult vg_send_request(struct vg_call *c)
{
	if (c->bad)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&c->seq, c->buf + offsetof(struct vg_req_hdr, seq), sizeof c->seq);
	return send_req(c);
}

CUresult vg_call_sync(struct vg_call *c)
{
	CUresult r = vg_send_request(c);
	return r == CUDA_SUCCESS ? vg_wait_reply(c) : r;
}

CUresult vg_wait_reply(struct vg_call *c)
{
	uint16_t type = 0;
	int n = vmgpu_gchan_recv(vg.chan, rbuf, rcap, &type, FOREVER);
	if (n < 0)
		return lose("receive", n);
	struct vg_rep_hdr rep;
	if (type != VG_REC_REPLY || (uint32_t)n < sizeof rep)
		return lose("reply", 0);
	memcpy(&rep, rbuf, sizeof rep);
	if (rep.seq != c->seq)
		return lose("reply order", 0);
	c->rep = rbuf + sizeof rep;
	c->rlen = (uint32_t)n - sizeof rep;
	c->rpos = 0;
	return (CUresult)rep.result;
}

const void *vg_get_ref(struct vg_call *c, size_t n)
{
	size_t padded = (n + 7) & ~(size_t)7;
	if (c->bad || !c->rep || padded > c->rlen - c->rpos) {
		c->bad = 1;
		return NULL;
	}
	const void *p = c->rep + c->rpos;
	c->rpos += (uint32_t)padded;
	return p;
}

void vg_get(struct vg_call *c, void *dst, size_t n)
{
	const void *p = vg_get_ref(c, n);
	if (p)
		memcpy(dst, p, n);
	else
		memset(dst, 0, n);
}

uint64_t vg_get_u64(struct vg_call *c)
{
	uint64_t v;
	vg_get(c, &v, 8);
	return v;
}

CUresult vg_end(struct vg_call *c, CUresult r)
{
	(void)c;
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult vg_send_async(struct vg_call *c)
{
	CUresult r;
	if (c->bad) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		struct vg_req_hdr *h = (struct vg_req_hdr *)c->buf;
		h->flags |= VG_F_NOREPLY;
		r = send_req(c);
	}
	pthread_mutex_unlock(&mu);
	return r;
}
