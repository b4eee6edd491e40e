/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The check of a module image before the driver sees it.  The driver is given
 * a pointer, never a length: it sizes an image from its own headers.  A guest
 * chooses those headers, so every size, offset and count the driver could
 * follow is checked here against the bytes the host actually received (a fatbin
 * that claims 64 MiB in 4 KiB made the driver read far past its buffer).
 * Arithmetic never wraps: every extent is tested as "off <= n && len <= n - off".
 *
 * Layout facts (all little-endian):
 *   fatbin container: u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 size
 *     (bytes of entries after the header); containers may follow back to back.
 *   fatbin entry: u16 kind (1 PTX, 2 ELF), u16, u32 header_size, u64 size (payload
 *     after the header), u32 compressed_size, u32, u16 minor, u16 major, u32 arch,
 *     u32 name_offset, u32 name_length, u64 flags (0x2000 or 0x8000: compressed),
 *     u64, u64 decompressed_size; PTX entries go on with u32 options offset and length.
 *   cubin: a 64-bit ELF; .nv.info sections (type 0x70000000) hold records of
 *     u8 format, u8 attribute, u16 value, with format 4 followed by value bytes.
 */
#include <elf.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "vg_wire.h"
#include "images.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u
#define FATBIN_HEADER 16u
#define FATBIN_ENTRY_HEADER 64u
#define FATBIN_KIND_PTX 1u
#define FATBIN_KIND_ELF 2u
#define FATBIN_COMPRESSED 0xA000ull /* either of the two compression flags */
#define SHT_CUDA_INFO 0x70000000u

static int refuse(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (why && len)
		vsnprintf(why, len, fmt, ap);
	va_end(ap);
	return -1;
}

/* [off, off + len) lies within n bytes */
static int within(uint64_t off, uint64_t len, uint64_t n)
{
	return off <= n && len <= n - off;
}

static uint64_t rd(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;
	memcpy(&v, p, bytes); /* little-endian hosts only, as the driver */
	return v;
}

/* ---- cubin (ELF) ----------------------------------------------------------------- */

struct elf {
	const uint8_t *p;
	uint64_t n;
	Elf64_Ehdr eh;
	char *why;
	size_t whylen;
};

static Elf64_Shdr shdr(const struct elf *e, unsigned i)
{
	Elf64_Shdr sh;
	memcpy(&sh, e->p + e->eh.e_shoff + (uint64_t)i * e->eh.e_shentsize, sizeof sh);
	return sh;
}

/* Records of notes: u32 namesz, descsz, type, then name and desc, each padded to 4. */
static int notes_ok(const struct elf *e, unsigned i, const Elf64_Shdr *sh)
{
	const uint8_t *p = e->p + sh->sh_offset;
	uint64_t pos = 0;
	while (pos < sh->sh_size) {
		if (sh->sh_size - pos < 12)
			return refuse(e->why, e->whylen, "ELF section %u: a note header runs past its section", i);
		uint64_t name = (rd(p + pos, 4) + 3) & ~3ull, desc = (rd(p + pos + 4, 4) + 3) & ~3ull;
		pos += 12;
		if (!within(pos, name, sh->sh_size) || !within(pos + name, desc, sh->sh_size))
			return refuse(e->why, e->whylen, "ELF section %u: a note declares more bytes than its section has",
				      i);
		pos += name + desc;
	}
	return 0;
}

/* .nv.info: 4-byte records, those of format 4 followed by as many bytes as they say. */
static int nvinfo_ok(const struct elf *e, unsigned i, const Elf64_Shdr *sh)
{
	const uint8_t *p = e->p + sh->sh_offset;
	uint64_t pos = 0;
	while (pos < sh->sh_size) {
		if (sh->sh_size - pos < 4)
			return refuse(e->why, e->whylen, "ELF section %u: an .nv.info record runs past its section", i);
		uint64_t len = p[pos] == 4 ? rd(p + pos + 2, 2) : 0;
		pos += 4;
		if (len > sh->sh_size - pos)
			return refuse(e->why, e->whylen,
				      "ELF section %u: an .nv.info record declares %llu bytes past its section", i,
				      (unsigned long long)len);
		pos += len;
	}
	return 0;
}

