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

/* A multi-target bundle whose GPU section this machine cannot open (no
 * Vulkan device: CB_ERR_GPU) is opened again for its CPU sections (*again). */
static cb_status finish_open(cb_bundle* b, const cb_open_options* o, int no_gpu, cb_bundle** out, int* again) {
  b->want = o ? o->target : NULL;
  b->no_gpu = no_gpu || (o && (o->flags & CB_OPEN_CPU_ONLY)) || (!b->want && !cb_gpu_node_present());
  cb_status s = open_verified(b, o ? o->flags : 0, o ? o->public_key : NULL);
  if (s) {
    *again = s == CB_ERR_GPU && b->section && !b->want && !b->no_gpu;
    cb_bundle_release(b);
    return s;
  }
  *out = b;
  return CB_OK;
}

const char* cb_bundle_target(const cb_bundle* b) {
  return !b ? "" : b->section ? b->section : b->model.gpu_api[0] ? b->model.gpu_api : b->model.cpu;
}

cb_status cb_bundle_open_file(const char* path, uint32_t flags, cb_bundle** out_bundle) {
  cb_open_options o = {flags, NULL, NULL};
  return cb_bundle_open_file_with(path, &o, out_bundle);
}

cb_status cb_bundle_open_memory(const void* data, size_t size, uint32_t flags, cb_bundle** out_bundle) {
  cb_open_options o = {flags, NULL, NULL};
  return cb_bundle_open_memory_with(data, size, &o, out_bundle);
}

cb_status cb_bundle_open_file_with(const char* path, const cb_open_options* options, cb_bundle** out_bundle) {
  if (!path || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "path and out_bundle are required");
  *out_bundle = NULL;
  for (int no_gpu = 0, again = 0;; no_gpu = 1) {
    cb_bundle* b = NULL;
    cb_status s = cb_bundle_from_file(path, options, &b);
    if (s || !(s = finish_open(b, options, no_gpu, out_bundle, &again)) || !again) return s;
  }
}

cb_status cb_bundle_open_memory_with(const void* data, size_t size, const cb_open_options* options,
                                     cb_bundle** out_bundle) {
  if (!data || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "data and out_bundle are required");
  *out_bundle = NULL;
  for (int no_gpu = 0, again = 0;; no_gpu = 1) {
    cb_bundle* b = NULL;
    cb_status s = cb_bundle_from_memory(data, size, &b);
    if (s || !(s = finish_open(b, options, no_gpu, out_bundle, &again)) || !again) return s;
  }
}

cb_status cb_bundle_check_memory(const void* data, size_t size) {
  if (!data) return cb_fail(CB_ERR_INVALID_ARGUMENT, "data is required");
  cb_bundle* b = NULL;
  uint32_t flags = CB_OPEN_SKIP_WEIGHT_CHECKSUMS;
  uint64_t key = 0;
  cb_status s = cb_bundle_from_memory(data, size, &b);
  if (!s) b->check_all = 1, s = cb_bundle_verify(b, &flags, NULL, &key);
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
