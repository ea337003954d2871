/* Target check: a bundle built for another ISA, or needing CPU features this
 * machine lacks, is refused with a message instead of dying on SIGILL. */
#include <pthread.h>
#include <string.h>

#include "internal.h"

#if defined(__x86_64__)
#define CB_HOST_ARCH "x86_64"
#elif defined(__aarch64__)
#define CB_HOST_ARCH "aarch64"
#else
#define CB_HOST_ARCH "unknown"
#endif

#if defined(__x86_64__)
#include <cpuid.h>

/* x86 features from CPUID (and XGETBV: the OS must save the AVX and
 * AVX-512 registers), one table for every compiler. */
typedef struct { const char* name; unsigned leaf, sub, reg, bit, xsave; } cb_x86_feature;
enum { EAX, EBX, ECX, EDX };
enum { XS_NONE, XS_AVX, XS_AVX512 };
static const cb_x86_feature k_x86[] = {
    {"sse4.2", 1, 0, ECX, 20, XS_NONE},     {"fma", 1, 0, ECX, 12, XS_AVX},
    {"avx", 1, 0, ECX, 28, XS_AVX},         {"f16c", 1, 0, ECX, 29, XS_AVX},
    {"avx2", 7, 0, EBX, 5, XS_AVX},         {"bmi", 7, 0, EBX, 3, XS_NONE},
    {"bmi2", 7, 0, EBX, 8, XS_NONE},        {"avx512f", 7, 0, EBX, 16, XS_AVX512},
    {"avx512dq", 7, 0, EBX, 17, XS_AVX512}, {"avx512cd", 7, 0, EBX, 28, XS_AVX512},
    {"avx512bw", 7, 0, EBX, 30, XS_AVX512}, {"avx512vl", 7, 0, EBX, 31, XS_AVX512},
    {"avx512vnni", 7, 0, ECX, 11, XS_AVX512}, {"avx512fp16", 7, 0, EDX, 23, XS_AVX512},
    {"avx512bf16", 7, 1, EAX, 5, XS_AVX512},
};

/* The CPUID leaves the table reads, and what the OS saves (XGETBV), asked
 * once per process: in a virtual machine every CPUID leaves the guest (on
 * the development VM the per-feature queries, about 60 CPUIDs for a
 * bundle's 15 features, were the largest share of an open's own CPU time
 * in a profile of repeated opens). */
typedef struct { unsigned r[3][4]; int avx, avx512; } cb_x86_host;

static cb_x86_host g_host;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

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
#endif

/* 1 = present, 0 = absent, -1 = a feature this runtime cannot check. */
int cb_host_has(const char* f) {
#if defined(__x86_64__)
  for (size_t i = 0; i < sizeof k_x86 / sizeof k_x86[0]; i++) {
    const cb_x86_feature* x = &k_x86[i];
    if (strcmp(f, x->name) != 0) continue;
    const cb_x86_host* h = x86_host();
    const unsigned* r = x86_leaf(h, x->leaf, x->sub);
    int saved = x->xsave == XS_NONE || (x->xsave == XS_AVX ? h->avx : h->avx512);
    return r && (r[x->reg] >> x->bit & 1u) && saved;
  }
#elif defined(__aarch64__)
  if (strcmp(f, "neon") == 0) return 1;
#endif
  return -1;
}

cb_status cb_target_check(const cb_model* m) {
  size_t n = strlen(CB_HOST_ARCH);
  if (strncmp(m->triple, CB_HOST_ARCH, n) != 0 || (m->triple[n] != '-' && m->triple[n] != 0))
    return cb_fail(CB_ERR_TARGET, "bundle is built for %s (cpu %s); this machine is %s", m->triple,
                   m->cpu, CB_HOST_ARCH);
  for (uint32_t i = 0; i < m->nfeatures; i++) {
    int has = cb_host_has(m->features[i]);
    if (has == 0)
      return cb_fail(CB_ERR_TARGET, "bundle is built for cpu %s and needs '%s', which this CPU lacks",
                     m->cpu, m->features[i]);
    if (has < 0)
      return cb_fail(CB_ERR_TARGET, "bundle needs CPU feature '%s', which this runtime cannot check",
                     m->features[i]);
  }
  return CB_OK;
}
