/* The runtime's lowest layer (base/): errors, heap allocations, the
 * checksum, the clock, the futex, the LZ4 codec. It includes and calls
 * nothing else of runtime/src; every other layer builds on it. Not
 * installed. */
#ifndef COLDBREW_BASE_H_
#define COLDBREW_BASE_H_

#include "coldbrew.h"
#include "coldbrew_testing.h" /* hooks the tests and the compiler call: exported too */

#ifdef __cplusplus
extern "C" {
#endif

/* Heap allocations (alloc.c): every allocation of the runtime goes through
 * these, so cb_debug_fail_allocation can make any one of them fail and
 * cb_debug_allocations can count what is live. Zero sizes allocate one
 * byte (one alignment unit); cb_aligned_alloc rounds the size up. */
void* cb_malloc(size_t size);
void* cb_calloc(size_t n, size_t size);
void* cb_aligned_alloc(size_t alignment, size_t size);
void cb_free(void* p);
/* `delta` live allocations are kept for reuse, not leaked (the kernels'
 * workspace blocks and the threads' caches holding them, cpu/backend.c):
 * cb_debug_allocations does not count them as live. */
void cb_alloc_kept(int64_t delta);

/* CLOCK_MONOTONIC in nanoseconds: the trace's clock (base.c). */
uint64_t cb_now_ns(void);
/* The page faults the calling thread has taken (minor and major): the trace's count. */
uint32_t cb_thread_faults(void);

/* Position-weighted 64-bit checksum (schemas/README.md) of a part of a
 * whole, its first word numbered `first_word` (cb_checksum64: the whole). */
uint64_t cb_checksum64_part(const uint8_t* data, uint64_t size, uint64_t first_word);

/* Error reporting: set the calling thread's message and return `status`. */
cb_status cb_fail(cb_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sleep while the 32-bit atomic int at `word` holds `value` (Linux futex,
 * this process only); wake up to `count` sleepers on it (base.c). */
void cb_futex_wait(void* word, int value);
void cb_futex_wake(void* word, int count);

/* A parallel loop's tasks: TVMParallelGroupEnv and FTVMParallelLambda,
 * restated. The CPU layer's pool runs them (cpu/backend.c,
 * cb_backend_parallel); a lower layer that can share its work among the
 * pool's threads (a bundle's checksums, bundle/stream.c) is handed the
 * launcher, never calls up for it. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} cb_parallel_env;
typedef int (*cb_parallel_lambda)(int task_id, cb_parallel_env* env, void* cdata);
/* Runs fn's tasks, at most `num_task` of them (fewer where fewer threads
 * are active: then env->num_task says how many); nonzero if a task failed. */
typedef int (*cb_parallel_launch)(cb_parallel_lambda fn, void* cdata, int num_task);

#ifdef __cplusplus
}
#endif

#endif /* COLDBREW_BASE_H_ */
