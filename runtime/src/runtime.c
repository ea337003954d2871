/* Bundle loading (map, verify, load kernels) and sessions (arena, run). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---- errors ------------------------------------------------------------ */

static _Thread_local char g_error[1024];

const char* cb_last_error(void) { return g_error; }

cb_status cb_fail(cb_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
  return status;
}

const char* cb_status_name(cb_status s) {
  static const char* names[] = {"OK", "INVALID_ARGUMENT", "IO", "BAD_MAGIC", "VERSION",
                                "CORRUPT", "TARGET", "LOAD", "KERNEL", "OUT_OF_MEMORY", "GPU", "SIGNATURE"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN";
}

/* ---- checksum ---------------------------------------------------------- */

/* sum over little-endian u64 words w_i (zero-padded) of w_i * (2i + 1), mod 2^64.
 * Odd multipliers make every single-bit flip and every word swap visible.
 * The sum is linear in the words, so parts of a buffer can be summed apart
 * (cb_checksum64_part, words numbered from the part's first) and added. */
uint64_t cb_checksum64_part(const uint8_t* data, uint64_t size, uint64_t first_word) {
  uint64_t sum = 0, n = size / 8, i = 0;
  for (; i < n; i++) {
    uint64_t w;
    memcpy(&w, data + 8 * i, 8);
    sum += w * (2 * (first_word + i) + 1);
  }
  if (size % 8) {
    uint64_t w = 0;
    memcpy(&w, data + 8 * n, size % 8);
    sum += w * (2 * (first_word + n) + 1);
  }
  return sum;
}

uint64_t cb_checksum64(const uint8_t* data, uint64_t size) { return cb_checksum64_part(data, size, 0); }

/* ---- bundle ------------------------------------------------------------ */

typedef int (*cb_kernel_fn)(void* self, const void* args, int32_t nargs, void* result);

struct cb_bundle {
  const uint8_t* base;
  uint64_t size;
  void* mapping;     /* munmap on release, or NULL */
  void* owned_copy;  /* aligned copy of a caller buffer, or NULL */
  cb_model model;
  void* code;        /* dlopen handle of the kernel shared object */
  int code_fd;       /* its memfd, open while loaded: the loader matches objects
                        by path, so a live bundle's fd number is never reused */
  cb_kernel_fn* kernels;    /* per plan step */
  cb_kernel_fn* transforms; /* per plan step; NULL where the weights need none */
  cb_kernel_fn* alternates; /* per plan step: continuous mode's warm variant, or NULL */
  cb_trace_event* open_events; /* verify, code load; GPU bundles: context, reads, upload, pipelines.
                                  Reported by traced sessions */
  int nopen_events, open_cap;
  uint64_t read_sink;          /* bytes touched by a reader (kept so the reads stay) */
  _Atomic uint8_t* verified; /* per tensor: its weight bytes passed their checksum; NULL when
                                weights are not checked per tensor (older bundle, or skipped) */
  _Atomic uint64_t advised;  /* file bytes [0, advised) were asked to be read ahead; while
                                `populating`, they are in memory */
  _Atomic int populating;    /* the streamer brings the file in itself: readers wait for it */
  _Atomic int stream_gen;    /* bumped after each of its chunks and at its end (a futex word) */
  _Atomic int stream_waiters;
  pthread_t streamer;        /* asks for the whole file, front to back, from the open on */
  int streaming;             /* the streamer was started (joined at release) */
  _Atomic int stream_stop;
  _Atomic uint64_t front;    /* end of the bytes before the first weight (header, code, shaders) */
  _Atomic int front_known;   /* the open parsed the header and set `front` (a futex word) */
  uint8_t* head;             /* the front read past the page cache (read_front), or NULL */
  uint64_t head_size;        /* file bytes [0, head_size) are in `head` (the open's own reads) */
  uint64_t head_end;         /* ... and [0, head_end) once `head_done`: the first weights too */
  _Atomic int head_done;     /* the streamer has filled the head to head_end (a futex word) */
  int head_fd;               /* its O_DIRECT descriptor while the head is read, else -1 */
  uint64_t open_ns;          /* when the open began: its traced verify phase starts there */
  cb_gpu* gpu;               /* GPU bundles: device, pipelines, weights buffer */
};

/* Reading the file. Its bytes lie in the order of need: preamble and
 * header, code, then the weights in plan order (then continuous mode's
 * alternates). A mapped bundle is read by a streamer thread, started the
 * moment the file is mapped: it brings the file into memory front to back,
 * a chunk at a time, so the disk works from the open's first microsecond
 * while the header is parsed, the code loaded and the first layers run; a
 * reader that needs a tensor waits only for bytes already on their way. It
 * stops early when the bundle is released. Without it (the thread could
 * not start) readers fall back to a window of read-ahead kept in front of
 * what they read.
 *
 * The mapping asks for huge pages (MADV_HUGEPAGE), and the streamer brings
 * 2 MB chunks in through the page-fault path (MADV_POPULATE_READ), whose
 * read-ahead then fills the page cache with 2 MB folios where the file
 * system can: on the development machine (Linux 6.18, ext4) that cut the
 * CPU time of reading a 47 MB bundle from about 11 ms (4 KB pages asked for
 * with MADV_WILLNEED) to about 3 ms, and on a 2-core machine that CPU time
 * is taken from the layers (resnet18 cold about a fifth faster there).
 * Readers behind it wait for it (wait_streamed).
 *
 * The front, preamble to code, is what the open waits for, and a request is
 * answered whole (there: 128 KB in 0.2-0.3 ms, a 2 MB folio in about 2 ms).
 * It is read apart, past the page cache (O_DIRECT, read_front) into memory
 * of the bundle's: the first 128 KB, then, once the header is parsed, the
 * rest up to the first weight. CB_HEAD_WEIGHTS more, the first layers'
 * weights, the streamer reads into the head while the open loads the code
 * (fill_head: about 0.5 ms for 384 KB there, ahead of the stream's first
 * folio); the layers use them from there, each reader waiting for the
 * head as for any byte on its way. The streamer then starts its chunks
 * from the file's first byte, so every 2 MB of the file comes in one folio.
 * Asked for through the page cache instead (MADV_WILLNEED of the first
 * 128 KB, the way a file system without O_DIRECT, or a front already in the
 * page cache, still goes), the front's small pages sat in the first 2 MB
 * and the read-ahead behind them fell back to small requests: a 5 MB
 * bundle took 4-6.5 ms to come in instead of 2.2-2.8 ms (st.c, page cache
 * dropped, interleaved). Where that older way leaves the code running past
 * the first request, the streamer asks for the rest of the front as one
 * more small request ahead of its first chunk.
 * A kernel without MADV_POPULATE_READ (before 5.14) gets the older way:
 * MADV_WILLNEED requests of CB_ADVISE_CHUNK, each under the kernel's
 * per-request read-ahead maximum, many in flight at once. */
#define CB_STREAM_FIRST (128u << 10)
#define CB_STREAM_CHUNK (2u << 20)
#define CB_ADVISE_CHUNK (1u << 20)
#define CB_READ_AHEAD (16u << 20)
#define CB_FRONT_MAX (1u << 20)   /* the most of the front read past the page cache */
#define CB_DIRECT_ALIGN 4096u     /* O_DIRECT's buffer, offset and length alignment */
#define CB_HEAD_WEIGHTS (384u << 10) /* weights read with the front */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

static void advise(const cb_bundle* b, uint64_t from, uint64_t to) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), lo = from / page * page;
  madvise((void*)(b->base + lo), (size_t)(to - lo), MADV_WILLNEED);
}

/* The streamer's progress, published: readers sleeping on it wake. */
static void stream_progress(cb_bundle* b, uint64_t at) {
  atomic_store(&b->advised, at);
  atomic_fetch_add(&b->stream_gen, 1);
  if (atomic_load(&b->stream_waiters)) cb_futex_wake(&b->stream_gen, INT32_MAX);
}

static void fill_head(cb_bundle* b);

/* The open tells the streamer where the front ends (0: unknown, the open
 * failed or the bundle is released). */
static void publish_front(cb_bundle* b, uint64_t front) {
  atomic_store(&b->front, front);
  atomic_store(&b->front_known, 1);
  cb_futex_wake(&b->front_known, INT32_MAX);
}

