/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memquota: take device memory through every path, in random sizes, until the quota says
 * no, then give half back and do it again.  Run through vmgpu; the test around it checks
 * the forwarder's charges (and, on a GPU, NVML) whenever this program stops.
 *
 *   memquota SEED ROUNDS CUBIN [PATHS]
 *
 * PATHS is a set of letters (default all): a cuMemAlloc, p pitched, r 3D array, s
 * stream-ordered (default pool), o own pool, v VMM (create, reserve, map, access), g graph
 * with a memory node, m module with a 64 MiB global (CUBIN, entry "touch").
 * Each round ends with "FULL round=R held=BYTES ooms=a:N,p:N,..." and waits for a line on
 * stdin; at the end it frees everything, prints "EMPTY" and waits once more.  Any error other
 * than CUDA_ERROR_OUT_OF_MEMORY fails the program (exit 1).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HELD 4096

static const char *paths_all = "aprsovgm";

struct held {
	char path;
	CUdeviceptr p;
	size_t size;
	void *obj; /* array, module, graph exec, VMM handle (as integer) */
	unsigned long long h;
};

static struct held held[MAX_HELD];
static int nheld;
static CUstream st;
static CUmemoryPool pool;
static CUdevice dev;
static void *image;
static unsigned long long rng;

static unsigned long long next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static int fail(const char *what, CUresult r)
{
	const char *s = "?";
	cuGetErrorName(r, &s);
	printf("FAIL %s: %s\n", what, s);
	fflush(stdout);
	exit(1);
}

/* A size from 1 byte to 256 MiB, spread evenly over the powers of two. */
static size_t rsize(void)
{
	int bits = (int)(next() % 28);
	size_t lo = (size_t)1 << bits;
	return lo + next() % lo;
}

