/* Opening in the background (coldbrew.h, cb_bundle_open_async): a thread
 * of the handle's own opens the bundle as cb_bundle_open_file_with does,
 * then reads and checks each step's weights in plan order, as a first run
 * would (bundle/stream.c), so that the first run finds them in memory; the
 * caller polls, waits, or hears a callback, and may use the bundle as soon
 * as it is open (a run then waits only for the weights it needs, as every
 * first run does). */
#define _GNU_SOURCE /* clock_gettime under -std=c11 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec/session.h"

struct cb_open_handle {
  pthread_t thread;
  char* path;
  cb_open_options options;   /* its target and public key copied into `target` and `key` */
  char* target;
  uint8_t key[CB_PUBLIC_KEY_BYTES];
  cb_open_ready_fn on_ready;
  void* user;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int opened, ready;         /* under mu: the open has ended; so has the reading */
  cb_status status;          /* the open's (or a weight's check's) */
  char error[512];
  cb_bundle* bundle;         /* set with `opened` (NULL when the open failed) */
  _Atomic int cancel;
  _Atomic uint32_t layers_ready;
  _Atomic uint64_t bytes_read;  /* the open's front, then each step's weights as the reading passes them */
  _Atomic int orphan;           /* released from its own callback: the thread frees it on its way out */
  uint32_t layers_total;
  uint64_t sink;             /* bytes touched by the reading (kept so the reads stay) */
};

