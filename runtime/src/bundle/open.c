/* Opening a bundle: its file mapped (or read, or the caller's memory
 * taken), the preamble, signature and header checked; freeing it;
 * what it says of its tensors and steps. The executor's part of an open
 * (the CPU code, the GPU) is the layers' above (exec/load.c puts them
 * together). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle/bundle.h"

void cb_open_event(cb_bundle* b, int k, uint32_t phase, uint64_t start, uint32_t faults) {
  b->open_events[k] = (cb_trace_event){CB_STEP_BUNDLE, phase, sched_getcpu(), 0, start, cb_now_ns(), 0,
                                       cb_thread_faults() - faults};
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

/* The end of the segments that lie before the first weight segment: what
 * the open reads before any layer (a bundle whose code sits behind its
 * weights, an older layout, has no such front beyond the header). */
static uint64_t front_end(const cb_model* m) {
  uint64_t first_weight = UINT64_MAX, end = 0;
  for (uint32_t i = 0; i < m->nsegments; i++)
    if (cb_is_weight_segment(&m->segments[i]) && m->segments[i].offset < first_weight)
      first_weight = m->segments[i].offset;
  for (uint32_t i = 0; i < m->nsegments; i++) {
    const cb_segment_desc* seg = &m->segments[i];
    if (!cb_is_weight_segment(seg) && seg->offset < first_weight && seg->offset + seg->size > end)
      end = seg->offset + seg->size;
  }
  return end;
}

/* A section's header stored compressed (Section.header_raw_size): decoded
 * into memory of its own (*out, cb_free), which the model's descriptions
 * point into while the bundle is open. */
static cb_status decode_header(const cb_section_desc* d, const uint8_t* stored, uint8_t** out) {
  uint8_t* h = cb_aligned_alloc(64, (size_t)d->header_raw_size);
  if (!h) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory (a %llu-byte section header)",
                         (unsigned long long)d->header_raw_size);
  if (cb_lz4_decode(stored, d->header_size, h, d->header_raw_size) != (int64_t)d->header_raw_size) {
    cb_free(h);
    return cb_fail(CB_ERR_CORRUPT, "bundle section '%s': its compressed header does not decode to its %llu bytes",
                   d->name, (unsigned long long)d->header_raw_size);
  }
  *out = h;
  return CB_OK;
}

/* A multi-target bundle's index (schema 7 or 9): the section opened instead
 * (*picked, inside *secs_out: the caller frees that), the first the asker
 * allows (b->want: its name; b->no_gpu: CPU sections only) that this
 * machine runs (a GPU section: the layer above finds out); or
 * CB_ERR_TARGET naming each section and why not. */
static cb_status pick_section(cb_bundle* b, const uint8_t* index, uint64_t size, const cb_section_desc** picked,
                              cb_section_desc** secs_out) {
  cb_section_desc* secs = NULL;
  uint32_t count = 0;
  cb_status s = cb_index_parse(index, size, b->size, &secs, &count);
  if (s) return s;
  char why[1024] = "";
  int at = 0;
  for (uint32_t k = 0; b->check_all && k < count; k++) { /* every section's structure, none opened */
    cb_model m;
    const uint8_t* h = cb_front_at(b, secs[k].header_offset, secs[k].header_size);
    uint8_t* plain = NULL;
    if (cb_checksum64(h, secs[k].header_size) != secs[k].header_checksum)
      s = cb_fail(CB_ERR_CORRUPT, "bundle section '%s': header checksum mismatch", secs[k].name);
    else if (secs[k].header_raw_size && (s = decode_header(&secs[k], h, &plain)))
      ;
    else if (!(s = cb_model_parse(plain ? plain : h, plain ? secs[k].header_raw_size : secs[k].header_size, b->size,
                                  secs[k].version, &m)))
      cb_model_free(&m);
    cb_free(plain);
    if (s) return cb_free(secs), s;
  }
  for (uint32_t k = 0; k < count; k++) {
    const cb_section_desc* d = &secs[k];
    const char* no = b->want && strcmp(b->want, d->name) ? "not the one asked for"
                     : b->want || b->check_all ? NULL /* (the open's target check still refuses another CPU's) */
                     : d->gpu_class[0] && b->no_gpu ? "no GPU asked for or found" /* (a GPU's: its architecture) */
                     : cb_target_runs(d->triple, d->cpu, d->features, d->gpu_class[0] ? 0 : d->nfeatures) ? cb_last_error()
                                                                                                   : NULL;
    if (!no) {
      b->section = d->name, *picked = d, *secs_out = secs;
      return CB_OK;
    }
    if (at < (int)sizeof why) at += snprintf(why + at, sizeof why - at, "%s%s (%s)", k ? "; " : "", d->name, no);
  }
  cb_free(secs);
  return cb_fail(CB_ERR_TARGET, "no target of this bundle runs here: %s", why);
}

