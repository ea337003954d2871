/* A session's run: each step's weights read, checked and prepared (on the
 * first run, by preparation workers where the plan says), then executed. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "exec/session.h"

static cb_status read_weights(cb_session* s, uint32_t step, int on_pool) {
  const cb_step_desc* st = &s->bundle->model.steps[step];
  cb_status c = cb_read_tensors(s, st->args, st->nargs, st->layer_name, on_pool);
  return c ? c : cb_read_tensors(s, st->transform_args, st->ntransform_args, st->layer_name, on_pool);
}

/* One kernel or transform call: its error message cleared before, its
 * thread's workspace blocks freed for reuse after a failure (a failing
 * kernel may return without freeing them). Nonzero on failure. */
static int call_kernel(cb_kernel_fn fn, cb_ffi_any* args, uint32_t nargs) {
  cb_ffi_any ret = {0};
  cb_backend_clear_kernel_error();
  int rc = fn(NULL, args, (int32_t)nargs, &ret);
  if (rc) cb_backend_kernel_failed();
  return rc;
}

/* Step `i`'s raw weights turned into its kernel's layout, once. */
static cb_status prepare_transform(cb_session* s, uint32_t i) {
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  cb_trace_event* ev;
  if (b->transforms[i] && !s->is_prepared[i]) { /* raw weights: transform once, on the first run */
    ev = cb_trace_step(s, i, CB_PHASE_TRANSFORM, 0);
    uint32_t t = s->targ_start[i];
    if (call_kernel(b->transforms[i], &s->targs[t], s->targ_start[i + 1] - t)) {
      return cb_fail(CB_ERR_KERNEL, "layer '%s' (transform '%s') failed: %s", m->steps[i].layer_name,
                     m->steps[i].transform, cb_backend_kernel_error());
    }
    s->is_prepared[i] = 1;
    cb_trace_end(ev);
  }
  return CB_OK;
}

/* One more step done with by the first run (prepared, or skipped as a
 * branch not taken): the warmer waits for all of them. */
static void count_prepared(cb_session* s) {
  if (atomic_fetch_add(&s->prepared_steps, 1) + 1 == s->bundle->model.nsteps && s->continuous) {
    pthread_mutex_lock(&s->mu); /* the warmer waits for the first run's reads */
    pthread_cond_broadcast(&s->ready_cv);
    pthread_mutex_unlock(&s->mu);
  }
}

/* Step `i`'s preparation: read (and check) its weights on the first run
 * (`first`), or on the first run that executes it (a branch step skipped
 * until then), then transform raw weights once. */
static cb_status prepare_step(cb_session* s, uint32_t i, int first) {
  if (first || !s->was_read[i]) {
    cb_trace_event* ev = cb_trace_step(s, i, CB_PHASE_READ, 0);
    cb_status st = read_weights(s, i, 1); /* a preparation worker's launches run inline */
    cb_trace_end(ev);
    if (st) return st;
    s->was_read[i] = 1;
  }
  cb_status done = prepare_transform(s, i);
  if (!done && first) count_prepared(s);
  return done;
}

/* Preparation workers. Worker q, pinned to a core after the execution
 * cores, takes its queue's steps in plan order; when its queue is empty it
 * steals the pending step at the head of another worker's queue, and the
 * executing thread prepares a step itself when it reaches one that nobody
 * has taken yet (a worker slowed by a busy core delays nothing it has not
 * started). A step is taken by whoever claims it first. Workers' transforms
 * run their parallel loops inline, off the execution pool. */
typedef struct {
  cb_session* s;
  uint32_t queue, nworkers;
} cb_prep_worker;

static int claim(cb_session* s, uint32_t i) {
  uint8_t free_ = 0;
  return atomic_compare_exchange_strong(&s->claimed[i], &free_, 1);
}

static void publish(cb_session* s, uint32_t i, cb_status st) {
  pthread_mutex_lock(&s->mu);
  if (st && !s->prep_status) {
    s->prep_status = st;
    snprintf(s->prep_error, sizeof s->prep_error, "%s", cb_last_error());
  }
  atomic_store(&s->ready[i], st ? 2 : 1);
  pthread_cond_broadcast(&s->ready_cv);
  pthread_mutex_unlock(&s->mu);
}

/* The next step worker `w` should prepare, claimed: its own queue's first
 * pending step, else the first pending step of any worker's queue; or -1. */
static int64_t next_item(cb_session* s, const cb_prep_worker* w, uint32_t* own, uint32_t* other) {
  const cb_model* m = &s->bundle->model;
  for (; *own < m->nsteps; ++*own)
    if (m->steps[*own].prep_queue == w->queue && claim(s, *own)) return (*own)++;
  for (; *other < m->nsteps; ++*other) {
    uint8_t q = m->steps[*other].prep_queue;
    if (q > 0 && q <= w->nworkers && claim(s, *other)) return (*other)++;
  }
  return -1;
}