static int symbols_ok(const struct elf *e, unsigned i, const Elf64_Shdr *sh)
{
	if (sh->sh_entsize != sizeof(Elf64_Sym) || sh->sh_size % sizeof(Elf64_Sym))
		return refuse(e->why, e->whylen, "ELF section %u: a symbol table of entries of %llu bytes", i,
			      (unsigned long long)sh->sh_entsize);
	Elf64_Shdr str = shdr(e, sh->sh_link);
	if (str.sh_type != SHT_STRTAB)
		return refuse(e->why, e->whylen, "ELF section %u: its symbols' names are not in a string table", i);
	for (uint64_t k = 0; k < sh->sh_size / sizeof(Elf64_Sym); k++) {
		Elf64_Sym s;
		memcpy(&s, e->p + sh->sh_offset + k * sizeof s, sizeof s);
		if (s.st_name >= str.sh_size && s.st_name)
			return refuse(e->why, e->whylen, "ELF symbol %llu: its name lies outside the string table",
				      (unsigned long long)k);
		if (s.st_shndx >= e->eh.e_shnum && s.st_shndx < SHN_LORESERVE)
			return refuse(e->why, e->whylen, "ELF symbol %llu: section %u does not exist",
				      (unsigned long long)k, s.st_shndx);
	}
	return 0;
}

/* The symbol table relocations index: the one sh_link names, or (as some libraries' cubins
 * link their relocations to another section) the image's own symbol table.  Its symbol count,
 * 0 if the image has none. */
static uint64_t reloc_symbols(const struct elf *e, const Elf64_Shdr *sh)
{
	Elf64_Shdr sym = shdr(e, sh->sh_link);
	for (unsigned k = 0; sym.sh_type != SHT_SYMTAB && sym.sh_type != SHT_DYNSYM && k < e->eh.e_shnum; k++)
		sym = shdr(e, k);
	if (sym.sh_type != SHT_SYMTAB && sym.sh_type != SHT_DYNSYM)
		return 0;
	return sym.sh_entsize ? sym.sh_size / sym.sh_entsize : 0;
}

static int relocations_ok(const struct elf *e, unsigned i, const Elf64_Shdr *sh)
{
	uint64_t ent = sh->sh_type == SHT_RELA ? sizeof(Elf64_Rela) : sizeof(Elf64_Rel);
	if (sh->sh_entsize != ent || sh->sh_size % ent)
		return refuse(e->why, e->whylen, "ELF section %u: relocations of %llu bytes each", i,
			      (unsigned long long)sh->sh_entsize);
	if (sh->sh_info >= e->eh.e_shnum)
		return refuse(e->why, e->whylen, "ELF section %u: relocations of section %u, which does not exist", i,
			      sh->sh_info);
	/* every relocation names a symbol that exists (or none) and, where it names the section it
	 * applies to, an offset inside it */
	Elf64_Shdr target = shdr(e, sh->sh_info);
	uint64_t nsym = reloc_symbols(e, sh);
	for (uint64_t k = 0; k < sh->sh_size / ent; k++) {
		Elf64_Rel r;
		memcpy(&r, e->p + sh->sh_offset + k * ent, sizeof r);
		uint64_t s = ELF64_R_SYM(r.r_info);
		if ((s && s >= nsym) || (sh->sh_info && target.sh_type != SHT_NULL && r.r_offset >= target.sh_size))
			return refuse(e->why, e->whylen,
				      "ELF section %u: relocation %llu names a symbol (%llu of %llu) or an offset "
				      "(%llu in section %u of %llu bytes) that does not exist",
				      i, (unsigned long long)k, (unsigned long long)s, (unsigned long long)nsym,
				      (unsigned long long)r.r_offset, sh->sh_info, (unsigned long long)target.sh_size);
	}
	return 0;
}

