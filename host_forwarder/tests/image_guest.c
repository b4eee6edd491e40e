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

#include "vg_hash.h"
#include "vg_ops.h"
#include "vg_wire.h"
#include "images.h"
#include "vmgpu/shm.h"

#define INVALID_IMAGE 200 /* CUDA_ERROR_INVALID_IMAGE */

static struct vmgpu_gchan *ch;
static uint8_t req[1 << 16], rep[1 << 16];
static uint64_t seqno;

static int call(uint32_t op, uint16_t flags, const void *args, uint32_t len, uint64_t *out)
{
	struct vg_req_hdr h = {op, op == VG_OP_HELLO ? VG_NO_DEVICE : 0, flags, ++seqno};
	memcpy(req, &h, sizeof h);
	if (len)
		memcpy(req + sizeof h, args, len);
	if (vmgpu_gchan_send(ch, VG_REC_REQUEST, req, sizeof h + len, 5000000000ull) < 0) {
		fprintf(stderr, "send failed: %s\n", vmgpu_shm_errmsg());
		return -1;
	}
	if (flags & VG_F_NOREPLY)
		return 0;
	uint16_t type;
	int n = vmgpu_gchan_recv(ch, rep, sizeof rep, &type, 30000000000ull);
	if (n < (int)sizeof(struct vg_rep_hdr)) {
		fprintf(stderr, "no reply to op %u: the forwarder's worker is gone (%s)\n", op, vmgpu_shm_errmsg());
		return -1;
	}
	struct vg_rep_hdr r;
	memcpy(&r, rep, sizeof r);
	if (r.seq != seqno)
		return -1;
	if (out && n >= (int)(sizeof r + 8))
		memcpy(out, rep + sizeof r, 8);
	return r.result;
}

/* Send an image (hash as given, or its own) and load it; the CUresult, or -1 if the forwarder is gone. */
static int load(const uint8_t *img, uint64_t n, int lie_hash)
{
	uint64_t begin[3] = {n, 0, 0}, cached = 0;
	vg_hash128(img, n, begin + 1);
	if (lie_hash)
		begin[1] ^= 1;
	int r = call(VG_OP_BLOB_BEGIN, 0, begin, sizeof begin, &cached);
	if (r != 0)
		return r;
	uint64_t step = vmgpu_gchan_bulk_size(ch) / 2;
	for (uint64_t done = cached ? n : 0; done < n;) {
		uint64_t len = n - done < step ? n - done : step, pos;
		void *bulk;
		if (vmgpu_gchan_bulk_alloc(ch, len, 5000000000ull, &pos, &bulk) < 0)
			return -1;
		memcpy(bulk, img + done, len);
		uint64_t put[3] = {done, pos, len};
		if (call(VG_OP_BLOB_PUT, VG_F_NOREPLY, put, sizeof put, NULL) < 0)
			return -1;
		done += len;
	}
	uint64_t mod = 0;
	r = call(VG_OP_cuModuleLoadData, 0, NULL, 0, &mod);
	if (r == 0 && call(VG_OP_cuModuleUnload, 0, &mod, sizeof mod, NULL) != 0)
		return -1;
	return r;
}

static int healthy(void)
{
	uint64_t info[2] = {1, 1};
	return call(VG_OP_cuMemGetInfo_v2, 0, info, 16, NULL) == 0;
}

/* ---- images ----------------------------------------------------------------------- */

struct buf {
	uint8_t *p;
	uint64_t n, cap;
};