static void* prep_main(void* arg) {
  cb_prep_worker* w = arg;
  cb_session* s = w->s;
  cb_backend_enter_prep_worker(w->queue);
  cb_trace_worker(w->queue);
  uint32_t own = 0, other = 0;
  for (int64_t i; !atomic_load(&s->abort) && (i = next_item(s, w, &own, &other)) >= 0;) {
    cb_status st = prepare_step(s, (uint32_t)i, 1);
    publish(s, (uint32_t)i, st);
    if (st) break;
  }
  cb_backend_leave_thread();
  return NULL;
}

/* Step `i` of a worker's queue, needed now: prepare it here if nobody has
 * taken it, else block until its preparer is done (its failure becomes ours). */
static cb_status take_or_wait(cb_session* s, uint32_t i) {
  if (claim(s, i)) {
    cb_status st = prepare_step(s, i, 1);
    publish(s, i, st);
    return st;
  }
  if (!atomic_load(&s->ready[i])) {
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&s->ready[i])) pthread_cond_wait(&s->ready_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
  }
  if (atomic_load(&s->ready[i]) == 2) return cb_fail(s->prep_status, "%s", s->prep_error);
  return CB_OK;
}

#define CB_MAX_PREP_QUEUES 8

/* A branch step whose guard does not hold this run (the If took the other
 * branch), or whose guard's own step was skipped (an If inside a branch not
 * taken): not executed; its output stays unread. */
static int skipped(cb_session* s, uint32_t i) {
  const cb_step_desc* st = &s->bundle->model.steps[i];
  int skip = st->guard >= 0 && ((st->guard_writer >= 0 && s->skipped[st->guard_writer]) ||
                                (*(const uint8_t*)s->tensors[st->guard].data != 0) != (st->guard_value != 0));
  s->skipped[i] = (uint8_t)skip;
  return skip;
}

static void observe_step(void* session, uint32_t i) {
  cb_session* s = session;
  const cb_step_desc* st = &s->bundle->model.steps[i];
  for (uint32_t a = st->nargs - st->nouts; a < st->nargs; a++)
    s->observe(s->observe_ctx, i, st->args[a], s->tensors[st->args[a]].data, s->nbytes[st->args[a]]);
}

/* A loop's body runs (again) for iteration `*it`: 1 while its condition
 * holds and `*it` is below the trip count, 0 once not; a failure where its
 * scan outputs hold no row for it. */
static int loop_holds(cb_session* s, const cb_loop_desc* l, cb_status* st) {
  int64_t it = *(const int64_t*)s->tensors[l->iteration].data;
  if (!*(const uint8_t*)s->tensors[l->cond].data || it >= *(const int64_t*)s->tensors[l->trip].data) return 0;
  if (l->most >= 0 && it >= l->most)
    *st = cb_fail(CB_ERR_INVALID_ARGUMENT, "a loop found %lld entries for '%s', more than the %lld the bundle "
                  "holds (compile with --bound %s=N for more)", (long long)it + 1, l->name, (long long)l->most,
                  l->name);
  return 1;
}

/* After an iteration of loop `l`'s body: the iteration number one more,
 * the carried values (and the condition) copied onto those the body
 * reads, the scan values into their rows. */
static void loop_next(cb_session* s, const cb_loop_desc* l) {
  int64_t* it = (int64_t*)s->tensors[l->iteration].data;
  for (uint32_t j = 0; j < l->nscans; j++) {
    uint64_t n = s->nbytes[l->scan_from[j]];
    memcpy((uint8_t*)s->tensors[l->scan_to[j]].data + (uint64_t)*it * n, s->tensors[l->scan_from[j]].data, n);
  }
  for (uint32_t j = 0; j < l->ncarried; j++)
    if (s->tensors[l->carried_from[j]].data != s->tensors[l->carried_to[j]].data)
      memmove(s->tensors[l->carried_to[j]].data, s->tensors[l->carried_from[j]].data, s->nbytes[l->carried_from[j]]);
  ++*it;
}

/* `queues`: the preparation queues workers serve on this run (0: none).
 * A loop's body runs again from its first step while it holds; on the
 * first run, steps met again are prepared as by a later run. */