cb_status cb_bundle_verify(cb_bundle* b, uint32_t* flags, const uint8_t* public_key, uint64_t* key) {
  uint64_t hdr_off = 0, hdr_size = 0;
  if (!b->open_ns) b->open_ns = cb_now_ns();
  const uint8_t* pre = cb_front_at(b, 0, CB_PREAMBLE_SIZE);
  cb_status s = check_preamble(pre, b->size, &hdr_off, &hdr_size);
  if (s) return s;
  /* a required signature is checked before anything else reads the header */
  if (public_key) {
    if ((s = cb_signature_check(b->base, b->size, public_key))) return s;
    *flags |= CB_OPEN_SKIP_WEIGHT_CHECKSUMS; /* every byte is authenticated: the weights' checksums add nothing */
  }
  cb_head_extend(b, hdr_off + hdr_size);
  const uint8_t* hdr = cb_front_at(b, hdr_off, hdr_size);
  uint64_t sum = rd64(pre + 24);
  uint32_t version = rd32(pre + 8);
  if (cb_checksum64(hdr, hdr_size) != sum)
    return cb_fail(CB_ERR_CORRUPT, "bundle header checksum mismatch (file altered or damaged)");
  if (cb_is_index_version(version)) {
    const cb_section_desc* d = NULL;
    cb_section_desc* secs = NULL;
    if ((s = pick_section(b, hdr, hdr_size, &d, &secs))) return s;
    hdr_off = d->header_offset, hdr_size = d->header_size, sum = d->header_checksum, version = d->version;
    cb_head_extend(b, hdr_off + hdr_size);
    hdr = cb_front_at(b, hdr_off, hdr_size);
    if (cb_checksum64(hdr, hdr_size) != sum)
      s = cb_fail(CB_ERR_CORRUPT, "bundle section '%s': header checksum mismatch (file altered or damaged)",
                  b->section);
    else if (d->header_raw_size && !(s = decode_header(d, hdr, &b->section_header)))
      hdr = b->section_header, hdr_size = d->header_raw_size;
    cb_free(secs);
    if (s) return s;
  }
  *key = sum;
  if ((s = cb_model_parse(hdr, hdr_size, b->size, version, &b->model))) return s;
  for (uint32_t i = 0; b->section && i < b->model.nsegments; i++) /* the streamer reads no further */
    if (b->model.segments[i].offset + b->model.segments[i].size > b->stream_end)
      b->stream_end = b->model.segments[i].offset + b->model.segments[i].size;
  uint64_t front = front_end(&b->model);
  cb_head_extend(b, front); /* the rest of the front; the first layers' weights, the streamer's (fill_head) */
  if (b->head) {
    uint64_t end = cb_head_limit(b, front + CB_HEAD_WEIGHTS);
    b->head_end = end > b->head_size ? end : b->head_size;
    if (!b->streaming) cb_head_fill(b);
  }
  if (b->streaming) cb_stream_publish_front(b, front);
  /* Weights with checksums of their own are checked by the run that first
   * reads them (GPU bundles: by the open's reader), nothing waits here for
   * bytes it does not need yet; an older bundle's weight segments are
   * checked whole, by the CPU open (cpu/code.c). */
  if (b->model.weight_checksums && !(*flags & CB_OPEN_SKIP_WEIGHT_CHECKSUMS) &&
      !(b->verified = cb_calloc(b->model.ntensors ? b->model.ntensors : 1, 1)))
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  return CB_OK;
}

