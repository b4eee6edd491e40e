/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images by content, shared by the workers serving one guest: an image
 * crosses the channel once; later loads of the same bytes (another process, a
 * reload) are read from the forwarder's image cache.  The hash is recomputed
 * over the received bytes, and the image checked (image_check.c), before an
 * image is kept, so what a guest claims cannot poison it.
 *
 * The cache is a private directory, /dev/shm/vmgpu-images-<pid>.XXXXXX: made by
 * mkdtemp (0700, a name no one can guess or make first), owned by the
 * forwarder's user, opened once by the supervisor and inherited by its workers,
 * which reach files only relative to that descriptor (O_NOFOLLOW, new files
 * O_EXCL, 0600).  /dev/shm because the workers are processes (not threads) and
 * images are read at memory speed; tmpfs pages are counted as the forwarder's
 * own shared memory.
 *
 * Bounded by VMGPU_IMAGE_CACHE_MIB (default 1024): one worker at a time, under
 * an flock of the directory's lock file, measures the directory and adds an
 * image only if it fits; past the bound, new images are simply not kept.
 *
 * The supervisor holds a shared flock on the directory for its life (and its
 * workers, through the descriptor they inherit, for theirs).  A forwarder that
 * starts removes the caches of forwarders that are gone: directories of its
 * name pattern, of its own user, not links, whose pid is dead and whose lock
 * nobody holds.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vg_hash.h"
#include "forwarder.h"
#include "images.h"
#include "proc.h"
#include "region_file.h"
#include "log.h"

#define LOCK_NAME ".lock"

static int cache_fd = -1; /* the directory; -1: no cache */

struct vh_image {
	uint64_t size;
	uint8_t *bytes; /* size + VH_IMAGE_GUARD, the guard zeroed */
};

static void name_of(uint64_t size, const uint64_t h[2], char *out, size_t len)
{
	snprintf(out, len, "%016llx-%016llx-%llu", (unsigned long long)h[0], (unsigned long long)h[1],
		 (unsigned long long)size);
}

const uint8_t *vh_image_bytes(const struct vh_image *img)
{
	return img->bytes;
}

struct vh_image *vh_image_find(struct vh_fwd *f, uint64_t size, const uint64_t hash[2])
{
	(void)f;
	if (cache_fd < 0)
		return NULL;
	char name[80];
	name_of(size, hash, name, sizeof name);
	int fd = openat(cache_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	struct vh_image *img = NULL;
	uint8_t *b = NULL;
	uint64_t got = 0;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
		goto out;
	img = calloc(1, sizeof *img);
	b = malloc(size + VH_IMAGE_GUARD);
	while (img && b && got < size) {
		ssize_t n = read(fd, b + got, size - got);
		if (n <= 0)
			break;
		got += (uint64_t)n;
	}
out:
	close(fd);
	if (!img || !b || got != size) {
		free(img);
		free(b);
		return NULL;
	}
	memset(b + size, 0, VH_IMAGE_GUARD);
	img->size = size;
	img->bytes = b;
	return img;
}

/* The bytes the cache holds, every file counted; stale temporary files (a writer that died
 * mid-write: writers hold the lock) are removed.  Called with the lock held. */
static uint64_t cache_bytes(void)
{
	int fd = openat(cache_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return UINT64_MAX;
	}
	uint64_t total = 0;
	struct dirent *e;
	struct stat st;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		size_t len = strlen(e->d_name);
		if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) {
			unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		if (!fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW))
			total += (uint64_t)st.st_size;
	}
	closedir(d);
	return total;
}

static uint64_t cache_limit(void)
{
	const char *e = getenv("VMGPU_IMAGE_CACHE_MIB");
	long long mib = e ? atoll(e) : 1024;
	return (uint64_t)(mib > 0 ? mib : 0) << 20;
}

