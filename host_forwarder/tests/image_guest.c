/*
 * A raw guest that sends module images straight to a forwarder (no libcuda):
 *
 *   image_guest REGION hostile          crafted images whose headers lie (sizes past the
 *                                       bytes, truncated headers, wrapping offsets, huge
 *                                       counts, PTX without NUL): each must be refused with
 *                                       CUDA_ERROR_INVALID_IMAGE; then valid ones must load
 *   image_guest REGION issue [FILE...]  issue 14's image (a fatbin claiming 64 MiB in 4 KiB),
 *                                       refused; then PTX and the FILEs load (a real GPU)
 *   image_guest REGION fuzz N SEED [FILE...]  N mutations of valid cubin/fatbin/PTX images
 *                                       (and FILEs); the forwarder must answer each, and
 *                                       still load valid images and answer correctly after
 *   image_guest REGION many N KIB SEED  load N distinct valid PTX images of about KIB KiB
 *   image_guest check FILE...           run the host's image check on FILEs (an executable's
 *                                       .nv_fatbin section, or the file): all must pass
 *
 * A FILE is a cubin, fatbin or PTX, or an executable whose .nv_fatbin is taken.
 * Exit 0: every expectation held.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image_build.h"
#include "raw_guest.h"
#include "vg_hash.h"
#include "vg_ops.h"
#include "vg_wire.h"
#include "images.h"
#include "vmgpu/shm.h"

#define INVALID_IMAGE 200 /* CUDA_ERROR_INVALID_IMAGE */

static struct raw_guest G; /* this program, as a guest */

/* Send an image (hash as given, or its own) and load it; the CUresult, or -1 if the forwarder is gone. */
static int load(const uint8_t *img, uint64_t n, int lie_hash)
{
	uint64_t begin[3] = {n, 0, 0}, cached = 0;
	vg_hash128(img, n, begin + 1);
	if (lie_hash)
		begin[1] ^= 1;
	int r = raw_call(&G, VG_OP_BLOB_BEGIN, 0, 0, begin, sizeof begin);
	if (r != 0)
		return r;
	cached = raw_out(&G, 0);
	uint64_t step = vmgpu_gchan_bulk_size(G.ch) / 2;
	for (uint64_t done = cached ? n : 0; done < n;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		if (vmgpu_gchan_bulk_alloc(G.ch, len, 5000000000ull, &pos, &bulk) < 0)
			return -1;
		memcpy(bulk, img + done, len);
		uint64_t put[3] = {done, pos, len};
		if (raw_call(&G, VG_OP_BLOB_PUT, 0, VG_F_NOREPLY, put, sizeof put) < 0)
			return -1;
		done += len;
	}
	uint64_t mod = 0;
	r = raw_call(&G, VG_OP_cuModuleLoadData, 0, 0, NULL, 0);
	mod = raw_out(&G, 0);
	if (r == 0 && raw_call(&G, VG_OP_cuModuleUnload, 0, 0, &mod, sizeof mod) != 0)
		return -1;
	return r;
}

static int healthy(void)
{
	uint64_t info[2] = {1, 1};
	return raw_call(&G, VG_OP_cuMemGetInfo_v2, 0, 0, info, 16) == 0;
}

/* ---- modes ------------------------------------------------------------------------ */

/* Valid images load: PTX, and (on the simulated backend, which runs no code) the synthetic
 * cubin and fatbin, whose instructions a real GPU would not take. */
static int valid_images_load_as(int synthetic)
{
	struct buf c = image_cubin(), f = image_fatbin();
	int ok = 1, r;
	if ((r = load((const uint8_t *)PTX_TEXT, sizeof PTX_TEXT, 0)) != 0)
		ok = 0, fprintf(stderr, "a valid PTX image was refused (%d)\n", r);
	if (!synthetic) {
		free(c.p), free(f.p);
		return ok;
	}
	if ((r = load(c.p, c.n, 0)) != 0)
		ok = 0, fprintf(stderr, "a valid cubin was refused (%d)\n", r);
	if ((r = load(f.p, f.n, 0)) != 0)
		ok = 0, fprintf(stderr, "a valid fatbin was refused (%d)\n", r);
	free(c.p), free(f.p);
	return ok;
}