static void put(struct buf *b, const void *p, uint64_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void pad(struct buf *b, uint64_t align)
{
	static const uint8_t zero[64];
	while (b->n % align)
		put(b, zero, 1);
}

static void put_u(struct buf *b, uint64_t v, unsigned bytes)
{
	put(b, &v, bytes);
}

static const char PTX_TEXT[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
			       ".visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n{\n"
			       "\tret;\n}\n";

/* A small, well-formed cubin: sections of every kind the check reads. */
static struct buf cubin(void)
{
	struct buf b = {0};
	static const char shstr[] = "\0.shstrtab\0.strtab\0.symtab\0.nv.info\0.text.k\0.note.nv.cuinfo\0.rela.text.k";
	static const char str[] = "\0k";
	Elf64_Ehdr eh = {0};
	memcpy(eh.e_ident, ELFMAG, SELFMAG);
	eh.e_ident[EI_CLASS] = ELFCLASS64;
	eh.e_ident[EI_DATA] = ELFDATA2LSB;
	eh.e_ident[EI_VERSION] = EV_CURRENT;
	eh.e_type = ET_EXEC;
	eh.e_machine = 190;
	eh.e_version = EV_CURRENT;
	eh.e_ehsize = sizeof eh;
	eh.e_phentsize = sizeof(Elf64_Phdr);
	eh.e_shentsize = sizeof(Elf64_Shdr);
	put(&b, &eh, sizeof eh);
	uint64_t off[8], size[8];
	off[1] = b.n, size[1] = sizeof shstr;
	put(&b, shstr, sizeof shstr);
	off[2] = b.n, size[2] = sizeof str;
	put(&b, str, sizeof str);
	pad(&b, 8);
	Elf64_Sym sym[2] = {{0}, {.st_name = 1, .st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC), .st_shndx = 5}};
	off[3] = b.n, size[3] = sizeof sym;
	put(&b, sym, sizeof sym);
	off[4] = b.n; /* .nv.info: a record with 8 bytes of value, one with none */
	put_u(&b, 0x2f04, 2), put_u(&b, 8, 2), put_u(&b, 1, 4), put_u(&b, 24, 4);
	put_u(&b, 0x1b03, 2), put_u(&b, 0xff, 2);
	size[4] = b.n - off[4];
	pad(&b, 16);
	off[5] = b.n, size[5] = 32;
	for (int i = 0; i < 4; i++)
		put_u(&b, 0x000fc00000000000ull + i, 8);
	off[6] = b.n; /* a note: name "NVIDIA", 8 bytes of desc */
	put_u(&b, 7, 4), put_u(&b, 8, 4), put_u(&b, 1000, 4), put(&b, "NVIDIA\0", 8), put_u(&b, 90, 8);
	size[6] = b.n - off[6];
	Elf64_Rela rela = {.r_offset = 8, .r_info = ELF64_R_INFO(1, 1)};
	off[7] = b.n, size[7] = sizeof rela;
	put(&b, &rela, sizeof rela);
	Elf64_Phdr ph = {.p_type = PT_LOAD, .p_flags = PF_R | PF_X, .p_offset = off[5], .p_filesz = 32, .p_memsz = 32};
	uint64_t phoff = b.n;
	put(&b, &ph, sizeof ph);
	pad(&b, 8);
	uint64_t shoff = b.n;
	static const uint32_t type[8] = {SHT_NULL, SHT_STRTAB, SHT_STRTAB, SHT_SYMTAB, 0x70000000, SHT_PROGBITS,
					 SHT_NOTE, SHT_RELA};
	static const uint32_t name[8] = {0, 1, 11, 19, 27, 36, 44, 60};
	for (int i = 0; i < 8; i++) {
		Elf64_Shdr sh = {.sh_name = name[i], .sh_type = type[i], .sh_offset = i ? off[i] : 0,
				 .sh_size = i ? size[i] : 0};
		if (i == 3)
			sh.sh_link = 2, sh.sh_info = 1, sh.sh_entsize = sizeof(Elf64_Sym);
		if (i == 4)
			sh.sh_link = 3;
		if (i == 7)
			sh.sh_link = 3, sh.sh_info = 5, sh.sh_entsize = sizeof(Elf64_Rela);
		put(&b, &sh, sizeof sh);
	}
	Elf64_Ehdr *h = (Elf64_Ehdr *)b.p;
	h->e_phoff = phoff, h->e_phnum = 1;
	h->e_shoff = shoff, h->e_shnum = 8, h->e_shstrndx = 1;
	return b;
}

/* A fatbin entry of kind with payload (padded to 8), hs 64 (ELF) or 80 (PTX, with options). */
static void entry(struct buf *b, unsigned kind, const void *payload, uint64_t n)
{
	uint64_t padded = (n + 7) & ~7ull;
	uint32_t hs = kind == 1 ? 80 : 64;
	put_u(b, kind, 2), put_u(b, 0x101, 2), put_u(b, hs, 4), put_u(b, padded, 8);
	put_u(b, 0, 4), put_u(b, kind == 1 ? 64 : 0, 4), put_u(b, kind == 1 ? 0x90000 : 0x10008, 4);
	put_u(b, 90, 4), put_u(b, 0, 4), put_u(b, 0, 4), put_u(b, 0x11, 8), put_u(b, 0, 8), put_u(b, 0, 8);
	if (kind == 1)
		put_u(b, 72, 4), put_u(b, 0, 4), put_u(b, 0, 8);
	put(b, payload, n);
	pad(b, 8);
}

static void container(struct buf *b, const struct buf *entries)
{
	put_u(b, 0xBA55ED50u, 4), put_u(b, 1, 2), put_u(b, 16, 2), put_u(b, entries->n, 8);
	put(b, entries->p, entries->n);
}

/* Two containers back to back: an ELF and a PTX entry, then a PTX entry. */
static struct buf fatbin(void)
{
	struct buf e1 = {0}, e2 = {0}, b = {0}, elf = cubin();
	entry(&e1, 2, elf.p, elf.n);
	entry(&e1, 1, PTX_TEXT, sizeof PTX_TEXT);
	entry(&e2, 1, PTX_TEXT, sizeof PTX_TEXT);
	container(&b, &e1);
	container(&b, &e2);
	free(e1.p), free(e2.p), free(elf.p);
	return b;
}

static struct buf copy(const struct buf *a)
{
	struct buf b = {0};
	put(&b, a->p, a->n);
	return b;
}

static void set(struct buf *b, uint64_t at, uint64_t v, unsigned bytes)
{
	memcpy(b->p + at, &v, bytes);
}

/* An executable's .nv_fatbin section, or the file itself. */
static struct buf read_image(const char *path)
{
	struct buf b = {0};
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(2);
	}
	uint8_t chunk[65536];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
		put(&b, chunk, n);
	fclose(f);
	Elf64_Ehdr eh;
	if (b.n < sizeof eh || memcmp(b.p, ELFMAG, SELFMAG))
		return b;
	memcpy(&eh, b.p, sizeof eh);
	if (eh.e_shstrndx >= eh.e_shnum || eh.e_shoff + (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr) > b.n)
		return b;
	Elf64_Shdr *sh = (Elf64_Shdr *)(b.p + eh.e_shoff), *names = &sh[eh.e_shstrndx];
	for (unsigned i = 0; i < eh.e_shnum; i++)
		if (names->sh_offset + sh[i].sh_name < b.n &&
		    !strcmp((const char *)b.p + names->sh_offset + sh[i].sh_name, ".nv_fatbin")) {
			struct buf s = {0};
			put(&s, b.p + sh[i].sh_offset, sh[i].sh_size);
			free(b.p);
			return s;
		}
	return b;
}

