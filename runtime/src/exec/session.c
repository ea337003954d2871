/* Sessions: created over a bundle (arena, prepared weights, kernel
 * arguments), fed inputs, read for outputs and traces. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "exec/session.h"

static void dl_dtype(uint8_t dtype, cb_dltensor* t) {
  static const uint8_t code[] = {2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 6};
  static const uint8_t bits[] = {32, 16, 64, 8, 16, 32, 64, 8, 16, 32, 64, 8};
  t->code = code[dtype], t->bits = bits[dtype], t->lanes = 1;
}

/* A session's large areas (arena, prepared weights): first written by the
 * first run, so each of their pages costs a fault there. Transparent huge
 * pages, where the kernel offers them, make that one fault per 2 MB
 * instead of per 4 KB. */
#define CB_HUGE_PAGE (2u << 20)
static void* big_alloc(size_t size) {
  if (size < CB_HUGE_PAGE) return cb_aligned_alloc(64, size);
  size = (size + CB_HUGE_PAGE - 1) / CB_HUGE_PAGE * CB_HUGE_PAGE;
  void* p = cb_aligned_alloc(CB_HUGE_PAGE, size);
  if (p) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

/* The split of runs with n execution threads: the caller's shares if they
 * are for n threads, else the plan's for n threads (its later runs' for
 * later runs), else NULL (even). */
static const uint8_t* split_for(const cb_model* m, int later, uint32_t n, const uint8_t* own, uint32_t nown) {
  if (nown && nown == n) return own;
  if (later && m->warm_threads && n == m->warm_threads) return m->warm_exec_shares;
  return n == m->threads ? m->exec_shares : NULL;
}

/* The caller's options checked: the execution threads of the first run and
 * of later runs. */
static cb_status session_threads(const cb_model* m, const cb_session_options* options, uint32_t* threads,
                                 uint32_t* later) {
  if (options && options->mode > CB_MODE_CONTINUOUS)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "unknown session mode %u", options->mode);
  *threads = options && options->threads ? options->threads : (m->threads ? m->threads : 1);
  /* runs after the first: the plan's later thread count (the warm plan's in
   * continuous mode; all execution cores where the first run kept some for
   * preparation), unless the caller gives one count for all runs */
  *later = options && options->threads ? *threads : (m->warm_threads ? m->warm_threads : *threads);
  uint32_t nshares = options ? options->exec_share_count : 0;
  if (nshares && (nshares != *threads || !options->exec_shares || nshares > 256))
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "exec_shares has %u entries for %u execution threads", nshares, *threads);
  for (uint32_t k = 0; k < nshares; k++)
    if (!options->exec_shares[k]) return cb_fail(CB_ERR_INVALID_ARGUMENT, "exec_shares gives thread %u no share", k);
  return CB_OK;
}

/* The session's memory: the arena (a GPU session's: its staging buffer,
 * where inputs and outputs live at their arena offsets), the prepared
 * weights, the kernels' arguments, the per-step state and the trace. */
