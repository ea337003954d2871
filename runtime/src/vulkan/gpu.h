/* The GPU executor (vulkan/) as the layers above see it (exec/): a
 * bundle's device, pipelines (made on up to `threads` CPU threads, through
 * the pipeline cache keyed by `bundle_key`) and weights buffer; a
 * session's arena, staging (its host view of inputs and outputs, at their
 * arena offsets) and recorded command buffer; a GPU bundle's open
 * (open_gpu.c). Includes only base/, bundle/ and vulkan/; its internals,
 * with the Vulkan headers, are vk.h's. */
#ifndef COLDBREW_GPU_H_
#define COLDBREW_GPU_H_

#include "bundle/bundle.h"

typedef struct cb_gpu cb_gpu;
typedef struct cb_gpu_session cb_gpu_session;
/* The loader, an instance and the device (the GPU context); with
 * `hardware`, no CPU implementation of Vulkan. */
cb_status cb_gpu_open(cb_gpu** out, int hardware);
/* Whether this machine shows a GPU's device node (vulkan.c). */
int cb_gpu_node_present(void);
/* The weights buffer of a bundle, and its pipelines started (through the
 * cache) on `threads` - 1 worker threads. */
cb_status cb_gpu_prepare(cb_gpu* g, const uint8_t* base, const cb_model* m, uint64_t bundle_key, uint32_t threads);
/* The caller helps make the remaining pipelines, then waits for all (once
 * per bundle: later calls return at once). */
cb_status cb_gpu_pipelines_finish(cb_gpu* g);
int cb_gpu_pipelines_done(const cb_gpu* g);
/* Whether every pipeline exists (finish would not wait). */
int cb_gpu_pipelines_made(const cb_gpu* g);
/* One shader's pipeline: whether it exists; wait for it (helping make the
 * next ones meanwhile). */
int cb_gpu_pipeline_ready(const cb_gpu* g, uint32_t shader);
cb_status cb_gpu_pipeline_wait(cb_gpu* g, uint32_t shader);
/* Per shader: when and on which core its pipeline was made (valid where
 * cb_gpu_pipeline_ready). */
const cb_trace_event* cb_gpu_pipeline_events(const cb_gpu* g);
int cb_gpu_weights_ready(cb_gpu* g);
void cb_gpu_release(cb_gpu* g);
const char* cb_gpu_device_name(const cb_gpu* g);
const char* cb_gpu_cache_path(const cb_gpu* g);
/* Copy every weight tensor (already read and checked) to the device, once per bundle. */
cb_status cb_gpu_upload_weights(cb_gpu* g, const uint8_t* base, const cb_model* m);
cb_status cb_gpu_session_create(cb_gpu* g, const cb_model* m, cb_gpu_session** out, void** host_view);
/* A run made while pipelines are still being made submits the layers in
 * chunks: each as soon as its pipelines exist (a layer with first-run
 * launches uses those while its own pipelines do not), the next waiting for
 * its own (at most CB_GPU_MAX_CHUNKS). The first run after every pipeline
 * exists finishes them (the cache written) and records the command buffer
 * every later run submits whole.
 * `chunks` (may be NULL) gets one event per submission (its first step, or
 * CB_STEP_BUNDLE for the whole plan; submitted; seen complete), `*nchunks`
 * their count. */
#define CB_GPU_MAX_CHUNKS 32
cb_status cb_gpu_session_run(cb_gpu_session* gs, cb_trace_event* chunks, uint32_t* nchunks);
/* The plan submitted step by step, each step's outputs copied to the
 * staging buffer and `done(ctx, step)` called (cb_session_run_observed). */
cb_status cb_gpu_session_run_steps(cb_gpu_session* gs, void (*done)(void*, uint32_t), void* ctx);
void cb_gpu_session_release(cb_gpu_session* gs);

/* open_gpu.c: a GPU bundle's open, after bundle/'s checks (cb_bundle_verify:
 * `t0` when the open began, `key` names its pipeline cache) */
cb_status cb_open_gpu(cb_bundle* b, uint64_t t0, uint64_t key);

#endif /* COLDBREW_GPU_H_ */
