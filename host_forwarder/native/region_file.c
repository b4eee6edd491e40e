/* SPDX-License-Identifier: Apache-2.0 */
/* The forwarder's files on the host, opened so that no other local user can slip one in: see
 * region_file.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <vmgpu/stats_abi.h>

#include "region_file.h"
#include "log.h"
#include "proc.h"

/* Is st a regular file of ours, with one name, that no one else may read or write? */
static int ours(const struct stat *st, const char *path, mode_t others)
{
	if (!S_ISREG(st->st_mode)) {
		vh_log("%s is not a regular file: refusing it (remove it)", path);
		errno = EINVAL;
		return 0;
	}
	if (st->st_uid != geteuid()) {
		vh_log("%s belongs to uid %u, not to this forwarder's user (uid %u): refusing a file someone else "
		       "made (remove it; vmgpu makes its own)",
		       path, (unsigned)st->st_uid, (unsigned)geteuid());
		errno = EPERM;
		return 0;
	}
	if (st->st_nlink != 1) {
		vh_log("%s has %u names (hard links): refusing it (remove it)", path, (unsigned)st->st_nlink);
		errno = EPERM;
		return 0;
	}
	if (st->st_mode & others) {
		vh_log("%s has mode %04o, open to other users: refusing it (remove it)", path,
		       (unsigned)(st->st_mode & 07777));
		errno = EPERM;
		return 0;
	}
	return 1;
}

static int refuse_link(const char *path)
{
	if (errno == ELOOP)
		vh_log("%s is a symbolic link: refusing to follow it (remove it)", path);
	return -1;
}

