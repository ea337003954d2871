/* One way of making a bundle's kernel code callable, timed once in a fresh
 * process (bench/experiments/code_load.py drives it). The code is the
 * compiler's shared object, found in FILE at byte OFFSET (plain, SIZE
 * bytes), and for the `lz4` arm also as an LZ4 block in LZ4FILE.
 *
 *   code_load ARM FILE OFFSET SIZE [LZ4FILE] -> "ARM microseconds"
 *
 * Arms: memfd (the runtime's way: decode the LZ4 block into a memfd's
 * shared mapping, then dlopen /proc/self/fd/N), anon (decode into an
 * anonymous mapping of the object's span, segments moved to their
 * addresses, relocated, no loader), inplace (map the plain object's
 * segments straight from the file, which is in the page cache, and
 * relocate: no copy at all). x86-64 only; relocations RELATIVE, GLOB_DAT,
 * JUMP_SLOT and 64, the only kinds the compiler's objects hold. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int64_t cb_lz4_decode(const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t cap);

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t span_of(const Elf64_Ehdr* eh) {
  const Elf64_Phdr* ph = (const Elf64_Phdr*)((const uint8_t*)eh + eh->e_phoff);
  uint64_t span = 0;
  for (int i = 0; i < eh->e_phnum; i++)
    if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr + ph[i].p_memsz > span) span = ph[i].p_vaddr + ph[i].p_memsz;
  return (span + 4095) & ~4095ull;
}

/* The object's dynamic relocations applied at `base`; its symbol `want`. */
static void* relocate(uint8_t* base, const Elf64_Dyn* dyn, const char* want) {
  const Elf64_Sym* sym = NULL;
  const char* str = NULL;
  const Elf64_Rela *rela = NULL, *jmp = NULL;
  uint64_t nrela = 0, njmp = 0, nsym = 0;
  for (; dyn->d_tag != DT_NULL; dyn++) {
    if (dyn->d_tag == DT_SYMTAB) sym = (const Elf64_Sym*)(base + dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_STRTAB) str = (const char*)(base + dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_RELA) rela = (const Elf64_Rela*)(base + dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_RELASZ) nrela = dyn->d_un.d_val / sizeof(Elf64_Rela);
    if (dyn->d_tag == DT_JMPREL) jmp = (const Elf64_Rela*)(base + dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_PLTRELSZ) njmp = dyn->d_un.d_val / sizeof(Elf64_Rela);
  }
  for (int pass = 0; pass < 2; pass++) {
    const Elf64_Rela* r = pass ? jmp : rela;
    for (uint64_t k = 0, n = pass ? njmp : nrela; k < n; k++) {
      uint64_t* where = (uint64_t*)(base + r[k].r_offset);
      uint32_t type = ELF64_R_TYPE(r[k].r_info), si = ELF64_R_SYM(r[k].r_info);
      if (si + 1 > nsym) nsym = si + 1;
      if (type == R_X86_64_RELATIVE) {
        *where = (uint64_t)base + (uint64_t)r[k].r_addend;
      } else if (type == R_X86_64_GLOB_DAT || type == R_X86_64_JUMP_SLOT || type == R_X86_64_64) {
        void* s = sym[si].st_shndx ? base + sym[si].st_value : dlsym(RTLD_DEFAULT, str + sym[si].st_name);
        *where = (uint64_t)s + (type == R_X86_64_64 ? (uint64_t)r[k].r_addend : 0);
      } else {
        fprintf(stderr, "relocation type %u not handled\n", type);
        exit(2);
      }
    }
  }
  for (const Elf64_Sym* s = sym + 1; (const char*)s < str; s++) /* the symbol table ends where the strings begin */
    if (s->st_shndx && strcmp(str + s->st_name, want) == 0) return base + s->st_value;
  return NULL;
}