static void* streamer_main(void* arg) {
  cb_bundle* b = arg;
  while (!atomic_load(&b->front_known)) cb_futex_wait(&b->front_known, 0);
  uint64_t front = atomic_load(&b->front), at0 = atomic_load(&b->advised);
  if (!atomic_load(&b->stream_stop)) fill_head(b); /* published by the open (its front may be 0) */
  if (!b->head && front > at0 && front <= b->size && !atomic_load(&b->stream_stop)) {
    advise(b, at0, front); /* small pages, answered before the chunks behind it */
    stream_progress(b, front);
  }
  for (uint64_t at = atomic_load(&b->advised); at < b->size && !atomic_load(&b->stream_stop);) {
    int populating = atomic_load(&b->populating);
    /* chunks end on 2 MB boundaries of the file, the folios' */
    uint64_t end = populating ? (at / CB_STREAM_CHUNK + 1) * CB_STREAM_CHUNK : at + CB_ADVISE_CHUNK;
    if (end > b->size) end = b->size;
    if (populating && madvise((void*)(b->base + at), (size_t)(end - at), MADV_POPULATE_READ) != 0 &&
        errno == EINVAL) { /* an older kernel: ask for the rest instead, and readers bring it in */
      atomic_store(&b->populating, 0);
      stream_progress(b, at);
      continue;
    }
    if (!populating) advise(b, at, end);
    stream_progress(b, at = end);
  }
  atomic_store(&b->populating, 0); /* done or stopped: nobody waits on it any more */
  stream_progress(b, atomic_load(&b->advised));
  return NULL;
}

/* Whether file bytes [0, n) are in the page cache already (a warm start):
 * the mapping then serves the front with no disk read. */
static int front_resident(const cb_bundle* b, uint64_t n) {
  unsigned char vec[CB_STREAM_FIRST / 4096];
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), pages = (n + page - 1) / page;
  if (pages > sizeof vec) pages = sizeof vec;
  if (mincore(b->mapping, (size_t)(pages * page), vec) != 0) return 0;
  for (uint64_t i = 0; i < pages; i++)
    if (!(vec[i] & 1)) return 0;
  return 1;
}

/* The most of file bytes [0, upto) the head can hold. */
static uint64_t head_limit(const cb_bundle* b, uint64_t upto) {
  if (upto > b->size) upto = b->size;
  return upto < CB_FRONT_MAX ? upto : CB_FRONT_MAX;
}

/* Read file bytes [have, upto) into the head (no further than
 * head_limit); returns the end of what it holds then. */
static uint64_t read_head(cb_bundle* b, uint64_t have, uint64_t upto) {
  if (!b->head || b->head_fd < 0) return have;
  upto = head_limit(b, upto);
  while (have < upto) {
    uint64_t from = have / CB_DIRECT_ALIGN * CB_DIRECT_ALIGN;
    uint64_t len = (upto - from + CB_DIRECT_ALIGN - 1) / CB_DIRECT_ALIGN * CB_DIRECT_ALIGN;
    ssize_t n = pread(b->head_fd, b->head + from, (size_t)len, (off_t)from);
    if (n <= 0 || from + (uint64_t)n <= have) break;
    have = from + (uint64_t)n;
  }
  return have;
}

/* The open's reads into the head; what a failed read leaves out, the
 * mapping serves (front_at). */
static void extend_head(cb_bundle* b, uint64_t upto) { b->head_size = read_head(b, b->head_size, upto); }

static void close_head(cb_bundle* b) {
  if (b->head_fd >= 0) close(b->head_fd);
  b->head_fd = -1;
}

/* The head's first weights, [head_size, head_end): read past the page cache
 * where the read succeeds, else copied from the mapping (layers were given
 * pointers into the head); then the head is published, and its descriptor
 * closed. Run by the streamer once the open has set head_end, or by the
 * open itself where no streamer runs. */
static void fill_head(cb_bundle* b) {
  if (!b->head || atomic_load(&b->head_done)) return;
  /* from head_size, which is 4 KB-aligned below the file's end: the open's
   * bytes are not written again while it reads them */
  uint64_t have = read_head(b, b->head_size, b->head_end);
  if (have < b->head_end) memcpy(b->head + have, b->base + have, b->head_end - have);
  close_head(b);
  atomic_store(&b->head_done, 1);
  cb_futex_wake(&b->head_done, INT32_MAX);
}

/* A reader of the head's weights waits until they are in. */
static void wait_head(cb_bundle* b) {
  while (!atomic_load(&b->head_done)) cb_futex_wait(&b->head_done, 0);
}

/* The front's first CB_STREAM_FIRST bytes read past the page cache, where
 * the file system allows it and they are not in the page cache already. */
static void read_front(cb_bundle* b, const char* path) {
  uint64_t first = b->size > CB_STREAM_FIRST ? CB_STREAM_FIRST : b->size;
  if (front_resident(b, first)) return;
  b->head_fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (b->head_fd < 0) return;
  b->head = cb_aligned_alloc(CB_DIRECT_ALIGN, CB_FRONT_MAX);
  extend_head(b, first);
  if (!b->head_size) {
    close_head(b);
    cb_free(b->head);
    b->head = NULL;
  }
}

/* File bytes [off, off + n): in the head where [0, end) of it covers them,
 * else in the mapping. */
static const uint8_t* head_or_mapping(const cb_bundle* b, uint64_t off, uint64_t n, uint64_t end) {
  return b->head && off <= end && n <= end - off ? b->head + off : b->base + off;
}

/* The open's view of file bytes [off, off + n): the head where it holds
 * them, else the mapping. */
static const uint8_t* front_at(const cb_bundle* b, uint64_t off, uint64_t n) {
  return head_or_mapping(b, off, n, b->head_size);
}

/* Whether `p` points into the head: memory of the bundle's, no page of the
 * mapping's to bring in (once head_done). */
static int in_head(const cb_bundle* b, const uint8_t* p) {
  return b->head && p >= b->head && p < b->head + b->head_end;
}

/* Weight tensor `t`'s bytes: in the head where it will hold them (the first
 * layers'), else in the mapping. */
static const uint8_t* weight_at(const cb_bundle* b, uint32_t t) {
  uint64_t off = (uint64_t)(cb_weight_data(b->base, &b->model, t) - b->base);
  return head_or_mapping(b, off, b->model.tensors[t].nbytes, b->head_end);
}

static void start_streamer(cb_bundle* b) {
  madvise(b->mapping, (size_t)b->size, MADV_HUGEPAGE); /* where the kernel offers them */
  uint64_t first = b->size > CB_STREAM_FIRST ? CB_STREAM_FIRST : b->size;
  if (b->head) first = 0; /* the streamer starts at the first byte */
  else advise(b, 0, first);
  atomic_store(&b->advised, first);
  atomic_store(&b->populating, 1);
  b->streaming = pthread_create(&b->streamer, NULL, streamer_main, b) == 0;
  if (!b->streaming) atomic_store(&b->populating, 0);
}

/* A reader of file bytes [.., end) sleeps while a populating streamer has
 * yet to bring them in, rather than fault them in itself: its faults, a
 * second stream through the file, would reset the read-ahead state the two
 * share and leave the disk a request at a time. The front the open asked
 * for apart, and anything after the streamer stops, readers bring in. */
static void wait_streamed(cb_bundle* b, uint64_t end) {
  for (;;) {
    int gen = atomic_load(&b->stream_gen);
    if (!atomic_load(&b->populating) || atomic_load(&b->advised) >= end) return;
    atomic_fetch_add(&b->stream_waiters, 1);
    cb_futex_wait(&b->stream_gen, gen);
    atomic_fetch_sub(&b->stream_waiters, 1);
  }
}

static void stop_streamer(cb_bundle* b) {
  if (!b->streaming) return;
  atomic_store(&b->stream_stop, 1);
  publish_front(b, 0);
  pthread_join(b->streamer, NULL);
  b->streaming = 0;
}

/* Bring the mapped bytes [data, data + n) into this process's page tables,
 * waiting for those still on their way from the disk: one call, where
 * touching page by page would sleep and wake once per page. Bytes in the
 * head are in memory once the streamer has filled it. Returns 0 when it
 * could not (an older kernel, memory not mapped from the file): the
 * reader's own touches then fault the pages in. */
