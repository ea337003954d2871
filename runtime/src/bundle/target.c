/* Target check: a bundle built for another ISA, or needing CPU features this
 * machine lacks, is refused with a message instead of dying on SIGILL. */
#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bundle/model.h"

#if defined(__x86_64__)
#define CB_HOST_ARCH "x86_64"
#elif defined(__aarch64__)
#define CB_HOST_ARCH "aarch64"
#else
#define CB_HOST_ARCH "unknown"
#endif

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* x86 features from CPUID (and XGETBV: the OS must save the AVX and
 * AVX-512 registers), one table for every compiler. */
typedef struct { const char* name; unsigned leaf, sub, reg, bit, xsave; } cb_x86_feature;
enum { EAX, EBX, ECX, EDX };
enum { XS_NONE, XS_AVX, XS_AVX512, XS_AMX };
static const cb_x86_feature k_x86[] = {
    {"sse4.2", 1, 0, ECX, 20, XS_NONE},     {"fma", 1, 0, ECX, 12, XS_AVX},
    {"avx", 1, 0, ECX, 28, XS_AVX},         {"f16c", 1, 0, ECX, 29, XS_AVX},
    {"avx2", 7, 0, EBX, 5, XS_AVX},         {"bmi", 7, 0, EBX, 3, XS_NONE},
    {"bmi2", 7, 0, EBX, 8, XS_NONE},        {"avx512f", 7, 0, EBX, 16, XS_AVX512},
    {"avx512dq", 7, 0, EBX, 17, XS_AVX512}, {"avx512cd", 7, 0, EBX, 28, XS_AVX512},
    {"avx512bw", 7, 0, EBX, 30, XS_AVX512}, {"avx512vl", 7, 0, EBX, 31, XS_AVX512},
    {"avx512vnni", 7, 0, ECX, 11, XS_AVX512}, {"avx512fp16", 7, 0, EDX, 23, XS_AVX512},
    {"avx512bf16", 7, 1, EAX, 5, XS_AVX512},
    {"amx-tile", 7, 0, EDX, 24, XS_AMX},    {"amx-int8", 7, 0, EDX, 25, XS_AMX},
};

/* The CPUID leaves the table reads, and what the OS saves (XGETBV), asked
 * once per process: in a virtual machine every CPUID leaves the guest (on
 * the development VM the per-feature queries, about 60 CPUIDs for a
 * bundle's 15 features, were the largest share of an open's own CPU time
 * in a profile of repeated opens). */
typedef struct { unsigned r[3][4]; int avx, avx512, amx; } cb_x86_host;

static cb_x86_host g_host;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

/* Linux hands a process the AMX tile registers' state (8 KiB per thread)
 * only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA); until
 * then the first tile instruction faults. Asked once per process, for
 * every thread; elsewhere the tiles count as absent. */
static int amx_permitted(void) {
#if defined(__linux__)
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
  return 0;
#endif
}

static void ask_host(void) {
  cb_x86_host h;
  memset(&h, 0, sizeof h);
  unsigned max = __get_cpuid_max(0, NULL);
  if (max >= 1) __cpuid_count(1, 0, h.r[0][EAX], h.r[0][EBX], h.r[0][ECX], h.r[0][EDX]);
  if (max >= 7) {
    __cpuid_count(7, 0, h.r[1][EAX], h.r[1][EBX], h.r[1][ECX], h.r[1][EDX]);
    if (h.r[1][EAX] >= 1) __cpuid_count(7, 1, h.r[2][EAX], h.r[2][EBX], h.r[2][ECX], h.r[2][EDX]);
  }
  if (h.r[0][ECX] & (1u << 27)) { /* OSXSAVE: XGETBV says which register states the OS saves */
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    h.avx = (lo & 0x6u) == 0x6u;      /* SSE and AVX state */
    h.avx512 = (lo & 0xE6u) == 0xE6u; /* + opmask, ZMM_Hi256, Hi16_ZMM */
    h.amx = (lo & 0x60000u) == 0x60000u && amx_permitted(); /* XTILECFG, XTILEDATA */
  }
  g_host = h;
}

static const cb_x86_host* x86_host(void) {
  pthread_once(&g_host_once, ask_host);
  return &g_host;
}

/* A table row's CPUID leaf as x86_host keeps it, or NULL (a leaf it does
 * not ask for). */