/* Keep an image's bytes under name, if it fits: one worker at a time measures and adds. */
static void keep(const uint8_t *bytes, uint64_t size, const char *name)
{
	int lock = openat(cache_fd, LOCK_NAME, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (lock < 0)
		return;
	if (flock(lock, LOCK_EX) != 0) {
		close(lock);
		return;
	}
	struct stat st;
	uint64_t used = cache_bytes();
	if (fstatat(cache_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 || used > cache_limit() ||
	    size > cache_limit() - used)
		goto out; /* kept already, or it does not fit */
	char tmp[96];
	snprintf(tmp, sizeof tmp, "%s.tmp", name);
	int fd = openat(cache_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		goto out;
	uint64_t put = 0;
	while (put < size) {
		ssize_t n = write(fd, bytes + put, size - put);
		if (n <= 0)
			break;
		put += (uint64_t)n;
	}
	close(fd);
	/* complete files only, by rename */
	if (put != size || renameat(cache_fd, tmp, cache_fd, name) != 0)
		unlinkat(cache_fd, tmp, 0);
out:
	flock(lock, LOCK_UN);
	close(lock);
}

struct vh_image *vh_image_add(struct vh_fwd *f, uint8_t *bytes, uint64_t size, const uint64_t claimed[2])
{
	(void)f;
	uint64_t h[2];
	if (cache_fd < 0)
		return NULL;
	vg_hash128(bytes, size, h);
	if (h[0] != claimed[0] || h[1] != claimed[1])
		return NULL; /* the guest's claim was false: load it, keep nothing */
	struct vh_image *img = calloc(1, sizeof *img);
	if (!img)
		return NULL;
	img->size = size;
	img->bytes = bytes;
	char name[80];
	name_of(size, h, name, sizeof name);
	keep(bytes, size, name);
	return img;
}

void vh_image_put(struct vh_fwd *f, struct vh_image *img)
{
	(void)f;
	if (!img)
		return;
	free(img->bytes);
	free(img);
}

/* ---- the cache directory's life ----------------------------------------------------- */

/* Empty the directory fd (closed here) of its files and, to a depth of 8, of its directories (the
 * driver's JIT cache is a tree, 3 deep): never through a link, never into a directory of someone
 * else's or on another file system (a mount). */
static void remove_tree(int fd, int depth)
{
	struct stat top;
	DIR *d = fstat(fd, &top) ? NULL : fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	struct dirent *e;
	struct stat st;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue;
		if (S_ISDIR(st.st_mode) && depth < 8 && st.st_uid == geteuid() && st.st_dev == top.st_dev) {
			int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				remove_tree(sub, depth + 1);
			unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
		} else if (!S_ISDIR(st.st_mode)) {
			unlinkat(dirfd(d), e->d_name, 0);
		}
	}
	closedir(d); /* and its lock, if it was held */
}

/* Empty directory fd (taken: remove_tree), then remove its name in parent. */
static void remove_dir(int parent, const char *name, int fd)
{
	remove_tree(fd, 0);
	if (unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
		vh_log("the module image cache %s/%s is left: %s", VH_IMAGE_CACHE_PARENT, name, strerror(errno));
}

/* The pid in a cache directory's name ("vmgpu-images-<pid>.XXXXXX"), or -1. */
static long name_pid(const char *name)
{
	size_t plen = strlen(VH_IMAGE_CACHE_PREFIX);
	if (strncmp(name, VH_IMAGE_CACHE_PREFIX, plen))
		return -1;
	char *end;
	errno = 0;
	long pid = strtol(name + plen, &end, 10);
	/* (a forwarder before mkdtemp named it "vmgpu-images-<pid>") */
	if (errno || end == name + plen || pid <= 0 || (*end && (*end != '.' || strlen(end + 1) != 6)))
		return -1;
	return pid;
}

/* Remove the caches that forwarders which are gone left behind (killed, crashed); how many such
 * caches are left because their lock is still held (a worker of a forwarder killed is still
 * ending: one holding a GPU context can take seconds in the driver's teardown). */
static int sweep(int parent)
{
	int fd = openat(parent, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	int ending = 0;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	struct dirent *e;
	struct stat st, st2;
	while ((e = readdir(d))) {
		long pid = name_pid(e->d_name);
		if (pid < 0 || pid == (long)getpid())
			continue;
		/* ours by name, by owner, a real directory; its forwarder gone */
		if (fstatat(parent, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode) ||
		    st.st_uid != geteuid())
			continue;
		/* (a forwarder killed but not yet reaped by its parent, vmgpud, is gone too: its lock,
		 * looked at next, is free once its workers have ended) */
		if (!vh_proc_gone((uint32_t)pid))
			continue;
		int dfd = openat(parent, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd < 0)
			continue;
		/* the same directory, and no worker of it still alive (they hold its lock) */
		if (fstat(dfd, &st2) || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev || st2.st_uid != geteuid()) {
			close(dfd);
			continue;
		}
		if (flock(dfd, LOCK_EX | LOCK_NB) != 0) {
			ending += errno == EWOULDBLOCK;
			close(dfd);
			continue;
		}
		vh_log("removing the module image cache %s/%s of forwarder %ld, which is gone", VH_IMAGE_CACHE_PARENT,
		       e->d_name, pid);
		remove_dir(parent, e->d_name, dfd);
	}
	closedir(d);
	return ending;
}

/* While caches of forwarders that are gone are held by workers still ending: when to stop looking. */
static uint64_t ending_until;

/* One look at the parent: the caches of forwarders that are gone removed; how many are still held. */
static int sweep_parent(void)
{
	int parent = open(VH_IMAGE_CACHE_PARENT, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int left = parent >= 0 ? sweep(parent) : 0;
	if (parent >= 0)
		close(parent);
	return left;
}

void vh_images_sweep(void)
{
	if (sweep_parent())
		ending_until = vh_real_clock.now_ns() + VH_SWEEP_PENDING_S * 1000000000ull; /* (looked at again) */
}

int vh_images_sweep_pending(void)
{
	if (!ending_until)
		return 0;
	int left = sweep_parent();
	int late = vh_real_clock.now_ns() >= ending_until;
	if (left && late)
		vh_log("%d module image cache(s) of forwarders that are gone are still held after %d s: left",
		       left, VH_SWEEP_PENDING_S);
	if (!left || late)
		ending_until = 0;
	return ending_until != 0;
}

void vh_images_open(struct vh_fwd *f)
{
	f->image_dir[0] = '\0';
	char path[sizeof f->image_dir];
	snprintf(path, sizeof path, "%s/%s%d.XXXXXX", VH_IMAGE_CACHE_PARENT, VH_IMAGE_CACHE_PREFIX, (int)getpid());
	if (!mkdtemp(path)) {
		vh_log("no module image cache (nor JIT cache): cannot make %s: %s", path, strerror(errno));
		return;
	}
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	int lock = -1;
	if (fd < 0 || fstat(fd, &st) || st.st_uid != geteuid() || (st.st_mode & 077) || flock(fd, LOCK_SH) ||
	    (lock = openat(fd, LOCK_NAME, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		vh_log("no module image cache (nor JIT cache): %s is not a private directory of this user", path);
		if (fd >= 0)
			close(fd);
		rmdir(path);
		return;
	}
	close(lock);
	cache_fd = fd;
	snprintf(f->image_dir, sizeof f->image_dir, "%s", path);
}

void vh_images_jit_cache(const struct vh_fwd *f)
{
	char path[sizeof f->image_dir + 8];
	if (f->image_dir[0] && snprintf(path, sizeof path, "%s/jit", f->image_dir) < (int)sizeof path) {
		setenv("CUDA_CACHE_PATH", path, 1);
		setenv("CUDA_CACHE_MAXSIZE", VH_JIT_CACHE_MAX, 1);
		unsetenv("CUDA_CACHE_DISABLE");
	} else {
		setenv("CUDA_CACHE_DISABLE", "1", 1);
	}
}

void vh_images_close(struct vh_fwd *f)
{
	if (cache_fd < 0)
		return;
	int parent = open(VH_IMAGE_CACHE_PARENT, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	const char *slash = strrchr(f->image_dir, '/');
	if (parent >= 0 && slash) {
		int fd = dup(cache_fd);
		if (fd >= 0)
			remove_dir(parent, slash + 1, fd);
	}
	if (parent >= 0)
		close(parent);
	close(cache_fd);
	cache_fd = -1;
	f->image_dir[0] = '\0';
}
