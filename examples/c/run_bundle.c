/* A plain C program using coldbrew's public header: open a bundle, fill
 * every input from a raw file (or with a fixed pattern), run once, write
 * every output to OUT_PREFIX<k>.bin and print a summary (each output's
 * bytes and its shape in that run).
 *
 *   cc -std=c11 run_bundle.c -I runtime/include -L DIR -lcoldbrew -o run_bundle
 *   ./run_bundle [--dump-layers DIR] model.brew [out_prefix] [input0.bin ...]
 *
 * --dump-layers DIR runs step by step (cb_session_run_observed)
 * and writes every output of step i, tensor t of the bundle, to
 * DIR/step<i>-<t>.bin (coldbrew compare reads them).
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coldbrew.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int fail(const char* what, cb_status s) {
  fprintf(stderr, "%s failed: %s: %s\n", what, cb_status_name(s), cb_last_error());
  return 1;
}

static void dump_layer(void* dir, uint32_t step, uint32_t tensor, const void* data, uint64_t nbytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/step%u-%u.bin", (const char*)dir, step, tensor);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, nbytes, f) != nbytes) fprintf(stderr, "cannot write %s\n", path);
  if (f) fclose(f);
}

int main(int argc, char** argv) {
  const char* dump = NULL;
  if (argc > 2 && !strcmp(argv[1], "--dump-layers")) dump = argv[2], argv += 2, argc -= 2;
  if (argc < 2) {
    fprintf(stderr, "usage: %s [--dump-layers DIR] model.brew [out_prefix] [input0.bin ...]\n", argv[0]);
    return 2;
  }
  double t0 = now_ms();
  cb_bundle* bundle = NULL;
  cb_status s = cb_bundle_open_file(argv[1], 0, &bundle);
  if (s) return fail("open", s);
  printf("target %s\n", cb_bundle_target(bundle)); /* a multi-target bundle's: the section it opened */
  cb_session* session = NULL;
  if ((s = cb_session_create(bundle, NULL, &session))) return fail("session", s);
  /* Every input at the bundle's shape: a bundle whose inputs take ranges of
   * shapes gives the largest (a session starts at the typical ones). The
   * shapes first, then the data: an input's shape may set another's. */
  for (size_t i = 0; i < cb_bundle_input_count(bundle); i++) {
    cb_tensor_info info;
    cb_bundle_input_info(bundle, i, &info);
    if ((s = cb_session_set_input_shape(session, i, info.shape, info.ndim))) return fail("set_input_shape", s);
  }
  for (size_t i = 0; i < cb_bundle_input_count(bundle); i++) {
    cb_tensor_info info;
    cb_session_input_info(session, i, &info);
    unsigned char* buf = malloc(info.nbytes ? info.nbytes : 1);
    if (!buf) return 1;
    if (argc > 3 + (int)i) {
      FILE* f = fopen(argv[3 + i], "rb");
      if (!f || fread(buf, 1, info.nbytes, f) != info.nbytes) {
        fprintf(stderr, "cannot read %llu bytes from %s\n", (unsigned long long)info.nbytes, argv[3 + i]);
        return 1;
      }
      fclose(f);
    } else {
      for (uint64_t k = 0; k < info.nbytes; k++) buf[k] = (unsigned char)(k % 7);
    }
    s = cb_session_set_input(session, i, buf, info.nbytes);
    free(buf);
    if (s) return fail("set_input", s);
  }
  if ((s = dump ? cb_session_run_observed(session, dump_layer, (void*)dump) : cb_session_run(session)))
    return fail("run", s);
  double t1 = now_ms();
  for (size_t i = 0; i < cb_bundle_output_count(bundle); i++) {
    cb_tensor_info info;
    const void* data;
    size_t nbytes;
    cb_session_output_info(session, i, &info);
    if ((s = cb_session_get_output(session, i, &data, &nbytes))) return fail("get_output", s);
    printf("output %zu %s: %zu bytes, shape ", i, info.name, nbytes); /* the run's (the data may size it) */
    for (int32_t k = 0; k < info.ndim; k++) printf("%s%lld", k ? "x" : "", (long long)info.shape[k]);
    printf("\n");
    if (argc > 2) {
      char path[4096];
      snprintf(path, sizeof path, "%s%zu.bin", argv[2], i);
      FILE* f = fopen(path, "wb");
      if (!f || fwrite(data, 1, nbytes, f) != nbytes) return 1;
      fclose(f);
    }
  }
  printf("open + first run: %.2f ms\n", t1 - t0);
  cb_session_release(session);
  cb_bundle_release(bundle);
  return 0;
}