static int valid_images_load(void)
{
	return valid_images_load_as(1);
}

static int expect_refused(const char *what, struct buf b)
{
	int r = load(b.p, b.n, 0);
	free(b.p);
	printf("%-60s %s (%d)\n", what, r == INVALID_IMAGE ? "refused" : "NOT REFUSED", r);
	return r == INVALID_IMAGE;
}

static struct buf issue_image(void)
{
	struct buf b = {0}, f = image_fatbin();
	buf_put(&b, f.p, f.n);
	buf_set(&b, 8, 64ull << 20, 8); /* the first container claims 64 MiB */
	while (b.n < 4096)
		buf_put_u(&b, 0, 1);
	free(f.p);
	return b;
}

static int hostile(void)
{
	int ok = 1;
	struct buf f = image_fatbin(), c = image_cubin(), b;
	/* where things are in the valid fatbin: container 1, its ELF entry, its PTX entry */
	uint64_t elf_entry = 16, elf_size = (c.n + 7) & ~7ull, ptx_entry = elf_entry + 64 + elf_size;
	uint64_t c2 = 16 + (ptx_entry - 16) + 80 + ((sizeof PTX_TEXT + 7) & ~7ull);
	Elf64_Ehdr *ceh = (Elf64_Ehdr *)c.p;
	uint64_t shoff = ceh->e_shoff;

	ok &= expect_refused("fatbin claiming 64 MiB in 4 KiB", issue_image());
	b = buf_copy(&f), b.n = 12;
	ok &= expect_refused("fatbin container header cut short", b);
	b = buf_copy(&f), buf_set(&b, 6, 0, 2);
	ok &= expect_refused("fatbin container header_size 0", b);
	b = buf_copy(&f), buf_set(&b, c2 + 8, 1ull << 30, 8);
	ok &= expect_refused("back-to-back: the second container lies about its size", b);
	b = buf_copy(&f), buf_set(&b, c2 + 8, UINT64_MAX - 8, 8);
	ok &= expect_refused("back-to-back: a container size that wraps", b);
	b = buf_copy(&f), b.n = c2 + 4;
	ok &= expect_refused("back-to-back: a second magic with no header", b);
	b = buf_copy(&f), buf_set(&b, 8, 40, 8), b.n = 16 + 40;
	ok &= expect_refused("fatbin entry header cut short", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 8, 1ull << 30, 8);
	ok &= expect_refused("fatbin entry claiming 1 GiB", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 4, 0xFFFFFFFFu, 4);
	ok &= expect_refused("fatbin entry header_size 4 GiB", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 4, 8, 4);
	ok &= expect_refused("fatbin entry header_size 8 (smaller than a header)", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 8, UINT64_MAX - 32, 8);
	ok &= expect_refused("fatbin entry size that wraps", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 32, 0xFFFFFFF0u, 4), buf_set(&b, elf_entry + 36, 0x20, 4);
	ok &= expect_refused("fatbin entry name offset that wraps", b);
	b = buf_copy(&f), buf_set(&b, ptx_entry + 40, 0x2011, 8), buf_set(&b, ptx_entry + 16, 0xFFFFFFFFu, 4);
	buf_set(&b, ptx_entry + 56, 4096, 8);
	ok &= expect_refused("compressed entry: more compressed bytes than the entry has", b);
	b = buf_copy(&f), buf_set(&b, ptx_entry + 40, 0x8011, 8), buf_set(&b, ptx_entry + 16, 16, 4);
	buf_set(&b, ptx_entry + 56, 1ull << 40, 8);
	ok &= expect_refused("compressed entry expanding to 1 TiB", b);
	b = buf_copy(&f), buf_set(&b, ptx_entry + 64, 0xFFFFFFF0u, 4), buf_set(&b, ptx_entry + 68, 0x100, 4);
	ok &= expect_refused("PTX entry options outside the entry", b);
	b = buf_copy(&f);
	for (uint64_t i = 0; i < sizeof PTX_TEXT; i++)
		b.p[ptx_entry + 80 + i] = b.p[ptx_entry + 80 + i] ? b.p[ptx_entry + 80 + i] : ' ';
	for (uint64_t i = sizeof PTX_TEXT; i < ((sizeof PTX_TEXT + 7) & ~7ull); i++)
		b.p[ptx_entry + 80 + i] = ' ';
	ok &= expect_refused("PTX entry without its NUL", b);
	b = buf_copy(&f), buf_set(&b, elf_entry + 64 + 0x28, 1ull << 40, 8);
	ok &= expect_refused("an ELF entry whose section headers lie past it", b);
	b = (struct buf){0};
	buf_put(&b, PTX_TEXT, sizeof PTX_TEXT - 1);
	ok &= expect_refused("PTX without NUL", b);
	b = buf_copy(&c), b.n = 40;
	ok &= expect_refused("ELF header cut short", b);
	b = buf_copy(&c), b.p[EI_CLASS] = ELFCLASS32;
	ok &= expect_refused("32-bit ELF", b);
	b = buf_copy(&c), buf_set(&b, 0x28, 1ull << 26, 8);
	ok &= expect_refused("ELF section headers past the image", b);
	b = buf_copy(&c), buf_set(&b, 0x28, UINT64_MAX - 63, 8);
	ok &= expect_refused("ELF section header offset that wraps", b);
	b = buf_copy(&c), buf_set(&b, 0x3c, 0xFFFF, 2);
	ok &= expect_refused("ELF with 65535 sections", b);
	b = buf_copy(&c), buf_set(&b, 0x38, 0xFFFF, 2);
	ok &= expect_refused("ELF with 65535 (PN_XNUM) program headers", b);
	b = buf_copy(&c), buf_set(&b, 0x3a, 8, 2);
	ok &= expect_refused("ELF section header entries of 8 bytes", b);
	b = buf_copy(&c), buf_set(&b, shoff + 5 * 64 + 0x20, 1ull << 30, 8);
	ok &= expect_refused("ELF section claiming 1 GiB", b);
	b = buf_copy(&c), buf_set(&b, shoff + 5 * 64 + 0x18, UINT64_MAX - 8, 8);
	ok &= expect_refused("ELF section offset that wraps", b);
	b = buf_copy(&c), buf_set(&b, shoff + 3 * 64 + 0x28, 0xFFFF, 4);
	ok &= expect_refused("ELF section linking to a section that does not exist", b);
	b = buf_copy(&c), buf_set(&b, ((Elf64_Shdr *)(c.p + shoff))[4].sh_offset + 2, 0xFFFF, 2);
	ok &= expect_refused(".nv.info record declaring 64 KiB past its section", b);
	b = buf_copy(&c), buf_set(&b, ((Elf64_Shdr *)(c.p + shoff))[3].sh_offset + 24, 0x7FFFFFFF, 4);
	ok &= expect_refused("ELF symbol named outside its string table", b);
	b = buf_copy(&c), b.p[((Elf64_Shdr *)(c.p + shoff))[2].sh_offset + 2] = 'x';
	ok &= expect_refused("ELF string table without a final NUL", b);
	b = buf_copy(&c), buf_set(&b, ((Elf64_Shdr *)(c.p + shoff))[6].sh_offset + 4, 0xFFFFFFF0u, 4);
	ok &= expect_refused("ELF note declaring 4 GiB", b);
	b = buf_copy(&c), buf_set(&b, ((Elf64_Shdr *)(c.p + shoff))[7].sh_offset, 1ull << 40, 8);
	ok &= expect_refused("ELF relocation at an offset past its section", b);
	b = buf_copy(&c), buf_set(&b, ((Elf64_Ehdr *)c.p)->e_phoff + 8, 1ull << 40, 8);
	ok &= expect_refused("ELF segment past the image", b);
	b = (struct buf){0};
	buf_put_u(&b, 0x466243B1u, 4), buf_put_u(&b, 1, 4), buf_put_u(&b, 0x7f0000001000ull, 8), buf_put_u(&b, 0, 8);
	ok &= expect_refused("fatbin wrapper with a host pointer", b);
	free(f.p), free(c.p);
	if (!healthy()) {
		fprintf(stderr, "the forwarder no longer answers\n");
		return 1;
	}
	if (!valid_images_load())
		return 1;
	printf(ok ? "every hostile image refused; valid images load\n" : "SOME HOSTILE IMAGES WERE NOT REFUSED\n");
	return ok ? 0 : 1;
}