static const Elf64_Dyn* dynamic(const Elf64_Ehdr* eh, uint8_t* base) {
  const Elf64_Phdr* ph = (const Elf64_Phdr*)((const uint8_t*)eh + eh->e_phoff);
  for (int i = 0; i < eh->e_phnum; i++)
    if (ph[i].p_type == PT_DYNAMIC) return (const Elf64_Dyn*)(base + ph[i].p_vaddr);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  const char* arm = argv[1];
  uint64_t at = strtoull(argv[3], NULL, 10), size = strtoull(argv[4], NULL, 10);
  int fd = open(argv[2], O_RDONLY);
  uint8_t* file = mmap(NULL, at + size, PROT_READ, MAP_PRIVATE, fd, 0); /* the bundle's own mapping */
  static uint8_t lz[16 << 20];
  size_t nlz = 0;
  if (argc > 5) {
    FILE* f = fopen(argv[5], "rb");
    nlz = fread(lz, 1, sizeof lz, f);
    fclose(f);
  }
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)(file + at);
  const Elf64_Phdr* ph = (const Elf64_Phdr*)(file + at + eh->e_phoff);
  const char* want = argc > 6 ? argv[6] : "";
  void* fn = NULL;
  uint64_t t0 = now_ns();
  if (strcmp(arm, "memfd") == 0) {
    int m = memfd_create("coldbrew-kernels", MFD_CLOEXEC);
    if (ftruncate(m, (off_t)size) != 0) return 3;
    uint8_t* d = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
    if (cb_lz4_decode(lz, nlz, d, size) != (int64_t)size) return 4;
    munmap(d, size);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", m);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    fn = h ? dlsym(h, want) : NULL;
  } else if (strcmp(arm, "anon") == 0) {
    uint64_t span = span_of(eh) > size ? span_of(eh) : (size + 4095) & ~4095ull;
    uint8_t* base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (cb_lz4_decode(lz, nlz, base, size) != (int64_t)size) return 4;
    for (int i = eh->e_phnum - 1; i >= 0; i--) /* segments to their addresses, the last first */
      if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr != ph[i].p_offset)
        memmove(base + ph[i].p_vaddr, base + ph[i].p_offset, ph[i].p_filesz);
    fn = relocate(base, dynamic(eh, base), want);
    for (int i = 0; i < eh->e_phnum; i++)
      if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X))
        mprotect(base + (ph[i].p_vaddr & ~4095ull), ph[i].p_memsz + (ph[i].p_vaddr & 4095), PROT_READ | PROT_EXEC);
  } else if (strcmp(arm, "inplace") == 0) {
    uint8_t* base = mmap(NULL, span_of(eh), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < eh->e_phnum; i++) {
      if (ph[i].p_type != PT_LOAD) continue;
      uint64_t pad = ph[i].p_vaddr & 4095;
      int prot = (ph[i].p_flags & PF_R ? PROT_READ : 0) | (ph[i].p_flags & PF_W ? PROT_WRITE : 0) |
                 (ph[i].p_flags & PF_X ? PROT_EXEC : 0);
      if (mmap(base + ph[i].p_vaddr - pad, ph[i].p_filesz + pad, prot, MAP_PRIVATE | MAP_FIXED, fd,
               (off_t)(at + ph[i].p_offset - pad)) == MAP_FAILED)
        return 5;
      uint64_t end = ph[i].p_vaddr + ph[i].p_filesz, page_end = (end + 4095) & ~4095ull;
      if (ph[i].p_memsz > ph[i].p_filesz) { /* .bss: the rest of its last file page zeroed, whole pages fresh */
        memset(base + end, 0, page_end - end);
        if (ph[i].p_vaddr + ph[i].p_memsz > page_end)
          mmap(base + page_end, ph[i].p_vaddr + ph[i].p_memsz - page_end, prot, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS,
               -1, 0);
      }
    }
    fn = relocate(base, dynamic(eh, base), want);
  } else {
    return 2;
  }
  printf("%s %.1f %s\n", arm, (double)(now_ns() - t0) / 1e3, fn ? "found" : "missing");
  return 0;
}