static int populate(cb_bundle* b, const uint8_t* data, uint64_t n) {
  if (in_head(b, data)) {
    wait_head(b);
    return 1;
  }
  if (!b->mapping || !n) return 0;
  wait_streamed(b, (uint64_t)(data - b->base) + n);
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), off = (uint64_t)(data - b->base), lo = off / page * page;
  return madvise((void*)(b->base + lo), (size_t)(off + n - lo), MADV_POPULATE_READ) == 0;
}

/* Without a streamer: read the mapped file up to `upto` (plus the window)
 * asynchronously, as readers advance. */
static void read_ahead(cb_bundle* b, uint64_t upto) {
  if (!b->mapping || b->streaming) return;
  uint64_t end = upto + CB_READ_AHEAD < b->size ? upto + CB_READ_AHEAD : b->size;
  uint64_t from = atomic_load(&b->advised);
  if (from >= upto + CB_READ_AHEAD / 2 || from >= b->size) return;
  if (!atomic_compare_exchange_strong(&b->advised, &from, end)) return; /* another thread advanced it */
  advise(b, from, end);
}

/* The same for a reader of [data, data + n) (the head needs none). */
static void read_ahead_of(cb_bundle* b, const uint8_t* data, uint64_t n) {
  if (!in_head(b, data)) read_ahead(b, (uint64_t)(data - b->base) + n);
}

/* A weight tensor's bytes brought into memory without checking them (a
 * tensor already checked, or a bundle opened without weight checks): in
 * one call where it can, else touched once per page. Returns what the
 * touches read, for the caller to keep so they are not optimised away. */
static uint64_t bring_in(cb_bundle* b, const uint8_t* data, uint64_t n) {
  read_ahead_of(b, data, n);
  if (populate(b, data, n)) return 0;
  const volatile uint8_t* p = data;
  uint64_t sum = 0;
  for (uint64_t off = 0; off < n; off += 4096) sum += p[off];
  return n ? sum + p[n - 1] : sum;
}

static int is_weight_segment(const cb_segment_desc* seg) {
  return seg->kind == CB_SEG_WEIGHTS_RAW || seg->kind == CB_SEG_WEIGHTS_CACHED;
}

/* An older bundle's weights: every weight segment checked whole. */
static cb_status check_weight_segments(const cb_bundle* b) {
  for (uint32_t i = 0; i < b->model.nsegments; i++) {
    const cb_segment_desc* seg = &b->model.segments[i];
    if (is_weight_segment(seg) && cb_checksum64(b->base + seg->offset, seg->size) != seg->checksum)
      return cb_fail(CB_ERR_CORRUPT, "segment %u checksum mismatch (file altered or damaged)", i);
  }
  return CB_OK;
}

/* A tensor's bytes brought in and summed in stripes that end on the
 * stream's chunk boundaries (file offsets), each brought in, then summed,
 * before the next: the check follows the stream and ends a stripe's sum
 * after the tensor's last byte arrives, not a whole share's. When the
 * caller is a run's executing thread and the tensor is large, the execution
 * pool's threads take the stripes in turn (the pool's workers would
 * otherwise wait it out idle); else one thread takes them all (the launch
 * of one task runs inline). */
#define CB_PARALLEL_CHECK_MIN (256u << 10)
#define CB_CHECK_PARTS 64

typedef struct {
  cb_bundle* b;
  const uint8_t* data;
  uint64_t nbytes, first; /* first: stripe 0's length, a multiple of 8 (the checksum's words) */
  uint64_t sums[CB_CHECK_PARTS];
} cb_check_job;

static int check_part(int task, cb_parallel_env* env, void* cdata) {
  cb_check_job* j = cdata;
  uint64_t sum = 0;
  for (uint64_t k = (uint64_t)task;; k += (uint64_t)env->num_task) {
    uint64_t lo = k ? j->first + (k - 1) * CB_STREAM_CHUNK : 0, hi = j->first + k * CB_STREAM_CHUNK;
    if (lo >= j->nbytes) break;
    if (hi > j->nbytes) hi = j->nbytes;
    populate(j->b, j->data + lo, hi - lo);
    sum += cb_checksum64_part(j->data + lo, hi - lo, lo / 8);
  }
  j->sums[task] = sum;
  return 0;
}

static uint64_t sum_tensor(cb_bundle* b, const uint8_t* data, uint64_t nbytes, int on_pool) {
  /* stripe 0 ends on a chunk boundary, rounded down to whole words (the
   * compiler aligns tensors to 64 bytes, so it only rounds a foreign
   * bundle's; an empty stripe 0 is summed as nothing) */
  uint64_t off = (uint64_t)(data - (in_head(b, data) ? b->head : b->base));
  cb_check_job j = {b, data, nbytes, (CB_STREAM_CHUNK - off % CB_STREAM_CHUNK) / 8 * 8, {0}};
  int n = on_pool && nbytes >= CB_PARALLEL_CHECK_MIN ? cb_backend_active_threads() : 1;
  n = n < 1 ? 1 : n > CB_CHECK_PARTS ? CB_CHECK_PARTS : n;
  cb_backend_parallel(check_part, &j, n); /* check_part cannot fail */
  uint64_t sum = 0;
  for (int k = 0; k < n; k++) sum += j.sums[k];
  return sum;
}

/* Weight tensor `t` (at `data`), read ahead and checked against its own
 * checksum unless already checked; `layer` names the reader for the error.
 * `on_pool`: the caller is a run's executing thread, whose pool may share
 * the work of a large tensor. */
static cb_status check_tensor(cb_bundle* b, uint32_t t, const uint8_t* data, const char* layer, int on_pool) {
  const cb_tensor_desc* d = &b->model.tensors[t];
  read_ahead_of(b, data, d->nbytes);
  if (b->verified && atomic_load(&b->verified[t])) return CB_OK;
  if (sum_tensor(b, data, d->nbytes, on_pool) != d->checksum)
    return layer ? cb_fail(CB_ERR_CORRUPT, "weight tensor '%s' of layer '%s' fails its checksum (file altered or damaged)",
                           d->name, layer)
                 : cb_fail(CB_ERR_CORRUPT, "weight tensor '%s' fails its checksum (file altered or damaged)", d->name);
  if (b->verified) atomic_store(&b->verified[t], 1);
  return CB_OK;
}

uint64_t cb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void open_event(cb_bundle* b, int k, uint32_t phase, uint64_t start) {
  b->open_events[k] = (cb_trace_event){CB_STEP_BUNDLE, phase, sched_getcpu(), 0, start, cb_now_ns()};
  if (k >= b->nopen_events) b->nopen_events = k + 1;
}

static uint32_t rd32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t* p) { uint64_t v; memcpy(&v, p, 8); return v; }

static cb_status check_preamble(const uint8_t* p, uint64_t size, uint64_t* hdr_off, uint64_t* hdr_size) {
  if (size < CB_PREAMBLE_SIZE || memcmp(p, CB_MAGIC, 8) != 0)
    return cb_fail(CB_ERR_BAD_MAGIC, "not a coldbrew bundle (no COLDBREW magic)");
  if (rd32(p + 8) < CB_SCHEMA_MIN_VERSION || rd32(p + 8) > CB_SCHEMA_VERSION)
    return cb_fail(CB_ERR_VERSION, "bundle schema version %u, this runtime reads %u to %u", rd32(p + 8),
                   CB_SCHEMA_MIN_VERSION, CB_SCHEMA_VERSION);
  uint64_t declared = rd64(p + 32);
  if (declared != size)
    return cb_fail(CB_ERR_CORRUPT, "bundle is %llu bytes but its header says %llu (truncated?)",
                   (unsigned long long)size, (unsigned long long)declared);
  uint64_t sig = rd64(p + 40);
  if (sig && (sig < CB_PREAMBLE_SIZE || sig > size || size - sig != CB_SIG_BLOCK_SIZE))
    return cb_fail(CB_ERR_CORRUPT, "bundle's signature block lies outside the file");
  *hdr_off = rd32(p + 12);
  *hdr_size = rd64(p + 16);
  if (*hdr_off < CB_PREAMBLE_SIZE || *hdr_off > size || *hdr_size > size - *hdr_off)
    return cb_fail(CB_ERR_CORRUPT, "bundle header lies outside the file");
  if (*hdr_off % 8 != 0) /* its 64-bit fields (shapes, sizes) are read in place */
    return cb_fail(CB_ERR_CORRUPT, "bundle header at offset %llu is not 8-byte aligned", (unsigned long long)*hdr_off);
  return CB_OK;
}

