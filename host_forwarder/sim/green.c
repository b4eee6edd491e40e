/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Green contexts: an H200's SMs (132, co-scheduled in groups of 8) split and combined into
 * partitions, green contexts of them, and streams in those.  Nothing runs faster or slower; what
 * a test can see is where each launch would have run: with VMGPU_SIM_SM_LOG=FILE every launch
 * appends "launch sms=N" (0: the whole GPU), every memset "memset sms=N" ("memset default sms=N"
 * for an async one on a default stream) and every wait for an event "wait" to FILE.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "sim.h"

#define SMS 132
#define ALIGN 8
#define GREEN_MAGIC 0x4e455247u
#define DESC_MAGIC 0x43534544u

/* A resource's SMs: a bit per SM, kept in the resource's own padding. */
typedef struct {
	uint8_t bits[(SMS + 7) / 8];
} smset;

static smset *set_of(CUdevResource *r) { return (smset *)r->_internal_padding; }

static int count(const smset *s)
{
	int n = 0;
	for (int i = 0; i < SMS; i++)
		n += (s->bits[i / 8] >> (i % 8)) & 1;
	return n;
}

struct sim_green {
	uint32_t magic; /* first: a CUcontext made of it is this object (cuCtxFromGreenCtx) */
	int dev, sms;
	smset set;
};

struct sim_desc {
	uint32_t magic;
	smset set;
};

int sim_green_device(CUcontext c)
{
	const struct sim_green *g = (const void *)c;
	return (uintptr_t)c >= 4096 && g->magic == GREEN_MAGIC ? g->dev : -1;
}

int sim_green_sms(CUcontext c)
{
	const struct sim_green *g = (const void *)c;
	return (uintptr_t)c >= 4096 && g->magic == GREEN_MAGIC ? g->sms : 0;
}

void sim_sm_log(const char *what, int sms)
{
	const char *path = getenv("VMGPU_SIM_SM_LOG");
	if (!path || !*path)
		return;
	char line[64];
	int n = sms >= 0 ? snprintf(line, sizeof line, "%s sms=%d\n", what, sms) : snprintf(line, sizeof line, "%s\n", what);
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)n) != n)
		n = 0;
	close(fd);
}

int sim_sms_of(CUstream s)
{
	struct sim_obj *so = sim_stream_obj(s);
	if (so)
		return so->green ? sim_green_sms((CUcontext)so->green) : 0;
	return sim_green_sms(sim_current); /* (a default stream: the current context's) */
}

EXPORT CUresult cuDeviceGetDevResource(CUdevice d, CUdevResource *r, CUdevResourceType type)
{
	if (!r || type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	memset(r, 0, sizeof *r);
	r->type = CU_DEV_RESOURCE_TYPE_SM;
	r->sm.smCount = SMS;
	r->sm.minSmPartitionSize = ALIGN;
	r->sm.smCoscheduledAlignment = ALIGN;
	for (int i = 0; i < SMS; i++)
		set_of(r)->bits[i / 8] |= (uint8_t)(1u << (i % 8));
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nb, const CUdevResource *in,
					    CUdevResource *rest, unsigned int flags, unsigned int min_count)
{
	if (!nb || !in || in->type != CU_DEV_RESOURCE_TYPE_SM || flags) return CUDA_ERROR_INVALID_VALUE;
	smset have = *set_of((CUdevResource *)in);
	unsigned size = min_count < ALIGN ? ALIGN : (min_count + ALIGN - 1) / ALIGN * ALIGN;
	unsigned can = (unsigned)count(&have) / size;
	if (!result) {
		*nb = can;
		return CUDA_SUCCESS;
	}
	unsigned made = *nb < can ? *nb : can;
	for (unsigned g = 0; g < made; g++) {
		memset(&result[g], 0, sizeof result[g]);
		result[g].type = CU_DEV_RESOURCE_TYPE_SM;
		result[g].sm.minSmPartitionSize = result[g].sm.smCoscheduledAlignment = ALIGN;
		unsigned taken = 0;
		for (int i = 0; i < SMS && taken < size; i++)
			if ((have.bits[i / 8] >> (i % 8)) & 1) {
				have.bits[i / 8] &= (uint8_t)~(1u << (i % 8));
				set_of(&result[g])->bits[i / 8] |= (uint8_t)(1u << (i % 8));
				taken++;
			}
		result[g].sm.smCount = taken;
	}
	if (rest) {
		memset(rest, 0, sizeof *rest);
		rest->type = CU_DEV_RESOURCE_TYPE_SM;
		*set_of(rest) = have;
		rest->sm.smCount = (unsigned)count(&have);
	}
	*nb = made;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *out, CUdevResource *res, unsigned int n)
{
	if (!out || !res || !n) return CUDA_ERROR_INVALID_VALUE;
	struct sim_desc *d = calloc(1, sizeof *d);
	if (!d) return CUDA_ERROR_OUT_OF_MEMORY;
	d->magic = DESC_MAGIC;
	for (unsigned k = 0; k < n; k++) {
		if (res[k].type != CU_DEV_RESOURCE_TYPE_SM) {
			free(d);
			return CUDA_ERROR_INVALID_RESOURCE_TYPE;
		}
		for (size_t b = 0; b < sizeof d->set.bits; b++) {
			if (d->set.bits[b] & set_of(&res[k])->bits[b]) { /* the same SM twice */
				free(d);
				return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
			}
			d->set.bits[b] |= set_of(&res[k])->bits[b];
		}
	}
	*out = (CUdevResourceDesc)d; /* (kept: a descriptor has no destroy call) */
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *out, CUdevResourceDesc desc, CUdevice d, unsigned int flags)
{
	struct sim_desc *ds = (struct sim_desc *)desc;
	if (!out || !ds || ds->magic != DESC_MAGIC || !(flags & CU_GREEN_CTX_DEFAULT_STREAM))
		return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= sim_devices()) return CUDA_ERROR_INVALID_DEVICE;
	struct sim_green *g = calloc(1, sizeof *g);
	if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = GREEN_MAGIC;
	g->dev = d;
	g->set = ds->set;
	g->sms = count(&g->set);
	sim_usage_add((int64_t)sim_green_bytes());
	*out = (CUgreenCtx)g;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx c)
{
	struct sim_green *g = (struct sim_green *)c;
	if (!g || g->magic != GREEN_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
	g->magic = 0;
	free(g);
	sim_usage_add(-(int64_t)sim_green_bytes());
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *c, CUgreenCtx g)
{
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (sim_green_device((CUcontext)g) < 0) return CUDA_ERROR_INVALID_CONTEXT;
	*c = (CUcontext)g;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxStreamCreate(CUstream *s, CUgreenCtx g, unsigned int flags, int prio)
{
	(void)prio;
	if (!s || !(flags & CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
	if (sim_green_device((CUcontext)g) < 0) return CUDA_ERROR_INVALID_CONTEXT;
	CUresult r = sim_new_obj((void **)s, STREAM_MAGIC, (int)flags);
	if (r == CUDA_SUCCESS)
		((struct sim_obj *)*s)->green = g;
	return r;
}
