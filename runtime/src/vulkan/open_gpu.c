/* Opening a GPU bundle: shaders checked, weights read beside the context,
 * pipelines started while the weights upload (the first run dispatches
 * each layer as soon as its pipelines exist, vulkan_session.c). */
#define _GNU_SOURCE
#include <sched.h>
#include <unistd.h>

#include "vulkan/gpu.h"

/* The reader of a GPU bundle's open: every step's weights, in plan order,
 * read from the file and checked against their checksums (or touched, for a
 * bundle opened without weight checks), while the opening thread makes the
 * GPU context. It reports nothing itself: a tensor it could not check stays
 * unchecked, and the first run's read names it. */
typedef struct gpu_reader {
  cb_bundle* b;
  cb_trace_event* events; /* per step */
  uint64_t sink;
} gpu_reader;

static void* gpu_reader_main(void* arg) {
  gpu_reader* r = arg;
  cb_bundle* b = r->b;
  const cb_model* m = &b->model;
  for (uint32_t i = 0; i < m->nsteps; i++) {
    uint64_t t0 = cb_now_ns();
    const cb_step_desc* st = &m->steps[i];
    for (uint32_t a = 0; a < st->nargs; a++) {
      uint32_t t = st->args[a];
      const cb_tensor_desc* d = &m->tensors[t];
      if (d->kind != CB_KIND_WEIGHT) continue;
      const uint8_t* data = cb_weight_data(b->base, m, t);
      if (b->verified) {
        if (cb_check_tensor(b, t, data, NULL, NULL)) return NULL; /* its error stays on this thread */
      } else {
        r->sink += cb_bring_in(b, data, d->stored);
      }
    }
    r->events[i] = (cb_trace_event){i, CB_PHASE_READ, sched_getcpu(), 0, t0, cb_now_ns(), 0, 0};
  }
  return NULL;
}

static int weights_checked(const cb_bundle* b) {
  for (uint32_t t = 0; b->verified && t < b->model.ntensors; t++)
    if (b->model.tensors[t].kind == CB_KIND_WEIGHT && !atomic_load(&b->verified[t])) return 0;
  return 1;
}

static void add_open_event(cb_bundle* b, cb_trace_event e) {
  if (e.end_ns && b->nopen_events < b->open_cap) b->open_events[b->nopen_events++] = e;
}

/* A GPU bundle's open, CPU threads preparing ahead of the GPU (see
 * cb_phase): shaders checked (as code); weights read and checked by a reader
 * thread while the GPU context is made; then the pipelines on worker threads
 * while this thread uploads the weights. The workers go on past the open:
 * the first run waits for each layer's own pipelines (and helps make them).
 * `key` names the bundle's pipeline cache. */
cb_status cb_open_gpu(cb_bundle* b, uint64_t t0, uint64_t key) {
  const cb_model* m = &b->model;
  const uint8_t* shaders = b->head ? b->head : b->base; /* the head, where it holds them all */
  for (uint32_t i = 0; i < m->nsegments; i++) {
    const cb_segment_desc* seg = &m->segments[i];
    if (seg->kind == CB_SEG_SPIRV) {
      cb_read_ahead(b, seg->offset + seg->size);
      const uint8_t* data = cb_front_at(b, seg->offset, seg->size);
      if (data == b->base + seg->offset) shaders = b->base;
      if (cb_checksum64(data, seg->size) != seg->checksum)
        return cb_fail(CB_ERR_CORRUPT, "segment %u checksum mismatch (file altered or damaged)", i);
    } else if (cb_is_code_segment(seg)) {
      return cb_fail(CB_ERR_CORRUPT, "a GPU bundle carries CPU code");
    }
  }
  b->open_cap = 4 + (int)m->nsteps;
  b->open_events = cb_calloc((size_t)b->open_cap, sizeof *b->open_events);
  gpu_reader reader = {b, cb_calloc(m->nsteps ? m->nsteps : 1, sizeof(cb_trace_event)), 0};
  if (!b->open_events || !reader.events) {
    cb_free(reader.events);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_VERIFY, sched_getcpu(), 0, t0, cb_now_ns(), 0, 0});
  pthread_t rt;
  int reading = pthread_create(&rt, NULL, gpu_reader_main, &reader) == 0;
  if (!reading) gpu_reader_main(&reader);
  uint64_t t1 = cb_now_ns();
  cb_status s = cb_gpu_open(&b->gpu, b->section && !b->want); /* a section picked unasked: a real GPU only */
  add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_GPU_CONTEXT, sched_getcpu(), 0, t1, cb_now_ns(), 0, 0});
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (!s) s = cb_gpu_prepare(b->gpu, shaders, m, key, cores > 0 ? (uint32_t)cores : 1);
  if (reading) pthread_join(rt, NULL);
  b->read_sink += reader.sink;
  for (uint32_t i = 0; i < m->nsteps; i++) add_open_event(b, reader.events[i]);
  cb_free(reader.events);
  if (!s && weights_checked(b)) { /* else the first run's read names the tensor */
    uint64_t t2 = cb_now_ns();
    s = cb_gpu_upload_weights(b->gpu, b->base, m);
    add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_UPLOAD, sched_getcpu(), 0, t2, cb_now_ns(), 0, 0});
  }
  return s;
}
