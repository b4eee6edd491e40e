/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel launches: each function's parameter layout is fetched from the host once
 * (cuFuncGetParamInfo / cuKernelGetParamInfo answer from it), and a launch packs
 * its parameters at the host's offsets into the request, which goes to the ring
 * without a reply.  Also the cluster occupancy queries (they carry a launch
 * configuration) and the function's name.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "function.h"
#include "vg_guest_protos.h"

/* ---- kernel parameter layouts ------------------------------------------------------------ */

#define LAYOUT_SLOTS 4096
static struct vg_param_layout *layout_table[LAYOUT_SLOTS];
static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned layout_slot(uint64_t h)
{
	return (unsigned)((h * 0x9E3779B97F4A7C15ull) >> 52) & (LAYOUT_SLOTS - 1);
}

CUresult vg_param_layout(uint64_t handle, struct vg_param_layout **out)
{
	pthread_mutex_lock(&layout_lock);
	unsigned s = layout_slot(handle);
	for (unsigned i = 0; i < LAYOUT_SLOTS; i++, s = (s + 1) & (LAYOUT_SLOTS - 1)) {
		if (!layout_table[s])
			break;
		if (layout_table[s]->handle == handle) {
			*out = layout_table[s];
			pthread_mutex_unlock(&layout_lock);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&layout_lock);

	struct vg_call c;
	CUresult r = vg_begin(&c, VG_OP_FUNC_PARAMS, 0);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, handle);
	r = vg_call_sync(&c);
	struct vg_param_layout *fi = NULL;
	if (r == CUDA_SUCCESS) {
		uint64_t n = vg_get_u64(&c);
		const struct vg_param_info *p = n <= VG_MAX_PARAMS ? vg_get_ref(&c, n * sizeof *p) : NULL;
		fi = calloc(1, sizeof *fi + n * sizeof *p);
		if (!p || !fi) {
			free(fi);
			fi = NULL;
			r = p ? CUDA_ERROR_OUT_OF_MEMORY : VG_ERROR_LOST;
		} else {
			fi->handle = handle;
			fi->nparams = (uint32_t)n;
			fi->params = (struct vg_param_info *)(fi + 1);
			memcpy(fi->params, p, n * sizeof *p);
			for (uint64_t i = 0; i < n; i++)
				if (p[i].offset + p[i].size > fi->bytes)
					fi->bytes = p[i].offset + p[i].size;
		}
	}
	vg_end(&c, r);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&layout_lock);
	s = layout_slot(handle);
	for (unsigned i = 0; i < LAYOUT_SLOTS; i++, s = (s + 1) & (LAYOUT_SLOTS - 1)) {
		if (!layout_table[s]) {
			layout_table[s] = fi;
			break;
		}
		if (layout_table[s]->handle == handle) { /* another thread was first */
			free(fi);
			fi = layout_table[s];
			break;
		}
	}
	pthread_mutex_unlock(&layout_lock);
	*out = fi; /* with a full table the layout is still returned, just not kept */
	return CUDA_SUCCESS;
}

CUresult handwritten_cuFuncGetParamInfo(CUfunction func, size_t i, size_t *off, size_t *size, unsigned f)
{
	(void)f;
	struct vg_param_layout *fi;
	if (!func)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = vg_param_layout(vg_function_handle(func), &fi);
	if (r != CUDA_SUCCESS)
		return r;
	if (i >= fi->nparams)
		return CUDA_ERROR_INVALID_VALUE;
	if (off)
		*off = fi->params[i].offset;
	if (size)
		*size = fi->params[i].size;
	return CUDA_SUCCESS;
}

CUresult handwritten_cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size, unsigned f)
{
	return handwritten_cuFuncGetParamInfo((CUfunction)k, i, off, size, f);
}

/* ---- launches ------------------------------------------------------------------------ */

/* Check a launch's parameters and append them at the host's offsets: u64 size, then the bytes
 * (a graph's kernel node's too: graph.c). */