static CUresult take(char path, struct held *h)
{
	size_t n = rsize();
	CUresult r;
	h->path = path;
	h->size = n;
	switch (path) {
	case 'a':
		r = cuMemAlloc(&h->p, n);
		if (r == CUDA_SUCCESS)
			r = cuMemsetD8(h->p, 0x5a, n);
		return r;
	case 'p': {
		size_t pitch, w = 1 + n % 65536, rows = 1 + n / (w + 1);
		r = cuMemAllocPitch(&h->p, &pitch, w, rows, 4);
		if (r == CUDA_SUCCESS)
			h->size = pitch * rows;
		return r;
	}
	case 'r': {
		size_t side = 64 + next() % 4096;
		CUDA_ARRAY3D_DESCRIPTOR d = {side, 1 + n / (side * 16 + 1) % 4096, 0, CU_AD_FORMAT_FLOAT, 4, 0};
		h->size = d.Width * d.Height * 16;
		return cuArray3DCreate((CUarray *)&h->obj, &d);
	}
	case 's':
		r = cuMemAllocAsync(&h->p, n, st);
		if (r == CUDA_SUCCESS)
			r = cuMemsetD8Async(h->p, 0x33, n, st);
		return r;
	case 'o':
		r = cuMemAllocFromPoolAsync(&h->p, n, pool, st);
		if (r == CUDA_SUCCESS)
			r = cuMemsetD8Async(h->p, 0x44, n, st);
		return r;
	case 'v': {
		CUmemAllocationProp prop = {0};
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = dev;
		size_t g;
		if ((r = cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
			return r;
		n = (n + g - 1) / g * g;
		h->size = n;
		if ((r = cuMemCreate(&h->h, n, &prop, 0)))
			return r;
		if ((r = cuMemAddressReserve(&h->p, n, 0, 0, 0)))
			fail("cuMemAddressReserve", r);
		if ((r = cuMemMap(h->p, n, 0, h->h, 0)))
			fail("cuMemMap", r);
		CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		if ((r = cuMemSetAccess(h->p, n, &acc, 1)))
			fail("cuMemSetAccess", r);
		return cuMemsetD8(h->p, 0x66, n);
	}
	case 'g': {
		CUgraph g;
		CUdeviceptr p;
		if ((r = cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL)))
			fail("cuStreamBeginCapture", r);
		r = cuMemAllocAsync(&p, n, st);
		if (r == CUDA_SUCCESS)
			cuMemsetD8Async(p, 0x77, n, st), cuMemFreeAsync(p, st);
		CUresult e = cuStreamEndCapture(st, &g);
		if (r || e)
			fail("graph capture", r ? r : e);
		r = cuGraphInstantiate((CUgraphExec *)&h->obj, g, 0);
		cuGraphDestroy(g);
		if (r == CUDA_SUCCESS)
			r = cuGraphLaunch((CUgraphExec)h->obj, st);
		return r;
	}
	case 'm':
		h->size = 64 << 20;
		return cuModuleLoadData((CUmodule *)&h->obj, image);
	}
	return CUDA_ERROR_INVALID_VALUE;
}

static void give(struct held *h)
{
	CUresult r = CUDA_SUCCESS;
	switch (h->path) {
	case 'a': case 'p': r = cuMemFree(h->p); break;
	case 'r': r = cuArrayDestroy((CUarray)h->obj); break;
	case 's': case 'o': r = cuMemFreeAsync(h->p, st); break;
	case 'v':
		if ((r = cuMemUnmap(h->p, h->size)) == CUDA_SUCCESS && (r = cuMemRelease(h->h)) == CUDA_SUCCESS)
			r = cuMemAddressFree(h->p, h->size);
		break;
	case 'g': r = cuGraphExecDestroy((CUgraphExec)h->obj); break;
	case 'm': r = cuModuleUnload((CUmodule)h->obj); break;
	}
	if (r != CUDA_SUCCESS)
		fail("free", r);
}

static void pause_here(const char *line)
{
	CUresult r = cuStreamSynchronize(st);
	if (r != CUDA_SUCCESS)
		fail("cuStreamSynchronize", r);
	cuMemPoolTrimTo(pool, 0);
	printf("%s\n", line);
	fflush(stdout);
	char buf[16];
	if (!fgets(buf, sizeof buf, stdin))
		exit(0);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: memquota SEED ROUNDS CUBIN [PATHS]\n");
		return 2;
	}
	rng = strtoull(argv[1], NULL, 10) * 2654435761ull + 1;
	int rounds = atoi(argv[2]);
	const char *paths = argc > 4 ? argv[4] : paths_all;
	FILE *f = fopen(argv[3], "rb");
	if (!f)
		return 2;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	rewind(f);
	image = malloc((size_t)len);
	if (!image || fread(image, 1, (size_t)len, f) != (size_t)len)
		return 2;
	fclose(f);

	CUcontext ctx;
	CUresult r;
	if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
	    (r = cuCtxSetCurrent(ctx)) || (r = cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)))
		fail("setup", r);
	CUmemPoolProps pp = {0};
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = dev;
	if ((r = cuMemPoolCreate(&pool, &pp)))
		fail("cuMemPoolCreate", r);

	int npaths = (int)strlen(paths);
	for (int round = 1; round <= rounds; round++) {
		int ooms[8] = {0}, streak = 0;
		size_t total = 0;
		for (int op = 0; op < 3000 && streak < 24 && nheld < MAX_HELD; op++) {
			char path = paths[next() % npaths];
			struct held *h = &held[nheld];
			memset(h, 0, sizeof *h);
			r = take(path, h);
			if (r == CUDA_ERROR_OUT_OF_MEMORY) {
				ooms[strchr(paths_all, path) - paths_all]++;
				streak++;
				continue;
			}
			if (r != CUDA_SUCCESS)
				fail("take", r);
			streak = 0;
			nheld++;
		}
		for (int i = 0; i < nheld; i++)
			total += held[i].size;
		size_t fr = 0, tot = 0;
		cuMemGetInfo(&fr, &tot);
		char line[256];
		/* ended=refused: the round stopped because 24 takes in a row were refused (the quota is
		 * reached), not because it ran out of tries or slots */
		int n = snprintf(line, sizeof line, "FULL round=%d held=%zu objects=%d free=%zu total=%zu ended=%s ooms=",
				 round, total, nheld, fr, tot, streak >= 24 ? "refused" : "tries");
		for (int i = 0; i < 8; i++)
			n += snprintf(line + n, sizeof line - n, "%c:%d%s", paths_all[i], ooms[i], i < 7 ? "," : "");
		pause_here(line);
		/* give back a random half */
		for (int i = 0; i < nheld;) {
			if (next() & 1) {
				give(&held[i]);
				held[i] = held[--nheld];
			} else {
				i++;
			}
		}
	}
	while (nheld > 0)
		give(&held[--nheld]);
	if ((r = cuMemPoolDestroy(pool)))
		fail("cuMemPoolDestroy", r);
	pool = NULL;
	pause_here("EMPTY");
	return 0;
}
