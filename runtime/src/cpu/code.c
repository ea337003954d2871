/* A CPU bundle's open, past bundle/'s checks: the code's segments checked,
 * the code decoded into memory and loaded (elf.c), and each plan step's kernels
 * found in it (or the runtime's own); unloaded at release. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/cpu.h"

/* The compressed code decoded straight into the memfd's pages. */
static cb_status decode_code(int fd, const cb_bundle* b, const cb_segment_desc* seg) {
  if (ftruncate(fd, (off_t)seg->raw_size) != 0)
    return cb_fail(CB_ERR_LOAD, "sizing the kernel code failed: %s", strerror(errno));
  void* dst = mmap(NULL, (size_t)seg->raw_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (dst == MAP_FAILED) return cb_fail(CB_ERR_LOAD, "mapping the kernel code failed: %s", strerror(errno));
  int64_t n = cb_lz4_decode(cb_front_at(b, seg->offset, seg->size), seg->size, dst, seg->raw_size);
  munmap(dst, (size_t)seg->raw_size);
  if (n != (int64_t)seg->raw_size)
    return cb_fail(CB_ERR_CORRUPT, "the compressed CPU code does not decode to its %llu bytes (damaged)",
                   (unsigned long long)seg->raw_size);
  return CB_OK;
}

/* The address of the loaded code's symbol `name`, or NULL. */
static void* code_symbol(const cb_bundle* b, const char* name) {
  return b->elf ? cb_elf_symbol(b->elf, name) : b->code ? dlsym(b->code, name) : NULL;
}

/* The code made callable: by coldbrew's own loader (elf.c), else, for an
 * object it does not take or where COLDBREW_CODE_LOADER=system, by the
 * system's (the object written to a memfd and dlopen'ed). */
static cb_status code_load(cb_bundle* b, const cb_segment_desc* seg) {
  const char* how = getenv("COLDBREW_CODE_LOADER");
  int lz4 = seg->kind == CB_SEG_CPU_CODE_LZ4;
  cb_status s = how && strcmp(how, "system") == 0 ? CB_OK
                : cb_elf_load(cb_front_at(b, seg->offset, seg->size), seg->size, lz4 ? seg->raw_size : seg->size, lz4,
                              &b->elf);
  if (s || b->elf) {
    if (b->elf) cb_backend_install(code_symbol, b);
    return s;
  }
  int fd = memfd_create("coldbrew-kernels", MFD_CLOEXEC);
  if (fd < 0) return cb_fail(CB_ERR_LOAD, "memfd_create failed: %s", strerror(errno));
  const uint8_t* p = cb_front_at(b, seg->offset, seg->size);
  uint64_t left = seg->kind == CB_SEG_CPU_CODE ? seg->size : 0;
  s = lz4 ? decode_code(fd, b, seg) : CB_OK;
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
  cb_backend_install(code_symbol, b);
  return CB_OK;
}

static int widen_f16_kernel(void* self, const void* args, int32_t nargs, void* result);
static int widen_i8_kernel(void* self, const void* args, int32_t nargs, void* result);

#define CB_SYMBOL_MAX 512 /* the compiler keeps kernel symbols far shorter (extract_layers.MAX_SYMBOL) */

/* The kernel `name` of a layer (`what`: "kernel", "transform kernel", ...):
 * CB_OK with *out set, or a LOAD error that says why it is not there. */
static cb_status find_kernel(const cb_bundle* b, const cb_step_desc* st, const char* what, const char* variant,
                             const char* name, cb_kernel_fn* out) {
  if (strcmp(name, CB_WIDEN_F16) == 0) { /* shapes checked at open (model.cc) */
    *out = widen_f16_kernel;
    return CB_OK;
  }
  if (strcmp(name, CB_WIDEN_I8) == 0) {
    *out = widen_i8_kernel;
    return CB_OK;
  }
  char sym[CB_SYMBOL_MAX];
  if ((size_t)snprintf(sym, sizeof sym, "__tvm_ffi_%s", name) >= sizeof sym)
    return cb_fail(CB_ERR_LOAD, "layer '%s' (variant '%s'): %s name is longer than %d characters", st->layer_name,
                   variant, what, CB_SYMBOL_MAX - 11);
  *out = (cb_kernel_fn)code_symbol(b, sym);
  if (!*out)
    return cb_fail(CB_ERR_LOAD, "layer '%s' (variant '%s'): %s '%s' is missing from the bundle", st->layer_name,
                   variant, what, name);
  return CB_OK;
}

static cb_status kernels_resolve(cb_bundle* b) {
  const cb_model* m = &b->model;
  b->kernels = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->kernels);
  b->transforms = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->transforms);
  b->alternates = cb_calloc(m->nsteps ? m->nsteps : 1, sizeof *b->alternates);
  if (!b->kernels || !b->transforms || !b->alternates) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nsteps; i++) {
    const cb_step_desc* st = &m->steps[i];
    cb_status s = find_kernel(b, st, "kernel", st->variant, st->kernel, &b->kernels[i]);
    if (s == CB_OK && st->transform)
      s = find_kernel(b, st, "transform kernel", st->variant, st->transform, &b->transforms[i]);
    if (s == CB_OK && st->warm_kernel)
      s = find_kernel(b, st, "warm kernel", st->warm_variant, st->warm_kernel, &b->alternates[i]);
    if (s != CB_OK) return s;
  }
  return CB_OK;
}

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

