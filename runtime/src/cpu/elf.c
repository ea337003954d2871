/* A bundle's kernel code made callable without the system loader: the
 * compiler's shared object (an ELF64 of this machine, position-independent,
 * its imports a few libc and libm functions) is decoded straight into one
 * anonymous mapping of its span, each segment moved to its address, its
 * dynamic relocations applied, its init functions run, and its segments
 * given their protections. The system loader's way (code.c: the object
 * written to a memfd and dlopen'ed) costs a second copy of every page and
 * the loader's own work: 0.26 against 0.47 ms for a 137 KB object here
 * (bench/experiments/code_load.py). An object this loader does not know
 * (thread-local storage, another relocation kind, no GNU hash table) goes
 * the system loader's way. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu/cpu.h"

#if defined(__x86_64__)
#define CB_ELF_MACHINE EM_X86_64
enum { REL_RELATIVE = R_X86_64_RELATIVE, REL_GLOB_DAT = R_X86_64_GLOB_DAT, REL_JUMP_SLOT = R_X86_64_JUMP_SLOT,
       REL_ABS64 = R_X86_64_64 };
#elif defined(__aarch64__)
#define CB_ELF_MACHINE EM_AARCH64
enum { REL_RELATIVE = R_AARCH64_RELATIVE, REL_GLOB_DAT = R_AARCH64_GLOB_DAT, REL_JUMP_SLOT = R_AARCH64_JUMP_SLOT,
       REL_ABS64 = R_AARCH64_ABS64 };
#else
#define CB_ELF_MACHINE EM_NONE
enum { REL_RELATIVE = -1, REL_GLOB_DAT = -1, REL_JUMP_SLOT = -1, REL_ABS64 = -1 };
#endif

#define CB_ELF_MAX_NEEDED 8
#define CB_PAGE 4096u

struct cb_elf {
  uint8_t* base;
  size_t reserved;
  uint64_t span;
  const Elf64_Sym* syms;
  const char* strs;
  const uint32_t* gnu_hash;
  void* needed[CB_ELF_MAX_NEEDED]; /* the libraries it names, held while it is loaded */
  uint64_t fini_array, fini_count;
};

/* The dynamic section's entry `tag` (its first), or 0. */
static uint64_t dyn_value(const Elf64_Dyn* dyn, int64_t tag) {
  for (; dyn->d_tag != DT_NULL; dyn++)
    if (dyn->d_tag == tag) return dyn->d_un.d_val;
  return 0;
}

void* cb_elf_symbol(const cb_elf* e, const char* name) {
  const uint32_t* h = e->gnu_hash;
  uint32_t hash = 5381;
  for (const unsigned char* c = (const unsigned char*)name; *c; c++) hash = hash * 33 + *c;
  const uint32_t* end = (const uint32_t*)(e->base + e->span);
  uint32_t nbuckets = h[0], first = h[1], nbloom = h[2];
  const uint32_t* buckets = h + 4 + 2 * (uint64_t)nbloom; /* past the 64-bit bloom words */
  const uint32_t* chain = buckets + nbuckets;
  if (buckets > end || chain > end || !nbuckets) return NULL;
  for (uint32_t k = buckets[hash % nbuckets]; k >= first && k && chain + (k - first) < end; k++) {
    uint32_t c = chain[k - first];
    const Elf64_Sym* sym = &e->syms[k];
    if ((const uint8_t*)(sym + 1) > e->base + e->span) break;
    if ((c | 1) == (hash | 1) && sym->st_shndx && sym->st_name < e->span &&
        strcmp(e->strs + sym->st_name, name) == 0)
      return sym->st_value < e->span ? e->base + sym->st_value : NULL;
    if (c & 1) break;
  }
  return NULL;
}

/* An import's address: in the libraries the object names, then anywhere. */
static void* import(const cb_elf* e, const char* name) {
  for (int k = 0; k < CB_ELF_MAX_NEEDED && e->needed[k]; k++) {
    void* p = dlsym(e->needed[k], name);
    if (p) return p;
  }
  return dlsym(RTLD_DEFAULT, name);
}

/* Its relocations applied; 0, or -1 for one this loader does not know or
 * a strong import not found. */
