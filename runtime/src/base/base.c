/* The base every other part builds on: error messages, the checksum, the
 * clock, the futex. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

/* ---- errors ------------------------------------------------------------ */

static _Thread_local char g_error[1024];

const char* cb_last_error(void) { return g_error; }

cb_status cb_fail(cb_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
  return status;
}

const char* cb_status_name(cb_status s) {
  static const char* names[] = {"OK", "INVALID_ARGUMENT", "IO", "BAD_MAGIC", "VERSION",
                                "CORRUPT", "TARGET", "LOAD", "KERNEL", "OUT_OF_MEMORY", "GPU", "SIGNATURE"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN";
}

/* ---- checksum ---------------------------------------------------------- */

/* sum over little-endian u64 words w_i (zero-padded) of w_i * (2i + 1), mod 2^64.
 * Odd multipliers make every single-bit flip and every word swap visible.
 * The sum is linear in the words, so parts of a buffer can be summed apart
 * (cb_checksum64_part, words numbered from the part's first) and added. */
uint64_t cb_checksum64_part(const uint8_t* data, uint64_t size, uint64_t first_word) {
  uint64_t sum = 0, n = size / 8, i = 0;
  for (; i < n; i++) {
    uint64_t w;
    memcpy(&w, data + 8 * i, 8);
    sum += w * (2 * (first_word + i) + 1);
  }
  if (size % 8) {
    uint64_t w = 0;
    memcpy(&w, data + 8 * n, size % 8);
    sum += w * (2 * (first_word + n) + 1);
  }
  return sum;
}

uint64_t cb_checksum64(const uint8_t* data, uint64_t size) { return cb_checksum64_part(data, size, 0); }

uint64_t cb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint32_t cb_thread_faults(void) {
#ifdef RUSAGE_THREAD
  struct rusage u;
  if (getrusage(RUSAGE_THREAD, &u) == 0) return (uint32_t)(u.ru_minflt + u.ru_majflt);
#endif
  return 0;
}

/* ---- futex ------------------------------------------------------------- */

void cb_futex_wait(void* word, int value) {
  syscall(SYS_futex, (int*)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

void cb_futex_wake(void* word, int count) {
  syscall(SYS_futex, (int*)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
