/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest's connection to its host forwarder: at cuInit the region is mapped,
 * a channel claimed and the host's device snapshot taken (hello); after a fork
 * the child connects afresh; once the host is lost every call says so.
 */
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

#include "call.h"
#include "connection.h"
#include "ivshmem.h"

struct vg_connection vg_conn;

static pthread_mutex_t channel_lock;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int lost;
static void *region;
static uint64_t region_size;

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
	pthread_mutex_lock(&channel_lock);
}

void vg_unlock(void)
{
	pthread_mutex_unlock(&channel_lock);
}

static void child_after_fork(void)
{
	/* the parent's channel is not ours: a CUDA call in the child connects afresh */
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&channel_lock, &a);
	memset(&vg_conn, 0, sizeof vg_conn);
	once = (pthread_once_t)PTHREAD_ONCE_INIT;
	lost = 0;
}

__attribute__((constructor)) static void vg_ctor(void)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&channel_lock, &a);
	pthread_atfork(NULL, NULL, child_after_fork);
}

__attribute__((destructor)) static void vg_dtor(void)
{
	/* runs after the program's own exit handlers (cudart's teardown included) */
	if (vg_conn.chan && !lost) {
		pthread_mutex_lock(&channel_lock);
		vmgpu_gchan_close(vg_conn.chan);
		vg_conn.chan = NULL;
		pthread_mutex_unlock(&channel_lock);
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
	vg_conn.ready = 1; /* vg_begin needs it; undone on failure */
	CUresult r = vg_begin(&c, VG_OP_HELLO, 0);
	if (r != CUDA_SUCCESS)
		return r;
	struct vg_hello_req req = {VG_PROTO_VERSION, (uint32_t)getpid()};
	vg_put(&c, &req, sizeof req);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		vg_get(&c, &vg_conn.hello, sizeof vg_conn.hello);
		if (vg_conn.hello.ndev > VG_MAX_DEVICES)
			vg_conn.hello.ndev = VG_MAX_DEVICES;
		for (uint32_t i = 0; i < vg_conn.hello.ndev; i++)
			vg_get(&c, &vg_conn.dev[i], sizeof vg_conn.dev[i]);
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
		vg_conn.init_result = fail(CUDA_ERROR_NO_DEVICE,
				      "the GPU region %s is not this user's (%s): the host gives it to the container's "
				      "user and group (docker run --user) or, in a VM, to the group of vmgpu-guest-agent "
				      "--gid; run as that user, or ask the host's operator",
				      path, strerror(errno));
		return;
	}
	if (fd < 0) {
		vg_conn.init_result = fail(CUDA_ERROR_NO_DEVICE, "no GPU region at %s (%s); set VMGPU_REGION", path,
				      strerror(errno));
		return;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size <= 0) {
		close(fd);
		vg_conn.init_result = fail(CUDA_ERROR_NO_DEVICE, "the GPU region %s is empty", path);
		return;
	}
	region_size = (uint64_t)st.st_size;
	region = mmap(NULL, region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (region == MAP_FAILED) {
		vg_conn.init_result = fail(CUDA_ERROR_NO_DEVICE, "cannot map the GPU region %s: %s", path, strerror(errno));
		return;
	}
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	int e = vmgpu_guest_attach(region, region_size, &wo, &vg_conn.guest);
	if (e == 0)
		e = vmgpu_guest_claim(vg_conn.guest, 5000000000ull, &vg_conn.chan);
	if (e != 0) {
		vg_conn.init_result = fail(CUDA_ERROR_NO_DEVICE, "GPU region %s: %s", path, vmgpu_shm_errmsg());
		return;
	}
	vmgpu_gchan_autobeat(vg_conn.chan, 200000000ull);
	vg_conn.send_cap = vmgpu_gchan_max_payload(vg_conn.chan, 0);
	vg_conn.reply_cap = vmgpu_gchan_max_payload(vg_conn.chan, 1);
	vg_conn.send_buf = aligned_alloc(64, vg_conn.send_cap);
	vg_conn.reply_buf = aligned_alloc(64, vg_conn.reply_cap + 64);
	vg_conn.bulk_size = vmgpu_gchan_bulk_size(vg_conn.chan);
	if (!vg_conn.send_buf || !vg_conn.reply_buf) {
		vg_conn.init_result = fail(CUDA_ERROR_OUT_OF_MEMORY, "out of memory");
		return;
	}
	CUresult r = hello();
	if (r != CUDA_SUCCESS) {
		vg_conn.ready = 0;
		if (r == CUDA_ERROR_NOT_SUPPORTED)
			vg_conn.init_result = fail(r, "the host forwarder speaks another version of the vmgpu protocol "
						      "than this guest library (%d): install the guest library of the "
						      "host's vmgpu release", VG_PROTO_VERSION);
		else
			vg_conn.init_result = fail(r == VG_ERROR_LOST ? CUDA_ERROR_NO_DEVICE : r,
						   "the host forwarder refused this guest library (CUresult %d)", r);
		return;
	}
	if (vg_conn.hello.flags & VG_HELLO_SIMULATED)
		vg_log("the host runs the SIMULATED backend (no GPU): results are for testing only");
	vg_conn.init_result = CUDA_SUCCESS;
}

CUresult vg_connect(void)
{
	pthread_once(&once, connect_once);
	return vg_conn.init_result;
}

CUresult vg_check_ready(void)
{
	if (!vg_conn.ready)
		return vg_conn.init_result ? vg_conn.init_result : CUDA_ERROR_NOT_INITIALIZED;
	if (__atomic_load_n(&lost, __ATOMIC_RELAXED))
		return VG_ERROR_LOST;
	return CUDA_SUCCESS;
}

CUresult vg_lose(const char *what, int e)
{
	if (!__atomic_exchange_n(&lost, 1, __ATOMIC_RELAXED))
		vg_log("lost the host forwarder (%s: %s); CUDA calls now return CUDA_ERROR_DEVICE_UNAVAILABLE", what,
		       e ? vmgpu_shm_errmsg() : "protocol error");
	return VG_ERROR_LOST;
}
