/* SPDX-License-Identifier: Apache-2.0 */
/* A host process as /proc shows it (proc.c). */
#ifndef VH_PROC_H
#define VH_PROC_H

#include <stdint.h>

/* Its state letter ('R', 'S', 'Z', ...) and parent from /proc/PID/stat; either may be NULL.
 * 0, or -1 if it cannot be read (gone, or another pid namespace). */
int vh_proc_stat(uint32_t pid, char *state, int *ppid);

#endif