static void set_state(cb_open_handle* h, int opened, int ready) {
  pthread_mutex_lock(&h->mu);
  h->opened |= opened, h->ready |= ready;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

static void fail(cb_open_handle* h, cb_status s) {
  pthread_mutex_lock(&h->mu);
  h->status = s;
  strncpy(h->error, cb_last_error(), sizeof h->error - 1);
  pthread_mutex_unlock(&h->mu);
}

/* Each step's weights (execute and transform arguments), in plan order,
 * until the handle is cancelled or a check fails. */
static void read_weights(cb_open_handle* h) {
  cb_bundle* b = h->bundle;
  const cb_model* m = &b->model;
  for (uint32_t k = 0; k < m->nsteps && !b->gpu; k++) { /* (a GPU open has uploaded them) */
    const cb_step_desc* st = &m->steps[k];
    for (uint32_t a = 0; a < st->nargs + st->ntransform_args; a++) {
      uint32_t t = a < st->nargs ? st->args[a] : st->transform_args[a - st->nargs];
      if (atomic_load(&h->cancel)) return;
      if (m->tensors[t].kind != CB_KIND_WEIGHT) continue;
      const uint8_t* data = cb_weight_at(b, t);
      cb_status s = b->verified ? cb_check_tensor(b, t, data, st->layer_name, NULL) : CB_OK;
      if (s) {
        fail(h, s);
        return;
      }
      if (!b->verified) h->sink += cb_bring_in(b, data, m->tensors[t].stored);
      atomic_fetch_add(&h->bytes_read, m->tensors[t].stored);
    }
    atomic_fetch_add(&h->layers_ready, 1);
  }
  atomic_store(&h->layers_ready, h->layers_total);
  atomic_store(&h->bytes_read, UINT64_MAX); /* every byte it needs (shared bytes were counted per use) */
}

static void free_handle(cb_open_handle* h);

static void* opener_main(void* arg) {
  cb_open_handle* h = arg;
  cb_bundle* b = NULL;
  cb_status s = cb_bundle_open_file_with(h->path, &h->options, &b);
  if (s) fail(h, s);
  pthread_mutex_lock(&h->mu);
  h->bundle = b, h->layers_total = b ? b->model.nsteps : 0;
  if (b) atomic_store(&h->bytes_read, atomic_load(&b->advised));
  pthread_mutex_unlock(&h->mu);
  set_state(h, 1, !b);
  if (b) read_weights(h);
  set_state(h, 1, 1);
  if (h->on_ready) h->on_ready(h->user, h->status);
  if (atomic_load(&h->orphan)) { /* cb_open_release from the callback: nothing waits to join */
    pthread_detach(pthread_self());
    cb_bundle_release(h->bundle);
    free_handle(h);
  }
  return NULL;
}

static void free_handle(cb_open_handle* h) {
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  cb_free(h->path), cb_free(h->target), cb_free(h);
}

static char* copy_text(const char* s) {
  char* c = s ? cb_malloc(strlen(s) + 1) : NULL;
  return c ? strcpy(c, s) : NULL;
}

cb_status cb_bundle_open_async(const char* path, const cb_open_options* options, cb_open_ready_fn on_ready,
                               void* user, cb_open_handle** out) {
  if (!path || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "path and out are required");
  *out = NULL;
  cb_open_handle* h = cb_calloc(1, sizeof *h);
  if (!h) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  h->on_ready = on_ready, h->user = user, h->path = copy_text(path);
  if (options) {
    h->options = *options;
    h->options.target = h->target = copy_text(options->target);
    if (options->public_key) h->options.public_key = memcpy(h->key, options->public_key, CB_PUBLIC_KEY_BYTES);
  }
  if (!h->path || (options && options->target && !h->target)) {
    free_handle(h);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (pthread_create(&h->thread, NULL, opener_main, h) != 0) {
    free_handle(h);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "cannot start the opening thread");
  }
  *out = h;
  return CB_OK;
}

int cb_open_ready(cb_open_handle* h) {
  pthread_mutex_lock(&h->mu);
  int ready = h->ready;
  pthread_mutex_unlock(&h->mu);
  return ready;
}

/* Wait while *flag is 0, at most timeout_ms (< 0: no limit); the flag. */
static int wait_for(cb_open_handle* h, const int* flag, int64_t timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  int64_t ns = until.tv_nsec + (timeout_ms > 0 ? timeout_ms % 1000 : 0) * 1000000;
  until.tv_sec += (timeout_ms > 0 ? timeout_ms / 1000 : 0) + ns / 1000000000, until.tv_nsec = ns % 1000000000;
  pthread_mutex_lock(&h->mu);
  while (!*flag) {
    if (timeout_ms < 0) pthread_cond_wait(&h->cv, &h->mu);
    else if (pthread_cond_timedwait(&h->cv, &h->mu, &until) != 0) break;
  }
  int got = *flag;
  pthread_mutex_unlock(&h->mu);
  return got;
}

int cb_open_wait(cb_open_handle* h, int64_t timeout_ms) { return wait_for(h, &h->ready, timeout_ms); }

cb_status cb_open_bundle(cb_open_handle* h, cb_bundle** out) {
  if (!h || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "handle and out are required");
  wait_for(h, &h->opened, -1);
  pthread_mutex_lock(&h->mu);
  cb_status s = h->status;
  *out = s ? NULL : h->bundle;
  if (s) cb_fail(s, "%s", h->error);
  pthread_mutex_unlock(&h->mu);
  return s;
}

void cb_open_get_progress(cb_open_handle* h, cb_open_progress* out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&h->mu);
  const cb_bundle* b = h->opened ? h->bundle : NULL;
  out->opened = h->opened;
  out->layers_total = h->layers_total;
  pthread_mutex_unlock(&h->mu);
  uint32_t ready = atomic_load(&h->layers_ready); /* (counted on since the total was read) */
  out->layers_ready = ready < out->layers_total ? ready : out->layers_total;
  if (!b) return;
  out->bytes_total = b->stream_end ? b->stream_end : b->size;
  uint64_t read = atomic_load(&((cb_bundle*)b)->advised), passed = atomic_load(&h->bytes_read);
  read = passed > read ? passed : read;
  out->bytes_read = read < out->bytes_total ? read : out->bytes_total;
}

void cb_open_cancel(cb_open_handle* h) {
  if (h) atomic_store(&h->cancel, 1);
}

void cb_open_release(cb_open_handle* h) {
  if (!h) return;
  cb_open_cancel(h);
  if (pthread_equal(pthread_self(), h->thread)) { /* from its own callback */
    atomic_store(&h->orphan, 1);
    return;
  }
  pthread_join(h->thread, NULL);
  cb_bundle_release(h->bundle);
  free_handle(h);
}
