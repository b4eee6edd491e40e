/* SPDX-License-Identifier: Apache-2.0 */
/* An NVML tracing library (a development tool): installed as libnvidia-ml.so.1 ahead of the real
 * one, it counts every NVML function a program calls and passes the call on to the real library
 * (NVT_REAL=/path/libnvidia-ml.so.1), or, without NVT_REAL, answers nvmlInit and nvmlShutdown with
 * success and everything else with NVML_ERROR_NOT_SUPPORTED (3), logging each call in order.
 * At exit it writes "count<TAB>name" lines to $NVT_OUT (or stderr). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"

#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN unsigned long nvt_counts[NVT_N];
HIDDEN void *nvt_real[NVT_N];

HIDDEN int nvt_fake(int i);
HIDDEN void nvt_returned(int i, long r);
HIDDEN void nvt_returned(int i, long r)
{
	static int verbose = -1;
	if (verbose < 0)
		verbose = getenv("NVT_VERBOSE") != NULL;
	if (verbose)
		fprintf(stderr, "nvtrace: %s -> %d\n", nvt_names[i], (int)r);
}
int nvt_fake(int i)
{
	fprintf(stderr, "nvtrace: %s\n", nvt_names[i]);
	if (!strncmp(nvt_names[i], "nvmlInit", 8) || !strcmp(nvt_names[i], "nvmlShutdown"))
		return 0;
	return 3;
}

__attribute__((constructor)) static void nvt_load(void)
{
	const char *p = getenv("NVT_REAL");
	if (!p)
		return;
	void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "nvtrace: %s\n", dlerror());
		return;
	}
	for (int i = 0; i < NVT_N; i++)
		nvt_real[i] = dlsym(h, nvt_names[i]);
}

__attribute__((destructor)) static void nvt_dump(void)
{
	const char *o = getenv("NVT_OUT");
	FILE *f = o ? fopen(o, "a") : stderr;
	if (!f)
		return;
	for (int i = 0; i < NVT_N; i++)
		if (nvt_counts[i])
			fprintf(f, "%lu\t%s\n", nvt_counts[i], nvt_names[i]);
	if (f != stderr)
		fclose(f);
}

/* ---- export tables: every slot call logged with its integer arguments and result ---------- */
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#define NVT_TABLES 8
#define NVT_SLOTS 320
HIDDEN void *nvt_table_real[NVT_TABLES * NVT_SLOTS];
HIDDEN long nvt_args[6];
HIDDEN long nvt_ret;
extern HIDDEN void *nvt_slot_fns[NVT_TABLES * NVT_SLOTS];
static void *nvt_table_copy[NVT_TABLES][NVT_SLOTS];
static int nvt_ntables;

static void nvt_dump_mem(const char *what, long v)
{
	unsigned char b[96];
	struct iovec l = {b, sizeof b}, r = {(void *)v, sizeof b};
	if (v < 0x10000 || process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof b)
		return;
	fprintf(stderr, "    %s %#lx:", what, v);
	for (size_t i = 0; i < sizeof b; i++)
		fprintf(stderr, "%s%02x", i % 8 ? "" : " ", b[i]);
	fprintf(stderr, "\n");
}

static long nvt_saved[6];
HIDDEN void nvt_before(int k);
HIDDEN void nvt_before(int k)
{
	memcpy(nvt_saved, nvt_args, sizeof nvt_saved);
	fprintf(stderr, "nvtrace: table %d slot %d (%#lx, %#lx, %#lx, %#lx, %#lx, %#lx)\n", k / NVT_SLOTS, k % NVT_SLOTS,
		nvt_args[0], nvt_args[1], nvt_args[2], nvt_args[3], nvt_args[4], nvt_args[5]);
	for (int i = 0; i < 4; i++)
		nvt_dump_mem("in ", nvt_args[i]);
}
HIDDEN void nvt_after(int k, long r);
HIDDEN void nvt_after(int k, long r)
{
	fprintf(stderr, "nvtrace: table %d slot %d -> %ld\n", k / NVT_SLOTS, k % NVT_SLOTS, r);
	for (int i = 0; i < 4; i++)
		nvt_dump_mem("out", nvt_saved[i]);
}

int nvmlInternalGetExportTable(const void **table, const unsigned char *uuid);
int nvmlInternalGetExportTable(const void **table, const unsigned char *uuid)
{
	static int (*real)(const void **, const unsigned char *);
	const char *p = getenv("NVT_REAL");
	fprintf(stderr, "nvtrace: nvmlInternalGetExportTable uuid ");
	for (int i = 0; i < 16; i++)
		fprintf(stderr, "%02x", uuid ? uuid[i] : 0);
	fprintf(stderr, "\n");
	if (!p)
		return 3;
	if (!real)
		real = dlsym(dlopen(p, RTLD_NOW | RTLD_LOCAL), "nvmlInternalGetExportTable");
	int r = real(table, uuid);
	if (r || !*table || nvt_ntables == NVT_TABLES)
		return r;
	const uint64_t *t = *table;
	int t_i = nvt_ntables++;
	uint64_t n = t[0] / 8;
	fprintf(stderr, "nvtrace: table %d: first word %#lx\n", t_i, (unsigned long)t[0]);
	if (n < 1 || n > NVT_SLOTS)
		n = 1;
	nvt_table_copy[t_i][0] = (void *)t[0];
	for (uint64_t i = 1; i < n; i++) {
		Dl_info di;
		nvt_table_real[t_i * NVT_SLOTS + i] = (void *)t[i];
		int fn = t[i] && dladdr((void *)t[i], &di) && di.dli_fname && strstr(di.dli_fname, "nvidia-ml");
		nvt_table_copy[t_i][i] = fn ? nvt_slot_fns[t_i * NVT_SLOTS + i] : (void *)t[i];
		if (!fn)
			fprintf(stderr, "    slot %lu %#lx (not a function)\n", (unsigned long)i, (unsigned long)t[i]);
	}
	*table = nvt_table_copy[t_i];
	return r;
}