static int is_code_segment(const cb_segment_desc* seg) {
  return seg->kind == CB_SEG_CPU_CODE || seg->kind == CB_SEG_CPU_CODE_LZ4;
}

/* The compressed code decoded straight into the memfd's pages. */
static cb_status decode_code(int fd, const cb_bundle* b, const cb_segment_desc* seg) {
  if (ftruncate(fd, (off_t)seg->raw_size) != 0)
    return cb_fail(CB_ERR_LOAD, "sizing the kernel code failed: %s", strerror(errno));
  void* dst = mmap(NULL, (size_t)seg->raw_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (dst == MAP_FAILED) return cb_fail(CB_ERR_LOAD, "mapping the kernel code failed: %s", strerror(errno));
  int64_t n = cb_lz4_decode(front_at(b, seg->offset, seg->size), seg->size, dst, seg->raw_size);
  munmap(dst, (size_t)seg->raw_size);
  if (n != (int64_t)seg->raw_size)
    return cb_fail(CB_ERR_CORRUPT, "the compressed CPU code does not decode to its %llu bytes (damaged)",
                   (unsigned long long)seg->raw_size);
  return CB_OK;
}

static cb_status load_code(cb_bundle* b, const cb_segment_desc* seg) {
  int fd = memfd_create("coldbrew-kernels", MFD_CLOEXEC);
  if (fd < 0) return cb_fail(CB_ERR_LOAD, "memfd_create failed: %s", strerror(errno));
  const uint8_t* p = front_at(b, seg->offset, seg->size);
  uint64_t left = seg->kind == CB_SEG_CPU_CODE ? seg->size : 0;
  cb_status s = seg->kind == CB_SEG_CPU_CODE_LZ4 ? decode_code(fd, b, seg) : CB_OK;
  if (s) {
    close(fd);
    return s;
  }
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w <= 0) {
      close(fd);
      return cb_fail(CB_ERR_LOAD, "writing kernel code failed: %s", strerror(errno));
    }
    p += w, left -= (uint64_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  b->code = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!b->code) {
    close(fd);
    return cb_fail(CB_ERR_LOAD, "loading kernel code failed: %s", dlerror());
  }
  b->code_fd = fd;
  cb_backend_install(b->code);
  return CB_OK;
}

static int widen_f16_kernel(void* self, const void* args, int32_t nargs, void* result);

static cb_kernel_fn find_kernel(const cb_bundle* b, const char* name) {
  if (strcmp(name, CB_WIDEN_F16) == 0) return widen_f16_kernel; /* shapes checked at open (model.cc) */
  char sym[512];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", name);
  return b->code ? (cb_kernel_fn)dlsym(b->code, sym) : NULL;
}

static cb_status resolve_kernels(cb_bundle* b) {
  const cb_model* m = &b->model;
  b->kernels = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->kernels);
  b->transforms = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->transforms);
  b->alternates = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->alternates);
  if (!b->kernels || !b->transforms || !b->alternates) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nsteps; i++) {
    const cb_step_desc* st = &m->steps[i];
    if (!(b->kernels[i] = find_kernel(b, st->kernel)))
      return cb_fail(CB_ERR_LOAD, "layer '%s' (variant '%s'): kernel '%s' is missing from the bundle",
                     st->layer_name, st->variant, st->kernel);
    if (st->transform && !(b->transforms[i] = find_kernel(b, st->transform)))
      return cb_fail(CB_ERR_LOAD, "layer '%s' (variant '%s'): transform kernel '%s' is missing from the bundle",
                     st->layer_name, st->variant, st->transform);
    if (st->warm_kernel && !(b->alternates[i] = find_kernel(b, st->warm_kernel)))
      return cb_fail(CB_ERR_LOAD, "layer '%s' (warm variant '%s'): kernel '%s' is missing from the bundle",
                     st->layer_name, st->warm_variant, st->warm_kernel);
  }
  return CB_OK;
}

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
        if (check_tensor(b, t, data, NULL, 0)) return NULL; /* its error stays on this thread */
      } else {
        r->sink += bring_in(b, data, d->nbytes);
      }
    }
    r->events[i] = (cb_trace_event){i, CB_PHASE_READ, sched_getcpu(), 0, t0, cb_now_ns()};
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
 * while this thread uploads the weights and helps. `key` names the bundle's
 * pipeline cache. */
static cb_status open_gpu(cb_bundle* b, uint64_t t0, uint64_t key) {
  const cb_model* m = &b->model;
  const uint8_t* shaders = b->head ? b->head : b->base; /* the head, where it holds them all */
  for (uint32_t i = 0; i < m->nsegments; i++) {
    const cb_segment_desc* seg = &m->segments[i];
    if (seg->kind == CB_SEG_SPIRV) {
      read_ahead(b, seg->offset + seg->size);
      const uint8_t* data = front_at(b, seg->offset, seg->size);
      if (data == b->base + seg->offset) shaders = b->base;
      if (cb_checksum64(data, seg->size) != seg->checksum)
        return cb_fail(CB_ERR_CORRUPT, "segment %u checksum mismatch (file altered or damaged)", i);
    } else if (is_code_segment(seg)) {
      return cb_fail(CB_ERR_CORRUPT, "a GPU bundle carries CPU code");
    }
  }
  b->open_cap = 4 + (int)m->nsteps + (int)m->nshaders;
  b->open_events = cb_calloc((size_t)b->open_cap, sizeof *b->open_events);
  gpu_reader reader = {b, cb_calloc(m->nsteps ? m->nsteps : 1, sizeof(cb_trace_event)), 0};
  if (!b->open_events || !reader.events) {
    cb_free(reader.events);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_VERIFY, sched_getcpu(), 0, t0, cb_now_ns()});
  pthread_t rt;
  int reading = pthread_create(&rt, NULL, gpu_reader_main, &reader) == 0;
  if (!reading) gpu_reader_main(&reader);
  uint64_t t1 = cb_now_ns();
  cb_status s = cb_gpu_open(&b->gpu);
  add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_GPU_CONTEXT, sched_getcpu(), 0, t1, cb_now_ns()});
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (!s) s = cb_gpu_prepare(b->gpu, shaders, m, key, cores > 0 ? (uint32_t)cores : 1);
  if (reading) pthread_join(rt, NULL);
  b->read_sink += reader.sink;
  for (uint32_t i = 0; i < m->nsteps; i++) add_open_event(b, reader.events[i]);
  cb_free(reader.events);
  if (!s && weights_checked(b)) { /* else the first run's read names the tensor */
    uint64_t t2 = cb_now_ns();
    s = cb_gpu_upload_weights(b->gpu, b->base, m);
    add_open_event(b, (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_UPLOAD, sched_getcpu(), 0, t2, cb_now_ns()});
  }
  if (b->gpu) {
    cb_status p = cb_gpu_pipelines_finish(b->gpu);
    if (!s) s = p;
    const cb_trace_event* pe = cb_gpu_pipeline_events(b->gpu);
    for (uint32_t i = 0; pe && i < m->nshaders; i++) add_open_event(b, pe[i]);
  }
  return s;
}

/* The end of the segments that lie before the first weight segment: what
 * the open reads before any layer (a bundle whose code sits behind its
 * weights, an older layout, has no such front beyond the header). */
static uint64_t front_end(const cb_model* m) {
  uint64_t first_weight = UINT64_MAX, end = 0;
  for (uint32_t i = 0; i < m->nsegments; i++)
    if (is_weight_segment(&m->segments[i]) && m->segments[i].offset < first_weight)
      first_weight = m->segments[i].offset;
  for (uint32_t i = 0; i < m->nsegments; i++) {
    const cb_segment_desc* seg = &m->segments[i];
    if (!is_weight_segment(seg) && seg->offset < first_weight && seg->offset + seg->size > end)
      end = seg->offset + seg->size;
  }
  return end;
}