static int section_ok(const struct elf *e, unsigned i, uint64_t shstr_size)
{
	Elf64_Shdr sh = shdr(e, i);
	if (sh.sh_type != SHT_NOBITS && !within(sh.sh_offset, sh.sh_size, e->n))
		return refuse(e->why, e->whylen, "ELF section %u: %llu bytes at %llu, past the image's %llu", i,
			      (unsigned long long)sh.sh_size, (unsigned long long)sh.sh_offset,
			      (unsigned long long)e->n);
	if (sh.sh_link >= e->eh.e_shnum)
		return refuse(e->why, e->whylen, "ELF section %u: links to section %u, which does not exist", i,
			      sh.sh_link);
	if (i && sh.sh_name >= shstr_size)
		return refuse(e->why, e->whylen, "ELF section %u: its name lies outside the section name table", i);
	if (sh.sh_type == SHT_NOBITS)
		return 0;
	switch (sh.sh_type) {
	case SHT_STRTAB:
		if (sh.sh_size && e->p[sh.sh_offset + sh.sh_size - 1] != 0)
			return refuse(e->why, e->whylen, "ELF section %u: a string table that does not end in NUL", i);
		return 0;
	case SHT_SYMTAB:
	case SHT_DYNSYM:
		return symbols_ok(e, i, &sh);
	case SHT_REL:
	case SHT_RELA:
		return relocations_ok(e, i, &sh);
	case SHT_NOTE:
		return notes_ok(e, i, &sh);
	case SHT_CUDA_INFO:
		return nvinfo_ok(e, i, &sh);
	default:
		return 0;
	}
}

static int elf_check(const uint8_t *p, uint64_t n, char *why, size_t whylen)
{
	struct elf e = {.p = p, .n = n, .why = why, .whylen = whylen};
	if (n < sizeof e.eh)
		return refuse(why, whylen, "an ELF image of %llu bytes, shorter than its header",
			      (unsigned long long)n);
	memcpy(&e.eh, p, sizeof e.eh);
	const Elf64_Ehdr *h = &e.eh;
	if (h->e_ident[EI_CLASS] != ELFCLASS64 || h->e_ident[EI_DATA] != ELFDATA2LSB)
		return refuse(why, whylen, "an ELF image that is not 64-bit little-endian");
	if (h->e_ehsize != sizeof e.eh)
		return refuse(why, whylen, "an ELF header of %u bytes", h->e_ehsize);
	if (h->e_phnum) {
		if (h->e_phnum == PN_XNUM || h->e_phentsize < sizeof(Elf64_Phdr) ||
		    !within(h->e_phoff, (uint64_t)h->e_phnum * h->e_phentsize, n))
			return refuse(why, whylen, "ELF program headers (%u of %u bytes at %llu) past the image's %llu",
				      h->e_phnum, h->e_phentsize, (unsigned long long)h->e_phoff,
				      (unsigned long long)n);
		for (unsigned i = 0; i < h->e_phnum; i++) {
			Elf64_Phdr ph;
			memcpy(&ph, p + h->e_phoff + (uint64_t)i * h->e_phentsize, sizeof ph);
			if (!within(ph.p_offset, ph.p_filesz, n))
				return refuse(why, whylen, "ELF segment %u: %llu bytes at %llu, past the image's %llu", i,
					      (unsigned long long)ph.p_filesz, (unsigned long long)ph.p_offset,
					      (unsigned long long)n);
		}
	}
	if (!h->e_shnum) {
		if (h->e_shoff)
			return refuse(why, whylen, "an ELF image with extended section numbering");
		return 0;
	}
	if (h->e_shentsize < sizeof(Elf64_Shdr) || !within(h->e_shoff, (uint64_t)h->e_shnum * h->e_shentsize, n))
		return refuse(why, whylen, "ELF section headers (%u of %u bytes at %llu) past the image's %llu",
			      h->e_shnum, h->e_shentsize, (unsigned long long)h->e_shoff, (unsigned long long)n);
	uint64_t shstr_size = 0;
	if (h->e_shstrndx != SHN_UNDEF) {
		if (h->e_shstrndx >= h->e_shnum)
			return refuse(why, whylen, "ELF section names in section %u, which does not exist", h->e_shstrndx);
		Elf64_Shdr s = shdr(&e, h->e_shstrndx);
		if (s.sh_type != SHT_STRTAB)
			return refuse(why, whylen, "ELF section names in a section that is not a string table");
		shstr_size = s.sh_size;
	}
	for (unsigned i = 0; i < h->e_shnum; i++)
		if (section_ok(&e, i, shstr_size))
			return -1;
	return 0;
}

/* ---- fatbin ---------------------------------------------------------------------- */

