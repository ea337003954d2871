/* A bundle as the runtime holds it (bundle/): opened and verified
 * (open.c), its file read in the order of need (stream.c). The layers above
 * fill their own parts of it: the CPU code and kernels (cpu/code.c), the
 * GPU (vulkan/open_gpu.c); sessions run it (exec/). Includes only base/ and
 * bundle/. */
#ifndef COLDBREW_BUNDLE_H_
#define COLDBREW_BUNDLE_H_

#include <pthread.h>
#include <stdatomic.h>

#include "bundle/model.h"

/* A kernel of the bundle's CPU code, or the runtime's own (cpu/code.c). */
typedef int (*cb_kernel_fn)(void* self, const void* args, int32_t nargs, void* result);

struct cb_bundle {
  const uint8_t* base;
  uint64_t size;
  void* mapping;     /* munmap on release, or NULL */
  void* owned_copy;  /* aligned copy of a caller buffer, or NULL */
  cb_model model;
  struct cb_elf* elf; /* the kernel shared object, loaded by cpu/elf.c, or NULL */
  void* code;        /* ... else its dlopen handle */
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
  struct cb_gpu* gpu;        /* GPU bundles: device, pipelines, weights buffer (vulkan/gpu.h) */
  const char* want;          /* a multi-target bundle: the section asked for (its name), or NULL */
  int no_gpu;                /* ... CPU sections only */
  int check_all;             /* ... every section's header checked, the first one opened (a tool's check) */
  const char* section;       /* ... the section opened (its name, in the index), or NULL */
  uint8_t* section_header;   /* ... its header where the file stores it compressed: decoded, or NULL */
  uint64_t stream_end;       /* the streamer reads [0, stream_end): the section's last byte (0: the file's) */
};

/* Reading the file (stream.c says how). */
#define CB_STREAM_FIRST (128u << 10)
#define CB_STREAM_CHUNK (2u << 20)
#define CB_ADVISE_CHUNK (1u << 20)
#define CB_READ_AHEAD (16u << 20)
#define CB_FRONT_MAX (1u << 20)   /* the most of the front read past the page cache */
#define CB_DIRECT_ALIGN 4096u     /* O_DIRECT's buffer, offset and length alignment */
#define CB_HEAD_WEIGHTS (384u << 10) /* weights read with the front */

/* stream.c: the file brought into memory in the order of need */
void cb_read_front(cb_bundle* b, const char* path);
void cb_stream_start(cb_bundle* b);
void cb_stream_stop(cb_bundle* b);
void cb_stream_publish_front(cb_bundle* b, uint64_t front);
uint64_t cb_head_limit(const cb_bundle* b, uint64_t upto);
void cb_head_extend(cb_bundle* b, uint64_t upto);
void cb_head_fill(cb_bundle* b);
void cb_head_close(cb_bundle* b);
const uint8_t* cb_front_at(const cb_bundle* b, uint64_t off, uint64_t n);
int cb_in_head(const cb_bundle* b, const uint8_t* p);
const uint8_t* cb_weight_at(const cb_bundle* b, uint32_t t);
int cb_populate(cb_bundle* b, const uint8_t* data, uint64_t n);
void cb_read_ahead(cb_bundle* b, uint64_t upto);
uint64_t cb_bring_in(cb_bundle* b, const uint8_t* data, uint64_t n);
int cb_is_weight_segment(const cb_segment_desc* seg);
int cb_is_code_segment(const cb_segment_desc* seg);
cb_status cb_check_weight_segments(const cb_bundle* b);
cb_status cb_check_tensor(cb_bundle* b, uint32_t t, const uint8_t* data, const char* layer, cb_parallel_launch pool);

/* open.c: a bundle from its file (mapped and streamed, or read whole into
 * memory of its own for a signed open) or from the caller's memory; not
 * verified yet */
cb_status cb_bundle_from_file(const char* path, const cb_open_options* options, cb_bundle** out);
cb_status cb_bundle_from_memory(const void* data, size_t size, cb_bundle** out);
/* The preamble, signature and header checked, the header parsed into
 * b->model and the front read: what every bundle's open does before the
 * target check and its executor's part (cpu/code.c, vulkan/open_gpu.c),
 * and all cb_bundle_check_memory does. A signed open adds
 * CB_OPEN_SKIP_WEIGHT_CHECKSUMS to `flags`; `key` receives the header's
 * checksum (a GPU bundle's pipeline cache is named by it); b->open_ns is
 * when the open began. */
cb_status cb_bundle_verify(cb_bundle* b, uint32_t* flags, const uint8_t* public_key, uint64_t* key);
/* Open event `k` of phase `phase`, from `start` to now. */
void cb_open_event(cb_bundle* b, int k, uint32_t phase, uint64_t start, uint32_t faults);
/* What this layer holds freed, the bundle too (the layers above free their
 * parts first: exec/load.c, cb_bundle_release). */
void cb_bundle_free(cb_bundle* b);

#endif /* COLDBREW_BUNDLE_H_ */
