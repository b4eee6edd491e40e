/* SPDX-License-Identifier: Apache-2.0 */
/* A forwarder's worker's memory (worker_maps.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker_maps.h"

static struct map maps[4096];
static int nmaps;

pid_t worker_find(pid_t fwd)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = 0;
	while (d && (e = readdir(d))) {
		char p[300], buf[512];
		snprintf(p, sizeof p, "/proc/%s/stat", e->d_name);
		FILE *f = fopen(p, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		int ppid = 0;
		char st;
		if (rp && sscanf(rp + 2, "%c %d", &st, &ppid) == 2 && ppid == fwd)
			found = atoi(e->d_name);
	}
	if (d)
		closedir(d);
	return found;
}

void worker_maps_read(pid_t worker)
{
	char p[64], line[600];
	snprintf(p, sizeof p, "/proc/%d/maps", (int)worker);
	FILE *f = fopen(p, "r");
	nmaps = 0;
	while (f && fgets(line, sizeof line, f) && nmaps < 4096) {
		struct map *m = &maps[nmaps];
		m->path[0] = 0;
		unsigned long long lo, hi;
		if (sscanf(line, "%llx-%llx %7s %*s %*s %*s %255s", &lo, &hi, m->perms, m->path) >= 3) {
			m->lo = lo;
			m->hi = hi;
			nmaps++;
		}
	}
	if (f)
		fclose(f);
}

/* The worker's memory a value could name: mappings it can read or write, but not the address
 * sanitizer's shadow (so large no host object is in it) and not the region's mapping at this
 * process's own address (the guest's own pointer, not a secret of the worker). */
const struct map *worker_memory(uint64_t v, const void *own_region)
{
	for (int i = 0; i < nmaps; i++) {
		const struct map *m = &maps[i];
		if (v < m->lo || v >= m->hi)
			continue;
		if (!strchr(m->perms, 'r') && !strchr(m->perms, 'w'))
			continue;
		if (m->hi - m->lo >= (1ull << 40) || m->lo == 0x7fff8000ull)
			continue;
		if (m->lo == (uint64_t)(uintptr_t)own_region)
			continue;
		return m;
	}
	return NULL;
}

const struct map *worker_map_named(const char *path, const char *perms)
{
	for (int i = 0; i < nmaps; i++)
		if (!strcmp(maps[i].path, path) && (!perms || !strcmp(maps[i].perms, perms)))
			return &maps[i];
	return NULL;
}

const struct map *worker_map_containing(const char *needle, const char *perms)
{
	for (int i = 0; i < nmaps; i++)
		if (strstr(maps[i].path, needle) && !strcmp(maps[i].perms, perms))
			return &maps[i];
	return NULL;
}

/* An address in no mapping of the worker: the middle of the widest gap below 2^47. */
uint64_t worker_unmapped_address(void)
{
	uint64_t best = 0, best_len = 0;
	for (int i = 0; i + 1 < nmaps; i++) {
		uint64_t lo = maps[i].hi, hi = maps[i + 1].lo;
		if (hi > lo && hi - lo > best_len && hi < (1ull << 47)) {
			best_len = hi - lo;
			best = lo + (hi - lo) / 2;
		}
	}
	return best & ~0xFFFull;
}