static cb_status run_steps(cb_session* s, int first, uint32_t queues) {
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  int32_t active = -1; /* the loop whose body is running */
  int again = 0;       /* its body's steps met before, on this run */
  for (uint32_t i = 0; i < m->nsteps; i++) {
    cb_status st = CB_OK;
    if (m->steps[i].loop_end >= 0 && m->steps[i].loop_end == active) {
      const cb_loop_desc* l = &m->loops[active];
      loop_next(s, l);
      if (loop_holds(s, l, &st)) {
        if (st) return st;
        again = 1, i = l->start; /* the body's first step next */
        continue;
      }
      active = -1, again = 0;
    }
    int worker = first && m->steps[i].prep_queue > 0 && m->steps[i].prep_queue <= queues;
    if (skipped(s, i)) { /* its weights wait for a run that takes its branch (a worker may have them already) */
      if (first && !again && !worker) count_prepared(s);
      if (first && !again && worker && claim(s, i)) count_prepared(s), publish(s, i, CB_OK);
      continue;
    }
    if (again && worker) st = take_or_wait(s, i); /* a worker took it on the body's first pass */
    if (!st) st = again ? prepare_step(s, i, 0) : worker ? take_or_wait(s, i) : prepare_step(s, i, first);
    if (st) return st;
    int alt = !first && atomic_load_explicit(&s->alt_ready[i], memory_order_acquire);
    /* an alternate not ready yet (the warmer may have begun it and be kept
     * off the cores), with its bytes resident: ready it here */
    if (!first && !alt && s->continuous && b->alternates[i] && cb_alternate_resident(s, i)) {
      if ((st = cb_alternate_ready(s, i))) return st;
      alt = 1;
    }
    cb_trace_event* ev = cb_trace_step(s, i, CB_PHASE_EXECUTE, (uint32_t)alt);
    const uint32_t* start = alt ? s->aarg_start : s->arg_start;
    uint32_t a = start[i];
    if (call_kernel((alt ? b->alternates : b->kernels)[i], &(alt ? s->aargs : s->args)[a], start[i + 1] - a)) {
      return cb_fail(CB_ERR_KERNEL, "layer '%s' (kernel '%s') failed: %s", m->steps[i].layer_name,
                     alt ? m->steps[i].warm_kernel : m->steps[i].kernel, cb_backend_kernel_error());
    }
    cb_trace_end(ev);
    if (m->steps[i].counts && (st = cb_shapes_count(s, i))) return st;
    if (s->observe) observe_step(s, i);
    if (m->steps[i].loop_start >= 0) { /* its state written: into the body, or on to its end */
      const cb_loop_desc* l = &m->loops[m->steps[i].loop_start];
      if (loop_holds(s, l, &st))
        active = m->steps[i].loop_start;
      else if (l->at_least_once)
        return cb_fail(CB_ERR_INVALID_ARGUMENT, "loop '%s' took no iteration: a value it carries has another shape "
                       "before its first one than after, so coldbrew runs it at least once", l->name);
      else
        i = l->end - 1;
      if (st) return st;
    }
  }
  return CB_OK;
}

/* The trace emptied for a run; a first run's begins with the open's and the session's events. */
static void trace_restart(cb_session* s, int first) {
  s->ntrace = 0;
  if (!s->trace || !first) return;
  for (int k = 0; k < s->bundle->nopen_events; k++) s->trace[s->ntrace++] = s->bundle->open_events[k];
  s->trace[s->ntrace++] = s->create_event;
}

/* A copy of `e` in the trace (an event another layer timed). */
static void trace_add(cb_session* s, const cb_trace_event* e) {
  cb_trace_event* ev = cb_trace_step(s, e->step, e->phase, 0);
  if (ev) *ev = *e;
}

/* A GPU bundle's run: it submits the recorded command buffer and waits. The
 * open read, checked and uploaded the weights; where it could not (a tensor
 * failed its checksum), the first run reads them itself and names it. A
 * first run while pipelines are still being made runs in chunks (one trace
 * event each), and the trace then holds the pipelines' events too. */
static cb_status run_gpu(cb_session* s, int first) {
  cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  for (uint32_t i = 0; i < m->ninputs; i++) { /* shaders compute int64 in 32 bits */
    const cb_tensor_desc* d = &m->tensors[m->inputs[i]];
    const int64_t* v = (const int64_t*)(s->arena + d->arena_offset);
    for (uint64_t k = 0; d->dtype == CB_I64 && k < d->nbytes / 8; k++)
      if (v[k] != (int32_t)v[k])
        return cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' holds %lld at element %llu: a GPU bundle computes int64 "
                       "in 32 bits (use the CPU target for such values)", d->name, (long long)v[k], (unsigned long long)k);
  }
  trace_restart(s, first);
  cb_status st = CB_OK;
  if (first && !cb_gpu_weights_ready(b->gpu)) { /* the open could not check them all */
    for (uint32_t i = 0; i < m->nsteps && !st; i++) {
      cb_trace_event* ev = cb_trace_step(s, i, CB_PHASE_READ, 0);
      st = read_weights(s, i, 0);
      cb_trace_end(ev);
    }
    cb_trace_event* ev = cb_trace_step(s, CB_STEP_BUNDLE, CB_PHASE_UPLOAD, 0);
    if (!st) st = cb_gpu_upload_weights(b->gpu, b->base, m);
    cb_trace_end(ev);
  }
  if (!st) {
    cb_trace_event chunks[CB_GPU_MAX_CHUNKS];
    uint32_t nchunks = 0;
    cb_trace_event* ev = cb_trace_step(s, CB_STEP_BUNDLE, CB_PHASE_GPU_EXECUTE, 0);
    if (ev) ev->cpu = -1; /* the GPU's lane */
    st = cb_gpu_session_run(s->gpu, chunks, &nchunks);
    cb_trace_end(ev);
    if (ev && nchunks) *ev = chunks[0]; /* the submissions' own times */
    for (uint32_t k = 1; ev && k < nchunks; k++) trace_add(s, &chunks[k]);
    const cb_trace_event* pe = first && s->trace ? cb_gpu_pipeline_events(b->gpu) : NULL;
    for (uint32_t i = 0; pe && !st && i < m->nshaders; i++) /* those made so far */
      if (cb_gpu_pipeline_ready(b->gpu, i)) trace_add(s, &pe[i]);
  }
  if (!st) s->warm = 1;
  return st;
}

