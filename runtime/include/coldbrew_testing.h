/* coldbrew runtime: hooks for the runtime's own tests, fuzzers and the
 * compiler's measurements. Not for apps: nothing here is stable.
 *
 * libcoldbrew.so exports what coldbrew.h declares and what this header
 * declares, and nothing else (it is built with -fvisibility=hidden).
 */
#ifndef COLDBREW_TESTING_H_
#define COLDBREW_TESTING_H_

#include <stdint.h>

#include "coldbrew.h"

CB_API_BEGIN

/* Allocation failures on demand.
 * cb_debug_fail_allocation(n): the n-th heap allocation the runtime makes
 * from now on fails as if memory ran out (n = 0: none fails); every call
 * must then end in a clean status (CB_ERR_OUT_OF_MEMORY, or the error of
 * the step that needed the memory) with nothing left allocated.
 * cb_debug_allocations: allocations attempted since the last
 * cb_debug_fail_allocation call with n > 0 (counted only while one is
 * armed), and the runtime's allocations live now, apart from the kernel
 * workspace blocks its threads keep for reuse and the per-thread caches
 * holding them (a thread may keep a block of a new size at any run: a
 * cache, freed when the thread ends). */
void cb_debug_fail_allocation(uint64_t n);
void cb_debug_allocations(uint64_t* out_made, int64_t* out_live);

/* Whether a GPU's device node is there, as a multi-target bundle's open
 * asks before it tries its GPU section: 1 or 0 from now on, -1 to look
 * again. */
void cb_debug_gpu_node(int present);

/* GPU bundles opened from now on: the pipeline of the shader named `name`
 * is not begun before `ms` milliseconds have passed, so that a run finds
 * it not made yet; NULL releases it. Set a name while no GPU bundle is
 * being opened. */
void cb_debug_gpu_hold_shader(const char* name, uint32_t ms);

/* Position-weighted 64-bit checksum of a bundle's segments and tensors
 * (schemas/README.md); the compiler computes the same in Python. */
uint64_t cb_checksum64(const uint8_t* data, uint64_t size);

/* Decode the LZ4 block src[0, n) into dst[0, cap): the decoded size, or -1
 * for a damaged block (the CPU code segment's codec). */
int64_t cb_lz4_decode(const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t cap);

/* A CPU bundle's code object (`image`, plain) loaded by the runtime's own
 * loader and unloaded: 1 where it took it and found `symbol`, 0 where it
 * declined (the open then takes the system loader's way) or the symbol is
 * missing, -1 on an error. */
int cb_debug_code_object(const uint8_t* image, uint64_t size, const char* symbol);

/* The runtime's own CPU weight transform: n fp16 values -> fp32 (the
 * profiler times it to model narrow weights' widening). */
void cb_widen_f16(const uint16_t* in, float* out, uint64_t n);
/* int8 weights times one scale per entry of their middle axis, over
 * [outer][n][inner] (the transform cb.widen_i8). */
void cb_widen_i8(const int8_t* in, const float* scale, float* out, uint64_t outer, uint64_t n, uint64_t inner);

/* Threads the current run's parallel loops use (a continuous-mode run
 * switches to the warm plan's count). */
int cb_backend_active_threads(void);

CB_API_END

#endif /* COLDBREW_TESTING_H_ */
