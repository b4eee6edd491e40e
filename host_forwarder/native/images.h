/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images on the host: the check every image passes before the driver
 * sees it (image_check.c) and the image cache's life (images.c).
 */
#ifndef VH_IMAGES_H
#define VH_IMAGES_H

#include <stddef.h>
#include <stdint.h>

struct vh_fwd;

/* Zero bytes after every image the driver is given: a reader that runs past what was
 * checked (a record's size field, a string, the next container's header) meets zeros
 * in memory we own, never another allocation.  64 KiB covers the largest size a
 * 16-bit field can declare. */
#define VH_IMAGE_GUARD (64u << 10)

/* Check a module image of n bytes as the driver will read it: a cubin (64-bit ELF:
 * header, section and program header tables, every section, string and symbol table,
 * relocation, note and .nv.info record within the bytes), a fatbin (back-to-back
 * containers, each entry's header and sizes, compressed sizes declared sanely,
 * uncompressed ELF and PTX entries checked as such), or PTX (text with its NUL within
 * the bytes).  0 if the image may be given to the driver; -1 with a sentence in why
 * (the caller answers CUDA_ERROR_INVALID_IMAGE). */
int vh_image_check(const uint8_t *p, uint64_t n, char *why, size_t whylen);
/* What an image's first bytes say it is: a fatbin container, an ELF (cubin), or anything else
 * (which the driver reads as PTX text). */
enum vh_image_kind { VH_IMAGE_OTHER, VH_IMAGE_FATBIN, VH_IMAGE_ELF };
enum vh_image_kind vh_image_kind(const uint8_t *p, uint64_t n);

/* The cache directory: made (0700, private, under /dev/shm) by the supervisor before it
 * forks workers, after removing the directories dead forwarders left behind; workers
 * inherit it.  Failing to make one only disables the cache.  vh_images_close removes it. */
void vh_images_open(struct vh_fwd *f);
void vh_images_close(struct vh_fwd *f);

/* Remove the caches of this user's forwarders that are gone (a forwarder does as it starts, before
 * vh_images_open; so does `vmgpu-forwarder --sweep`, which vmgpud runs when it stops a guest's
 * forwarder).  A cache whose
 * lock is still held (its workers still ending) is looked for again by vh_images_sweep_pending,
 * which the caller calls every so often, for VH_SWEEP_PENDING_S at most (region_file.h), and
 * removed once nobody holds it; it answers 1 while it is still looking, 0 once it is done. */
void vh_images_sweep(void);
int vh_images_sweep_pending(void);

/* The driver's JIT cache (the PTX it compiles, by content) is the guest's own: in its image cache
 * directory (jit/, at most VH_JIT_CACHE_MAX bytes, gone with the forwarder), none where there is
 * no such directory.  By default it is root's ~/.nv/ComputeCache, shared by every guest, where a
 * guest could tell by how fast its PTX loads whether another had loaded the same.  Called by the
 * supervisor before it forks workers. */
void vh_images_jit_cache(const struct vh_fwd *f);
#define VH_JIT_CACHE_MAX "134217728" /* 128 MiB, in memory (/dev/shm) */

/* The cache's images (images.c).  find: the image of that size and hash, if cached (a reference
 * the caller puts back).  add: take bytes (malloc'd, size + VH_IMAGE_GUARD, the guard zeroed) as
 * an image, kept for others if their hash is `claimed`; NULL if the claim was false (the caller
 * keeps the bytes). */
struct vh_image;
struct vh_image *vh_image_find(struct vh_fwd *f, uint64_t size, const uint64_t hash[2]);
struct vh_image *vh_image_add(struct vh_fwd *f, uint8_t *bytes, uint64_t size, const uint64_t claimed[2]);
void vh_image_put(struct vh_fwd *f, struct vh_image *img);
const uint8_t *vh_image_bytes(const struct vh_image *img);

/* The directory under which caches are made, and the part of their names before the pid. */
#define VH_IMAGE_CACHE_PARENT "/dev/shm"
#define VH_IMAGE_CACHE_PREFIX "vmgpu-images-"

#endif
