/* The runtime's heap allocations, all through here: counted, and with a
 * failure-injection hook so tests can make any one of them fail. */
#include <stdatomic.h>
#include <stdlib.h>

#include "base/base.h"

static _Atomic uint64_t g_fail_at; /* the allocation (1-based, since the hook was set) that fails; 0: none */
static _Atomic uint64_t g_made;    /* allocations attempted since the hook was armed */
static _Atomic int64_t g_live;     /* allocations not yet freed */
static _Atomic int64_t g_kept;     /* ... of which kept for reuse (cb_alloc_kept) */

/* Counted only while a failure is armed: apps' allocations touch no shared counter. */
static int injected_failure(void) {
  uint64_t at = atomic_load_explicit(&g_fail_at, memory_order_relaxed);
  return at && atomic_fetch_add(&g_made, 1) + 1 == at;
}

static void* counted(void* p) {
  if (p) atomic_fetch_add(&g_live, 1);
  return p;
}

void* cb_malloc(size_t size) { return injected_failure() ? NULL : counted(malloc(size ? size : 1)); }

void* cb_calloc(size_t n, size_t size) {
  return injected_failure() ? NULL : counted(calloc(n ? n : 1, size ? size : 1));
}

void* cb_aligned_alloc(size_t alignment, size_t size) {
  size = (size + alignment - 1) / alignment * alignment;
  return injected_failure() ? NULL : counted(aligned_alloc(alignment, size ? size : alignment));
}

void cb_free(void* p) {
  if (!p) return;
  atomic_fetch_sub(&g_live, 1);
  free(p);
}

void cb_debug_fail_allocation(uint64_t n) {
  atomic_store(&g_fail_at, 0);
  atomic_store(&g_made, 0);
  atomic_store(&g_fail_at, n);
}

void cb_alloc_kept(int64_t delta) { atomic_fetch_add(&g_kept, delta); }

void cb_debug_allocations(uint64_t* out_made, int64_t* out_live) {
  if (out_made) *out_made = atomic_load(&g_made);
  if (out_live) *out_live = atomic_load(&g_live) - atomic_load(&g_kept);
}