static cb_status open_verified(cb_bundle* b, uint32_t flags, const uint8_t* public_key) {
  uint64_t t0 = b->open_ns ? b->open_ns : cb_now_ns(), hdr_off = 0, hdr_size = 0;
  const uint8_t* pre = front_at(b, 0, CB_PREAMBLE_SIZE);
  cb_status s = check_preamble(pre, b->size, &hdr_off, &hdr_size);
  if (s) return s;
  /* a required signature is checked before anything else reads the header */
  if (public_key) {
    if ((s = cb_signature_check(b->base, b->size, public_key))) return s;
    flags |= CB_OPEN_SKIP_WEIGHT_CHECKSUMS; /* every byte is authenticated: the weights' checksums add nothing */
  }
  extend_head(b, hdr_off + hdr_size);
  const uint8_t* hdr = front_at(b, hdr_off, hdr_size);
  if (cb_checksum64(hdr, hdr_size) != rd64(pre + 24))
    return cb_fail(CB_ERR_CORRUPT, "bundle header checksum mismatch (file altered or damaged)");
  if ((s = cb_model_parse(hdr, hdr_size, b->size, rd32(pre + 8), &b->model))) return s;
  uint64_t front = front_end(&b->model);
  extend_head(b, front); /* the rest of the front; the first layers' weights, the streamer's (fill_head) */
  if (b->head) {
    uint64_t end = head_limit(b, front + CB_HEAD_WEIGHTS);
    b->head_end = end > b->head_size ? end : b->head_size;
    if (!b->streaming) fill_head(b);
  }
  if (b->streaming) publish_front(b, front);
  if ((s = cb_target_check(&b->model))) return s;
  /* Weights with checksums of their own are checked by the run that first
   * reads them (GPU bundles: by the open's reader), nothing waits here for
   * bytes it does not need yet; an older bundle's weight segments are
   * checked whole, here. */
  if (b->model.weight_checksums && !(flags & CB_OPEN_SKIP_WEIGHT_CHECKSUMS) &&
      !(b->verified = cb_calloc(b->model.ntensors ? b->model.ntensors : 1, 1)))
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  if (b->model.gpu_api[0]) return open_gpu(b, t0, rd64(pre + 24));
  b->open_cap = 2;
  if (!(b->open_events = cb_calloc(2, sizeof *b->open_events))) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  /* the execution pool's threads start now and come up while the code is
   * checked and loaded: as many as the plan's first run uses (a session
   * with other thread counts resizes the pool; a failure here is retried,
   * and reported, by the session) */
  (void)cb_backend_set_threads((int)(b->model.threads ? b->model.threads : 1));
  const cb_segment_desc* code = NULL;
  for (uint32_t i = 0; i < b->model.nsegments; i++)
    if (is_code_segment(&b->model.segments[i])) {
      if (code) return cb_fail(CB_ERR_CORRUPT, "bundle has more than one CPU code segment");
      code = &b->model.segments[i];
    }
  if (code) read_ahead(b, code->offset + code->size); /* the code, and the first weights behind it */
  for (uint32_t i = 0; i < b->model.nsegments; i++) {
    const cb_segment_desc* seg = &b->model.segments[i];
    if (is_weight_segment(seg)) continue;
    const uint8_t* data = front_at(b, seg->offset, seg->size);
    if (data == b->base + seg->offset) populate(b, data, seg->size); /* beside the streamer, not across it */
    if (cb_checksum64(data, seg->size) != seg->checksum)
      return cb_fail(CB_ERR_CORRUPT, "segment %u checksum mismatch (file altered or damaged)", i);
  }
  if (!b->model.weight_checksums && !(flags & CB_OPEN_SKIP_WEIGHT_CHECKSUMS) && (s = check_weight_segments(b)))
    return s;
  open_event(b, 0, CB_PHASE_VERIFY, t0);
  uint64_t t1 = cb_now_ns();
  if (code && (s = load_code(b, code))) return s;
  s = resolve_kernels(b);
  open_event(b, 1, CB_PHASE_CODE_LOAD, t1);
  return s;
}

