/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libvmgpu-simcuda.so: the simulated backend.  A small CUDA driver for hosts
 * without a GPU (CI): device memory is host memory behind made-up device
 * addresses, every address a call names is checked against what was
 * allocated, streams and events are objects that complete at once, and
 * modules are read from PTX text, alone or uncompressed inside a fatbin (entry
 * names and parameter layouts; images checked by the forwarder first).  One
 * kernel really runs: any entry whose name contains "vadd" with (const float*,
 * const float*, float*, int) computes c = a + b, so tests can check results.
 * Other launches are accepted and do nothing.  It is for tests only; the
 * forwarder marks every log line when it runs on it.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define SIM_BASE 0x7e0000000000ull

struct range {
	uint64_t dev;  /* device address */
	uint8_t *host; /* backing bytes */
	uint64_t size;
	int registered; /* host memory registered by the forwarder (device address = host address) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;
static size_t nranges, capranges;
static uint64_t next_dev = SIM_BASE;
static uint64_t used_bytes;
/* What the process holds, as NVML would say: allocations rounded as the H100's driver rounds
 * them, and VMGPU_SIM_CTX_MIB (default 0) per context.  vmgpuSimProcessUsage reports it. */
static uint64_t proc_bytes;

/* VMGPU_SIM_USAGE_DIR: each process keeps what it holds in DIR/<pid>, rewritten at every
 * change, so that tests can check the forwarder's books against the simulated driver's own
 * account, as the GPU tests check them against NVML. */
static void usage_add(int64_t delta)
{
	uint64_t now = __atomic_add_fetch(&proc_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
	const char *dir = getenv("VMGPU_SIM_USAGE_DIR");
	if (!dir || !*dir)
		return;
	char path[512], line[32];
	snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
	int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	int n = snprintf(line, sizeof line, "%020llu\n", (unsigned long long)now);
	if (pwrite(fd, line, (size_t)n, 0) != n)
		now = 0;
	close(fd);
}

static uint64_t sim_round(uint64_t n)
{
	uint64_t unit = n <= (1u << 20) ? (64u << 10) : (2u << 20);
	return (n + unit - 1) / unit * unit;
}

static uint64_t ctx_bytes(void)
{
	const char *e = getenv("VMGPU_SIM_CTX_MIB");
	return (e && atoll(e) > 0 ? (uint64_t)atoll(e) : 0) << 20;
}

static uint64_t total_mem(void)
{
	const char *e = getenv("VMGPU_SIM_MEM_MIB");
	return (e && atoll(e) > 0 ? (uint64_t)atoll(e) : 16384) << 20;
}

/* The bytes behind [addr, addr+n), or NULL if that is not inside one allocation. */
static uint8_t *resolve(uint64_t addr, uint64_t n)
{
	uint8_t *p = NULL;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges; i++) {
		struct range *r = &ranges[i];
		if (addr >= r->dev && n <= r->size && addr - r->dev <= r->size - n) {
			p = r->host + (addr - r->dev);
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return p;
}

static CUresult add_range(uint64_t dev, uint8_t *host, uint64_t size, int registered)
{
	pthread_mutex_lock(&mu);
	if (nranges == capranges) {
		size_t cap = capranges ? capranges * 2 : 64;
		struct range *r = realloc(ranges, cap * sizeof *r);
		if (!r) {
			pthread_mutex_unlock(&mu);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		ranges = r;
		capranges = cap;
	}
	ranges[nranges++] = (struct range){dev, host, size, registered};
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned int flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
/* VMGPU_SIM_DEVICES (default 1, at most 8) simulated GPUs, told apart by UUID and PCI bus. */
static int ndev(void)
{
	const char *e = getenv("VMGPU_SIM_DEVICES");
	int n = e ? atoi(e) : 1;
	return n < 1 ? 1 : n > 8 ? 8 : n;
}
EXPORT CUresult cuDeviceGetCount(int *n) { if (!n) return CUDA_ERROR_INVALID_VALUE; *n = ndev(); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord)
{
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	if (ord < 0 || ord >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	*d = ord;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	strncpy(name, "vmgpu simulated GPU", (size_t)len - 1);
	name[len - 1] = 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	static const char id[16] = {'v', 'm', 'g', 'p', 'u', '-', 's', 'i', 'm', 0, 0, 0, 0, 0, 0, 1};
	if (!u) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	memcpy(u->bytes, id, 16);
	u->bytes[15] = (char)(d + 1);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
	if (!b) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	*b = total_mem();
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d)
{
	if (!pi) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 8; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1000000; break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x42 + d; break;
	/* VMGPU_SIM_PAGEABLE_ACCESS=1: a GPU whose kernels reach pageable host memory (HMM/ATS) */
	case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: *pi = getenv("VMGPU_SIM_PAGEABLE_ACCESS") != NULL; break;
	default: *pi = 0; break;
	}
	return CUDA_SUCCESS;
}
static int primary_ctx[8];
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	*c = (CUcontext)&primary_ctx[d];
	if (__atomic_fetch_add(&primary_ctx[d], 1, __ATOMIC_RELAXED) == 0)
		usage_add((int64_t)ctx_bytes()); /* made by the first retain */
	return CUDA_SUCCESS;
}
/* The last release destroys the primary context, and the device memory allocated in it. */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	int was = __atomic_load_n(&primary_ctx[d], __ATOMIC_RELAXED);
	if (was <= 0) return CUDA_ERROR_INVALID_CONTEXT;
	if (__atomic_sub_fetch(&primary_ctx[d], 1, __ATOMIC_RELAXED) != 0)
		return CUDA_SUCCESS;
	int64_t freed = (int64_t)ctx_bytes();
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges;) {
		if (!ranges[i].registered) { /* cuMemAlloc's, not mappings */
			free(ranges[i].host);
			used_bytes -= ranges[i].size;
			freed += (int64_t)sim_round(ranges[i].size);
			ranges[i] = ranges[--nranges];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&mu);
	usage_add(-freed);
	return CUDA_SUCCESS;
}
/* Contexts: the primary one, and any number created (all share the one address space). */
#define CTX_MAGIC 0x43545853u
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice d)
{
	(void)p; (void)flags;
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	uint32_t *x = malloc(sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	*x = CTX_MAGIC;
	*c = (CUcontext)x;
	usage_add((int64_t)ctx_bytes());
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
	if ((uintptr_t)c < 4096 || *(uint32_t *)c != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
	*(uint32_t *)c = 0;
	free(c);
	usage_add(-(int64_t)ctx_bytes());
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
	if (!c || ((int *)c >= primary_ctx && (int *)c < primary_ctx + 8)) return CUDA_SUCCESS;
	return (uintptr_t)c >= 4096 && *(uint32_t *)c == CTX_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
EXPORT CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) { return cuCtxSetCurrent(c); }

EXPORT CUresult cuGetErrorName(CUresult r, const char **s)
{
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	*s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR (simulated backend)";
	return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int over = n > total_mem() - used_bytes;
	uint64_t dev = next_dev;
	next_dev += (n + 0xFFFF) & ~0xFFFFull;
	if (!over) {
		used_bytes += n;
		usage_add((int64_t)sim_round(n));
	}
	pthread_mutex_unlock(&mu);
	if (over) return CUDA_ERROR_OUT_OF_MEMORY;
	uint8_t *host = calloc(1, n);
	if (!host || add_range(dev, host, n, 0)) {
		free(host);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*p = dev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges; i++) {
		if (ranges[i].dev == p && !ranges[i].registered) {
			free(ranges[i].host);
			used_bytes -= ranges[i].size;
			usage_add(-(int64_t)sim_round(ranges[i].size));
			ranges[i] = ranges[--nranges];
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
	pthread_mutex_lock(&mu);
	if (f) *f = total_mem() - used_bytes;
	if (t) *t = total_mem();
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges; i++) {
		if (!ranges[i].registered && p >= ranges[i].dev && p - ranges[i].dev < ranges[i].size) {
			if (base) *base = ranges[i].dev;
			if (size) *size = ranges[i].size;
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags)
{
	(void)flags;
	if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
	return add_range((uint64_t)(uintptr_t)p, p, n, 1);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	(void)p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
	if (!d || flags) return CUDA_ERROR_INVALID_VALUE;
	if (!resolve((uint64_t)(uintptr_t)p, 1)) return CUDA_ERROR_INVALID_VALUE;
	*d = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

static CUresult copy(uint64_t dst, uint64_t src, size_t n)
{
	uint8_t *d = resolve(dst, n), *s = resolve(src, n);
	if (!n) return CUDA_SUCCESS;
	if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
	memmove(d, s, n);
	return CUDA_SUCCESS;
}

static CUresult to_dev(CUdeviceptr dst, const void *src, size_t n)
{
	uint8_t *d = resolve(dst, n);
	if (!n) return CUDA_SUCCESS;
	if (!d || !src) return CUDA_ERROR_INVALID_VALUE;
	memcpy(d, src, n);
	return CUDA_SUCCESS;
}

static CUresult from_dev(void *dst, CUdeviceptr src, size_t n)
{
	uint8_t *s = resolve(src, n);
	if (!n) return CUDA_SUCCESS;
	if (!s || !dst) return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, s, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return to_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return from_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return to_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return from_dev(d, s, n); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, s, n); }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return copy(d, s, n); }

static CUresult fill(CUdeviceptr d, const void *v, size_t elsz, size_t n)
{
	if (n > SIZE_MAX / elsz) return CUDA_ERROR_INVALID_VALUE;
	uint8_t *p = resolve(d, n * elsz);
	if (n && !p) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++)
		memcpy(p + i * elsz, v, elsz);
	return CUDA_SUCCESS;
}
/* VMGPU_SIM_EXIT_AT_MEMSET=N: the process's Nth cuMemsetD8 ends it with exit status 3, as a
 * driver that calls exit() would (tests: a worker that ends with a status while it holds the
 * GPU). */
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
	static unsigned long long calls;
	const char *e = getenv("VMGPU_SIM_EXIT_AT_MEMSET");
	if (e && *e && __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) == strtoull(e, NULL, 10))
		exit(3);
	return fill(d, &v, 1, n);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return fill(d, &v, 4, n); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return fill(d, &v, 1, n); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return fill(d, &v, 2, n); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)s; return fill(d, &v, 4, n); }

/* ---- streams and events -------------------------------------------------------- */

struct sim_graph;
struct sim_obj {
	uint32_t magic;
	int flags;
	uint64_t t_ns;
	struct sim_graph *capturing; /* streams: the graph being captured */
};
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUresult new_obj(void **out, uint32_t magic, int flags)
{
	if (!out) return CUDA_ERROR_INVALID_VALUE;
	struct sim_obj *o = calloc(1, sizeof *o);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	o->magic = magic;
	o->flags = flags;
	*out = o;
	return CUDA_SUCCESS;
}

/* Special stream values (legacy, per-thread) reach us as small integers, never objects. */
static int is_obj(const void *p, uint32_t magic)
{
	return (uintptr_t)p >= 4096 && *(const uint32_t *)p == magic;
}

static CUresult del_obj(void *p, uint32_t magic)
{
	struct sim_obj *o = p;
	if (!is_obj(o, magic)) return CUDA_ERROR_INVALID_HANDLE;
	o->magic = 0;
	free(o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int f) { return new_obj((void **)s, STREAM_MAGIC, (int)f); }
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int f, int p) { (void)p; return new_obj((void **)s, STREAM_MAGIC, (int)f); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return del_obj(s, STREAM_MAGIC); }
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamQuery(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) { (void)s; (void)e; (void)f; return CUDA_SUCCESS; }
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int f) { return new_obj((void **)e, EVENT_MAGIC, (int)f); }
EXPORT CUresult cuEventDestroy_v2(CUevent e) { return del_obj(e, EVENT_MAGIC); }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
	(void)s;
	struct sim_obj *o = (struct sim_obj *)e;
	if (!is_obj(o, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	o->t_ns = now_ns();
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int f) { (void)f; return cuEventRecord(e, s); }
EXPORT CUresult cuEventSynchronize(CUevent e) { (void)e; return CUDA_SUCCESS; }
EXPORT CUresult cuEventQuery(CUevent e) { (void)e; return CUDA_SUCCESS; }
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
	struct sim_obj *x = (struct sim_obj *)a, *y = (struct sim_obj *)b;
	if (!ms) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(x, EVENT_MAGIC) || !is_obj(y, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*ms = (float)((double)(y->t_ns - x->t_ns) / 1e6);
	return CUDA_SUCCESS;
}

/* ---- modules from PTX text ------------------------------------------------------- */

#define MAX_FN 64
#define MAX_P 32
#define MAX_PARAM_BYTES 32764 /* the most a launch can pass */
struct sim_fn {
	uint32_t magic;
	char name[128];
	int max_dynamic_smem;
	int np;
	size_t off[MAX_P], size[MAX_P];
};
struct sim_mod {
	uint32_t magic;
	int nfn;
	struct sim_fn fn[MAX_FN];
};
#define MOD_MAGIC 0x4d4f4455u
#define FN_MAGIC 0x46554e43u

static size_t ptx_type_size(const char *t)
{
	if (!strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) || !strncmp(t, ".b64", 4) || !strncmp(t, ".f64", 4)) return 8;
	if (!strncmp(t, ".u32", 4) || !strncmp(t, ".s32", 4) || !strncmp(t, ".b32", 4) || !strncmp(t, ".f32", 4)) return 4;
	if (!strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4) || !strncmp(t, ".b16", 4)) return 2;
	if (!strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3) || !strncmp(t, ".b8", 3)) return 1;
	return 0;
}

