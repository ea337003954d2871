/* Continuous mode: the warm alternates' weights read and checked behind
 * the first run, and taken up by later runs. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "exec/session.h"

/* Continuous mode's warmer: at idle priority, once the first run has read
 * every weight it needs (so the two never compete for the disk), read and
 * check each step's warm-alternate weights in plan order and mark the step
 * ready; later runs switch to a step's alternate once it is. Back-to-back
 * runs leave an idle-priority thread no time, so a later run that reaches
 * an alternate not yet ready, with its bytes already in memory, readies it
 * itself (a checksum pass; the paper's "pipelined in the second
 * inference"), also one the warmer has begun (the runs may keep the warmer
 * off the cores). The two may check the same tensors at once; a check only
 * reads, and readiness is a flag. One whose bytes are still on disk keeps
 * the plan's variant. COLDBREW_WARMER=off starts no warmer (runs ready the
 * alternates alone). */
cb_status cb_alternate_ready(cb_session* s, uint32_t i) {
  const cb_step_desc* st = &s->bundle->model.steps[i];
  cb_trace_event* ev = cb_trace_step(s, i, CB_PHASE_READ, 1);
  cb_status c = cb_read_tensors(s, st->warm_args, st->nwarm_args, st->layer_name, 0);
  cb_trace_end(ev);
  if (c) {
    pthread_mutex_lock(&s->mu);
    s->alt_status = c;
    snprintf(s->alt_error, sizeof s->alt_error, "%s", cb_last_error());
    pthread_mutex_unlock(&s->mu);
    return c;
  }
  atomic_store_explicit(&s->alt_ready[i], 1, memory_order_release);
  return CB_OK;
}

/* Every page of step `i`'s alternate weights is in memory (mincore). */
int cb_alternate_resident(cb_session* s, uint32_t i) {
  const cb_bundle* b = s->bundle;
  if (!b->mapping) return 1;
  const cb_step_desc* st = &b->model.steps[i];
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  unsigned char vec[256];
  for (uint32_t a = 0; a < st->nwarm_args; a++) {
    const cb_tensor_desc* d = &b->model.tensors[st->warm_args[a]];
    const uint8_t* data = s->tensors[st->warm_args[a]].data;
    if (d->kind != CB_KIND_WEIGHT || !d->nbytes || cb_in_head(b, data)) continue;
    uint64_t off = (uint64_t)(data - b->base);
    uint64_t lo = off / page * page, hi = off + d->nbytes;
    for (uint64_t at = lo; at < hi; at += sizeof vec * page) {
      uint64_t len = hi - at < sizeof vec * page ? hi - at : sizeof vec * page;
      if (mincore((void*)(b->base + at), (size_t)len, vec) != 0) return 0;
      for (uint64_t k = 0; k < (len + page - 1) / page; k++)
        if (!(vec[k] & 1)) return 0;
    }
  }
  return 1;
}

static void* warmer_main(void* arg) {
  cb_session* s = arg;
  const cb_model* m = &s->bundle->model;
  struct sched_param idle = {0};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  pthread_mutex_lock(&s->mu);
  while (atomic_load(&s->prepared_steps) < m->nsteps && !atomic_load(&s->warmer_stop))
    pthread_cond_wait(&s->ready_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < m->nsteps && !atomic_load(&s->warmer_stop); i++)
    if (s->bundle->alternates[i] && !atomic_load_explicit(&s->alt_ready[i], memory_order_acquire) &&
        cb_alternate_ready(s, i))
      break;
  return NULL;
}

/* At the first run's start. */
void cb_warmer_start(cb_session* s) {
  if (s->warmer_started || !s->continuous || !s->bundle->model.nwarm) return;
  const char* want = getenv("COLDBREW_WARMER");
  if (want && !strcmp(want, "off")) return;
  atomic_store(&s->warmer_stop, 0);
  s->warmer_started = pthread_create(&s->warmer, NULL, warmer_main, s) == 0;
  /* no thread: later runs ready the alternates whose bytes are in memory */
}

void cb_warmer_stop(cb_session* s) {
  if (!s->warmer_started) return;
  pthread_mutex_lock(&s->mu);
  atomic_store(&s->warmer_stop, 1);
  pthread_cond_broadcast(&s->ready_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->warmer, NULL);
  s->warmer_started = 0;
}