int vh_open_ours(const char *path, int flags)
{
	int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	if (fd < 0)
		return refuse_link(path);
	struct stat st;
	if (fstat(fd, &st) != 0 || !ours(&st, path, 0)) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

int vh_fresh_file(const char *path, uint64_t size, const char *what)
{
	char dir[4096], tmp[4096 + 64];
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, sizeof dir, ".");
	else if (slash == path)
		snprintf(dir, sizeof dir, "/");
	else
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
	int fd = -1;
	for (int tries = 0; fd < 0 && tries < 16; tries++) {
		uint32_t r = 0;
		if (getrandom(&r, sizeof r, 0) != sizeof r)
			r = (uint32_t)tries * 2654435761u;
		snprintf(tmp, sizeof tmp, "%s/.vmgpu-new-%d-%08x", dir, (int)getpid(), r);
		fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST) {
			vh_log("cannot create a %s in %s: %s", what, dir, strerror(errno));
			return -1;
		}
	}
	if (fd < 0) {
		vh_log("cannot create a %s in %s: every fresh name was taken", what, dir);
		return -1;
	}
	/* 0600 whatever the umask: others get access only by the ACL entries vmgpu adds for the guest */
	if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)size) != 0 || rename(tmp, path) != 0) {
		int e = errno;
		vh_log("cannot create %s %s: %s", what, path, strerror(e));
		unlink(tmp);
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

int vh_region_open(const char *path, uint64_t create)
{
	if (!create) /* no mode bits checked: the ACL mask shows in group's when guests are given access */
		return vh_open_ours(path, O_RDWR);
	return vh_fresh_file(path, create, "region");
}

int vh_private_dir(const char *path)
{
	if (mkdir(path, 0700) != 0 && errno != EEXIST) {
		vh_log("cannot make the directory %s: %s", path, strerror(errno));
		return -1;
	}
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (e == ELOOP || e == ENOTDIR)
			vh_log("%s is not a directory (a symbolic link or a file): refusing it (remove it)", path);
		else
			vh_log("cannot open the directory %s: %s", path, strerror(e));
		errno = e;
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
		vh_log("the directory %s belongs to uid %u with mode %04o: refusing it; it must be this user's "
		       "(uid %u) and writable by no one else (remove it: vmgpu makes it 0700)",
		       path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

int vh_private_file(int dirfd, const char *dir, const char *name)
{
	char shown[4096 + 256];
	snprintf(shown, sizeof shown, "%s/%s", dir, name);
	int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0 || errno != EEXIST)
		return fd >= 0 ? fd : refuse_link(shown);
	fd = openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return refuse_link(shown);
	struct stat st;
	if (fstat(fd, &st) != 0 || !ours(&st, shown, 077)) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* "cuda.shm.<first>.<pid>.<last>" (in hex) at name; async-signal-safe. */
static void driver_file_name(char name[64], unsigned first, unsigned pid, unsigned last)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned parts[] = {first, pid, last};
	char *p = name;
	for (const char *c = "cuda.shm"; *c; c++)
		*p++ = *c;
	for (int i = 0; i < 3; i++) {
		char rev[8];
		int n = 0;
		unsigned v = parts[i];
		do
			rev[n++] = hex[v & 15];
		while ((v >>= 4) && n < 8);
		*p++ = '.';
		while (n)
			*p++ = rev[--n];
	}
	*p = 0;
}

#define VH_STR_(x) #x
#define VH_STR(x) VH_STR_(x)

/* The loop of vh_driver_files_remove; what cannot be removed is logged unless quiet (in a signal
 * handler, where only async-signal-safe calls are made); a file whose status last changed before
 * since_ns, or at or after before_ns where that is not 0, is left (CLOCK_REALTIME). */
static int remove_driver_files(pid_t pid, int quiet, uint64_t since_ns, uint64_t before_ns)
{
	int fd = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		static int said;
		if (!quiet && !said++)
			vh_log("cannot open /dev/shm (%s): files the CUDA driver leaves there for ended workers are not "
			       "removed",
			       strerror(errno));
		return 0;
	}
	int n = 0;
	for (unsigned first = 0; first < VH_DRIVER_FILES_FIRST; first++)
		for (unsigned last = 0; last < VH_DRIVER_FILES_LAST; last++) {
			char name[64];
			struct stat st;
			driver_file_name(name, first, (unsigned)pid, last);
			if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
			    st.st_uid != geteuid())
				continue;
			uint64_t changed = (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec;
			if (changed < since_ns || (before_ns && changed >= before_ns))
				continue;
			if (unlinkat(fd, name, 0) == 0)
				n++;
			else if (!quiet)
				vh_log("cannot remove /dev/shm/%s, which the CUDA driver left for process %d: %s", name,
				       (int)pid, strerror(errno));
		}
	close(fd);
	return n;
}

int vh_driver_files_remove(pid_t pid)
{
	return remove_driver_files(pid, 0, 0, 0);
}

int vh_driver_files_remove_mine(void)
{
	int e = errno; /* (a handler's calls must not change what the interrupted code sees) */
	int n = remove_driver_files(getpid(), 1, 0, 0);
	errno = e;
	return n;
}

static uint64_t clock_ns(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

uint64_t vh_coarse_realtime_ns(void)
{
	return clock_ns(CLOCK_REALTIME_COARSE);
}

/* One look at an earlier forwarder's worker: how many of its files were removed, or
 * VH_SWEEP_PID_IN_USE / VH_SWEEP_STILL_ENDING (nothing removed). */
static int sweep(pid_t pid, uint64_t forked_ns, uint64_t started)
{
	if (pid <= 0)
		return VH_SWEEP_PID_IN_USE;
	/* (a file the driver makes for a later holder of the pid is made after this look) */
	uint64_t looked = vh_coarse_realtime_ns();
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return remove_driver_files(pid, 0, forked_ns, looked);
	uint64_t now_started;
	if (vh_proc_started((uint32_t)pid, &now_started) == 0 && started && now_started != started)
		return VH_SWEEP_PID_IN_USE;
	return VH_SWEEP_STILL_ENDING;
}

/* Workers of an earlier forwarder still ending when this one started: looked at again from the
 * supervisor's loop until they end, for at most VH_SWEEP_PENDING_S (region_file.h). */
static struct {
	pid_t pid;
	uint64_t forked_ns, started;
} pending[VMGPU_STATS_WORKERS];
static uint32_t npending;
static uint64_t pending_until;

/* The log line of a worker whose files are left (why: what sweep answered). */
static void left(pid_t pid, int why)
{
	vh_log("worker %d of an earlier forwarder: %s, so what the CUDA driver may have left in /dev/shm for it "
	       "is not removed",
	       (int)pid,
	       why == VH_SWEEP_PID_IN_USE ? "another process has its pid now"
					  : "it had not ended after " VH_STR(VH_SWEEP_PENDING_S) " s");
}

int vh_driver_files_sweep(pid_t pid, uint64_t forked_ns, uint64_t started)
{
	int n = sweep(pid, forked_ns, started);
	if (n == VH_SWEEP_PID_IN_USE)
		left(pid, n);
	else if (n == VH_SWEEP_STILL_ENDING && npending < VMGPU_STATS_WORKERS) {
		pending[npending].pid = pid;
		pending[npending].forked_ns = forked_ns;
		pending[npending++].started = started;
		pending_until = clock_ns(CLOCK_MONOTONIC) + VH_SWEEP_PENDING_S * 1000000000ull;
	}
	return n;
}

int vh_driver_files_sweep_pending(void)
{
	int late = npending && clock_ns(CLOCK_MONOTONIC) >= pending_until;
	for (uint32_t i = 0; i < npending;) {
		int n = sweep(pending[i].pid, pending[i].forked_ns, pending[i].started);
		if (n == VH_SWEEP_STILL_ENDING && !late) {
			i++;
			continue;
		}
		if (n >= 0)
			vh_log("worker %d of an earlier forwarder has ended: removed %d file(s) the CUDA driver left "
			       "in /dev/shm for it",
			       (int)pending[i].pid, n);
		else
			left(pending[i].pid, n);
		pending[i] = pending[--npending];
	}
	return (int)npending;
}
