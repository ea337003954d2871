/* The runtime's stress program, built plain and under sanitizers by
 * tests/runtime/test_stress.py (ASan + UBSan, TSan). Every mode prints one
 * JSON line and exits 0 when its checks pass, 1 (with a message) when not.
 *
 *   stress cycles  BUNDLE N          N x (open -> session -> run -> release), file and memory
 *                                    opens alternating; memory, fds and mappings must end flat
 *   stress threads BUNDLE T R [MODE] T threads, each with its own session of one shared bundle
 *                                    (MODE 1: continuous), R runs each, outputs checked against
 *                                    a single-threaded reference
 *   stress oom     BUNDLE [MODE]     the n-th allocation fails, for n = 1, 2, ... until a whole
 *                                    open -> session -> run passes: every failure a clean status
 *                                    with a message, every allocation released
 *   stress async   BUNDLE N          N background opens (cb_bundle_open_async): each polled for
 *                                    progress from another thread, then cancelled at once, run
 *                                    before it is ready, or waited for; the callback once each
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coldbrew_testing.h"

static int die(const char* what, cb_status s) {
  fprintf(stderr, "stress: %s failed: %s: %s\n", what, cb_status_name(s), cb_last_error());
  exit(1);
}

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "stress: cannot read %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = aligned_alloc(64, (*size + 63) / 64 * 64);
  if (!data || fread(data, 1, *size, f) != *size) exit(1);
  fclose(f);
  return data;
}

/* A deterministic input pattern: floats in [-1, 1], other types zero; each
 * input at the session's shape (a ranged bundle's typical one). */
static cb_status fill_inputs(const cb_bundle* b, cb_session* s) {
  for (size_t i = 0; i < cb_bundle_input_count(b); i++) {
    cb_tensor_info info;
    cb_status st = cb_session_input_info(s, i, &info);
    if (st) return st;
    unsigned char* data = calloc(1, info.nbytes ? info.nbytes : 1);
    if (!data) return CB_ERR_OUT_OF_MEMORY;
    if (info.dtype == CB_F32)
      for (uint64_t k = 0; k < info.nbytes / 4; k++) ((float*)data)[k] = sinf(0.37f * (float)k + (float)i);
    st = cb_session_set_input(s, i, data, info.nbytes);
    free(data);
    if (st) return st;
  }
  return CB_OK;
}

/* One whole use of a bundle; the first failing call's status. */
static cb_status cycle(const char* path, const void* bytes, size_t size, uint32_t mode) {
  cb_bundle* b = NULL;
  cb_session* s = NULL;
  cb_status st = bytes ? cb_bundle_open_memory(bytes, size, 0, &b) : cb_bundle_open_file(path, 0, &b);
  cb_session_options opts = {0, 1, mode, 0, NULL};
  if (!st) st = cb_session_create(b, &opts, &s);
  if (!st) st = fill_inputs(b, s);
  for (int run = 0; run < 2 && !st; run++) st = cb_session_run(s);
  for (size_t i = 0; !st && i < cb_bundle_output_count(b); i++) {
    const void* out;
    size_t n;
    st = cb_session_get_output(s, i, &out, &n);
  }
  const cb_trace_event* ev;
  size_t nev;
  if (!st) st = cb_session_trace(s, &ev, &nev);
  cb_session_release(s);
  cb_bundle_release(b);
  return st;
}

typedef struct {
  long rss_kb, fds, maps;
  int64_t live;
} usage;

static usage measure(void) {
  usage u = {0, 0, 0, 0};
  char line[512];
  FILE* f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) u.rss_kb = atol(line + 6);
  if (f) fclose(f);
  f = fopen("/proc/self/maps", "r");
  while (f && fgets(line, sizeof line, f)) u.maps++;
  if (f) fclose(f);
  DIR* d = opendir("/proc/self/fd");
  for (struct dirent* e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') u.fds++;
  if (d) closedir(d);
  cb_debug_allocations(NULL, &u.live);
  return u;
}

