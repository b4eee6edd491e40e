/* SPDX-License-Identifier: Apache-2.0 */
/* A host process as /proc shows it (proc.c). */
#ifndef VH_PROC_H
#define VH_PROC_H

#include <stdint.h>

/* Its state letter ('R', 'S', 'Z', ...) and parent from /proc/PID/stat; either may be NULL.
 * 0, or -1 if it cannot be read (gone, or another pid namespace). */
int vh_proc_stat(uint32_t pid, char *state, int *ppid);

/* Whether no process has the pid, or only a zombie its parent has not yet reaped (killed, it holds
 * nothing of its own any more): 1 or 0. */
int vh_proc_gone(uint32_t pid);

/* When it started, in clock ticks after boot (/proc/PID/stat's field 22): with the pid, which
 * process it is (a pid used again has another).  0, or -1 as above. */
int vh_proc_started(uint32_t pid, uint64_t *ticks);

/* This boot's id (/proc/sys/kernel/random/boot_id) into out, NUL-padded: 0, or -1 (out all 0). */
int vh_boot_id(char out[48]);

#endif