static cb_bundle* new_bundle(void) {
  cb_bundle* b = cb_calloc(1, sizeof *b);
  if (b) b->head_fd = -1;
  return b;
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

/* A signed open reads the file into memory of its own: what was verified is
 * what runs, even if the file changes afterwards (a mapping would see it). */
static cb_status open_file_copy(int fd, uint64_t size, const char* path, const cb_open_options* options,
                                cb_bundle** out) {
  cb_bundle* b = new_bundle();
  void* copy = cb_aligned_alloc(64, (size_t)size);
  if (!b || !copy) {
    close(fd);
    cb_free(b), cb_free(copy);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory (%llu-byte bundle)", (unsigned long long)size);
  }
  for (uint64_t done = 0; done < size;) {
    ssize_t n = pread(fd, (uint8_t*)copy + done, (size_t)(size - done), (off_t)done);
    if (n <= 0) {
      close(fd);
      cb_free(b), cb_free(copy);
      return cb_fail(CB_ERR_IO, "cannot read '%s': %s", path, n < 0 ? strerror(errno) : "file shrank");
    }
    done += (uint64_t)n;
  }
  close(fd);
  b->base = copy, b->size = size, b->owned_copy = copy;
  return finish_open(b, options, out);
}

cb_status cb_bundle_open_file_with(const char* path, const cb_open_options* options, cb_bundle** out_bundle) {
  if (!path || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "path and out_bundle are required");
  *out_bundle = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cb_fail(CB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return cb_fail(CB_ERR_BAD_MAGIC, "'%s' is empty or unreadable, not a coldbrew bundle", path);
  }
  if (options && options->public_key) return open_file_copy(fd, (uint64_t)st.st_size, path, options, out_bundle);
  uint64_t t0 = cb_now_ns();
  void* map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return cb_fail(CB_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
  cb_bundle* b = new_bundle();
  if (!b) {
    munmap(map, (size_t)st.st_size);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  b->base = map, b->size = (uint64_t)st.st_size, b->mapping = map, b->open_ns = t0;
  read_front(b, path);
  start_streamer(b);
  return finish_open(b, options, out_bundle);
}

cb_status cb_bundle_open_memory_with(const void* data, size_t size, const cb_open_options* options,
                                     cb_bundle** out_bundle) {
  if (!data || !out_bundle) return cb_fail(CB_ERR_INVALID_ARGUMENT, "data and out_bundle are required");
  *out_bundle = NULL;
  cb_bundle* b = new_bundle();
  if (!b) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  b->base = data, b->size = size;
  if ((uintptr_t)data % 64 != 0) { /* weights are used in place and must be aligned */
    b->owned_copy = cb_aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!b->owned_copy) {
      cb_free(b);
      return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(b->owned_copy, data, size);
    b->base = b->owned_copy;
  }
  return finish_open(b, options, out_bundle);
}

void cb_bundle_release(cb_bundle* b) {
  if (!b) return;
  stop_streamer(b);
  cb_gpu_release(b->gpu);
  cb_free(b->open_events);
  if (b->code) dlclose(b->code);
  if (b->code_fd > 0) close(b->code_fd);
  cb_free(b->kernels);
  cb_free(b->transforms);
  cb_free(b->alternates);
  cb_free((void*)b->verified);
  cb_model_free(&b->model);
  if (b->mapping) munmap(b->mapping, (size_t)b->size);
  close_head(b);
  cb_free(b->head);
  cb_free(b->owned_copy);
  cb_free(b);
}

cb_status cb_bundle_verify_weights(cb_bundle* b) {
  if (!b) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle is required");
  const cb_model* m = &b->model;
  if (!m->weight_checksums) return check_weight_segments(b);
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    if (d->kind != CB_KIND_WEIGHT) continue;
    cb_status s = check_tensor(b, i, cb_weight_data(b->base, m, i), NULL, 0);
    if (s) return s;
  }
  return CB_OK;
}


size_t cb_bundle_input_count(const cb_bundle* b) { return b ? b->model.ninputs : 0; }
size_t cb_bundle_output_count(const cb_bundle* b) { return b ? b->model.noutputs : 0; }

static cb_status tensor_info(const cb_bundle* b, const uint32_t* ids, uint32_t n, size_t i,
                             const char* what, cb_tensor_info* out) {
  if (!b || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out_info are required");
  if (i >= n) return cb_fail(CB_ERR_INVALID_ARGUMENT, "%s index %zu out of range (%u %ss)", what, i, n, what);
  const cb_tensor_desc* t = &b->model.tensors[ids[i]];
  out->name = t->name, out->dtype = (cb_dtype)t->dtype, out->ndim = t->ndim;
  out->shape = t->shape, out->nbytes = t->nbytes;
  return CB_OK;
}

cb_status cb_bundle_input_info(const cb_bundle* b, size_t i, cb_tensor_info* out) {
  return tensor_info(b, b ? b->model.inputs : NULL, b ? b->model.ninputs : 0, i, "input", out);
}

cb_status cb_bundle_output_info(const cb_bundle* b, size_t i, cb_tensor_info* out) {
  return tensor_info(b, b ? b->model.outputs : NULL, b ? b->model.noutputs : 0, i, "output", out);
}

cb_status cb_bundle_find_input(const cb_bundle* b, const char* name, size_t* out_index) {
  if (!b || !name || !out_index) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle, name and out_index are required");
  for (uint32_t i = 0; i < b->model.ninputs; i++)
    if (strcmp(b->model.tensors[b->model.inputs[i]].name, name) == 0) {
      *out_index = i;
      return CB_OK;
    }
  return cb_fail(CB_ERR_INVALID_ARGUMENT, "the model has no input named '%s'", name);
}

/* ---- session ----------------------------------------------------------- */

/* DLPack's DLTensor and tvm-ffi's TVMFFIAny, restated (ABI-stable). */
typedef struct {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} cb_dltensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void* v_ptr;
  };
} cb_ffi_any;

enum { CB_FFI_NONE = 0, CB_FFI_DLTENSOR_PTR = 7, CB_DL_CPU = 1 };

/* The runtime's own transform, called like a kernel: pairs of (fp16
 * weights, fp32 prepared tensor of their shape). */
static int widen_f16_kernel(void* self, const void* args, int32_t nargs, void* result) {
  (void)self, (void)result;
  const cb_ffi_any* a = args;
  if (nargs < 2 || nargs % 2) return -1;
  for (int32_t k = 0; k < nargs; k += 2) {
    const cb_dltensor* in = a[k].v_ptr;
    const cb_dltensor* out = a[k + 1].v_ptr;
    uint64_t n = 1;
    for (int32_t d = 0; d < in->ndim; d++) n *= (uint64_t)in->shape[d];
    cb_widen_f16(in->data, out->data, n);
  }
  return 0;
}

struct cb_session {
  cb_bundle* bundle;
  uint8_t* arena;
  uint8_t* prepared;      /* transformed weights, made once, kept across runs */
  uint8_t* is_prepared;   /* per step */
  cb_dltensor* tensors;
  cb_ffi_any* args;       /* all steps' execute arguments, back to back */
  uint32_t* arg_start;    /* per step */
  cb_ffi_any* targs;      /* all steps' transform arguments, back to back */
  uint32_t* targ_start;   /* per step */
  cb_ffi_any* aargs;      /* all steps' warm alternates' arguments, back to back */
  uint32_t* aarg_start;   /* per step */
  cb_trace_event* trace;  /* 4 per step + the open and create events when tracing, else NULL */
  cb_trace_event create_event; /* session creation (reported by the first traced run) */
  size_t trace_cap;
  _Atomic size_t ntrace;  /* the executing thread and preparation workers both record */
  uint32_t threads;       /* execution threads of the first run */
  uint32_t later_threads; /* ... and of later runs (continuous mode: the warm plan's) */
  const uint8_t* shares;       /* the first run's parallel-loop split (NULL: even) */
  const uint8_t* later_shares; /* ... and later runs' */
  uint8_t own_shares[256];     /* the caller's exec_shares, copied */
  int warm;               /* a run has completed: weights read, checked and prepared */
  _Atomic uint64_t read_sink; /* keeps the weight reads observable */
  /* the first run's preparation workers (plan steps with prep_queue > 0) */
  pthread_mutex_t mu;
  pthread_cond_t ready_cv;
  _Atomic uint8_t* ready;   /* per step: 0 pending, 1 prepared, 2 failed */
  _Atomic uint8_t* claimed; /* per step: a thread has taken its preparation */
  atomic_int abort;       /* the executing thread failed: workers stop */
  cb_status prep_status;
  char prep_error[1024];
  _Atomic uint32_t prepared_steps; /* first-run preparations done (the warmer waits for all) */
  /* continuous mode: the warmer readies the steps' warm alternates */
  int continuous;
  int warmer_started;
  pthread_t warmer;
  atomic_int warmer_stop;
  _Atomic uint8_t* alt_ready; /* per step: its warm alternate's weights are read and checked */
  _Atomic uint8_t* alt_claimed; /* per step: the warmer or a run has taken its reading */
  cb_gpu_session* gpu;        /* GPU bundles: arena, staging (= arena above), command buffer */
  cb_status alt_status;       /* a warm weight failed its check (set by the warmer, under mu) */
  char alt_error[1024];
};

static void dl_dtype(uint8_t dtype, cb_dltensor* t) {
  static const uint8_t code[] = {2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 6};
  static const uint8_t bits[] = {32, 16, 64, 8, 16, 32, 64, 8, 16, 32, 64, 8};
  t->code = code[dtype], t->bits = bits[dtype], t->lanes = 1;
}

/* Kernel arguments: pointers to the session's tensor descriptions. */
static uint32_t bind_args(cb_session* s, const uint32_t* ids, uint32_t n, cb_ffi_any* out) {
  for (uint32_t a = 0; a < n; a++) out[a].type_index = CB_FFI_DLTENSOR_PTR, out[a].v_ptr = &s->tensors[ids[a]];
  return n;
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

cb_status cb_session_create(cb_bundle* b, const cb_session_options* options, cb_session** out) {
  if (!b || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out_session are required");
  *out = NULL;
  uint64_t t0 = cb_now_ns();
  const cb_model* m = &b->model;
  if (options && options->mode > CB_MODE_CONTINUOUS)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "unknown session mode %u", options->mode);
  int continuous = options && options->mode == CB_MODE_CONTINUOUS;
  uint32_t threads = options && options->threads ? options->threads : (m->threads ? m->threads : 1);
  /* runs after the first: the plan's later thread count (the warm plan's in
   * continuous mode; all execution cores where the first run kept some for
   * preparation), unless the caller gives one count for all runs */
  uint32_t later = options && options->threads ? threads : (m->warm_threads ? m->warm_threads : threads);
  uint32_t nshares = options ? options->exec_share_count : 0;
  if (nshares && (nshares != threads || !options->exec_shares || nshares > 256))
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "exec_shares has %u entries for %u execution threads", nshares, threads);
  for (uint32_t k = 0; k < nshares; k++)
    if (!options->exec_shares[k]) return cb_fail(CB_ERR_INVALID_ARGUMENT, "exec_shares gives thread %u no share", k);
  int gpu = m->gpu_api[0] != 0;
  cb_status st = gpu ? CB_OK : cb_backend_set_threads((int)(threads > later ? threads : later));
  if (st) return st;
  uint64_t total_args = 0, total_targs = 0, total_aargs = 0;
  for (uint32_t i = 0; i < m->nsteps; i++)
    total_args += m->steps[i].nargs, total_targs += m->steps[i].ntransform_args, total_aargs += m->steps[i].nwarm_args;
  cb_session* s = cb_calloc(1, sizeof *s);
  if (!s) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  s->bundle = b;
  s->threads = threads, s->later_threads = later, s->continuous = continuous;
  if (nshares) memcpy(s->own_shares, options->exec_shares, nshares);
  s->shares = split_for(m, 0, threads, s->own_shares, nshares);
  s->later_shares = split_for(m, 1, later, s->own_shares, nshares);
  if (gpu) { /* inputs and outputs live in the GPU session's staging buffer, at their arena offsets */
    void* view = NULL;
    if ((st = cb_gpu_session_create(b->gpu, m, &s->gpu, &view))) {
      cb_session_release(s);
      return st;
    }
    s->arena = view;
  } else {
    s->arena = big_alloc((size_t)((m->arena_size + 63) & ~(uint64_t)63) + 64);
  }
  s->tensors = cb_calloc(m->ntensors ? m->ntensors : 1, sizeof *s->tensors);
  s->args = cb_calloc(total_args ? total_args : 1, sizeof *s->args);
  s->arg_start = cb_calloc(m->nsteps + 1, sizeof *s->arg_start);
  s->targs = cb_calloc(total_targs ? total_targs : 1, sizeof *s->targs);
  s->targ_start = cb_calloc(m->nsteps + 1, sizeof *s->targ_start);
  s->aargs = cb_calloc(total_aargs ? total_aargs : 1, sizeof *s->aargs);
  s->aarg_start = cb_calloc(m->nsteps + 1, sizeof *s->aarg_start);
  s->alt_ready = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->alt_claimed = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->is_prepared = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->ready = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  s->claimed = cb_calloc(m->nsteps ? m->nsteps : 1, 1);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->ready_cv, NULL);
  /* GPU bundles keep prepared tensors in the device's weights buffer */
  s->prepared = gpu ? cb_aligned_alloc(64, 64) : big_alloc((size_t)((m->prepared_size + 63) & ~(uint64_t)63) + 64);
  if (options && options->trace) {
    s->trace_cap = 4 * (size_t)m->nsteps + 6 + (size_t)b->nopen_events;
    s->trace = cb_calloc(s->trace_cap, sizeof *s->trace);
    if (!s->trace) {
      cb_session_release(s);
      return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
    }
  }
  if (!s->arena || !s->tensors || !s->args || !s->arg_start || !s->targs || !s->targ_start || !s->is_prepared ||
      !s->prepared || !s->ready || !s->claimed || !s->aargs || !s->aarg_start || !s->alt_ready ||
      !s->alt_claimed) {
    cb_session_release(s);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory (arena %llu bytes)", (unsigned long long)m->arena_size);
  }
  /* the arena is not zeroed: every tensor in it is written (inputs by the
   * caller, the rest by the layers) before it is read */
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    cb_dltensor* t = &s->tensors[i];
    if (d->kind == CB_KIND_WEIGHT)
      t->data = (void*)weight_at(b, i);
    else if (d->kind == CB_KIND_PREPARED)
      t->data = gpu ? NULL : s->prepared + d->arena_offset;
    else
      t->data = s->arena + d->arena_offset;
    t->device_type = CB_DL_CPU;
    t->ndim = d->ndim;
    t->shape = (int64_t*)d->shape;
    dl_dtype(d->dtype, t);
  }
  uint32_t k = 0, kt = 0, ka = 0;
  for (uint32_t i = 0; i < m->nsteps; i++) {
    const cb_step_desc* sd = &m->steps[i];
    s->arg_start[i] = k, s->targ_start[i] = kt, s->aarg_start[i] = ka;
    k += bind_args(s, sd->args, sd->nargs, &s->args[k]);
    kt += bind_args(s, sd->transform_args, sd->ntransform_args, &s->targs[kt]);
    ka += bind_args(s, sd->warm_args, sd->nwarm_args, &s->aargs[ka]);
  }
  s->arg_start[m->nsteps] = k, s->targ_start[m->nsteps] = kt, s->aarg_start[m->nsteps] = ka;
  s->create_event = (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_SESSION, sched_getcpu(), 0, t0, cb_now_ns()};
  *out = s;
  return CB_OK;
}