static int issue(int argc, char **argv)
{
	struct buf bad = issue_image();
	int r = load(bad.p, bad.n, 0);
	free(bad.p);
	printf("fatbin claiming 64 MiB in 4 KiB: %d\n", r);
	if (r != INVALID_IMAGE)
		return 1;
	if (!valid_images_load_as(0))
		return 1;
	for (int i = 0; i < argc; i++) {
		struct buf b = image_read(argv[i]);
		if ((r = load(b.p, b.n, 0)) != 0) {
			fprintf(stderr, "%s was refused (%d)\n", argv[i], r);
			return 1;
		}
		free(b.p);
		printf("%s: loaded\n", argv[i]);
	}
	printf("refused cleanly; the worker then loads valid images\n");
	return healthy() ? 0 : 1;
}

static uint64_t rng;
static uint64_t rnd(void)
{
	return raw_rnd(&rng);
}

static void mutate(struct buf *b)
{
	static const uint64_t odd[] = {0, 1, 7, 8, 15, 16, 63, 64, 4096, 0x7FFFFFFF, 0x80000000u, 0xFFFFFFFFu,
				       1ull << 32, 1ull << 40, INT64_MAX, UINT64_MAX, UINT64_MAX - 15};
	unsigned times = 1 + (unsigned)(rnd() % 4);
	for (unsigned t = 0; t < times && b->n; t++) {
		uint64_t at = rnd() % b->n;
		/* headers are where the lies are: favour the first bytes and 8-byte fields */
		if (rnd() % 2)
			at = rnd() % (b->n < 256 ? b->n : 256);
		switch (rnd() % 6) {
		case 0: b->p[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
		case 1: b->p[at] = (uint8_t)rnd(); break;
		case 2: {
			unsigned w = 1u << (rnd() % 4); /* 1, 2, 4 or 8 bytes */
			at &= ~(uint64_t)(w - 1);
			uint64_t v = odd[rnd() % (sizeof odd / sizeof *odd)];
			if (rnd() % 3 == 0)
				v = b->n + (rnd() % 64) - 32;
			if (at + w <= b->n)
				memcpy(b->p + at, &v, w);
			break;
		}
		case 3: b->n = rnd() % b->n; break; /* truncated */
		case 4: {
			uint64_t more = rnd() % 64;
			for (uint64_t i = 0; i < more; i++)
				buf_put_u(b, rnd(), 1);
			break;
		}
		default: { /* a copy of its own head appended: containers back to back */
			uint64_t n = rnd() % (b->n < 512 ? b->n : 512) + 1;
			struct buf head = {0};
			buf_put(&head, b->p, n);
			buf_put(b, head.p, head.n);
			free(head.p);
			break;
		}
		}
	}
}

static int fuzz(long iters, uint64_t seed, int nfiles, char **files)
{
	rng = seed * 2654435761u + 88172645463325252ull;
	struct buf base[3 + 16];
	int nbase = 0;
	base[nbase++] = image_cubin();
	base[nbase++] = image_fatbin();
	base[nbase] = (struct buf){0};
	buf_put(&base[nbase++], PTX_TEXT, sizeof PTX_TEXT);
	for (int i = 0; i < nfiles && i < 16; i++)
		base[nbase++] = image_read(files[i]);
	long refused = 0, loaded = 0;
	for (long i = 0; i < iters; i++) {
		struct buf b = buf_copy(&base[rnd() % nbase]);
		mutate(&b);
		if (!b.n)
			buf_put_u(&b, rnd(), 1);
		int r = load(b.p, b.n, rnd() % 8 == 0);
		free(b.p);
		if (r < 0) {
			fprintf(stderr, "the forwarder stopped answering after %ld images\n", i);
			return 1;
		}
		refused += r != 0;
		loaded += r == 0;
		if (i % 500 == 499 && !valid_images_load())
			return 1;
	}
	for (int i = 0; i < nbase; i++)
		free(base[i].p);
	if (!healthy() || !valid_images_load())
		return 1;
	printf("image fuzz: %ld images, %ld loaded, %ld refused; forwarder healthy\n", iters, loaded, refused);
	return 0;
}

static int many(long n, long kib, uint64_t seed)
{
	for (long i = 0; i < n; i++) {
		struct buf b = {0};
		char line[96];
		snprintf(line, sizeof line, "// image %llu-%ld\n", (unsigned long long)seed, i);
		buf_put(&b, line, strlen(line));
		while (b.n + sizeof PTX_TEXT < (uint64_t)kib << 10)
			buf_put(&b, "// padding to make the image as large as asked .................\n", 64);
		buf_put(&b, PTX_TEXT, sizeof PTX_TEXT);
		int r = load(b.p, b.n, 0);
		free(b.p);
		if (r != 0) {
			fprintf(stderr, "image %ld: %d\n", i, r);
			return 1;
		}
	}
	printf("loaded %ld\n", n);
	return 0;
}

static int check(int argc, char **argv)
{
	int bad = 0;
	for (int i = 0; i < argc; i++) {
		struct buf b = image_read(argv[i]);
		char why[256] = "";
		/* as the host holds it: the bytes, then zeros */
		b.p = realloc(b.p, b.n + VH_IMAGE_GUARD);
		memset(b.p + b.n, 0, VH_IMAGE_GUARD);
		int r = vh_image_check(b.p, b.n, why, sizeof why);
		printf("%s (%llu bytes): %s%s\n", argv[i], (unsigned long long)b.n, r ? "REFUSED: " : "ok", why);
		bad |= r != 0;
		free(b.p);
	}
	return bad;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "check"))
		return check(argc - 2, argv + 2);
	if (argc < 3) {
		fprintf(stderr, "usage: image_guest REGION hostile|issue|fuzz|many ... | image_guest check FILE...\n");
		return 2;
	}
	G.reply_timeout_ns = 30000000000ull;
	if (raw_guest_open(&G, argv[1], 1))
		return 2;
	struct vg_hello_req hello = {VG_PROTO_VERSION, (uint32_t)getpid()};
	if (raw_call(&G, VG_OP_HELLO, VG_NO_DEVICE, 0, &hello, sizeof hello) != 0)
		return 2;
	int rc = 2;
	const char *mode = argv[2];
	if (!strcmp(mode, "hostile"))
		rc = hostile();
	else if (!strcmp(mode, "issue"))
		rc = issue(argc - 3, argv + 3);
	else if (!strcmp(mode, "fuzz") && argc >= 5)
		rc = fuzz(atol(argv[3]), strtoull(argv[4], NULL, 10), argc - 5, argv + 5);
	else if (!strcmp(mode, "many") && argc == 6)
		rc = many(atol(argv[3]), atol(argv[4]), strtoull(argv[5], NULL, 10));
	raw_guest_close(&G);
	return rc;
}
