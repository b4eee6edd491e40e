/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images by content, shared by the workers serving one guest: an image
 * crosses the channel once; later loads of the same bytes (another process, a
 * reload) are read from the forwarder's image directory.  The hash is recomputed
 * over the received bytes before an image is kept, so what a guest claims cannot
 * poison it.  Bounded by VMGPU_IMAGE_CACHE_MIB (default 1024): past it, new
 * images are simply not kept.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vg_hash.h"
#include "vh_dispatch.h"

struct vh_image {
	uint64_t size;
	uint8_t *bytes; /* size + 1, the last a NUL */
};

static void path_of(const struct vh_fwd *f, uint64_t size, const uint64_t h[2], char *out, size_t len)
{
	snprintf(out, len, "%s/%016llx-%016llx-%llu", f->image_dir, (unsigned long long)h[0],
		 (unsigned long long)h[1], (unsigned long long)size);
}

const uint8_t *vh_image_bytes(const struct vh_image *img)
{
	return img->bytes;
}

struct vh_image *vh_image_find(struct vh_fwd *f, uint64_t size, const uint64_t hash[2])
{
	if (!f->image_dir[0])
		return NULL;
	char path[512];
	path_of(f, size, hash, path, sizeof path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct vh_image *img = calloc(1, sizeof *img);
	uint8_t *b = malloc(size + 1);
	uint64_t got = 0;
	while (img && b && got < size) {
		ssize_t n = read(fd, b + got, size - got);
		if (n <= 0)
			break;
		got += (uint64_t)n;
	}
	close(fd);
	if (!img || !b || got != size) {
		free(img);
		free(b);
		return NULL;
	}
	b[size] = 0;
	img->size = size;
	img->bytes = b;
	return img;
}

static uint64_t dir_bytes(const char *dir)
{
	uint64_t total = 0;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	struct dirent *e;
	struct stat st;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && !fstatat(dirfd(d), e->d_name, &st, 0))
			total += (uint64_t)st.st_size;
	closedir(d);
	return total;
}

struct vh_image *vh_image_add(struct vh_fwd *f, uint8_t *bytes, uint64_t size, const uint64_t claimed[2])
{
	uint64_t h[2];
	if (!f->image_dir[0])
		return NULL;
	vg_hash128(bytes, size, h);
	if (h[0] != claimed[0] || h[1] != claimed[1])
		return NULL; /* the guest's claim was false: load it, keep nothing */
	const char *e = getenv("VMGPU_IMAGE_CACHE_MIB");
	uint64_t limit = (e && atoll(e) >= 0 ? (uint64_t)atoll(e) : 1024) << 20;
	struct vh_image *img = calloc(1, sizeof *img);
	if (!img)
		return NULL;
	img->size = size;
	img->bytes = bytes;
	if (dir_bytes(f->image_dir) + size > limit)
		return img;
	char path[512], tmp[600];
	path_of(f, size, h, path, sizeof path);
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return img;
	uint64_t put = 0;
	while (put < size) {
		ssize_t n = write(fd, bytes + put, size - put);
		if (n <= 0)
			break;
		put += (uint64_t)n;
	}
	close(fd);
	/* complete files only, by rename */
	if (put != size || rename(tmp, path) != 0)
		unlink(tmp);
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