static int cycles(const char* path, int n) {
  size_t size;
  void* bytes = read_file(path, &size);
  cb_status st;
  for (int k = 0; k < 3; k++) /* warm-up: the pool's threads, the loader's caches */
    if ((st = cycle(path, k % 2 ? bytes : NULL, size, 0))) die("warm-up cycle", st);
  usage before = measure();
  for (int k = 0; k < n; k++)
    if ((st = cycle(path, k % 2 ? bytes : NULL, size, 0))) die("cycle", st);
  usage after = measure();
  free(bytes);
  printf("{\"cycles\": %d, \"rss_kb\": [%ld, %ld], \"fds\": [%ld, %ld], \"maps\": [%ld, %ld], "
         "\"live_allocations\": [%lld, %lld]}\n",
         n, before.rss_kb, after.rss_kb, before.fds, after.fds, before.maps, after.maps,
         (long long)before.live, (long long)after.live);
  return 0;
}

typedef struct {
  cb_bundle* bundle;
  uint32_t mode;
  int runs;
  const float* ref;
  size_t ref_n;
  float scale;
  cb_status status;
  char error[256];
} worker;

static void* worker_main(void* arg) {
  worker* w = arg;
  cb_session* s = NULL;
  cb_session_options opts = {0, 0, w->mode, 0, NULL};
  cb_status st = cb_session_create(w->bundle, &opts, &s);
  if (!st) st = fill_inputs(w->bundle, s);
  for (int r = 0; r < w->runs && !st; r++) {
    if ((st = cb_session_run(s))) break;
    const void* out;
    size_t n;
    if ((st = cb_session_get_output(s, 0, &out, &n))) break;
    for (size_t k = 0; k < n / 4 && k < w->ref_n; k++)
      if (!(fabsf(((const float*)out)[k] - w->ref[k]) <= 1e-4f * w->scale)) {
        snprintf(w->error, sizeof w->error, "run %d: output[%zu] = %g, single-threaded reference %g", r, k,
                 ((const float*)out)[k], w->ref[k]);
        st = CB_ERR_KERNEL;
        break;
      }
  }
  if (st && !w->error[0]) snprintf(w->error, sizeof w->error, "%s", cb_last_error());
  w->status = st;
  cb_session_release(s);
  return NULL;
}

static int threads(const char* path, int nthreads, int runs, uint32_t mode) {
  cb_bundle* b = NULL;
  cb_session* s = NULL;
  cb_status st = cb_bundle_open_file(path, 0, &b);
  if (st) die("open", st);
  if ((st = cb_session_create(b, NULL, &s)) || (st = fill_inputs(b, s)) || (st = cb_session_run(s))) die("reference", st);
  const void* out;
  size_t n;
  if ((st = cb_session_get_output(s, 0, &out, &n))) die("reference output", st);
  float* ref = malloc(n ? n : 1), scale = 1.0f;
  memcpy(ref, out, n);
  for (size_t k = 0; k < n / 4; k++) scale = fmaxf(scale, fabsf(ref[k]));
  cb_session_release(s);
  worker* ws = calloc((size_t)nthreads, sizeof *ws);
  pthread_t* ts = calloc((size_t)nthreads, sizeof *ts);
  for (int k = 0; k < nthreads; k++) {
    ws[k] = (worker){b, k % 2 ? mode : 0, runs, ref, n / 4, scale, CB_OK, ""};
    pthread_create(&ts[k], NULL, worker_main, &ws[k]);
  }
  int failed = 0;
  for (int k = 0; k < nthreads; k++) {
    pthread_join(ts[k], NULL);
    if (ws[k].status) {
      fprintf(stderr, "stress: thread %d: %s: %s\n", k, cb_status_name(ws[k].status), ws[k].error);
      failed = 1;
    }
  }
  cb_bundle_release(b);
  free(ws), free(ts), free(ref);
  printf("{\"threads\": %d, \"runs\": %d, \"mode\": %u, \"failed\": %d}\n", nthreads, runs, mode, failed);
  return failed;
}

