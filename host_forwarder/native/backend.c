/* SPDX-License-Identifier: Apache-2.0 */
/* The driver the forwarder runs calls on: the real libcuda.so.1, or the simulated backend. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

static CUresult not_in_backend(void)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

static void sim_path(char *out, size_t len)
{
	const char *env = getenv("VMGPU_SIMCUDA");
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return;
	}
	char self[PATH_MAX - 32];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	self[n > 0 ? n : 0] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	snprintf(out, len, "%s/libvmgpu-simcuda.so", self);
}

int vh_backend_load(struct vh_backend *b, const char *which, char *err, size_t errlen)
{
	memset(b, 0, sizeof *b);
	char path[PATH_MAX];
	if (!strcmp(which, "cuda")) {
		snprintf(path, sizeof path, "libcuda.so.1");
	} else if (!strcmp(which, "sim")) {
		sim_path(path, sizeof path);
		b->simulated = 1;
	} else {
		snprintf(err, errlen, "unknown backend '%s' (cuda or sim)", which);
		return -1;
	}
	b->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!b->dl) {
		snprintf(err, errlen, "cannot load the %s backend %s: %s", which, path, dlerror());
		return -1;
	}
	/* a function the backend lacks answers CUDA_ERROR_NOT_SUPPORTED */
#define X(n)                                                   \
	b->n = (__typeof__(&n))dlsym(b->dl, #n);               \
	if (!b->n)                                             \
		b->n = (__typeof__(&n))(void (*)(void))not_in_backend;
	VH_BACKEND_FNS(X)
#undef X
#define P(n, v) b->n##_pt = (__typeof__(&v))dlsym(b->dl, #v);
	VH_BACKEND_PT_FNS(P)
#undef P
	return 0;
}