CUresult vg_put_params(struct vg_call *c, const struct vg_param_layout *fi, void **params, void **extra)
{
	const void *packed = NULL;
	const size_t *packed_size_at = NULL;
	size_t packed_size = 0;
	if (!params && extra) {
		for (void **e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
			if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				packed = e[1];
			else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				packed_size_at = e[1];
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		/* the pointer and its size each have no effect without the other (cuda.h): parameters
		 * not given.  A buffer shorter than the parameters is taken, the rest zero: NCCL's
		 * kernels take a 4 KiB struct and it passes only the part it filled, as the driver allows */
		if (!packed || !packed_size_at)
			return CUDA_ERROR_INVALID_VALUE;
		packed_size = *packed_size_at;
		if (packed_size > fi->bytes)
			packed_size = fi->bytes;
	} else if (!params && fi->nparams) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	vg_put_u64(c, fi->bytes);
	/* the parameter bytes go straight into the request */
	size_t padded = ((size_t)fi->bytes + 7) & ~(size_t)7;
	if (padded > c->cap - c->len) {
		c->bad = 1;
		return CUDA_SUCCESS;
	}
	uint8_t *blob = c->buf + c->len;
	memset(blob, 0, padded);
	if (packed)
		memcpy(blob, packed, packed_size);
	else
		for (uint32_t i = 0; i < fi->nparams; i++)
			memcpy(blob + fi->params[i].offset, params[i], fi->params[i].size);
	c->len += (uint32_t)padded;
	return CUDA_SUCCESS;
}

/* A launch configuration: dims, shared memory, stream, attributes. */
void vg_put_launch_config(struct vg_call *c, const CUlaunchConfig *cfg)
{
	uint32_t dims[8] = {cfg->gridDimX,  cfg->gridDimY,	 cfg->gridDimZ, cfg->blockDimX,
			    cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes, cfg->numAttrs};
	vg_put(c, dims, sizeof dims);
	vg_put_u64(c, (uint64_t)(uintptr_t)cfg->hStream);
	vg_put_arr(c, cfg->attrs, cfg->numAttrs, sizeof(CUlaunchAttribute));
}

/* A launch's common start: the function (a tools node becomes its handle), its parameter
 * layout, and the request with the function in it; the channel is held on success. */
static CUresult launch_begin(struct vg_call *c, uint32_t op, CUfunction f, unsigned fl, struct vg_param_layout **fi)
{
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t h = vg_function_handle(f);
	CUresult r = vg_param_layout(h, fi);
	if (r == CUDA_SUCCESS && (r = vg_begin(c, op, fl)) == CUDA_SUCCESS)
		vg_put_u64(c, h);
	return r;
}

CUresult handwritten_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
			    unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
			    void **extra, unsigned fl)
{
	struct vg_param_layout *fi;
	struct vg_call c;
	CUresult r = launch_begin(&c, VG_OP_cuLaunchKernel, f, fl, &fi);
	if (r != CUDA_SUCCESS)
		return r;
	uint32_t dims[8] = {gx, gy, gz, bx, by, bz, shmem, 0};
	vg_put(&c, dims, sizeof dims);
	vg_put_u64(&c, (uint64_t)(uintptr_t)s);
	if ((r = vg_put_params(&c, fi, params, extra)) != CUDA_SUCCESS)
		return vg_end(&c, r);
	return vg_send_async(&c);
}

CUresult handwritten_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra, unsigned fl)
{
	if (f && (!config || (config->numAttrs && !config->attrs)))
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_param_layout *fi;
	struct vg_call c;
	CUresult r = launch_begin(&c, VG_OP_cuLaunchKernelEx, f, fl, &fi);
	if (r != CUDA_SUCCESS)
		return r;
	vg_put_launch_config(&c, config);
	if ((r = vg_put_params(&c, fi, params, extra)) != CUDA_SUCCESS)
		return vg_end(&c, r);
	return vg_send_async(&c);
}

CUresult handwritten_cuFuncGetName(const char **name, CUfunction f, unsigned fl)
{
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_param_layout *fi;
	CUresult r = vg_param_layout(vg_function_handle(f), &fi);
	if (r != CUDA_SUCCESS)
		return r;
	if (fi->name) {
		*name = fi->name;
		return CUDA_SUCCESS;
	}
	struct vg_call c;
	if ((r = vg_begin(&c, VG_OP_cuFuncGetName, fl)) != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, vg_function_handle(f));
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		uint64_t n = vg_get_u64(&c);
		const char *s = n && n < 65536 ? vg_get_ref(&c, n) : NULL;
		char *copy = s && s[n - 1] == '\0' ? strdup(s) : NULL;
		if (!copy)
			r = VG_ERROR_LOST;
		else if (!__atomic_compare_exchange_n(&fi->name, &(char *){NULL}, copy, 0, __ATOMIC_ACQ_REL,
						      __ATOMIC_ACQUIRE))
			free(copy);
		if (copy)
			*name = fi->name;
	}
	return vg_end(&c, r);
}
