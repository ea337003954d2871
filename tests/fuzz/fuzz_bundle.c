/* libFuzzer target: a bundle given as bytes, opened from memory; with
 * CB_FUZZ_RUN also a session created (cold at its first shapes, then
 * continuous mode at the bundle's largest), its inputs set and run twice,
 * its outputs and trace read. Built by
 * tests/fuzz/fuzz.py with ASan + UBSan, plain (every mutation checked at
 * the door) or with tests/fuzz/structured.cc (checksums recomputed, so the
 * deeper checks, the session and the run are reached). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle/model.h"

/* The code segment is native code: trusted through its checksum against
 * accidents and through a signature against intent, never through parsing.
 * The checksum is linear, so a fuzzer that changes two code words can
 * cancel it out (libFuzzer did); running such code tests the mutated code,
 * not the runtime. So an input whose code segment passes its checksum but
 * is not byte-for-byte the code of a seed (CB_FUZZ_CORPUS: their folder) is
 * skipped before it is opened; every other input, including code that fails
 * its checksum, goes through the runtime. */
#define MAX_TRUSTED 64
static uint64_t g_trusted[MAX_TRUSTED];
static int g_ntrusted;

static uint64_t fnv1a(const uint8_t* p, uint64_t n) {
  uint64_t h = 14695981039346656037ull;
  for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* The code segment of `data` if its checksum holds: 1 and its FNV-1a hash; else 0. */
static int checked_code(const uint8_t* data, size_t size, uint64_t* hash) {
  uint32_t off;
  uint64_t n, declared;
  if (size < CB_PREAMBLE_SIZE || memcmp(data, CB_MAGIC, 8) != 0) return 0;
  memcpy(&off, data + 12, 4), memcpy(&n, data + 16, 8), memcpy(&declared, data + 32, 8);
  if (declared != size || off < CB_PREAMBLE_SIZE || off > size || n > size - off || off % 8) return 0;
  uint32_t version;
  memcpy(&version, data + 8, 4);
  cb_model m;
  if (cb_model_parse(data + off, n, size, version, &m) != CB_OK) return 0;
  int found = 0;
  for (uint32_t i = 0; i < m.nsegments && !found; i++) {
    const cb_segment_desc* s = &m.segments[i];
    if ((s->kind == CB_SEG_CPU_CODE || s->kind == CB_SEG_CPU_CODE_LZ4) &&
        cb_checksum64(data + s->offset, s->size) == s->checksum) {
      *hash = fnv1a(data + s->offset, s->size);
      found = 1;
    }
  }
  cb_model_free(&m);
  return found;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* dir = getenv("CB_FUZZ_CORPUS");
  DIR* d = dir ? opendir(dir) : NULL;
  for (struct dirent* e; d && (e = readdir(d)) && g_ntrusted < MAX_TRUSTED;) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE* f = fopen(path, "rb");
    if (!f) continue;
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    uint64_t h;
    if (checked_code(buf, n, &h)) g_trusted[g_ntrusted++] = h;
  }
  if (d) closedir(d);
  return 0;
}

static int untrusted_code(const uint8_t* data, size_t size) {
  uint64_t h;
  if (!checked_code(data, size, &h)) return 0; /* no code, or code the runtime will refuse */
  for (int i = 0; i < g_ntrusted; i++)
    if (g_trusted[i] == h) return 0;
  return 1;
}

static void use_bundle(cb_bundle* b) {
  for (size_t i = 0; i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    size_t k;
    if (cb_bundle_input_info(b, i, &info)) continue;
    (void)cb_bundle_find_input(b, info.name, &k);
    for (int32_t a = 0; a <= info.ndim; a++) { /* one past the last axis: refused */
      int64_t lo, hi, step;
      (void)cb_bundle_input_range(b, i, a, &lo, &hi, &step);
    }
  }
  for (size_t i = 0; i < cb_bundle_output_count(b); i++) {
    cb_tensor_info info;
    (void)cb_bundle_output_info(b, i, &info);
  }
  const char *layer, *variant;
  for (size_t i = 0; !cb_bundle_step_info(b, i, &layer, &variant); i++) (void)cb_bundle_step_alternate(b, i, &variant);
}

#ifdef CB_FUZZ_RUN
/* A session's runs at its first shapes (a ranged bundle's typical ones) or,
 * `largest`, at the bundle's (every shape program at its largest). */
static void run_session(cb_bundle* b, uint32_t mode, int largest) {
  cb_session_options opts = {0, 1, mode, 0, NULL};
  cb_session* s = NULL;
  if (cb_session_create(b, &opts, &s)) return;
  for (size_t i = 0; largest && i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    if (!cb_bundle_input_info(b, i, &info)) (void)cb_session_set_input_shape(s, i, info.shape, info.ndim);
  }
  for (size_t i = 0; i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    if (cb_session_input_info(s, i, &info) || info.nbytes > (64u << 20)) continue; /* at the session's shape */
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
  if (untrusted_code(data, size)) return 0;
  cb_bundle* b = NULL;
  if (cb_bundle_open_memory(data, size, 0, &b)) return 0;
  use_bundle(b);
#ifdef CB_FUZZ_RUN
  run_session(b, 0, 0);
  run_session(b, 1, 1);
#else
  (void)cb_bundle_verify_weights(b);
#endif
  cb_bundle_release(b);
  return 0;
}
