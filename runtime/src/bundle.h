/* A bundle as the runtime holds it, shared by the parts that open it
 * (open.c, code.c, open_gpu.c), read it (stream.c) and run it (session.c,
 * run.c, warmer.c). */
#ifndef COLDBREW_BUNDLE_H_
#define COLDBREW_BUNDLE_H_

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

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
cb_status cb_check_weight_segments(const cb_bundle* b);
cb_status cb_check_tensor(cb_bundle* b, uint32_t t, const uint8_t* data, const char* layer, int on_pool);

/* code.c: the CPU kernels' code loaded, and each step's kernels found */
int cb_is_code_segment(const cb_segment_desc* seg);
cb_status cb_code_load(cb_bundle* b, const cb_segment_desc* seg);
cb_status cb_kernels_resolve(cb_bundle* b);

/* open_gpu.c: a GPU bundle's open; `key` names its pipeline cache */
cb_status cb_open_gpu(cb_bundle* b, uint64_t t0, uint64_t key);

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

#endif /* COLDBREW_BUNDLE_H_ */