static int oom(const char* path, uint32_t mode) {
  size_t size;
  void* bytes = read_file(path, &size);
  cb_status st = cycle(path, NULL, size, mode); /* the pool's threads and caches, made once */
  if (st) die("unfailing cycle", st);
  int64_t base;
  cb_debug_allocations(NULL, &base);
  uint64_t n = 1, failures = 0;
  for (;; n++) {
    cb_debug_fail_allocation(n);
    st = cycle(path, n % 2 ? bytes : NULL, size, mode);
    uint64_t made;
    int64_t live;
    cb_debug_allocations(&made, &live);
    cb_debug_fail_allocation(0);
    if (live != base) {
      fprintf(stderr, "stress: allocation %llu failed: %lld allocations left live (status %s: %s)\n",
              (unsigned long long)n, (long long)(live - base), cb_status_name(st), cb_last_error());
      return 1;
    }
    if (!st) {
      if (made >= n) { /* the failed allocation was one a run may retry or do without */
        failures++;
        continue;
      }
      break; /* n is past the last allocation: every earlier one was failed once */
    }
    if (!cb_last_error()[0]) {
      fprintf(stderr, "stress: allocation %llu failed with %s and no message\n", (unsigned long long)n,
              cb_status_name(st));
      return 1;
    }
    failures++;
  }
  free(bytes);
  printf("{\"allocations\": %llu, \"failed_cleanly\": %llu, \"mode\": %u}\n", (unsigned long long)(n - 1),
         (unsigned long long)failures, mode);
  return 0;
}

typedef struct {
  cb_open_handle* h;
  _Atomic int stop;
  long polls;
} poller;

static void* poll_main(void* arg) { /* progress and readiness asked while the handle's thread works */
  poller* p = arg;
  cb_open_progress pr;
  while (!p->stop) {
    cb_open_get_progress(p->h, &pr);
    if (pr.layers_ready > pr.layers_total || pr.bytes_read > pr.bytes_total) die("progress beyond its total", 1);
    cb_open_ready(p->h);
    p->polls++;
  }
  return NULL;
}

static void on_ready(void* user, cb_status s) { (*(_Atomic int*)user)++; }

static int async_opens(const char* path, int n) {
  _Atomic int calls = 0;
  int ran = 0;
  for (int k = 0; k < n; k++) {
    cb_open_handle* h = NULL;
    cb_status st = cb_bundle_open_async(path, NULL, on_ready, (void*)&calls, &h);
    if (st) die("open_async", st);
    poller p = {h, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, poll_main, &p);
    if (k % 3 == 1) { /* run before ready: the run waits for what it needs */
      cb_bundle* b = NULL;
      cb_session* s = NULL;
      if ((st = cb_open_bundle(h, &b)) || (st = cb_session_create(b, NULL, &s)) || (st = fill_inputs(b, s)) ||
          (st = cb_session_run(s)))
        die("run before ready", st);
      cb_session_release(s);
      ran++;
    } else if (k % 3 == 2 && cb_open_wait(h, -1) != 1) {
      die("wait", 1);
    }
    p.stop = 1;
    pthread_join(t, NULL);
    cb_open_release(h); /* k % 3 == 0: cancelled at once */
  }
  if (calls != n) die("one callback per open", 1);
  printf("{\"opens\": %d, \"ran\": %d, \"callbacks\": %d}\n", n, ran, (int)calls);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 4 && !strcmp(argv[1], "async")) return async_opens(argv[2], atoi(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "cycles")) return cycles(argv[2], atoi(argv[3]));
  if (argc >= 5 && !strcmp(argv[1], "threads"))
    return threads(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 ? (uint32_t)atoi(argv[5]) : 0);
  if (argc >= 3 && !strcmp(argv[1], "oom")) return oom(argv[2], argc > 3 ? (uint32_t)atoi(argv[3]) : 0);
  fprintf(stderr, "usage: stress cycles BUNDLE N | threads BUNDLE T R [MODE] | oom BUNDLE [MODE] | async BUNDLE N\n");
  return 2;
}