static void stop_warmer(cb_session* s);

void cb_session_release(cb_session* s) {
  if (!s) return;
  stop_warmer(s);
  cb_free(s->aargs);
  cb_free(s->aarg_start);
  cb_free((void*)s->alt_ready);
  cb_free((void*)s->alt_claimed);
  if (s->gpu) cb_gpu_session_release(s->gpu);
  else cb_free(s->arena);
  cb_free(s->trace);
  cb_free(s->prepared);
  cb_free(s->is_prepared);
  cb_free((void*)s->ready);
  cb_free((void*)s->claimed);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->ready_cv);
  cb_free(s->targs);
  cb_free(s->targ_start);
  cb_free(s->tensors);
  cb_free(s->args);
  cb_free(s->arg_start);
  cb_free(s);
}

cb_status cb_session_set_input(cb_session* s, size_t index, const void* data, size_t nbytes) {
  if (!s || !data) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and data are required");
  const cb_model* m = &s->bundle->model;
  if (index >= m->ninputs)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input index %zu out of range (%u inputs)", index, m->ninputs);
  const cb_tensor_desc* d = &m->tensors[m->inputs[index]];
  if (nbytes != d->nbytes)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' takes %llu bytes, got %zu", d->name,
                   (unsigned long long)d->nbytes, nbytes);
  memcpy(s->arena + d->arena_offset, data, nbytes);
  return CB_OK;
}

/* Bring a step's weights (execute and transform arguments living in the
 * bundle) into memory, checking each tensor's checksum the first time any
 * run reads it (a corrupt weight is an error, never a wrong result); a
 * tensor already checked, or one of a bundle opened without weight checks,
 * is touched once per page. */
static cb_status read_tensors(cb_session* s, const uint32_t* ids, uint32_t n, const char* layer, int on_pool) {
  cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  uint64_t sum = 0;
  for (uint32_t a = 0; a < n; a++) {
    const cb_tensor_desc* d = &m->tensors[ids[a]];
    if (d->kind != CB_KIND_WEIGHT) continue;
    const uint8_t* data = (const uint8_t*)s->tensors[ids[a]].data;
    if (b->verified && !atomic_load(&b->verified[ids[a]])) { /* reading it checks it */
      cb_status c = check_tensor(b, ids[a], data, layer, on_pool);
      if (c) return c;
      continue;
    }
    sum += bring_in(b, data, d->nbytes);
  }
  s->read_sink += sum;
  return CB_OK;
}

static cb_status read_weights(cb_session* s, uint32_t step, int on_pool) {
  const cb_step_desc* st = &s->bundle->model.steps[step];
  cb_status c = read_tensors(s, st->args, st->nargs, st->layer_name, on_pool);
  return c ? c : read_tensors(s, st->transform_args, st->ntransform_args, st->layer_name, on_pool);
}

static cb_trace_event* trace_event(cb_session* s, uint32_t step, uint32_t phase, uint32_t alternate) {
  if (!s->trace) return NULL;
  size_t k = atomic_fetch_add(&s->ntrace, 1);
  if (k >= s->trace_cap) return NULL; /* the warmer outlived the run whose trace it wrote to */
  cb_trace_event* ev = &s->trace[k];
  ev->step = step, ev->phase = phase, ev->cpu = sched_getcpu(), ev->alternate = alternate, ev->start_ns = cb_now_ns();
  return ev;
}

static cb_trace_event* trace_begin(cb_session* s, uint32_t step, uint32_t phase) {
  return trace_event(s, step, phase, 0);
}

static void trace_end(cb_trace_event* ev) {
  if (ev) ev->end_ns = cb_now_ns();
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
    ev = trace_begin(s, i, CB_PHASE_TRANSFORM);
    uint32_t t = s->targ_start[i];
    if (call_kernel(b->transforms[i], &s->targs[t], s->targ_start[i + 1] - t)) {
      return cb_fail(CB_ERR_KERNEL, "layer '%s' (transform '%s') failed: %s", m->steps[i].layer_name,
                     m->steps[i].transform, cb_backend_kernel_error());
    }
    s->is_prepared[i] = 1;
    trace_end(ev);
  }
  return CB_OK;
}

/* Step `i`'s preparation: read (and check) its weights on the first run,
 * then transform raw weights once. */