static int entry_check(const uint8_t *p, uint64_t n, uint64_t at, char *why, size_t whylen)
{
	uint64_t kind = rd(p, 2), hs = rd(p + 4, 4), size = rd(p + 8, 8), csize = rd(p + 16, 4);
	uint64_t name_off = rd(p + 32, 4), name_len = rd(p + 36, 4), flags = rd(p + 40, 8), dsize = rd(p + 56, 8);
	if (hs < FATBIN_ENTRY_HEADER || hs > n || size > n - hs)
		return refuse(why, whylen,
			      "fatbin entry at %llu: a header of %llu and %llu bytes of code, past the %llu its container "
			      "holds",
			      (unsigned long long)at, (unsigned long long)hs, (unsigned long long)size,
			      (unsigned long long)n);
	if ((name_off || name_len) && !within(name_off, name_len, hs + size))
		return refuse(why, whylen, "fatbin entry at %llu: its name lies outside the entry", (unsigned long long)at);
	if (kind == FATBIN_KIND_PTX && hs >= 72) {
		uint64_t opt_off = rd(p + 64, 4), opt_len = rd(p + 68, 4);
		if (opt_len && !within(opt_off, opt_len, hs + size))
			return refuse(why, whylen, "fatbin entry at %llu: its options lie outside the entry",
				      (unsigned long long)at);
	}
	const uint8_t *code = p + hs;
	if (flags & FATBIN_COMPRESSED) {
		/* what the driver decompresses: all of it within the entry, to a sane size */
		if (!csize || csize > size || !dsize || dsize > VG_MAX_BLOB)
			return refuse(why, whylen,
				      "fatbin entry at %llu: %llu compressed bytes (of %llu there) declared to expand to "
				      "%llu",
				      (unsigned long long)at, (unsigned long long)csize, (unsigned long long)size,
				      (unsigned long long)dsize);
		return 0;
	}
	if (kind == FATBIN_KIND_ELF && elf_check(code, size, why, whylen))
		return -1;
	if (kind == FATBIN_KIND_PTX && !memchr(code, 0, size))
		return refuse(why, whylen, "fatbin entry at %llu: PTX text without its NUL", (unsigned long long)at);
	return 0;
}

static int fatbin_check(const uint8_t *p, uint64_t n, char *why, size_t whylen)
{
	uint64_t pos = 0;
	/* back-to-back containers, as long as the next bytes are one's magic */
	while (n - pos >= 4 && rd(p + pos, 4) == FATBIN_MAGIC) {
		if (n - pos < FATBIN_HEADER)
			return refuse(why, whylen, "a fatbin container header at %llu cut short", (unsigned long long)pos);
		uint64_t hs = rd(p + pos + 6, 2), size = rd(p + pos + 8, 8);
		if (hs < FATBIN_HEADER || !within(pos + hs, size, n) || hs > n - pos)
			return refuse(why, whylen,
				      "a fatbin container at %llu declares %llu bytes; the image has %llu after it",
				      (unsigned long long)pos, (unsigned long long)size,
				      (unsigned long long)(n - pos > hs ? n - pos - hs : 0));
		uint64_t at = pos + hs, end = pos + hs + size;
		while (at < end) {
			if (end - at < FATBIN_ENTRY_HEADER)
				return refuse(why, whylen, "a fatbin entry header at %llu cut short", (unsigned long long)at);
			if (entry_check(p + at, end - at, at, why, whylen))
				return -1;
			at += rd(p + at + 4, 4) + rd(p + at + 8, 8);
		}
		pos = end;
	}
	return 0;
}

enum vh_image_kind vh_image_kind(const uint8_t *p, uint64_t n)
{
	if (n >= 4 && rd(p, 4) == FATBIN_MAGIC)
		return VH_IMAGE_FATBIN;
	if (n >= SELFMAG && !memcmp(p, ELFMAG, SELFMAG))
		return VH_IMAGE_ELF;
	return VH_IMAGE_OTHER;
}

int vh_image_check(const uint8_t *p, uint64_t n, char *why, size_t whylen)
{
	if (!n)
		return refuse(why, whylen, "an empty image");
	if (n >= 4 && rd(p, 4) == FATBIN_WRAPPER_MAGIC)
		return refuse(why, whylen, "a fatbin wrapper (it holds a pointer; send the fatbin it points to)");
	enum vh_image_kind kind = vh_image_kind(p, n);
	if (kind == VH_IMAGE_FATBIN)
		return fatbin_check(p, n, why, whylen);
	if (kind == VH_IMAGE_ELF)
		return elf_check(p, n, why, whylen);
	/* anything else the driver reads as PTX text, up to its NUL */
	if (!memchr(p, 0, n))
		return refuse(why, whylen, "PTX text of %llu bytes without its NUL", (unsigned long long)n);
	return 0;
}