cb_status cb_session_run(cb_session* s) {
  if (!s) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session is required");
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  int first = !s->warm; /* until a run completes (a failed first run leaves it cold) */
  pthread_mutex_lock(&s->mu);
  cb_status alt_status = s->alt_status;
  pthread_mutex_unlock(&s->mu);
  if (alt_status) return cb_fail(alt_status, "%s", s->alt_error);
  cb_shapes_keep_outputs(s);
  if (s->gpu) return run_gpu(s, first);
  /* the pool holds the larger of the two thread counts; this run launches on its own */
  cb_status ts = cb_backend_set_threads((int)(s->threads > s->later_threads ? s->threads : s->later_threads));
  if (ts) return ts;
  cb_backend_set_split((int)(first ? s->threads : s->later_threads), first ? s->shares : s->later_shares);
  trace_restart(s, first);
  /* the executing thread stays on its core, and the first run's
   * preparation workers, placed after it, start before anything executes */
  cpu_set_t saved;
  int pinned = cb_backend_pin_caller(&saved);
  pthread_t workers[CB_MAX_PREP_QUEUES];
  cb_prep_worker args[CB_MAX_PREP_QUEUES];
  uint32_t nworkers = 0, want = 0;
  pthread_attr_t attr; /* workers start on the caller's cores as they were before its pin */
  int attr_ok = first && pthread_attr_init(&attr) == 0;
  if (attr_ok && pinned) pthread_attr_setaffinity_np(&attr, sizeof saved, &saved);
  if (first) {
    atomic_store(&s->abort, 0);
    atomic_store(&s->prepared_steps, 0);
    s->prep_status = CB_OK;
    for (uint32_t i = 0; i < m->nsteps; i++) atomic_store(&s->ready[i], 0), atomic_store(&s->claimed[i], 0);
    want = m->prep_queues < CB_MAX_PREP_QUEUES ? m->prep_queues : CB_MAX_PREP_QUEUES;
    cb_trace_event* ev = want ? cb_trace_step(s, CB_STEP_BUNDLE, CB_PHASE_THREAD_START, 0) : NULL;
    for (uint32_t q = 1; q <= want; q++) {
      args[q - 1] = (cb_prep_worker){s, q, want};
      if (pthread_create(&workers[q - 1], attr_ok ? &attr : NULL, prep_main, &args[q - 1]) != 0) break;
      nworkers = q;
    }
    cb_trace_end(ev);
  }
  if (attr_ok) pthread_attr_destroy(&attr);
  if (first) cb_warmer_start(s);
  /* a worker that could not start leaves its queue to the others (they
   * steal) and to the executing thread (it claims what nobody took) */
  cb_status st = run_steps(s, first, nworkers ? want : 0);
  if (pinned) cb_backend_restore_caller(&saved);
  if (nworkers) {
    atomic_store(&s->abort, 1);
    for (uint32_t q = 0; q < nworkers; q++) pthread_join(workers[q], NULL);
  }
  if (!st) s->warm = 1;
  if (!st) cb_shapes_keep_outputs(s); /* sizes the data set during the run */
  return st;
}

cb_status cb_session_run_observed(cb_session* s, cb_step_observer observe, void* ctx) {
  if (!s || !observe) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and observer are required");
  cb_status st = s->gpu && !s->warm ? cb_session_run(s) : CB_OK; /* weights up, pipelines made */
  s->observe = observe, s->observe_ctx = ctx;
  if (!st) st = s->gpu ? cb_gpu_session_run_steps(s->gpu, observe_step, s) : cb_session_run(s);
  s->observe = NULL;
  return st;
}
