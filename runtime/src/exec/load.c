/* A bundle opened to run: verified by bundle/ (cb_bundle_verify, then
 * cb_target_check against this machine), then
 * its executor readied, the CPU's (cpu/code.c: the code loaded) or the
 * GPU's (vulkan/open_gpu.c: context, pipelines, weights); released in the
 * reverse order. */
#include "exec/session.h"

static cb_status open_verified(cb_bundle* b, uint32_t flags, const uint8_t* public_key) {
  uint64_t key = 0;
  cb_status s = cb_bundle_verify(b, &flags, public_key, &key);
  if (s || (s = cb_target_check(&b->model))) return s;
  if (b->model.gpu_api[0]) return cb_open_gpu(b, b->open_ns, key);
  return cb_open_cpu(b, b->open_ns, flags);
}

static cb_status finish_open(cb_bundle* b, const cb_open_options* o, cb_bundle** out) {
  cb_status s = open_verified(b, o ? o->flags : 0, o ? o->public_key : NULL);
  if (s) {
    cb_bundle_release(b);
    return s;
  }
  *out = b;
  return CB_OK;
}

cb_status cb_bundle_open_file(const char* path, uint32_t flags, cb_bundle** out_bundle) {
  cb_open_options o = {flags, NULL};
  return cb_bundle_open_file_with(path, &o, out_bundle);
}

cb_status cb_bundle_open_memory(const void* data, size_t size, uint32_t flags, cb_bundle** out_bundle) {
  cb_open_options o = {flags, NULL};
  return cb_bundle_open_memory_with(data, size, &o, out_bundle);
}

cb_status cb_bundle_open_file_with(const char* path, const cb_open_options* options, cb_bundle** out_bundle) {
  if (!path || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "path and out_bundle are required");
  *out_bundle = NULL;
  cb_bundle* b = NULL;
  cb_status s = cb_bundle_from_file(path, options, &b);
  return s ? s : finish_open(b, options, out_bundle);
}

cb_status cb_bundle_open_memory_with(const void* data, size_t size, const cb_open_options* options,
                                     cb_bundle** out_bundle) {
  if (!data || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "data and out_bundle are required");
  *out_bundle = NULL;
  cb_bundle* b = NULL;
  cb_status s = cb_bundle_from_memory(data, size, &b);
  return s ? s : finish_open(b, options, out_bundle);
}

cb_status cb_bundle_check_memory(const void* data, size_t size) {
  if (!data) return cb_fail(CB_ERR_INVALID_ARGUMENT, "data is required");
  cb_bundle* b = NULL;
  uint32_t flags = CB_OPEN_SKIP_WEIGHT_CHECKSUMS;
  uint64_t key = 0;
  cb_status s = cb_bundle_from_memory(data, size, &b);
  if (!s) s = cb_bundle_verify(b, &flags, NULL, &key);
  cb_bundle_free(b);
  return s;
}

void cb_bundle_release(cb_bundle* b) {
  if (!b) return;
  cb_stream_stop(b);
  cb_gpu_release(b->gpu);
  cb_code_unload(b);
  cb_bundle_free(b);
}