/* ... and triples of (int8 weights, their fp32 scale: the weights' rank,
 * every axis 1 but at most one, checked at open; the fp32 prepared tensor). */
static int widen_i8_kernel(void* self, const void* args, int32_t nargs, void* result) {
  (void)self, (void)result;
  const cb_ffi_any* a = args;
  if (nargs < 3 || nargs % 3) return -1;
  for (int32_t k = 0; k < nargs; k += 3) {
    const cb_dltensor* in = a[k].v_ptr;
    const cb_dltensor* scale = a[k + 1].v_ptr;
    uint64_t outer = 1, n = 1, inner = 1;
    int32_t axis = -1;
    for (int32_t d = 0; d < in->ndim; d++)
      if (scale->shape[d] != 1) axis = d;
    for (int32_t d = 0; d < in->ndim; d++) {
      uint64_t e = (uint64_t)in->shape[d];
      if (axis < 0 || d > axis) inner *= e;
      else if (d == axis) n = e;
      else outer *= e;
    }
    const cb_dltensor* out = a[k + 2].v_ptr;
    cb_widen_i8(in->data, scale->data, out->data, outer, n, inner);
  }
  return 0;
}

cb_status cb_open_cpu(cb_bundle* b, uint64_t t0, uint32_t flags) {
  cb_status s;
  uint32_t f0 = cb_thread_faults();
  b->open_cap = 3;
  if (!(b->open_events = cb_calloc(3, sizeof *b->open_events))) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  /* the execution pool's threads start now and come up while the code is
   * checked and loaded: as many as the plan's first run uses (a session
   * with other thread counts resizes the pool; a failure here is retried,
   * and reported, by the session) */
  uint64_t tt = cb_now_ns();
  (void)cb_backend_set_threads((int)(b->model.threads ? b->model.threads : 1));
  cb_open_event(b, 2, CB_PHASE_THREAD_START, tt, f0);
  const cb_segment_desc* code = NULL;
  for (uint32_t i = 0; i < b->model.nsegments; i++)
    if (cb_is_code_segment(&b->model.segments[i])) {
      if (code) return cb_fail(CB_ERR_CORRUPT, "bundle has more than one CPU code segment");
      code = &b->model.segments[i];
    }
  if (code) cb_read_ahead(b, code->offset + code->size); /* the code, and the first weights behind it */
  for (uint32_t i = 0; i < b->model.nsegments; i++) {
    const cb_segment_desc* seg = &b->model.segments[i];
    if (cb_is_weight_segment(seg)) continue;
    const uint8_t* data = cb_front_at(b, seg->offset, seg->size);
    if (data == b->base + seg->offset) cb_populate(b, data, seg->size); /* beside the streamer, not across it */
    if (cb_checksum64(data, seg->size) != seg->checksum)
      return cb_fail(CB_ERR_CORRUPT, "segment %u checksum mismatch (file altered or damaged)", i);
  }
  if (!b->model.weight_checksums && !(flags & CB_OPEN_SKIP_WEIGHT_CHECKSUMS) && (s = cb_check_weight_segments(b)))
    return s;
  cb_open_event(b, 0, CB_PHASE_VERIFY, t0, f0);
  uint64_t t1 = cb_now_ns();
  uint32_t f1 = cb_thread_faults();
  if (code && (s = code_load(b, code))) return s;
  s = kernels_resolve(b);
  cb_open_event(b, 1, CB_PHASE_CODE_LOAD, t1, f1);
  return s;
}

void cb_code_unload(cb_bundle* b) {
  cb_elf_free(b->elf);
  if (b->code) dlclose(b->code);
  if (b->code_fd > 0) close(b->code_fd);
  cb_free(b->kernels);
  cb_free(b->transforms);
  cb_free(b->alternates);
}
