/* libFuzzer target: a bundle given as bytes, opened from memory; with
 * CB_FUZZ_RUN also a session created (cold, then continuous mode), its
 * inputs set and run twice, its outputs and trace read. Built by
 * tests/fuzz/fuzz.py with ASan + UBSan, plain (every mutation checked at
 * the door) or with tests/fuzz/structured.cc (checksums recomputed, so the
 * deeper checks, the session and the run are reached). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coldbrew.h"

static void use_bundle(cb_bundle* b) {
  for (size_t i = 0; i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    size_t k;
    if (!cb_bundle_input_info(b, i, &info)) (void)cb_bundle_find_input(b, info.name, &k);
  }
  for (size_t i = 0; i < cb_bundle_output_count(b); i++) {
    cb_tensor_info info;
    (void)cb_bundle_output_info(b, i, &info);
  }
  const char *layer, *variant;
  for (size_t i = 0; !cb_bundle_step_info(b, i, &layer, &variant); i++) (void)cb_bundle_step_alternate(b, i, &variant);
}

#ifdef CB_FUZZ_RUN
static void run_session(cb_bundle* b, uint32_t mode) {
  cb_session_options opts = {0, 1, mode, 0, NULL};
  cb_session* s = NULL;
  if (cb_session_create(b, &opts, &s)) return;
  for (size_t i = 0; i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    if (cb_bundle_input_info(b, i, &info) || info.nbytes > (64u << 20)) continue;
    void* zero = calloc(1, info.nbytes ? info.nbytes : 1);
    if (zero) (void)cb_session_set_input(s, i, zero, info.nbytes);
    free(zero);
  }
  for (int r = 0; r < 2; r++) {
    if (cb_session_run(s)) break;
    for (size_t i = 0; i < cb_bundle_output_count(b); i++) {
      const void* out;
      size_t n;
      (void)cb_session_get_output(s, i, &out, &n);
    }
  }
  const cb_trace_event* ev;
  size_t nev, ready, total;
  (void)cb_session_trace(s, &ev, &nev);
  (void)cb_session_alternates(s, &ready, &total);
  cb_session_release(s);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cb_bundle* b = NULL;
  if (cb_bundle_open_memory(data, size, 0, &b)) return 0;
  use_bundle(b);
#ifdef CB_FUZZ_RUN
  run_session(b, 0);
  run_session(b, 1);
#else
  (void)cb_bundle_verify_weights(b);
#endif
  cb_bundle_release(b);
  return 0;
}