static int relocate(cb_elf* e, const Elf64_Rela* r, uint64_t n, uint64_t span) {
  for (uint64_t k = 0; k < n; k++) {
    uint32_t type = ELF64_R_TYPE(r[k].r_info), si = ELF64_R_SYM(r[k].r_info);
    if (r[k].r_offset > span - 8) return -1;
    uint64_t* where = (uint64_t*)(e->base + r[k].r_offset);
    if ((int)type == REL_RELATIVE) {
      *where = (uint64_t)e->base + (uint64_t)r[k].r_addend;
    } else if ((int)type == REL_GLOB_DAT || (int)type == REL_JUMP_SLOT || (int)type == REL_ABS64) {
      const Elf64_Sym* s = &e->syms[si];
      if ((const uint8_t*)(s + 1) > e->base + span || (const uint8_t*)e->strs + s->st_name >= e->base + span)
        return -1;
      void* p = s->st_shndx ? e->base + s->st_value : import(e, e->strs + s->st_name);
      if (!p && ELF64_ST_BIND(s->st_info) != STB_WEAK) return -1;
      *where = (uint64_t)p + ((int)type == REL_GLOB_DAT && CB_ELF_MACHINE == EM_X86_64 ? 0 : (uint64_t)r[k].r_addend);
    } else {
      return -1;
    }
  }
  return 0;
}

/* The span the object's segments take at their addresses (they are
 * moved there from the image decoded at the mapping's start, the last
 * first: they only move up); -1 for an object this loader does not take. */
static int place(const Elf64_Phdr* ph, int n, uint64_t image, uint64_t* span) {
  *span = 0;
  for (int i = 0; i < n; i++) {
    if (ph[i].p_type == PT_TLS || ph[i].p_type == PT_INTERP) return -1;
    if (ph[i].p_type != PT_LOAD) continue;
    if (ph[i].p_filesz > ph[i].p_memsz || ph[i].p_offset + ph[i].p_filesz > image || ph[i].p_vaddr < ph[i].p_offset ||
        ph[i].p_vaddr + ph[i].p_memsz < ph[i].p_vaddr)
      return -1;
    if (ph[i].p_vaddr + ph[i].p_memsz > *span) *span = ph[i].p_vaddr + ph[i].p_memsz;
  }
  *span = (*span + CB_PAGE - 1) & ~(uint64_t)(CB_PAGE - 1);
  return *span ? 0 : -1;
}

/* Each page given the protections of the segments on it (their union: a
 * page two segments share keeps both), pages of none inaccessible; -1
 * where the system refuses (one that never lets written memory run). */
static int protect(uint8_t* base, const Elf64_Phdr* ph, int n, uint64_t span, size_t reserved) {
  int prev = -1, failed = reserved > span && mprotect(base + span, reserved - span, PROT_NONE) != 0;
  uint64_t run = 0;
  for (uint64_t page = 0; page <= span; page += CB_PAGE) {
    int prot = 0;
    for (int i = 0; page < span && i < n; i++)
      if (ph[i].p_type == PT_LOAD && page + CB_PAGE > ph[i].p_vaddr && page < ph[i].p_vaddr + ph[i].p_memsz)
        prot |= (ph[i].p_flags & PF_R ? PROT_READ : 0) | (ph[i].p_flags & PF_W ? PROT_WRITE : 0) |
                (ph[i].p_flags & PF_X ? PROT_EXEC : 0);
    if (page == span || (prev >= 0 && prot != prev)) {
      failed |= mprotect(base + run, (size_t)(page - run), prev) != 0;
      run = page;
    }
    prev = prot;
  }
  return failed ? -1 : 0;
}

