/* What the run (run.c) and the warmer (warmer.c) both do to a step: read
 * and check its weights, trace its phases. */
#define _GNU_SOURCE
#include <sched.h>

#include "exec/session.h"

/* Bring a step's weights (execute and transform arguments living in the
 * bundle) into memory, checking each tensor's checksum the first time any
 * run reads it (a corrupt weight is an error, never a wrong result); a
 * tensor already checked, or one of a bundle opened without weight checks,
 * is touched once per page. */
cb_status cb_read_tensors(cb_session* s, const uint32_t* ids, uint32_t n, const char* layer, int on_pool) {
  cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  uint64_t sum = 0;
  for (uint32_t a = 0; a < n; a++) {
    const cb_tensor_desc* d = &m->tensors[ids[a]];
    if (d->kind != CB_KIND_WEIGHT) continue;
    const uint8_t* data = (const uint8_t*)s->tensors[ids[a]].data;
    if (b->verified && !atomic_load(&b->verified[ids[a]])) { /* reading it checks it */
      cb_status c = cb_check_tensor(b, ids[a], data, layer, on_pool ? cb_backend_parallel : NULL);
      if (c) return c;
      continue;
    }
    sum += cb_bring_in(b, data, d->nbytes);
  }
  s->read_sink += sum;
  return CB_OK;
}

/* The preparation worker this thread is (its queue), 0 on every other thread. */
static _Thread_local uint32_t t_worker;

void cb_trace_worker(uint32_t queue) { t_worker = queue; }

cb_trace_event* cb_trace_step(cb_session* s, uint32_t step, uint32_t phase, uint32_t alternate) {
  if (!s->trace) return NULL;
  size_t k = atomic_fetch_add(&s->ntrace, 1);
  if (k >= s->trace_cap) return NULL; /* the warmer outlived the run whose trace it wrote to */
  cb_trace_event* ev = &s->trace[k];
  ev->step = step, ev->phase = phase, ev->cpu = sched_getcpu(), ev->alternate = alternate, ev->worker = t_worker;
  ev->faults = cb_thread_faults();
  ev->start_ns = cb_now_ns();
  return ev;
}

void cb_trace_end(cb_trace_event* ev) {
  if (!ev) return;
  ev->end_ns = cb_now_ns();
  ev->faults = cb_thread_faults() - ev->faults;
}
