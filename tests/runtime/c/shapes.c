/* Shapes set at run time through the C API, built under ASan + UBSan by
 * tests/runtime/test_shapes.py. BUNDLE is its model y = (relu(x) + z) * b
 * with x and z of shape [1, n, 3], n in 2..40 in steps of 2 (typical 10),
 * b = [0.5, 2, -1]. Prints "ok" and exits 0 when every check passes, else
 * names the first that fails and exits 1.
 *
 *   shapes BUNDLE
 */
#include <stdio.h>
#include <string.h>

#include "coldbrew.h"

#define CHECK(cond, what)                                                            \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "shapes: line %d: %s (last error: %s)\n", __LINE__, what, cb_last_error()); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

static int is(const cb_tensor_info* i, int64_t n, uint64_t nbytes) {
  return i->ndim == 3 && i->shape[0] == 1 && i->shape[1] == n && i->shape[2] == 3 && i->nbytes == nbytes;
}

/* x and z set to shape [1, n, 3] and their data, a run, its output checked. */
static int run_at(cb_session* s, int64_t n) {
  float x[120], z[120], want[120];
  const float b[3] = {0.5f, 2.0f, -1.0f};
  const int64_t shape[3] = {1, n, 3};
  cb_tensor_info info;
  for (int64_t i = 0; i < 3 * n; i++) {
    x[i] = (float)(i % 7) - 3.0f, z[i] = (float)(i % 5) * 0.25f;
    want[i] = ((x[i] > 0 ? x[i] : 0) + z[i]) * b[i % 3];
  }
  CHECK(cb_session_set_input_shape(s, 0, shape, 3) == CB_OK, "x's shape");
  CHECK(cb_session_set_input_shape(s, 1, shape, 3) == CB_OK, "z's shape, as x's dim made it");
  CHECK(cb_session_set_input(s, 0, x, 12 * n) == CB_OK && cb_session_set_input(s, 1, z, 12 * n) == CB_OK, "data");
  CHECK(cb_session_run(s) == CB_OK, "run");
  const void* out = NULL;
  size_t nbytes = 0;
  CHECK(cb_session_output_info(s, 0, &info) == CB_OK && is(&info, n, 12 * n), "the output's shape in the run");
  CHECK(cb_session_get_output(s, 0, &out, &nbytes) == CB_OK && nbytes == (size_t)(12 * n), "the output's bytes");
  CHECK(memcmp(out, want, nbytes) == 0, "the output's values");
  return 0;
}

int main(int argc, char** argv) {
  cb_bundle* b = NULL;
  cb_session* s = NULL;
  cb_tensor_info info;
  int64_t lo = 0, hi = 0, step = 0;
  float big[120] = {0};
  CHECK(argc == 2 && cb_bundle_open_file(argv[1], 0, &b) == CB_OK, "open");
  CHECK(cb_bundle_input_range(b, 1, 1, &lo, &hi, &step) == CB_OK && lo == 2 && hi == 40 && step == 2, "z's range");
  CHECK(cb_bundle_input_range(b, 0, 2, &lo, &hi, &step) == CB_OK && lo == 3 && hi == 3 && step == 1, "a fixed axis");
  CHECK(cb_bundle_input_range(b, 0, 3, &lo, &hi, &step) == CB_ERR_INVALID_ARGUMENT, "an axis x lacks");
  CHECK(cb_bundle_output_range(b, 0, 1, &lo, &hi, &step) == CB_OK && lo == 2 && hi == 40 && step == 2, "y's range");
  CHECK(cb_bundle_output_range(b, 0, 0, &lo, &hi, &step) == CB_OK && lo == 1 && hi == 1 && step == 1, "y's fixed axis");
  CHECK(cb_bundle_output_range(b, 1, 0, &lo, &hi, &step) == CB_ERR_INVALID_ARGUMENT, "an output y's bundle lacks");
  CHECK(cb_bundle_input_info(b, 0, &info) == CB_OK && is(&info, 40, 480), "the bundle's shape is the largest");
  CHECK(cb_session_create(b, NULL, &s) == CB_OK, "session");
  CHECK(cb_session_input_info(s, 1, &info) == CB_OK && is(&info, 10, 120), "a session starts at the typical shape");
  CHECK(cb_session_output_info(s, 0, &info) == CB_OK && is(&info, 10, 120), "... its outputs too");
  CHECK(cb_session_set_input(s, 0, big, 480) == CB_ERR_INVALID_ARGUMENT, "the largest bytes at the typical shape");
  if (run_at(s, 4) || run_at(s, 40) || run_at(s, 2)) return 1;
  /* refused shapes name the input, the axis and what it takes, and change nothing */
  const int64_t over[3] = {1, 42, 3}, odd[3] = {1, 5, 3}, wide[3] = {1, 2, 4}, six[3] = {1, 6, 3}, eight[3] = {1, 8, 3};
  CHECK(cb_session_set_input_shape(s, 0, over, 3) == CB_ERR_INVALID_ARGUMENT &&
        strstr(cb_last_error(), "input 'x' axis 1 is 42: the bundle takes 2..40 in steps of 2"), "out of range");
  CHECK(cb_session_set_input_shape(s, 0, odd, 3) == CB_ERR_INVALID_ARGUMENT, "not a multiple of the step");
  CHECK(cb_session_set_input_shape(s, 0, wide, 3) == CB_ERR_INVALID_ARGUMENT &&
        strstr(cb_last_error(), "input 'x' axis 2 is 4: the bundle takes 3 there"), "a fixed axis");
  CHECK(cb_session_set_input_shape(s, 1, six, 3) == CB_ERR_INVALID_ARGUMENT &&
        strstr(cb_last_error(), "input 'z' axis 1 is 6: the bundle takes 2 there"), "an axis x's shape sets");
  CHECK(cb_session_set_input_shape(s, 0, over, 2) == CB_ERR_INVALID_ARGUMENT, "a rank of its own");
  CHECK(cb_session_input_info(s, 1, &info) == CB_OK && is(&info, 2, 24), "refusals change no shape");
  /* a new shape changes the inputs' at once, the outputs' with the next run */
  CHECK(cb_session_set_input_shape(s, 0, eight, 3) == CB_OK, "x at 8");
  CHECK(cb_session_input_info(s, 1, &info) == CB_OK && is(&info, 8, 96), "z follows x's dim");
  CHECK(cb_session_output_info(s, 0, &info) == CB_OK && is(&info, 2, 24), "the output keeps the last run's shape");
  if (run_at(s, 8) || run_at(s, 8)) return 1; /* the same shape again: nothing to change */
  cb_session_release(s);
  cb_bundle_release(b);
  printf("ok\n");
  return 0;
}