cb_status cb_elf_load(const uint8_t* src, uint64_t n, uint64_t image, int compressed, cb_elf** out) {
  *out = NULL;
  cb_elf* e = cb_calloc(1, sizeof *e);
  if (!e) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  /* room for the image and for its segments' moves (a page-aligned object's
   * data segment lies at most its alignment past its file offset) */
  e->reserved = (size_t)((image + (1u << 20) + CB_PAGE - 1) & ~(uint64_t)(CB_PAGE - 1));
  void* p = mmap(NULL, e->reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return cb_free(e), cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory (kernel code)");
  e->base = p;
  if (compressed ? cb_lz4_decode(src, n, e->base, image) != (int64_t)image : (memcpy(e->base, src, image), 0)) {
    cb_elf_free(e);
    return cb_fail(CB_ERR_CORRUPT, "the compressed CPU code does not decode to its %llu bytes (damaged)",
                   (unsigned long long)image);
  }
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)e->base;
  uint64_t span = 0;
  if (image < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_type != ET_DYN || eh->e_machine != CB_ELF_MACHINE || eh->e_phentsize != sizeof(Elf64_Phdr) ||
      eh->e_phoff > image || (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > image - eh->e_phoff)
    return cb_elf_free(e), CB_OK; /* not one for this loader: *out stays NULL */
  Elf64_Phdr ph[32];
  int nph = eh->e_phnum < 32 ? eh->e_phnum : 0;
  memcpy(ph, e->base + eh->e_phoff, (size_t)nph * sizeof *ph);
  const Elf64_Phdr* dynamic = NULL;
  for (int i = 0; i < nph; i++)
    if (ph[i].p_type == PT_DYNAMIC) dynamic = &ph[i];
  if (!nph || !dynamic || place(ph, nph, image, &span) || span > e->reserved ||
      dynamic->p_vaddr + dynamic->p_memsz > span)
    return cb_elf_free(e), CB_OK;
  for (int i = nph - 1; i >= 0; i--)
    if (ph[i].p_type == PT_LOAD) {
      memmove(e->base + ph[i].p_vaddr, e->base + ph[i].p_offset, ph[i].p_filesz);
      memset(e->base + ph[i].p_vaddr + ph[i].p_filesz, 0, ph[i].p_memsz - ph[i].p_filesz); /* .bss */
    }
  const Elf64_Dyn* dyn = (const Elf64_Dyn*)(e->base + dynamic->p_vaddr);
  uint64_t symtab = dyn_value(dyn, DT_SYMTAB), strtab = dyn_value(dyn, DT_STRTAB), hash = dyn_value(dyn, DT_GNU_HASH);
  uint64_t rela = dyn_value(dyn, DT_RELA), nrela = dyn_value(dyn, DT_RELASZ) / sizeof(Elf64_Rela);
  uint64_t jmprel = dyn_value(dyn, DT_JMPREL), njmp = dyn_value(dyn, DT_PLTRELSZ) / sizeof(Elf64_Rela);
  if (!symtab || !strtab || !hash || symtab >= span || strtab >= span || hash >= span || rela > span ||
      rela + nrela * sizeof(Elf64_Rela) > span || jmprel > span || jmprel + njmp * sizeof(Elf64_Rela) > span ||
      (njmp && dyn_value(dyn, DT_PLTREL) != DT_RELA))
    return cb_elf_free(e), CB_OK;
  e->span = span;
  e->syms = (const Elf64_Sym*)(e->base + symtab), e->strs = (const char*)(e->base + strtab);
  e->gnu_hash = (const uint32_t*)(e->base + hash);
  int k = 0;
  for (const Elf64_Dyn* d = dyn; d->d_tag != DT_NULL && k < CB_ELF_MAX_NEEDED; d++)
    if (d->d_tag == DT_NEEDED && strtab + d->d_un.d_val < span)
      e->needed[k++] = dlopen(e->strs + d->d_un.d_val, RTLD_NOW | RTLD_LOCAL);
  uint64_t init = dyn_value(dyn, DT_INIT), array = dyn_value(dyn, DT_INIT_ARRAY);
  uint64_t count = dyn_value(dyn, DT_INIT_ARRAYSZ) / sizeof(void*);
  uint64_t fini = dyn_value(dyn, DT_FINI_ARRAY), nfini = dyn_value(dyn, DT_FINI_ARRAYSZ) / sizeof(void*);
  if (relocate(e, (const Elf64_Rela*)(e->base + rela), nrela, span) ||
      relocate(e, (const Elf64_Rela*)(e->base + jmprel), njmp, span) || init >= span || array > span ||
      count > (span - array) / sizeof(void*) || fini > span || nfini > (span - fini) / sizeof(void*))
    return cb_elf_free(e), CB_OK;
  __builtin___clear_cache((char*)e->base, (char*)e->base + span); /* written code, about to run (aarch64) */
  if (protect(e->base, ph, nph, span, e->reserved)) return cb_elf_free(e), CB_OK;
  if (init) ((void (*)(void))(e->base + init))();
  for (uint64_t i = 0; array && i < count; i++) ((void (**)(void))(e->base + array))[i]();
  e->fini_array = fini, e->fini_count = fini ? nfini : 0;
  *out = e;
  return CB_OK;
}

void cb_elf_free(cb_elf* e) {
  if (!e) return;
  for (uint64_t i = e->fini_count; i > 0; i--)
    ((void (**)(void))(e->base + e->fini_array))[i - 1]();
  if (e->base) munmap(e->base, e->reserved);
  for (int k = 0; k < CB_ELF_MAX_NEEDED; k++)
    if (e->needed[k]) dlclose(e->needed[k]);
  cb_free(e);
}

int cb_debug_code_object(const uint8_t* image, uint64_t size, const char* symbol) {
  cb_elf* e = NULL;
  if (cb_elf_load(image, size, size, 0, &e)) return -1;
  if (!e) return 0;
  int found = cb_elf_symbol(e, symbol) != NULL;
  cb_elf_free(e);
  return found;
}
