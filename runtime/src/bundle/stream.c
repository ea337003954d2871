/* Reading a bundle's file: the streamer, the head read past the page
 * cache, and the weights' checks as they come in. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bundle/bundle.h"

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


/* The open tells the streamer where the front ends (0: unknown, the open
 * failed or the bundle is released). */
void cb_stream_publish_front(cb_bundle* b, uint64_t front) {
  atomic_store(&b->front, front);
  atomic_store(&b->front_known, 1);
  cb_futex_wake(&b->front_known, INT32_MAX);
}

static void* streamer_main(void* arg) {
  cb_bundle* b = arg;
  while (!atomic_load(&b->front_known)) cb_futex_wait(&b->front_known, 0);
  uint64_t front = atomic_load(&b->front), at0 = atomic_load(&b->advised);
  if (!atomic_load(&b->stream_stop)) cb_head_fill(b); /* published by the open (its front may be 0) */
  if (!b->head && front > at0 && front <= b->size && !atomic_load(&b->stream_stop)) {
    advise(b, at0, front); /* small pages, answered before the chunks behind it */
    stream_progress(b, front);
  }
  uint64_t last = b->stream_end ? b->stream_end : b->size; /* (a multi-target bundle's: its section's) */
  for (uint64_t at = atomic_load(&b->advised); at < last && !atomic_load(&b->stream_stop);) {
    int populating = atomic_load(&b->populating);
    /* chunks end on 2 MB boundaries of the file, the folios' */
    uint64_t end = populating ? (at / CB_STREAM_CHUNK + 1) * CB_STREAM_CHUNK : at + CB_ADVISE_CHUNK;
    if (end > last) end = last;
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
uint64_t cb_head_limit(const cb_bundle* b, uint64_t upto) {
  if (upto > b->size) upto = b->size;
  return upto < CB_FRONT_MAX ? upto : CB_FRONT_MAX;
}

/* Read file bytes [have, upto) into the head (no further than
 * head_limit); returns the end of what it holds then. */
static uint64_t read_head(cb_bundle* b, uint64_t have, uint64_t upto) {
  if (!b->head || b->head_fd < 0) return have;
  upto = cb_head_limit(b, upto);
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
void cb_head_extend(cb_bundle* b, uint64_t upto) { b->head_size = read_head(b, b->head_size, upto); }

void cb_head_close(cb_bundle* b) {
  if (b->head_fd >= 0) close(b->head_fd);
  b->head_fd = -1;
}

/* The head's first weights, [head_size, head_end): read past the page cache
 * where the read succeeds, else copied from the mapping (layers were given
 * pointers into the head); then the head is published, and its descriptor
 * closed. Run by the streamer once the open has set head_end, or by the
 * open itself where no streamer runs. */
void cb_head_fill(cb_bundle* b) {
  if (!b->head || atomic_load(&b->head_done)) return;
  /* from head_size, which is 4 KB-aligned below the file's end: the open's
   * bytes are not written again while it reads them */
  uint64_t have = read_head(b, b->head_size, b->head_end);
  if (have < b->head_end) memcpy(b->head + have, b->base + have, b->head_end - have);
  cb_head_close(b);
  atomic_store(&b->head_done, 1);
  cb_futex_wake(&b->head_done, INT32_MAX);
}

/* A reader of the head's weights waits until they are in. */
static void wait_head(cb_bundle* b) {
  while (!atomic_load(&b->head_done)) cb_futex_wait(&b->head_done, 0);
}

/* The front's first CB_STREAM_FIRST bytes read past the page cache, where
 * the file system allows it and they are not in the page cache already. */
void cb_read_front(cb_bundle* b, const char* path) {
  uint64_t first = b->size > CB_STREAM_FIRST ? CB_STREAM_FIRST : b->size;
  if (front_resident(b, first)) return;
  b->head_fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (b->head_fd < 0) return;
  b->head = cb_aligned_alloc(CB_DIRECT_ALIGN, CB_FRONT_MAX);
  cb_head_extend(b, first);
  if (!b->head_size) {
    cb_head_close(b);
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
const uint8_t* cb_front_at(const cb_bundle* b, uint64_t off, uint64_t n) {
  return head_or_mapping(b, off, n, b->head_size);
}

/* Whether `p` points into the head: memory of the bundle's, no page of the
 * mapping's to bring in (once head_done). */
int cb_in_head(const cb_bundle* b, const uint8_t* p) {
  return b->head && p >= b->head && p < b->head + b->head_end;
}

/* Weight tensor `t`'s bytes: in the head where it will hold them (the first
 * layers'), else in the mapping. */
const uint8_t* cb_weight_at(const cb_bundle* b, uint32_t t) {
  uint64_t off = (uint64_t)(cb_weight_data(b->base, &b->model, t) - b->base);
  return head_or_mapping(b, off, b->model.tensors[t].stored, b->head_end);
}

void cb_stream_start(cb_bundle* b) {
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

void cb_stream_stop(cb_bundle* b) {
  if (!b->streaming) return;
  atomic_store(&b->stream_stop, 1);
  cb_stream_publish_front(b, 0);
  pthread_join(b->streamer, NULL);
  b->streaming = 0;
}

/* Bring the mapped bytes [data, data + n) into this process's page tables,
 * waiting for those still on their way from the disk: one call, where
 * touching page by page would sleep and wake once per page. Bytes in the
 * head are in memory once the streamer has filled it. Returns 0 when it
 * could not (an older kernel, memory not mapped from the file): the
 * reader's own touches then fault the pages in. */
int cb_populate(cb_bundle* b, const uint8_t* data, uint64_t n) {
  if (cb_in_head(b, data)) {
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
void cb_read_ahead(cb_bundle* b, uint64_t upto) {
  if (!b->mapping || b->streaming) return;
  uint64_t end = upto + CB_READ_AHEAD < b->size ? upto + CB_READ_AHEAD : b->size;
  uint64_t from = atomic_load(&b->advised);
  if (from >= upto + CB_READ_AHEAD / 2 || from >= b->size) return;
  if (!atomic_compare_exchange_strong(&b->advised, &from, end)) return; /* another thread advanced it */
  advise(b, from, end);
}

/* The same for a reader of [data, data + n) (the head needs none). */
static void read_ahead_of(cb_bundle* b, const uint8_t* data, uint64_t n) {
  if (!cb_in_head(b, data)) cb_read_ahead(b, (uint64_t)(data - b->base) + n);
}

/* A weight tensor's bytes brought into memory without checking them (a
 * tensor already checked, or a bundle opened without weight checks): in
 * one call where it can, else touched once per page. Returns what the
 * touches read, for the caller to keep so they are not optimised away. */
uint64_t cb_bring_in(cb_bundle* b, const uint8_t* data, uint64_t n) {
  read_ahead_of(b, data, n);
  if (cb_populate(b, data, n)) return 0;
  const volatile uint8_t* p = data;
  uint64_t sum = 0;
  for (uint64_t off = 0; off < n; off += 4096) sum += p[off];
  return n ? sum + p[n - 1] : sum;
}

int cb_is_weight_segment(const cb_segment_desc* seg) {
  return seg->kind == CB_SEG_WEIGHTS_RAW || seg->kind == CB_SEG_WEIGHTS_CACHED;
}

int cb_is_code_segment(const cb_segment_desc* seg) {
  return seg->kind == CB_SEG_CPU_CODE || seg->kind == CB_SEG_CPU_CODE_LZ4;
}

/* An older bundle's weights: every weight segment checked whole. */
cb_status cb_check_weight_segments(const cb_bundle* b) {
  for (uint32_t i = 0; i < b->model.nsegments; i++) {
    const cb_segment_desc* seg = &b->model.segments[i];
    if (cb_is_weight_segment(seg) && cb_checksum64(b->base + seg->offset, seg->size) != seg->checksum)
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
    cb_populate(j->b, j->data + lo, hi - lo);
    sum += cb_checksum64_part(j->data + lo, hi - lo, lo / 8);
  }
  j->sums[task] = sum;
  return 0;
}

static uint64_t sum_tensor(cb_bundle* b, const uint8_t* data, uint64_t nbytes, cb_parallel_launch pool) {
  /* stripe 0 ends on a chunk boundary, rounded down to whole words (the
   * compiler aligns tensors to 64 bytes, so it only rounds a foreign
   * bundle's; an empty stripe 0 is summed as nothing) */
  uint64_t off = (uint64_t)(data - (cb_in_head(b, data) ? b->head : b->base));
  cb_check_job j = {b, data, nbytes, (CB_STREAM_CHUNK - off % CB_STREAM_CHUNK) / 8 * 8, {0}};
  /* the pool runs as many parts as it has active threads, at most
   * CB_CHECK_PARTS (one, inline, where it has one); parts it leaves out sum
   * to nothing */
  if (pool && nbytes >= CB_PARALLEL_CHECK_MIN) {
    pool(check_part, &j, CB_CHECK_PARTS); /* check_part cannot fail */
  } else {
    cb_parallel_env one = {NULL, 1};
    check_part(0, &one, &j);
  }
  uint64_t sum = 0;
  for (int k = 0; k < CB_CHECK_PARTS; k++) sum += j.sums[k];
  return sum;
}

/* Weight tensor `t` (at `data`), read ahead and checked against its own
 * checksum unless already checked; `layer` names the reader for the error.
 * `pool`: the caller is a run's executing thread, and this launches its
 * pool's parallel loops (cb_backend_parallel), which may share the work of
 * a large tensor; NULL: this thread alone. */
cb_status cb_check_tensor(cb_bundle* b, uint32_t t, const uint8_t* data, const char* layer, cb_parallel_launch pool) {
  const cb_tensor_desc* d = &b->model.tensors[t];
  read_ahead_of(b, data, d->stored);
  if (b->verified && atomic_load(&b->verified[t])) return CB_OK;
  if (sum_tensor(b, data, d->stored, pool) != d->checksum)
    return layer ? cb_fail(CB_ERR_CORRUPT, "weight tensor '%s' of layer '%s' fails its checksum (file altered or damaged)",
                           d->name, layer)
                 : cb_fail(CB_ERR_CORRUPT, "weight tensor '%s' fails its checksum (file altered or damaged)", d->name);
  if (b->verified) atomic_store(&b->verified[t], 1);
  return CB_OK;
}