/* Entry points and their parameter layouts, read from PTX (NUL-terminated text).  A
 * parameter whose size or alignment makes no sense ends the parse of its entry. */
static void parse_ptx(struct sim_mod *m, const char *text)
{
	const char *p = text;
	while ((p = strstr(p, ".entry ")) && m->nfn < MAX_FN) {
		p += 7;
		struct sim_fn *f = &m->fn[m->nfn++];
		f->magic = FN_MAGIC;
		size_t k = 0;
		while (*p == ' ') p++;
		while (*p && *p != '(' && *p != ' ' && *p != '\n' && k < sizeof f->name - 1) f->name[k++] = *p++;
		f->name[k] = 0;
		const char *close = strchr(p, ')');
		size_t off = 0;
		for (const char *q = p; close && (q = strstr(q, ".param")) && q < close && f->np < MAX_P; q += 6) {
			const char *t = q + 6;
			while (*t == ' ') t++;
			size_t align = 0, sz = 0;
			if (!strncmp(t, ".align", 6)) {
				align = strtoul(t + 6, (char **)&t, 10);
				while (*t == ' ') t++;
			}
			sz = ptx_type_size(t);
			const char *br = strchr(t, '[');
			if (br && br < close && (!strchr(t, ',') || br < strchr(t, ','))) {
				unsigned long count = strtoul(br + 1, NULL, 10);
				sz = count <= MAX_PARAM_BYTES ? sz * count : MAX_PARAM_BYTES + 1;
			}
			if (!align) align = sz ? (sz > 8 ? 8 : sz) : 1;
			if (sz > MAX_PARAM_BYTES || align > MAX_PARAM_BYTES || (align & (align - 1)))
				break; /* not a parameter a kernel can have */
			off = (off + align - 1) / align * align;
			if (off + sz > MAX_PARAM_BYTES)
				break;
			f->off[f->np] = off;
			f->size[f->np] = sz;
			f->np++;
			off += sz;
		}
	}
}