static cb_bundle* new_bundle(void) {
  cb_bundle* b = cb_calloc(1, sizeof *b);
  if (b) b->head_fd = -1;
  return b;
}

/* A signed open reads the file into memory of its own: what was verified is
 * what runs, even if the file changes afterwards (a mapping would see it). */
static cb_status open_file_copy(int fd, uint64_t size, const char* path, cb_bundle** out) {
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
  *out = b;
  return CB_OK;
}

cb_status cb_bundle_from_file(const char* path, const cb_open_options* options, cb_bundle** out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cb_fail(CB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return cb_fail(CB_ERR_BAD_MAGIC, "'%s' is empty or unreadable, not a coldbrew bundle", path);
  }
  if (options && options->public_key) return open_file_copy(fd, (uint64_t)st.st_size, path, out);
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
  cb_read_front(b, path);
  cb_stream_start(b);
  *out = b;
  return CB_OK;
}

cb_status cb_bundle_from_memory(const void* data, size_t size, cb_bundle** out) {
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
  *out = b;
  return CB_OK;
}

void cb_bundle_free(cb_bundle* b) {
  if (!b) return;
  cb_stream_stop(b);
  cb_free(b->open_events);
  cb_free((void*)b->verified);
  cb_model_free(&b->model);
  if (b->mapping) munmap(b->mapping, (size_t)b->size);
  cb_head_close(b);
  cb_free(b->head);
  cb_free(b->owned_copy);
  cb_free(b->section_header);
  cb_free(b);
}

cb_status cb_bundle_verify_weights(cb_bundle* b) {
  if (!b) return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle is required");
  const cb_model* m = &b->model;
  if (!m->weight_checksums) return cb_check_weight_segments(b);
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    if (d->kind != CB_KIND_WEIGHT) continue;
    cb_status s = cb_check_tensor(b, i, cb_weight_data(b->base, m, i), NULL, NULL);
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

static cb_status axis_range(const cb_bundle* b, const uint32_t* ids, uint32_t count, const char* what, size_t i,
                            int32_t axis, int64_t* out_min, int64_t* out_max, int64_t* out_step) {
  if (!b || !out_min || !out_max || !out_step)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "bundle and out pointers are required");
  if (i >= count) return cb_fail(CB_ERR_INVALID_ARGUMENT, "%s index %zu out of range (%u %ss)", what, i, count, what);
  uint32_t t = ids[i];
  if (axis < 0 || axis >= b->model.tensors[t].ndim)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "%s '%s' has no axis %d", what, b->model.tensors[t].name, axis);
  cb_axis_range(&b->model, t, (uint32_t)axis, out_min, out_max, out_step);
  return CB_OK;
}

cb_status cb_bundle_input_range(const cb_bundle* b, size_t i, int32_t axis, int64_t* out_min, int64_t* out_max,
                                int64_t* out_step) {
  return axis_range(b, b ? b->model.inputs : NULL, b ? b->model.ninputs : 0, "input", i, axis, out_min, out_max,
                    out_step);
}

cb_status cb_bundle_output_range(const cb_bundle* b, size_t i, int32_t axis, int64_t* out_min, int64_t* out_max,
                                 int64_t* out_step) {
  return axis_range(b, b ? b->model.outputs : NULL, b ? b->model.noutputs : 0, "output", i, axis, out_min, out_max,
                    out_step);
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
