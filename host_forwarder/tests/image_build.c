/* SPDX-License-Identifier: Apache-2.0 */
/* Module images built byte by byte (image_build.h). */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_build.h"

void buf_put(struct buf *b, const void *p, uint64_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

void buf_pad(struct buf *b, uint64_t align)
{
	static const uint8_t zero[64];
	while (b->n % align)
		buf_put(b, zero, 1);
}

void buf_put_u(struct buf *b, uint64_t v, unsigned bytes)
{
	buf_put(b, &v, bytes);
}

/* A small, well-formed cubin: sections of every kind the check reads. */
struct buf image_cubin(void)
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
	buf_put(&b, &eh, sizeof eh);
	uint64_t off[8], size[8];
	off[1] = b.n, size[1] = sizeof shstr;
	buf_put(&b, shstr, sizeof shstr);
	off[2] = b.n, size[2] = sizeof str;
	buf_put(&b, str, sizeof str);
	buf_pad(&b, 8);
	Elf64_Sym sym[2] = {{0}, {.st_name = 1, .st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC), .st_shndx = 5}};
	off[3] = b.n, size[3] = sizeof sym;
	buf_put(&b, sym, sizeof sym);
	off[4] = b.n; /* .nv.info: a record with 8 bytes of value, one with none */
	buf_put_u(&b, 0x2f04, 2), buf_put_u(&b, 8, 2), buf_put_u(&b, 1, 4), buf_put_u(&b, 24, 4);
	buf_put_u(&b, 0x1b03, 2), buf_put_u(&b, 0xff, 2);
	size[4] = b.n - off[4];
	buf_pad(&b, 16);
	off[5] = b.n, size[5] = 32;
	for (int i = 0; i < 4; i++)
		buf_put_u(&b, 0x000fc00000000000ull + i, 8);
	off[6] = b.n; /* a note: name "NVIDIA", 8 bytes of desc */
	buf_put_u(&b, 7, 4), buf_put_u(&b, 8, 4), buf_put_u(&b, 1000, 4), buf_put(&b, "NVIDIA\0", 8), buf_put_u(&b, 90, 8);
	size[6] = b.n - off[6];
	Elf64_Rela rela = {.r_offset = 8, .r_info = ELF64_R_INFO(1, 1)};
	off[7] = b.n, size[7] = sizeof rela;
	buf_put(&b, &rela, sizeof rela);
	Elf64_Phdr ph = {.p_type = PT_LOAD, .p_flags = PF_R | PF_X, .p_offset = off[5], .p_filesz = 32, .p_memsz = 32};
	uint64_t phoff = b.n;
	buf_put(&b, &ph, sizeof ph);
	buf_pad(&b, 8);
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
		buf_put(&b, &sh, sizeof sh);
	}
	Elf64_Ehdr *h = (Elf64_Ehdr *)b.p;
	h->e_phoff = phoff, h->e_phnum = 1;
	h->e_shoff = shoff, h->e_shnum = 8, h->e_shstrndx = 1;
	return b;
}

/* A fatbin entry of kind with payload (padded to 8), hs 64 (ELF) or 80 (PTX, with options). */
void image_entry(struct buf *b, unsigned kind, const void *payload, uint64_t n)
{
	uint64_t padded = (n + 7) & ~7ull;
	uint32_t hs = kind == 1 ? 80 : 64;
	buf_put_u(b, kind, 2), buf_put_u(b, 0x101, 2), buf_put_u(b, hs, 4), buf_put_u(b, padded, 8);
	buf_put_u(b, 0, 4), buf_put_u(b, kind == 1 ? 64 : 0, 4), buf_put_u(b, kind == 1 ? 0x90000 : 0x10008, 4);
	buf_put_u(b, 90, 4), buf_put_u(b, 0, 4), buf_put_u(b, 0, 4), buf_put_u(b, 0x11, 8), buf_put_u(b, 0, 8), buf_put_u(b, 0, 8);
	if (kind == 1)
		buf_put_u(b, 72, 4), buf_put_u(b, 0, 4), buf_put_u(b, 0, 8);
	buf_put(b, payload, n);
	buf_pad(b, 8);
}

void image_container(struct buf *b, const struct buf *entries)
{
	buf_put_u(b, 0xBA55ED50u, 4), buf_put_u(b, 1, 2), buf_put_u(b, 16, 2), buf_put_u(b, entries->n, 8);
	buf_put(b, entries->p, entries->n);
}

/* Two containers back to back: an ELF and a PTX entry, then a PTX entry. */
struct buf image_fatbin(void)
{
	struct buf e1 = {0}, e2 = {0}, b = {0}, elf = image_cubin();
	image_entry(&e1, 2, elf.p, elf.n);
	image_entry(&e1, 1, PTX_TEXT, sizeof PTX_TEXT);
	image_entry(&e2, 1, PTX_TEXT, sizeof PTX_TEXT);
	image_container(&b, &e1);
	image_container(&b, &e2);
	free(e1.p), free(e2.p), free(elf.p);
	return b;
}

struct buf buf_copy(const struct buf *a)
{
	struct buf b = {0};
	buf_put(&b, a->p, a->n);
	return b;
}

void buf_set(struct buf *b, uint64_t at, uint64_t v, unsigned bytes)
{
	memcpy(b->p + at, &v, bytes);
}

/* An executable's .nv_fatbin section, or the file itself. */
struct buf image_read(const char *path)
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
		buf_put(&b, chunk, n);
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
			buf_put(&s, b.p + sh[i].sh_offset, sh[i].sh_size);
			free(b.p);
			return s;
		}
	return b;
}
