/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forwarder's files on the host: the guest's region and the GPUs' scheduler pages.  Any local
 * user may be hostile (DESIGN.md, the trust boundary): nothing here follows a symbolic link, opens
 * a file someone else made, or truncates an existing file through a path.
 *
 * Each function logs why it refused (vh_log) and returns -1 with errno set.
 */
#ifndef VH_REGION_FILE_H
#define VH_REGION_FILE_H

#include <stdint.h>
#include <sys/types.h>

/* The region at path, open for reading and writing.
 * create != 0: a new region file of that many bytes, mode 0600, made under a fresh name beside path
 *   (O_CREAT|O_EXCL|O_NOFOLLOW) and renamed over path: whatever was at path (a stale region, a
 *   link someone planted) is replaced, never written through.  The caller formats it.
 * create == 0: an existing region: a regular file with one link, owned by this process's user
 *   (vmgpu gives guests access by ACL entries, so the owner stays root), not a link. */
int vh_region_open(const char *path, uint64_t create);

/* path opened with flags (O_CREAT: made 0600), never through a link, and only if it is a
 * regular file of this process's user with one link (its mode is not checked). */
int vh_open_ours(const char *path, int flags);

/* A directory only this process's user can change: made (0700) if missing; refused if it is a
 * link, not a directory, not ours, or writable by group or others.  Returns an O_DIRECTORY fd. */
int vh_private_dir(const char *path);

/* name in the private directory dirfd (shown as dir in messages), open for reading and writing:
 * made (mode 0600, empty) if missing, with O_EXCL; an existing one must be a regular file of ours
 * with one link, not readable or writable by anyone else. */
int vh_private_file(int dirfd, const char *dir, const char *name);

/* The files the CUDA driver made in /dev/shm for process pid and left there: its interprocess
 * events' file (`cuda.shm.0.<pid in hex>.1` on an H100, driver 580), which the driver removes with
 * the process's last such event or its context but which a process that is killed leaves behind
 * (root's, 80 KiB).  A guest that could have its workers killed holding one (by truncating its
 * region, which ends them all) would fill the host's /dev/shm a file at a time.  The names are
 * tried, not searched for (`cuda.shm.<a>.<pid>.<b>`, a and b in hex below the bounds here), so that
 * what another user puts in /dev/shm costs nothing; a name is removed only if it is a regular file
 * of this process's user (unlinked by name, never through a link).  pid must be an ended child not
 * yet reaped, so that no other process has the pid meanwhile, and the driver names files by the pid
 * as this process sees it (the forwarder runs in the pid namespace of the /dev/shm it uses).
 * Returns how many were removed. */
#define VH_DRIVER_FILES_FIRST 8
#define VH_DRIVER_FILES_LAST 64
int vh_driver_files_remove(pid_t pid);

/* The same for this process's own files, from a signal handler (async-signal-safe, nothing
 * logged): a worker whose supervisor is gone removes them itself as it ends (worker.c), since no
 * one reaps it who would. */
int vh_driver_files_remove_mine(void);

/* The same for a worker of an earlier forwarder, killed with it at one stroke (a cgroup's kill:
 * nobody was left to remove them), named by the statistics page it left (main.c): pid, when it
 * was forked (forked_ns, vh_coarse_realtime_ns before the fork) and started (clock ticks after
 * boot, 0 if unknown).  pid is no child of this process, so its files are removed only once no
 * process has the pid, and only those made since the fork and before that was seen (files under
 * the name made outside the worker's life are another process's).  One whose pid another process
 * has now is logged and left; one still ending (a worker killed holding a GPU context can take
 * seconds in the driver's teardown) is looked at again by vh_driver_files_sweep_pending, which the
 * supervisor's loop calls, until it has ended, for two minutes at most, each outcome logged.
 * Returns how many were removed, or one of these (nothing removed yet): */
#define VH_SWEEP_PENDING_S 120 /* how long what an earlier forwarder's workers still ending hold is
				  * looked for again (their driver files here, their image cache:
				  * images.c) */
#define VH_SWEEP_PID_IN_USE (-1)   /* another process has the pid */
#define VH_SWEEP_STILL_ENDING (-2) /* the worker itself (that pid, started then) has not ended yet */
int vh_driver_files_sweep(pid_t pid, uint64_t forked_ns, uint64_t started);
int vh_driver_files_sweep_pending(void); /* how many workers are still looked for */

/* CLOCK_REALTIME_COARSE in ns: the clock a file's times are taken from. */
uint64_t vh_coarse_realtime_ns(void);

/* A file at path made afresh in one step, `size` bytes, 0600, this user's: made under a fresh
 * name beside it (O_EXCL, never through a link) and renamed over whatever is at path, so a process
 * that still has the old file keeps it to itself.  The descriptor, or -1 after logging (what names
 * the file in the log). */
int vh_fresh_file(const char *path, uint64_t size, const char *what);

#endif