/* The uncompressed PTX entries of a fatbin (nvcc -no-compress), container after container.
 * Like the driver, it sizes the image from its own headers: the forwarder has checked them
 * against the bytes it received (image_check.c), and left zeros after them.  A header that
 * contradicts itself ends the walk. */
static void parse_fatbin(struct sim_mod *m, const uint8_t *image)
{
	uint64_t total = 0;
	for (;;) {
		struct { uint32_t magic; uint16_t version, header_size; uint64_t size; } h;
		memcpy(&h, image + total, sizeof h);
		if (h.magic != 0xBA55ED50u || h.header_size < sizeof h || h.size > (1ull << 30) ||
		    total + h.header_size + h.size > (1ull << 30))
			return;
		const uint8_t *e = image + total + h.header_size, *end = e + h.size;
		while (end - e >= 64) {
			uint32_t hs;
			uint64_t size, flags;
			uint16_t kind;
			memcpy(&kind, e, 2);
			memcpy(&hs, e + 4, 4);
			memcpy(&size, e + 8, 8);
			memcpy(&flags, e + 40, 8);
			if (hs < 64 || hs > (uint64_t)(end - e) || size > (uint64_t)(end - e) - hs)
				return;
			if (kind == 1 && !(flags & 0xA000)) { /* PTX, not compressed */
				char *text = malloc(size + 1);
				if (!text) return;
				memcpy(text, e + hs, size);
				text[size] = 0;
				parse_ptx(m, text);
				free(text);
			}
			e += hs + size;
		}
		total += h.header_size + h.size;
	}
}

EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
	if (!mod || !image) return CUDA_ERROR_INVALID_VALUE;
	struct sim_mod *m = calloc(1, sizeof *m);
	if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = MOD_MAGIC;
	uint32_t magic;
	memcpy(&magic, image, 4);
	if (magic == 0xBA55ED50u)
		parse_fatbin(m, image);
	else if (memcmp(image, "\x7f" "ELF", 4) != 0)
		parse_ptx(m, image);
	*mod = (CUmodule)m;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, CUjit_option *o, void **v)
{
	(void)n; (void)o; (void)v;
	return cuModuleLoadData(mod, image);
}
EXPORT CUresult cuModuleUnload(CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	m->magic = 0;
	free(m);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *fn, CUmodule mod, const char *name)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!fn || !name) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	for (int i = 0; i < m->nfn; i++)
		if (!strcmp(m->fn[i].name, name)) {
			*fn = (CUfunction)&m->fn[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuModuleGetFunctionCount(unsigned int *n, CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!n) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*n = (unsigned int)m->nfn;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *fns, unsigned int n, CUmodule mod)
{
	struct sim_mod *m = (struct sim_mod *)mod;
	if (!fns) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(m, MOD_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	for (unsigned int i = 0; i < n && i < (unsigned int)m->nfn; i++)
		fns[i] = (CUfunction)&m->fn[i];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
				  CUlibraryOption *lo, void **lv, unsigned int nl)
{
	(void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
	return cuModuleLoadData((CUmodule *)lib, code);
}
EXPORT CUresult cuLibraryUnload(CUlibrary lib) { return cuModuleUnload((CUmodule)lib); }
EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) { return cuModuleGetFunction((CUfunction *)k, (CUmodule)lib, name); }
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
	if (!f) return CUDA_ERROR_INVALID_VALUE;
	*f = (CUfunction)k;
	return CUDA_SUCCESS;
}

static struct sim_fn *fn_of(const void *h)
{
	struct sim_fn *f = (struct sim_fn *)h;
	return is_obj(f, FN_MAGIC) ? f : NULL;
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t i, size_t *off, size_t *size)
{
	struct sim_fn *f = fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (i >= (size_t)f->np) return CUDA_ERROR_INVALID_VALUE;
	if (off) *off = f->off[i];
	if (size) *size = f->size[i];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size) { return cuFuncGetParamInfo((CUfunction)k, i, off, size); }
EXPORT CUresult cuFuncGetName(const char **name, CUfunction func)
{
	struct sim_fn *f = fn_of(func);
	if (!name) return CUDA_ERROR_INVALID_VALUE;
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	*name = f->name;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuKernelGetName(const char **name, CUkernel k) { return cuFuncGetName(name, (CUfunction)k); }
EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction func)
{
	if (!pi) return CUDA_ERROR_INVALID_VALUE;
	if (!fn_of(func)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_fn *f = fn_of(func);
	*pi = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
	      : a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ? f->max_dynamic_smem
								      : 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncSetAttribute(CUfunction func, CUfunction_attribute a, int v)
{
	struct sim_fn *f = fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_NOT_SUPPORTED;
	if (v < 0 || v > 227 * 1024) return CUDA_ERROR_INVALID_VALUE;
	f->max_dynamic_smem = v;
	return CUDA_SUCCESS;
}

static int capture_launch(CUstream s, CUfunction func, const unsigned dims[7], void **args, CUresult *r);

EXPORT CUresult cuLaunchKernel(CUfunction func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			       unsigned bz, unsigned shmem, CUstream s, void **args, void **extra)
{
	(void)extra;
	struct sim_fn *f = fn_of(func);
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
	const unsigned dims[7] = {gx, gy, gz, bx, by, bz, shmem};
	CUresult cr;
	if (capture_launch(s, func, dims, args, &cr))
		return cr;
	if (strstr(f->name, "vadd") && f->np == 4 && f->size[0] == 8 && f->size[3] == 4) {
		uint64_t a, b, c;
		int n;
		memcpy(&a, args[0], 8);
		memcpy(&b, args[1], 8);
		memcpy(&c, args[2], 8);
		memcpy(&n, args[3], 4);
		uint64_t threads = (uint64_t)gx * gy * gz * bx * by * bz;
		uint64_t count = n < 0 ? 0 : ((uint64_t)n < threads ? (uint64_t)n : threads);
		float *pa = (float *)resolve(a, count * 4), *pb = (float *)resolve(b, count * 4);
		float *pc = (float *)resolve(c, count * 4);
		if (count && (!pa || !pb || !pc)) return CUDA_ERROR_ILLEGAL_ADDRESS;
		for (uint64_t i = 0; i < count; i++) pc[i] = pa[i] + pb[i];
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **args, void **extra)
{
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
			      c->sharedMemBytes, c->hStream, args, extra);
}

EXPORT CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c)
{
	if (!n || !c) return CUDA_ERROR_INVALID_VALUE;
	if (!fn_of(f)) return CUDA_ERROR_INVALID_HANDLE;
	*n = 8; /* one cluster per simulated multiprocessor */
	return CUDA_SUCCESS;
}

/* ---- graphs: launches captured on a stream, replayed by cuGraphLaunch ------------------------ */

#define GRAPH_MAGIC 0x47525048u
#define EXEC_MAGIC 0x47455845u
#define MAX_NODES 64
struct sim_node {
	CUfunction fn;
	unsigned dims[7];
	uint8_t params[256];
};
struct sim_graph {
	uint32_t magic;
	int n;
	struct sim_node node[MAX_NODES];
};
static __thread CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static struct sim_obj *stream_obj(CUstream s)
{
	return is_obj(s, STREAM_MAGIC) ? (struct sim_obj *)s : NULL;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	(void)mode;
	struct sim_obj *o = stream_obj(s);
	if (!o) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (o->capturing) return CUDA_ERROR_ILLEGAL_STATE;
	o->capturing = calloc(1, sizeof *o->capturing);
	if (!o->capturing) return CUDA_ERROR_OUT_OF_MEMORY;
	o->capturing->magic = GRAPH_MAGIC;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	struct sim_obj *o = stream_obj(s);
	if (!g) return CUDA_ERROR_INVALID_VALUE;
	if (!o || !o->capturing) return CUDA_ERROR_ILLEGAL_STATE;
	*g = (CUgraph)o->capturing;
	o->capturing = NULL;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	struct sim_obj *o = stream_obj(s);
	if (!st) return CUDA_ERROR_INVALID_VALUE;
	*st = o && o->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
					  const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n)
{
	struct sim_obj *o = stream_obj(s);
	if (!st) return CUDA_ERROR_INVALID_VALUE;
	*st = o && o->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	if (id) *id = o && o->capturing ? (cuuint64_t)(uintptr_t)o->capturing : 0;
	if (g) *g = o && o->capturing ? (CUgraph)o->capturing : NULL;
	if (deps) *deps = NULL;
	if (edges) *edges = NULL;
	if (n) *n = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	if (!mode) return CUDA_ERROR_INVALID_VALUE;
	CUstreamCaptureMode old = capture_mode;
	capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)flags;
	if (!e) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *x = malloc(sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	*x = *(struct sim_graph *)g;
	x->magic = EXEC_MAGIC;
	*e = (CUgraphExec)x;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	(void)s;
	if (!is_obj(e, EXEC_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *x = (struct sim_graph *)e;
	for (int i = 0; i < x->n; i++) {
		struct sim_node *nd = &x->node[i];
		struct sim_fn *f = fn_of(nd->fn);
		void *args[MAX_P];
		for (int k = 0; f && k < f->np; k++)
			args[k] = nd->params + f->off[k];
		CUresult r = cuLaunchKernel(nd->fn, nd->dims[0], nd->dims[1], nd->dims[2], nd->dims[3], nd->dims[4],
					    nd->dims[5], nd->dims[6], NULL, args, NULL);
		if (r != CUDA_SUCCESS) return r;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
	(void)s;
	return is_obj(e, EXEC_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
	if (!is_obj(e, EXEC_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	((struct sim_graph *)e)->magic = 0;
	free(e);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
	if (!is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	((struct sim_graph *)g)->magic = 0;
	free(g);
	return CUDA_SUCCESS;
}

/* Called by cuLaunchKernel: a launch on a capturing stream is recorded, not run. */
static int capture_launch(CUstream s, CUfunction func, const unsigned dims[7], void **args, CUresult *r)
{
	struct sim_obj *o = stream_obj(s);
	struct sim_fn *f = fn_of(func);
	if (!o || !o->capturing)
		return 0;
	struct sim_graph *g = o->capturing;
	if (!f || g->n == MAX_NODES) {
		*r = f ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_HANDLE;
		return 1;
	}
	struct sim_node *nd = &g->node[g->n];
	nd->fn = func;
	memcpy(nd->dims, dims, sizeof nd->dims);
	for (int k = 0; k < f->np; k++) {
		if (f->off[k] > sizeof nd->params || f->size[k] > sizeof nd->params - f->off[k]) {
			*r = CUDA_ERROR_INVALID_VALUE;
			return 1;
		}
		memcpy(nd->params + f->off[k], args[k], f->size[k]);
	}
	g->n++;
	*r = CUDA_SUCCESS;
	return 1;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
	if (!num) return CUDA_ERROR_INVALID_VALUE;
	if (!is_obj(g, GRAPH_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	struct sim_graph *x = (struct sim_graph *)g;
	if (!nodes) {
		*num = (size_t)x->n;
		return CUDA_SUCCESS;
	}
	size_t n = *num < (size_t)x->n ? *num : (size_t)x->n;
	for (size_t i = 0; i < n; i++)
		nodes[i] = (CUgraphNode)&x->node[i];
	*num = n;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	if (!data) return CUDA_ERROR_INVALID_VALUE;
	uint8_t *host = resolve(p, 1);
	if (!host) return CUDA_ERROR_INVALID_VALUE;
	int registered = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges; i++)
		if (ranges[i].registered && p >= ranges[i].dev && p - ranges[i].dev < ranges[i].size)
			registered = 1;
	pthread_mutex_unlock(&mu);
	switch (a) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = registered ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (!registered) return CUDA_ERROR_INVALID_VALUE;
		*(void **)data = host;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

/* As the driver: an address it does not know gets zeroes (memory type 0: unregistered). */
EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	if (!attrs || !data)
		return CUDA_ERROR_INVALID_VALUE;
	int known = resolve(p, 1) != NULL;
	for (unsigned i = 0; i < n; i++) {
		if (!data[i])
			return CUDA_ERROR_INVALID_VALUE;
		memset(data[i], 0, 8);
		if (known)
			(void)cuPointerGetAttribute(data[i], attrs[i], p);
	}
	return CUDA_SUCCESS;
}

/* ---- the rest of the allocation paths, and the process's usage ---------------------- */

EXPORT int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes)
{
	if (d != 0 || !bytes)
		return -1; /* one device's usage is modelled; the others are not measured */
	*bytes = __atomic_load_n(&proc_bytes, __ATOMIC_RELAXED);
	return 0;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned el)
{
	if (!pitch || !w || !h || (el != 4 && el != 8 && el != 16)) return CUDA_ERROR_INVALID_VALUE;
	size_t pw = (w + 511) & ~(size_t)511;
	CUresult r = cuMemAlloc_v2(p, pw * h);
	if (r == CUDA_SUCCESS) *pitch = pw;
	return r;
}

#define ARRAY_MAGIC 0x41525259u
struct sim_array { uint32_t magic; CUDA_ARRAY3D_DESCRIPTOR d; CUdeviceptr mem; };

static CUresult array_new(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	if (!out || !d || !d->Width || !d->NumChannels) return CUDA_ERROR_INVALID_VALUE;
	uint64_t n = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * d->NumChannels * 4;
	struct sim_array *a = calloc(1, sizeof *a);
	if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = cuMemAlloc_v2(&a->mem, n);
	if (r != CUDA_SUCCESS) { free(a); return r; }
	a->magic = ARRAY_MAGIC;
	a->d = *d;
	*out = (CUarray)a;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d) { return array_new(out, d); }
EXPORT CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *d)
{
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
	return array_new(out, &d3);
}
EXPORT CUresult cuArrayDestroy(CUarray h)
{
	struct sim_array *a = (struct sim_array *)h;
	if (!is_obj(a, ARRAY_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	cuMemFree_v2(a->mem);
	a->magic = 0;
	free(a);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray h)
{
	struct sim_array *a = (struct sim_array *)h;
	if (!d || !is_obj(a, ARRAY_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	*d = a->d;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray h)
{
	CUDA_ARRAY3D_DESCRIPTOR d3;
	CUresult r = cuArray3DGetDescriptor_v2(&d3, h);
	if (r == CUDA_SUCCESS) *d = (CUDA_ARRAY_DESCRIPTOR){d3.Width, d3.Height, d3.Format, d3.NumChannels};
	return r;
}

/* Pools: objects that hand out plain allocations at once (streams complete at once). */
#define POOL_MAGIC 0x504f4f4cu
static struct sim_obj default_pool[8] = {{POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0},
					 {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0},
					 {POOL_MAGIC, 0, 0, 0}, {POOL_MAGIC, 0, 0, 0}};
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d)
{
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
	*p = (CUmemoryPool)&default_pool[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) { return cuDeviceGetDefaultMemPool(p, d); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props)
{
	if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
	    props->location.id >= ndev())
		return CUDA_ERROR_INVALID_VALUE;
	return new_obj((void **)p, POOL_MAGIC, 0);
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p)
{
	for (int i = 0; i < 8; i++)
		if ((void *)p == (void *)&default_pool[i]) return CUDA_ERROR_INVALID_VALUE;
	return del_obj(p, POOL_MAGIC);
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep) { (void)keep; return is_obj(p, POOL_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
	(void)a;
	return is_obj(p, POOL_MAGIC) && v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
	if (!is_obj(p, POOL_MAGIC) || !v) return CUDA_ERROR_INVALID_VALUE;
	if (a <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) *(int *)v = 1;
	else *(cuuint64_t *)v = 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
	(void)s;
	if (!is_obj(p, POOL_MAGIC)) return CUDA_ERROR_INVALID_VALUE;
	return cuMemAlloc_v2(d, n);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(d, n); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { (void)s; return cuMemFree_v2(d); }

/* VMM: a handle is host memory; a mapping makes a range of a reserved address window resolve to it. */
#define VMM_MAGIC 0x564d4d48u
struct sim_vmm { uint32_t magic; int released, maps; uint8_t *host; uint64_t size; };
#define VMM_GRAN (2u << 20)
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o)
{
	(void)o;
	if (!g || !p) return CUDA_ERROR_INVALID_VALUE;
	*g = VMM_GRAN;
	return CUDA_SUCCESS;
}
static void vmm_maybe_free(struct sim_vmm *v)
{
	if (!v->released || v->maps) return;
	usage_add(-(int64_t)v->size);
	pthread_mutex_lock(&mu);
	used_bytes -= v->size;
	pthread_mutex_unlock(&mu);
	free(v->host);
	v->magic = 0;
	free(v);
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long fl)
{
	if (!h || !p || fl || !size || size % VMM_GRAN) return CUDA_ERROR_INVALID_VALUE;
	if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id < 0 || p->location.id >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	int over = size > total_mem() - used_bytes;
	if (!over) used_bytes += size;
	pthread_mutex_unlock(&mu);
	if (over) return CUDA_ERROR_OUT_OF_MEMORY;
	struct sim_vmm *v = calloc(1, sizeof *v);
	if (v) v->host = calloc(1, size);
	if (!v || !v->host) { free(v); return CUDA_ERROR_OUT_OF_MEMORY; }
	v->magic = VMM_MAGIC;
	v->size = size;
	usage_add((int64_t)size);
	*h = (CUmemGenericAllocationHandle)(uintptr_t)v;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (!is_obj(v, VMM_MAGIC) || v->released) return CUDA_ERROR_INVALID_VALUE;
	v->released = 1;
	vmm_maybe_free(v);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long fl)
{
	(void)align; (void)addr; (void)fl;
	if (!p || !size || size % VMM_GRAN) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	*p = next_dev;
	next_dev += size + VMM_GRAN;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return CUDA_SUCCESS; }
struct sim_map { CUdeviceptr va; struct sim_vmm *v; };
static struct sim_map maps[256];
EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long fl)
{
	struct sim_vmm *v = (struct sim_vmm *)(uintptr_t)h;
	if (fl || !is_obj(v, VMM_MAGIC) || v->released || off > v->size || size > v->size - off) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 0; i < 256 && slot < 0; i++)
		if (!maps[i].v) slot = i;
	if (slot >= 0) maps[slot] = (struct sim_map){va, v};
	pthread_mutex_unlock(&mu);
	if (slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
	v->maps++;
	return add_range(va, v->host + off, size, 2);
}
EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size)
{
	(void)size;
	struct sim_vmm *v = NULL;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < 256 && !v; i++)
		if (maps[i].v && maps[i].va == va) { v = maps[i].v; maps[i].v = NULL; }
	for (size_t i = 0; v && i < nranges; i++)
		if (ranges[i].dev == va && ranges[i].registered == 2) { ranges[i] = ranges[--nranges]; break; }
	pthread_mutex_unlock(&mu);
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	v->maps--;
	vmm_maybe_free(v);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n)
{
	(void)p; (void)size;
	if (!d || !n) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < n; i++)
		if (d[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || d[i].location.id < 0 || d[i].location.id >= ndev())
			return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}