/* ---- modes ------------------------------------------------------------------------ */

/* Valid images load: PTX, and (on the simulated backend, which runs no code) the synthetic
 * cubin and fatbin, whose instructions a real GPU would not take. */
static int valid_images_load_as(int synthetic)
{
	struct buf c = cubin(), f = fatbin();
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
	struct buf b = {0}, f = fatbin();
	put(&b, f.p, f.n);
	set(&b, 8, 64ull << 20, 8); /* the first container claims 64 MiB */
	while (b.n < 4096)
		put_u(&b, 0, 1);
	free(f.p);
	return b;
}

static int hostile(void)
{
	int ok = 1;
	struct buf f = fatbin(), c = cubin(), b;
	/* where things are in the valid fatbin: container 1, its ELF entry, its PTX entry */
	uint64_t elf_entry = 16, elf_size = (c.n + 7) & ~7ull, ptx_entry = elf_entry + 64 + elf_size;
	uint64_t c2 = 16 + (ptx_entry - 16) + 80 + ((sizeof PTX_TEXT + 7) & ~7ull);
	Elf64_Ehdr *ceh = (Elf64_Ehdr *)c.p;
	uint64_t shoff = ceh->e_shoff;

	ok &= expect_refused("fatbin claiming 64 MiB in 4 KiB", issue_image());
	b = copy(&f), b.n = 12;
	ok &= expect_refused("fatbin container header cut short", b);
	b = copy(&f), set(&b, 6, 0, 2);
	ok &= expect_refused("fatbin container header_size 0", b);
	b = copy(&f), set(&b, c2 + 8, 1ull << 30, 8);
	ok &= expect_refused("back-to-back: the second container lies about its size", b);
	b = copy(&f), set(&b, c2 + 8, UINT64_MAX - 8, 8);
	ok &= expect_refused("back-to-back: a container size that wraps", b);
	b = copy(&f), b.n = c2 + 4;
	ok &= expect_refused("back-to-back: a second magic with no header", b);
	b = copy(&f), set(&b, 8, 40, 8), b.n = 16 + 40;
	ok &= expect_refused("fatbin entry header cut short", b);
	b = copy(&f), set(&b, elf_entry + 8, 1ull << 30, 8);
	ok &= expect_refused("fatbin entry claiming 1 GiB", b);
	b = copy(&f), set(&b, elf_entry + 4, 0xFFFFFFFFu, 4);
	ok &= expect_refused("fatbin entry header_size 4 GiB", b);
	b = copy(&f), set(&b, elf_entry + 4, 8, 4);
	ok &= expect_refused("fatbin entry header_size 8 (smaller than a header)", b);
	b = copy(&f), set(&b, elf_entry + 8, UINT64_MAX - 32, 8);
	ok &= expect_refused("fatbin entry size that wraps", b);
	b = copy(&f), set(&b, elf_entry + 32, 0xFFFFFFF0u, 4), set(&b, elf_entry + 36, 0x20, 4);
	ok &= expect_refused("fatbin entry name offset that wraps", b);
	b = copy(&f), set(&b, ptx_entry + 40, 0x2011, 8), set(&b, ptx_entry + 16, 0xFFFFFFFFu, 4);
	set(&b, ptx_entry + 56, 4096, 8);
	ok &= expect_refused("compressed entry: more compressed bytes than the entry has", b);
	b = copy(&f), set(&b, ptx_entry + 40, 0x8011, 8), set(&b, ptx_entry + 16, 16, 4);
	set(&b, ptx_entry + 56, 1ull << 40, 8);
	ok &= expect_refused("compressed entry expanding to 1 TiB", b);
	b = copy(&f), set(&b, ptx_entry + 64, 0xFFFFFFF0u, 4), set(&b, ptx_entry + 68, 0x100, 4);
	ok &= expect_refused("PTX entry options outside the entry", b);
	b = copy(&f);
	for (uint64_t i = 0; i < sizeof PTX_TEXT; i++)
		b.p[ptx_entry + 80 + i] = b.p[ptx_entry + 80 + i] ? b.p[ptx_entry + 80 + i] : ' ';
	for (uint64_t i = sizeof PTX_TEXT; i < ((sizeof PTX_TEXT + 7) & ~7ull); i++)
		b.p[ptx_entry + 80 + i] = ' ';
	ok &= expect_refused("PTX entry without its NUL", b);
	b = copy(&f), set(&b, elf_entry + 64 + 0x28, 1ull << 40, 8);
	ok &= expect_refused("an ELF entry whose section headers lie past it", b);
	b = (struct buf){0};
	put(&b, PTX_TEXT, sizeof PTX_TEXT - 1);
	ok &= expect_refused("PTX without NUL", b);
	b = copy(&c), b.n = 40;
	ok &= expect_refused("ELF header cut short", b);
	b = copy(&c), b.p[EI_CLASS] = ELFCLASS32;
	ok &= expect_refused("32-bit ELF", b);
	b = copy(&c), set(&b, 0x28, 1ull << 26, 8);
	ok &= expect_refused("ELF section headers past the image", b);
	b = copy(&c), set(&b, 0x28, UINT64_MAX - 63, 8);
	ok &= expect_refused("ELF section header offset that wraps", b);
	b = copy(&c), set(&b, 0x3c, 0xFFFF, 2);
	ok &= expect_refused("ELF with 65535 sections", b);
	b = copy(&c), set(&b, 0x38, 0xFFFF, 2);
	ok &= expect_refused("ELF with 65535 (PN_XNUM) program headers", b);
	b = copy(&c), set(&b, 0x3a, 8, 2);
	ok &= expect_refused("ELF section header entries of 8 bytes", b);
	b = copy(&c), set(&b, shoff + 5 * 64 + 0x20, 1ull << 30, 8);
	ok &= expect_refused("ELF section claiming 1 GiB", b);
	b = copy(&c), set(&b, shoff + 5 * 64 + 0x18, UINT64_MAX - 8, 8);
	ok &= expect_refused("ELF section offset that wraps", b);
	b = copy(&c), set(&b, shoff + 3 * 64 + 0x28, 0xFFFF, 4);
	ok &= expect_refused("ELF section linking to a section that does not exist", b);
	b = copy(&c), set(&b, ((Elf64_Shdr *)(c.p + shoff))[4].sh_offset + 2, 0xFFFF, 2);
	ok &= expect_refused(".nv.info record declaring 64 KiB past its section", b);
	b = copy(&c), set(&b, ((Elf64_Shdr *)(c.p + shoff))[3].sh_offset + 24, 0x7FFFFFFF, 4);
	ok &= expect_refused("ELF symbol named outside its string table", b);
	b = copy(&c), b.p[((Elf64_Shdr *)(c.p + shoff))[2].sh_offset + 2] = 'x';
	ok &= expect_refused("ELF string table without a final NUL", b);
	b = copy(&c), set(&b, ((Elf64_Shdr *)(c.p + shoff))[6].sh_offset + 4, 0xFFFFFFF0u, 4);
	ok &= expect_refused("ELF note declaring 4 GiB", b);
	b = copy(&c), set(&b, ((Elf64_Shdr *)(c.p + shoff))[7].sh_offset, 1ull << 40, 8);
	ok &= expect_refused("ELF relocation at an offset past its section", b);
	b = copy(&c), set(&b, ((Elf64_Ehdr *)c.p)->e_phoff + 8, 1ull << 40, 8);
	ok &= expect_refused("ELF segment past the image", b);
	b = (struct buf){0};
	put_u(&b, 0x466243B1u, 4), put_u(&b, 1, 4), put_u(&b, 0x7f0000001000ull, 8), put_u(&b, 0, 8);
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
		struct buf b = read_image(argv[i]);
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
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
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
				put_u(b, rnd(), 1);
			break;
		}
		default: { /* a copy of its own head appended: containers back to back */
			uint64_t n = rnd() % (b->n < 512 ? b->n : 512) + 1;
			struct buf head = {0};
			put(&head, b->p, n);
			put(b, head.p, head.n);
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
	base[nbase++] = cubin();
	base[nbase++] = fatbin();
	base[nbase] = (struct buf){0};
	put(&base[nbase++], PTX_TEXT, sizeof PTX_TEXT);
	for (int i = 0; i < nfiles && i < 16; i++)
		base[nbase++] = read_image(files[i]);
	long refused = 0, loaded = 0;
	for (long i = 0; i < iters; i++) {
		struct buf b = copy(&base[rnd() % nbase]);
		mutate(&b);
		if (!b.n)
			put_u(&b, rnd(), 1);
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
		put(&b, line, strlen(line));
		while (b.n + sizeof PTX_TEXT < (uint64_t)kib << 10)
			put(&b, "// padding to make the image as large as asked .................\n", 64);
		put(&b, PTX_TEXT, sizeof PTX_TEXT);
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
		struct buf b = read_image(argv[i]);
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
	int fd = open(argv[1], O_RDWR);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		perror(argv[1]);
		return 2;
	}
	void *base = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	struct vmgpu_guest *g;
	if (base == MAP_FAILED || vmgpu_guest_attach(base, st.st_size, &wo, &g) ||
	    vmgpu_guest_claim(g, 5000000000ull, &ch)) {
		fprintf(stderr, "attach: %s\n", vmgpu_shm_errmsg());
		return 2;
	}
	vmgpu_gchan_autobeat(ch, 100000000ull);
	struct vg_hello_req hello = {VG_PROTO_VERSION, (uint32_t)getpid()};
	if (call(VG_OP_HELLO, 0, &hello, sizeof hello, NULL) != 0)
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
	vmgpu_gchan_close(ch);
	vmgpu_guest_detach(g);
	munmap(base, (size_t)st.st_size);
	return rc;
}