static cb_status session_memory(cb_session* s, const cb_session_options* options) {
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  int gpu = m->gpu_api[0] != 0;
  uint64_t total_args = 0, total_targs = 0, total_aargs = 0;
  for (uint32_t i = 0; i < m->nsteps; i++)
    total_args += m->steps[i].nargs, total_targs += m->steps[i].ntransform_args, total_aargs += m->steps[i].nwarm_args;
  if (gpu) {
    void* view = NULL;
    cb_status st = cb_gpu_session_create(b->gpu, m, &s->gpu, &view);
    if (st) return st;
    s->arena = view;
  } else {
    s->arena = big_alloc((size_t)((m->arena_size + 63) & ~(uint64_t)63) + 64);
    if (s->arena && getenv("COLDBREW_POISON_ARENA")) /* checks: what a layer reads unwritten is NaN */
      memset(s->arena, 0xFF, (size_t)m->arena_size);
  }
  s->tensors = cb_calloc(m->ntensors ? m->ntensors : 1, sizeof *s->tensors);
  s->args = cb_calloc(total_args ? total_args : 1, sizeof *s->args);
  s->arg_start = cb_calloc(m->nsteps + 1, sizeof *s->arg_start);
  s->targs = cb_calloc(total_targs ? total_targs : 1, sizeof *s->targs);
  s->targ_start = cb_calloc(m->nsteps + 1, sizeof *s->targ_start);
  s->aargs = cb_calloc(total_aargs ? total_aargs : 1, sizeof *s->aargs);
  s->aarg_start = cb_calloc(m->nsteps + 1, sizeof *s->aarg_start);
  s->alt_ready = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->is_prepared = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->skipped = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->was_read = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->ready = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->claimed = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  uint32_t out_axes = 0;
  for (uint32_t k = 0; k < m->noutputs; k++) out_axes += (uint32_t)m->tensors[m->outputs[k]].ndim;
  s->dims = cb_calloc(2 * (size_t)m->ntensors + 1, sizeof *s->dims);
  s->nbytes = cb_calloc(m->ntensors + 1, sizeof *s->nbytes);
  s->shapes = cb_calloc(m->program_axes + 1, sizeof *s->shapes);
  s->out_shapes = cb_calloc(out_axes + 1, sizeof *s->out_shapes);
  s->out_nbytes = cb_calloc(m->noutputs + 1, sizeof *s->out_nbytes);
  /* GPU bundles keep prepared tensors in the device's weights buffer */
  s->prepared = gpu ? cb_aligned_alloc(64, 64) : big_alloc((size_t)((m->prepared_size + 63) & ~(uint64_t)63) + 64);
  if (options && options->trace) {
    s->trace_cap = 4 * (size_t)m->nsteps + 7 + (size_t)b->nopen_events + m->nshaders + CB_GPU_MAX_CHUNKS;
    s->trace = cb_calloc(s->trace_cap, sizeof *s->trace);
    if (!s->trace) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (!s->arena || !s->tensors || !s->args || !s->arg_start || !s->targs || !s->targ_start || !s->is_prepared || !s->skipped || !s->was_read ||
      !s->prepared || !s->ready || !s->claimed || !s->aargs || !s->aarg_start || !s->alt_ready || !s->dims ||
      !s->nbytes || !s->shapes || !s->out_shapes || !s->out_nbytes)
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory (arena %llu bytes)", (unsigned long long)m->arena_size);
  return CB_OK;
}

/* Every tensor's place and shape (shapes.c: those set at run time, and the
 * kernel arguments). The arena is not zeroed: every tensor in it is written
 * (inputs by the caller, the rest by the layers) before it is read
 * (COLDBREW_POISON_ARENA fills it with NaN bytes at creation, to check that). */
static cb_status bind_session(cb_session* s) {
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    cb_dltensor* t = &s->tensors[i];
    if (d->kind == CB_KIND_WEIGHT)
      t->data = (void*)cb_weight_at(b, i);
    else if (d->kind == CB_KIND_PREPARED)
      t->data = s->gpu ? NULL : s->prepared + d->arena_offset;
    else
      t->data = s->arena + d->arena_offset;
    t->device_type = CB_DL_CPU;
    t->ndim = d->ndim;
    t->shape = (int64_t*)d->shape;
    dl_dtype(d->dtype, t);
  }
  return cb_shapes_start(s);
}

cb_status cb_session_create(cb_bundle* b, const cb_session_options* options, cb_session** out) {
  if (!b || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out_session are required");
  *out = NULL;
  uint64_t t0 = cb_now_ns();
  int traced = options && options->trace;
  uint32_t f0 = traced ? cb_thread_faults() : 0; /* (a system call: only for a trace) */
  const cb_model* m = &b->model;
  uint32_t threads = 1, later = 1;
  cb_status st = session_threads(m, options, &threads, &later);
  if (st) return st;
  if (!m->gpu_api[0] && (st = cb_backend_set_threads((int)(threads > later ? threads : later)))) return st;
  cb_session* s = cb_calloc(1, sizeof *s);
  if (!s) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->ready_cv, NULL);
  s->bundle = b;
  s->threads = threads, s->later_threads = later, s->continuous = options && options->mode == CB_MODE_CONTINUOUS;
  uint32_t nshares = options ? options->exec_share_count : 0;
  if (nshares) memcpy(s->own_shares, options->exec_shares, nshares);
  s->shares = split_for(m, 0, threads, s->own_shares, nshares);
  s->later_shares = split_for(m, 1, later, s->own_shares, nshares);
  if ((st = session_memory(s, options)) || (st = bind_session(s))) {
    cb_session_release(s);
    return st;
  }
  s->create_event = (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_SESSION, sched_getcpu(), 0, t0, cb_now_ns(), 0,
                                     traced ? cb_thread_faults() - f0 : 0};
  *out = s;
  return CB_OK;
}

