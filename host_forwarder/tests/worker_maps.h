/* SPDX-License-Identifier: Apache-2.0 */
/* A forwarder's worker's memory, as /proc/<pid>/maps shows it (for guest_addresses.c). */
#ifndef WORKER_MAPS_H
#define WORKER_MAPS_H

#include <stdint.h>
#include <sys/types.h>

struct map {
	uint64_t lo, hi;
	char perms[8], path[256];
};

/* The worker of the forwarder fwd (its child), or 0. */
pid_t worker_find(pid_t fwd);
/* Read the worker's mappings (again). */
void worker_maps_read(pid_t worker);
/* The mapping of the worker's memory v lies in, if a value naming it would name the worker's
 * memory (own_region: this process's own address of the region, which is no secret); else NULL. */
const struct map *worker_memory(uint64_t v, const void *own_region);
/* The mapping of that file (and permissions, if given), or NULL. */
const struct map *worker_map_named(const char *path, const char *perms);
/* The first mapping whose path contains needle, with these permissions, or NULL. */
const struct map *worker_map_containing(const char *needle, const char *perms);
/* An address in no mapping of the worker: the middle of the widest gap below 2^47. */
uint64_t worker_unmapped_address(void);

#endif