static cb_status prepare_step(cb_session* s, uint32_t i, int first) {
  const cb_model* m = &s->bundle->model;
  if (first) {
    cb_trace_event* ev = trace_begin(s, i, CB_PHASE_READ);
    cb_status st = read_weights(s, i, 1); /* a preparation worker's launches run inline */
    trace_end(ev);
    if (st) return st;
  }
  cb_status done = prepare_transform(s, i);
  if (!done && first && atomic_fetch_add(&s->prepared_steps, 1) + 1 == m->nsteps && s->continuous) {
    pthread_mutex_lock(&s->mu); /* the warmer waits for the first run's reads */
    pthread_cond_broadcast(&s->ready_cv);
    pthread_mutex_unlock(&s->mu);
  }
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

/* Continuous mode's warmer: at idle priority, once the first run has read
 * every weight it needs (so the two never compete for the disk), read and
 * check each step's warm-alternate weights in plan order and mark the step
 * ready; later runs switch to a step's alternate once it is. Back-to-back
 * runs leave an idle-priority thread no time, so a later run that reaches
 * an alternate nobody has taken, with its bytes already in memory, readies
 * it itself (a checksum pass; the paper's "pipelined in the second
 * inference"); one whose bytes are still on disk keeps the plan's variant. */
static cb_status ready_alternate(cb_session* s, uint32_t i) {
  const cb_step_desc* st = &s->bundle->model.steps[i];
  cb_trace_event* ev = trace_event(s, i, CB_PHASE_READ, 1);
  cb_status c = read_tensors(s, st->warm_args, st->nwarm_args, st->layer_name, 0);
  trace_end(ev);
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

static int claim_alternate(cb_session* s, uint32_t i) {
  uint8_t free_ = 0;
  return atomic_compare_exchange_strong(&s->alt_claimed[i], &free_, 1);
}

/* Every page of step `i`'s alternate weights is in memory (mincore). */
static int alternate_resident(cb_session* s, uint32_t i) {
  const cb_bundle* b = s->bundle;
  if (!b->mapping) return 1;
  const cb_step_desc* st = &b->model.steps[i];
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  unsigned char vec[256];
  for (uint32_t a = 0; a < st->nwarm_args; a++) {
    const cb_tensor_desc* d = &b->model.tensors[st->warm_args[a]];
    const uint8_t* data = s->tensors[st->warm_args[a]].data;
    if (d->kind != CB_KIND_WEIGHT || !d->nbytes || in_head(b, data)) continue;
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
    if (s->bundle->alternates[i] && claim_alternate(s, i) && ready_alternate(s, i)) break;
  return NULL;
}

static void start_warmer(cb_session* s) {
  if (s->warmer_started || !s->continuous || !s->bundle->model.nwarm) return;
  atomic_store(&s->warmer_stop, 0);
  s->warmer_started = pthread_create(&s->warmer, NULL, warmer_main, s) == 0;
  /* no thread: later runs keep the plan's variants */
}

static void stop_warmer(cb_session* s) {
  if (!s->warmer_started) return;
  pthread_mutex_lock(&s->mu);
  atomic_store(&s->warmer_stop, 1);
  pthread_cond_broadcast(&s->ready_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->warmer, NULL);
  s->warmer_started = 0;
}

#define CB_MAX_PREP_QUEUES 8

/* `queues`: the preparation queues workers serve on this run (0: none). */
static cb_status run_steps(cb_session* s, int first, uint32_t queues) {
  const cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  for (uint32_t i = 0; i < m->nsteps; i++) {
    cb_status st = first && m->steps[i].prep_queue > 0 && m->steps[i].prep_queue <= queues
                       ? take_or_wait(s, i) : prepare_step(s, i, first);
    if (st) return st;
    int alt = !first && atomic_load_explicit(&s->alt_ready[i], memory_order_acquire);
    /* an alternate nobody has taken (a plain load first: the warmer's or a
     * finished one costs no syscall), with its bytes resident: ready it here */
    if (!first && !alt && s->continuous && b->alternates[i] && !atomic_load(&s->alt_claimed[i]) &&
        alternate_resident(s, i) && claim_alternate(s, i)) {
      if ((st = ready_alternate(s, i))) return st;
      alt = 1;
    }
    cb_trace_event* ev = trace_event(s, i, CB_PHASE_EXECUTE, (uint32_t)alt);
    const uint32_t* start = alt ? s->aarg_start : s->arg_start;
    uint32_t a = start[i];
    if (call_kernel((alt ? b->alternates : b->kernels)[i], &(alt ? s->aargs : s->args)[a], start[i + 1] - a)) {
      return cb_fail(CB_ERR_KERNEL, "layer '%s' (kernel '%s') failed: %s", m->steps[i].layer_name,
                     alt ? m->steps[i].warm_kernel : m->steps[i].kernel, cb_backend_kernel_error());
    }
    trace_end(ev);
  }
  return CB_OK;
}

/* A GPU bundle's run: it submits the recorded command buffer and waits. The
 * open read, checked and uploaded the weights; where it could not (a tensor
 * failed its checksum), the first run reads them itself and names it. */
static cb_status run_gpu(cb_session* s, int first) {
  cb_bundle* b = s->bundle;
  const cb_model* m = &b->model;
  s->ntrace = 0;
  if (s->trace && first) {
    for (int k = 0; k < b->nopen_events; k++) s->trace[s->ntrace++] = b->open_events[k];
    s->trace[s->ntrace++] = s->create_event;
  }
  cb_status st = CB_OK;
  if (first && !cb_gpu_weights_ready(b->gpu)) { /* the open could not check them all */
    for (uint32_t i = 0; i < m->nsteps && !st; i++) {
      cb_trace_event* ev = trace_begin(s, i, CB_PHASE_READ);
      st = read_weights(s, i, 0);
      trace_end(ev);
    }
    cb_trace_event* ev = trace_begin(s, CB_STEP_BUNDLE, CB_PHASE_UPLOAD);
    if (!st) st = cb_gpu_upload_weights(b->gpu, b->base, m);
    trace_end(ev);
  }
  if (!st) {
    cb_trace_event* ev = trace_begin(s, CB_STEP_BUNDLE, CB_PHASE_GPU_EXECUTE);
    if (ev) ev->cpu = -1; /* the GPU's lane */
    st = cb_gpu_session_run(s->gpu);
    trace_end(ev);
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
  if (s->gpu) return run_gpu(s, first);
  /* the pool holds the larger of the two thread counts; this run launches on its own */
  cb_status ts = cb_backend_set_threads((int)(s->threads > s->later_threads ? s->threads : s->later_threads));
  if (ts) return ts;
  cb_backend_set_split((int)(first ? s->threads : s->later_threads), first ? s->shares : s->later_shares);
  s->ntrace = 0;
  if (s->trace && first) {
    for (int k = 0; k < b->nopen_events; k++) s->trace[s->ntrace++] = b->open_events[k];
    s->trace[s->ntrace++] = s->create_event;
  }
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
    for (uint32_t q = 1; q <= want; q++) {
      args[q - 1] = (cb_prep_worker){s, q, want};
      if (pthread_create(&workers[q - 1], attr_ok ? &attr : NULL, prep_main, &args[q - 1]) != 0) break;
      nworkers = q;
    }
  }
  if (attr_ok) pthread_attr_destroy(&attr);
  if (first) start_warmer(s);
  /* a worker that could not start leaves its queue to the others (they
   * steal) and to the executing thread (it claims what nobody took) */
  cb_status st = run_steps(s, first, nworkers ? want : 0);
  if (pinned) cb_backend_restore_caller(&saved);
  if (nworkers) {
    atomic_store(&s->abort, 1);
    for (uint32_t q = 0; q < nworkers; q++) pthread_join(workers[q], NULL);
  }
  if (!st) s->warm = 1;
  return st;
}

cb_status cb_session_get_output(const cb_session* s, size_t index, const void** out_data, size_t* out_nbytes) {
  if (!s || !out_data || !out_nbytes) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out pointers are required");
  const cb_model* m = &s->bundle->model;
  if (index >= m->noutputs)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "output index %zu out of range (%u outputs)", index, m->noutputs);
  const cb_tensor_desc* d = &m->tensors[m->outputs[index]];
  *out_data = s->arena + d->arena_offset;
  *out_nbytes = (size_t)d->nbytes;
  return CB_OK;
}

cb_status cb_session_trace(const cb_session* s, const cb_trace_event** out_events, size_t* out_count) {
  if (!s || !out_events || !out_count) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out pointers are required");
  if (!s->trace) return cb_fail(CB_ERR_INVALID_ARGUMENT, "the session was not created with trace = 1");
  *out_events = s->trace;
  *out_count = s->ntrace;
  return CB_OK;
}

cb_status cb_bundle_step_info(const cb_bundle* b, size_t step, const char** out_layer, const char** out_variant) {
  if (!b || !out_layer || !out_variant) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out pointers are required");
  if (step >= b->model.nsteps) return cb_fail(CB_ERR_INVALID_ARGUMENT, "step %zu out of range", step);
  *out_layer = b->model.steps[step].layer_name;
  *out_variant = b->model.steps[step].variant;
  return CB_OK;
}

cb_status cb_bundle_step_alternate(const cb_bundle* b, size_t step, const char** out_variant) {
  if (!b || !out_variant) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out_variant are required");
  if (step >= b->model.nsteps) return cb_fail(CB_ERR_INVALID_ARGUMENT, "step %zu out of range", step);
  *out_variant = b->model.steps[step].warm_kernel ? b->model.steps[step].warm_variant : NULL;
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
