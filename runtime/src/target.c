/* Target check: a bundle built for another ISA, or needing CPU features this
 * machine lacks, is refused with a message instead of dying on SIGILL. */
#include <string.h>

#include "internal.h"

#if defined(__x86_64__)
#define CB_HOST_ARCH "x86_64"
#elif defined(__aarch64__)
#define CB_HOST_ARCH "aarch64"
#else
#define CB_HOST_ARCH "unknown"
#endif

/* 1 = present, 0 = absent, -1 = a feature this runtime cannot check. */
static int host_has(const char* f) {
#if defined(__x86_64__)
  __builtin_cpu_init();
#define CB_X86(name) if (strcmp(f, name) == 0) return __builtin_cpu_supports(name) ? 1 : 0;
  CB_X86("sse4.2") CB_X86("avx") CB_X86("avx2") CB_X86("fma") CB_X86("f16c")
  CB_X86("avx512f") CB_X86("avx512bw") CB_X86("avx512dq") CB_X86("avx512vl")
  CB_X86("avx512cd") CB_X86("avx512vnni") CB_X86("avx512bf16") CB_X86("avx512fp16")
  CB_X86("bmi") CB_X86("bmi2")
#undef CB_X86
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
    int has = host_has(m->features[i]);
    if (has == 0)
      return cb_fail(CB_ERR_TARGET, "bundle is built for cpu %s and needs '%s', which this CPU lacks",
                     m->cpu, m->features[i]);
    if (has < 0)
      return cb_fail(CB_ERR_TARGET, "bundle needs CPU feature '%s', which this runtime cannot check",
                     m->features[i]);
  }
  return CB_OK;
}
