/* SPDX-License-Identifier: Apache-2.0 */
/* Where a guest finds its vmgpu region: $VMGPU_REGION, else VG_REGION_LINK (made by the
 * guest agent in a VM, bind-mounted by the container runtime), else an ivshmem PCI device
 * (1af4:1110) whose BAR2 starts with the region magic.  Shared by the guest library, the
 * guest agent and vmgpu-smi (header only). */
#ifndef VMGPU_IVSHMEM_H
#define VMGPU_IVSHMEM_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmgpu/shm.h"

#define VG_PCI_DEVICES "/sys/bus/pci/devices"
#define VG_REGION_LINK "/dev/vmgpu/region"

static inline int vg_read_small(const char *path, char *buf, size_t n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t r = read(fd, buf, n - 1);
	close(fd);
	if (r < 0)
		return -1;
	buf[r] = 0;
	return 0;
}

static inline int vg_is_ivshmem(const char *dev)
{
	char p[512], b[32];
	snprintf(p, sizeof p, "%s/vendor", dev);
	if (vg_read_small(p, b, sizeof b) || strncmp(b, "0x1af4", 6))
		return 0;
	snprintf(p, sizeof p, "%s/device", dev);
	return !vg_read_small(p, b, sizeof b) && !strncmp(b, "0x1110", 6);
}

/* Does this BAR2 file hold a vmgpu region (the host formatted it)? */
static inline int vg_has_region_magic(const char *resource2)
{
	int fd = open(resource2, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return 0;
	uint64_t magic;
	memcpy(&magic, m, sizeof magic);
	munmap(m, 4096);
	return magic == VMGPU_SHM_MAGIC;
}

/* Calls fn(device dir, resource2 path, ctx) for every ivshmem device until it returns
 * nonzero; returns that value, or 0. */
static inline int vg_each_ivshmem(int (*fn)(const char *dev, const char *res2, void *ctx), void *ctx)
{
	DIR *d = opendir(VG_PCI_DEVICES);
	if (!d)
		return 0;
	struct dirent *e;
	int r = 0;
	while (!r && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char dev[300], res2[320];
		snprintf(dev, sizeof dev, VG_PCI_DEVICES "/%s", e->d_name);
		if (!vg_is_ivshmem(dev))
			continue;
		snprintf(res2, sizeof res2, "%s/resource2", dev);
		r = fn(dev, res2, ctx);
	}
	closedir(d);
	return r;
}

struct vg_found {
	char *buf;
	size_t len;
};

static inline int vg_take_region(const char *dev, const char *res2, void *ctx)
{
	(void)dev;
	struct vg_found *f = ctx;
	if (!vg_has_region_magic(res2))
		return 0;
	snprintf(f->buf, f->len, "%s", res2);
	return 1;
}

/* The region file this guest process should map (see the top of this file). */
static inline const char *vg_region_path(char *buf, size_t len)
{
	const char *env = getenv("VMGPU_REGION");
	if (env && *env) {
		snprintf(buf, len, strchr(env, '/') ? "%s" : "/dev/shm/%s", env);
		return buf;
	}
	snprintf(buf, len, "%s", VG_REGION_LINK);
	if (access(buf, F_OK) == 0)
		return buf;
	/* a VM without the agent: the ivshmem device itself, if this process may map it */
	struct vg_found f = {buf, len};
	vg_each_ivshmem(vg_take_region, &f);
	return buf;
}

#endif