void cb_session_release(cb_session* s) {
  if (!s) return;
  cb_warmer_stop(s);
  cb_free(s->aargs);
  cb_free(s->aarg_start);
  cb_free((void*)s->alt_ready);
  if (s->gpu) cb_gpu_session_release(s->gpu);
  else cb_free(s->arena);
  cb_free(s->trace);
  cb_free(s->prepared);
  cb_free(s->is_prepared);
  cb_free(s->skipped);
  cb_free((void*)s->was_read);
  cb_free((void*)s->ready);
  cb_free((void*)s->claimed);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->ready_cv);
  cb_free(s->targs);
  cb_free(s->targ_start);
  cb_free(s->tensors);
  cb_free(s->args);
  cb_free(s->arg_start);
  cb_free(s->dims);
  cb_free(s->nbytes);
  cb_free(s->shapes);
  cb_free(s->out_shapes);
  cb_free(s->out_nbytes);
  cb_free(s);
}

cb_status cb_session_set_input(cb_session* s, size_t index, const void* data, size_t nbytes) {
  if (!s || !data) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and data are required");
  const cb_model* m = &s->bundle->model;
  if (index >= m->ninputs)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input index %zu out of range (%u inputs)", index, m->ninputs);
  const cb_tensor_desc* d = &m->tensors[m->inputs[index]];
  if (nbytes != s->nbytes[m->inputs[index]])
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' takes %llu bytes at its shape, got %zu", d->name,
                   (unsigned long long)s->nbytes[m->inputs[index]], nbytes);
  memcpy(s->arena + d->arena_offset, data, nbytes);
  return CB_OK;
}

/* Where model input (or output) `index` lies in the session's arena. */
static cb_status io_place(const cb_session* s, size_t index, int input, void** out_data, size_t* out_nbytes) {
  if (!s || !out_data || !out_nbytes) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out pointers are required");
  const cb_model* m = &s->bundle->model;
  uint32_t count = input ? m->ninputs : m->noutputs;
  if (index >= count)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "%s index %zu out of range (%u %ss)", input ? "input" : "output", index,
                   count, input ? "input" : "output");
  const cb_tensor_desc* d = &m->tensors[input ? m->inputs[index] : m->outputs[index]];
  *out_data = s->arena + d->arena_offset;
  *out_nbytes = (size_t)(input ? s->nbytes[m->inputs[index]] : s->out_nbytes[index]);
  return CB_OK;
}

cb_status cb_session_input_buffer(cb_session* s, size_t index, void** out_data, size_t* out_nbytes) {
  return io_place(s, index, 1, out_data, out_nbytes);
}

cb_status cb_session_get_output(const cb_session* s, size_t index, const void** out_data, size_t* out_nbytes) {
  return io_place(s, index, 0, (void**)out_data, out_nbytes);
}

cb_status cb_session_trace(const cb_session* s, const cb_trace_event** out_events, size_t* out_count) {
  if (!s || !out_events || !out_count) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out pointers are required");
  if (!s->trace) return cb_fail(CB_ERR_INVALID_ARGUMENT, "the session was not created with trace = 1");
  *out_events = s->trace;
  *out_count = s->ntrace < s->trace_cap ? s->ntrace : s->trace_cap; /* a loop's later iterations may not fit */
  return CB_OK;
}

cb_status cb_session_alternates(const cb_session* s, size_t* out_ready, size_t* out_total) {
  if (!s || !out_ready || !out_total) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out pointers are required");
  const cb_model* m = &s->bundle->model;
  size_t ready = 0;
  for (uint32_t i = 0; i < m->nsteps; i++) ready += atomic_load(&s->alt_ready[i]);
  *out_ready = ready, *out_total = m->nwarm;
  return CB_OK;
}