static const unsigned* x86_leaf(const cb_x86_host* h, unsigned leaf, unsigned sub) {
  if (leaf == 1 && sub == 0) return h->r[0];
  if (leaf == 7 && sub <= 1) return h->r[1 + sub];
  return NULL;
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* aarch64 features from the kernel's hardware capabilities (AT_HWCAP,
 * AT_HWCAP2): user space may not read the ID registers without the
 * kernel's emulation, and the kernel reports only what it also enables.
 * The bit values are those of the Linux UAPI header
 * arch/arm64/include/uapi/asm/hwcap.h (<asm/hwcap.h>), defined here since
 * an older <asm/hwcap.h> (or bionic's) may lack the newer ones. */
#define CB_HWCAP_FP (1ul << 0)
#define CB_HWCAP_ASIMD (1ul << 1)
#define CB_HWCAP_AES (1ul << 3)
#define CB_HWCAP_PMULL (1ul << 4)
#define CB_HWCAP_SHA1 (1ul << 5)
#define CB_HWCAP_SHA2 (1ul << 6)
#define CB_HWCAP_CRC32 (1ul << 7)
#define CB_HWCAP_ATOMICS (1ul << 8)
#define CB_HWCAP_FPHP (1ul << 9)
#define CB_HWCAP_ASIMDHP (1ul << 10)
#define CB_HWCAP_ASIMDRDM (1ul << 12)
#define CB_HWCAP_FCMA (1ul << 14)
#define CB_HWCAP_LRCPC (1ul << 15)
#define CB_HWCAP_SHA3 (1ul << 17)
#define CB_HWCAP_ASIMDDP (1ul << 20)
#define CB_HWCAP_SHA512 (1ul << 21)
#define CB_HWCAP_SVE (1ul << 22)
#define CB_HWCAP_ASIMDFHM (1ul << 23)
#define CB_HWCAP2_SVE2 (1ul << 1)
#define CB_HWCAP2_I8MM (1ul << 13)
#define CB_HWCAP2_BF16 (1ul << 14)
#ifndef AT_HWCAP2
#define AT_HWCAP2 26 /* <linux/auxvec.h> */
#endif

/* coldbrew's name -> the bits all required in AT_HWCAP and AT_HWCAP2. Each
 * row covers every instruction LLVM's feature of that name enables
 * (targets/__init__.py maps LLVM's names to these): fullfp16 is scalar and
 * vector half precision, aes includes the 64-bit PMULL, sha2 includes SHA1,
 * sha3 includes SHA512. Keep the names in sync with CHECKED_FEATURES in
 * targets/schema.py (tests/runtime/test_aarch64.py compares them). */
typedef struct { const char* name; unsigned long hwcap, hwcap2; } cb_arm_feature;
static const cb_arm_feature k_arm[] = {
    {"neon", CB_HWCAP_FP | CB_HWCAP_ASIMD, 0},
    {"fp16", CB_HWCAP_FPHP | CB_HWCAP_ASIMDHP, 0},
    {"dotprod", CB_HWCAP_ASIMDDP, 0},
    {"rdm", CB_HWCAP_ASIMDRDM, 0},
    {"lse", CB_HWCAP_ATOMICS, 0},
    {"crc", CB_HWCAP_CRC32, 0},
    {"rcpc", CB_HWCAP_LRCPC, 0},
    {"fhm", CB_HWCAP_ASIMDFHM, 0},
    {"i8mm", 0, CB_HWCAP2_I8MM},
    {"bf16", 0, CB_HWCAP2_BF16},
    {"sve", CB_HWCAP_SVE, 0},
    {"sve2", CB_HWCAP_SVE, CB_HWCAP2_SVE2},
    {"aes", CB_HWCAP_AES | CB_HWCAP_PMULL, 0},
    {"sha2", CB_HWCAP_SHA1 | CB_HWCAP_SHA2, 0},
    {"sha3", CB_HWCAP_SHA3 | CB_HWCAP_SHA512, 0},
    {"fcma", CB_HWCAP_FCMA, 0},
};

/* Both words asked once per process, as x86 asks CPUID once. */
typedef struct { unsigned long hwcap, hwcap2; } cb_arm_host;

static cb_arm_host g_host;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static void ask_host(void) {
  g_host.hwcap = getauxval(AT_HWCAP);
  g_host.hwcap2 = getauxval(AT_HWCAP2);
}

static const cb_arm_host* arm_host(void) {
  pthread_once(&g_host_once, ask_host);
  return &g_host;
}
#endif

/* 1 = present, 0 = absent, -1 = a feature this runtime cannot check. */
int cb_host_has(const char* f) {
#if defined(__x86_64__)
  for (size_t i = 0; i < sizeof k_x86 / sizeof k_x86[0]; i++) {
    const cb_x86_feature* x = &k_x86[i];
    if (strcmp(f, x->name) != 0) continue;
    const cb_x86_host* h = x86_host();
    const unsigned* r = x86_leaf(h, x->leaf, x->sub);
    int saved = x->xsave == XS_NONE || (x->xsave == XS_AVX ? h->avx : x->xsave == XS_AVX512 ? h->avx512 : h->amx);
    return r && (r[x->reg] >> x->bit & 1u) && saved;
  }
#elif defined(__aarch64__) && defined(__linux__)
  for (size_t i = 0; i < sizeof k_arm / sizeof k_arm[0]; i++) {
    const cb_arm_feature* a = &k_arm[i];
    if (strcmp(f, a->name) != 0) continue;
    const cb_arm_host* h = arm_host();
    return (h->hwcap & a->hwcap) == a->hwcap && (h->hwcap2 & a->hwcap2) == a->hwcap2;
  }
#elif defined(__aarch64__)
  if (strcmp(f, "neon") == 0) return 1; /* part of the base ISA; no HWCAP to ask elsewhere */
#endif
  return -1;
}

cb_status cb_target_runs(const char* triple, const char* cpu, const char* const* features, uint32_t nfeatures) {
  size_t n = strlen(CB_HOST_ARCH);
  if (strncmp(triple, CB_HOST_ARCH, n) != 0 || (triple[n] != '-' && triple[n] != 0))
    return cb_fail(CB_ERR_TARGET, "bundle is built for %s (cpu %s); this machine is %s", triple, cpu, CB_HOST_ARCH);
  char lacks[512] = "";
  for (uint32_t i = 0, at = 0; i < nfeatures; i++) {
    int has = cb_host_has(features[i]);
    if (has < 0)
      return cb_fail(CB_ERR_TARGET, "bundle needs CPU feature '%s', which this runtime cannot check", features[i]);
    if (!has && at < sizeof lacks) at += snprintf(lacks + at, sizeof lacks - at, "%s'%s'", at ? ", " : "", features[i]);
  }
  if (lacks[0]) return cb_fail(CB_ERR_TARGET, "bundle is built for cpu %s and needs %s, which this CPU lacks", cpu, lacks);
  return CB_OK;
}

cb_status cb_target_check(const cb_model* m) { return cb_target_runs(m->triple, m->cpu, m->features, m->nfeatures); }
