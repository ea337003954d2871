// Header verification: the generated FlatBuffer verifier first, then
// hand-written, overflow-safe bounds checks of everything the runtime will
// index with. The result is a plain C description (cb_model) so the rest of
// the runtime never touches the FlatBuffer API.
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "bundle_generated.h"
#include "bundle/model.h"

namespace fbs = coldbrew::schema;
// Tensor.relayout (index.cc: with the multi-target bundles that write it).
cb_status parse_relayout(const fbs::Tensor* t, uint32_t i, cb_model* m);
// A GPU bundle's shaders and every step's dispatches (model_gpu.cc).
cb_status cb_parse_gpu(const fbs::Bundle* b, cb_model* m);

namespace {

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

template <typename T>
T* alloc_array(uint32_t n) { return static_cast<T*>(cb_calloc(n ? n : 1, sizeof(T))); }

// A plan's per-thread task shares: empty (even split), or one share of 1 to
// 255 per execution thread. They point into the header.
cb_status read_shares(const flatbuffers::Vector<uint8_t>* v, uint32_t threads, const char* what,
                      const uint8_t** out) {
  *out = nullptr;
  if (!v || v->size() == 0) return CB_OK;
  if (v->size() != threads)
    return cb_fail(CB_ERR_CORRUPT, "plan %s has %u entries for %u execution threads", what, v->size(), threads);
  for (uint32_t k = 0; k < v->size(); k++)
    if (v->Get(k) == 0) return cb_fail(CB_ERR_CORRUPT, "plan %s gives thread %u no share", what, k);
  *out = v->data();
  return CB_OK;
}

static bool same_shape(const cb_tensor_desc* a, const cb_tensor_desc* b) {
  bool same = a->ndim == b->ndim;
  for (int32_t d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  return same;
}

// An int8 widening's scale: fp32, the weights' rank, every axis 1 but at
// most one, which matches the weights'.
static bool broadcast_scale(const cb_tensor_desc* s, const cb_tensor_desc* w) {
  if (s->dtype != CB_F32 || s->kind != CB_KIND_WEIGHT || s->ndim != w->ndim) return false;
  int32_t wide = 0;
  for (int32_t d = 0; d < s->ndim; d++)
    if (s->shape[d] != 1) {
      if (s->shape[d] != w->shape[d]) return false;
      wide++;
    }
  return wide <= 1;
}

// A CPU step that names one of the runtime's own transforms (widen.c):
// cb.widen_f16 takes pairs (fp16 weights, a prepared fp32 tensor of their
// shape); cb.widen_i8 triples (int8 weights, their fp32 scale, a prepared
// fp32 tensor of their shape).
static cb_status check_widen(const cb_model* m, uint32_t i) {
  const cb_step_desc* st = &m->steps[i];
  if (!st->transform) return CB_OK;
  bool f16 = strcmp(st->transform, CB_WIDEN_F16) == 0, i8 = strcmp(st->transform, CB_WIDEN_I8) == 0;
  if (!f16 && !i8) return CB_OK;
  uint32_t group = f16 ? 2 : 3;
  if (st->ntransform_args < group || st->ntransform_args % group)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u: %s takes %s of tensors", i, st->transform, f16 ? "pairs" : "triples");
  for (uint32_t k = 0; k < st->ntransform_args; k += group) {
    const cb_tensor_desc* in = &m->tensors[st->transform_args[k]];
    const cb_tensor_desc* out = &m->tensors[st->transform_args[k + group - 1]];
    bool ok = in->kind == CB_KIND_WEIGHT && out->kind == CB_KIND_PREPARED && out->dtype == CB_F32 &&
              same_shape(in, out) && in->nbytes * (f16 ? 2 : 4) == out->nbytes &&
              in->dtype == (f16 ? CB_F16 : CB_I8) && (f16 || broadcast_scale(&m->tensors[st->transform_args[k + 1]], in));
    if (!ok)
      return cb_fail(CB_ERR_CORRUPT, "plan step %u: %s needs %s weights%s and a prepared fp32 tensor of their shape", i,
                     st->transform, f16 ? "fp16" : "int8", f16 ? "" : ", an fp32 scale that broadcasts over them");
  }
  return CB_OK;
}

// A CPU bundle's steps that name the runtime's own transforms (check_widen);
// a GPU bundle's shaders, dispatches and transforms (model_gpu.cc).
cb_status check_transforms(const fbs::Bundle* b, cb_model* m) {
  cb_status st = cb_parse_gpu(b, m);
  for (uint32_t i = 0; !st && !m->gpu_api[0] && i < m->nsteps; i++) st = check_widen(m, i);
  return st;
}

// The kernel named `symbol` in a list sorted by symbol (binary search; an
// unsorted list finds fewer, which check_call reports), or NULL.
const fbs::Kernel* find_kernel(const flatbuffers::Vector<flatbuffers::Offset<fbs::Kernel>>* ks, const char* symbol) {
  uint32_t lo = 0, hi = ks->size();
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    const fbs::Kernel* k = ks->Get(mid);
    int c = strcmp(k->symbol() ? k->symbol()->c_str() : "", symbol);
    if (c == 0) return k;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return nullptr;
}

// One CPU kernel call (a step's execute, transform or warm kernel with its
// argument tensors) against the kernel's recorded contract (Bundle.kernels):
// as many arguments as it takes, each of its dtype and byte size. Kernels of
// schema 2 do not check their arguments, so a call let through here is one
// whose kernel reads and writes inside the tensors it is given.
cb_status check_call(const fbs::Bundle* b, const cb_model* m, uint32_t i, const char* what, const char* symbol,
                     const uint32_t* args, uint32_t nargs) {
  const fbs::Kernel* k = find_kernel(b->kernels(), symbol);
  if (!k)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u calls %s kernel '%s', which the bundle's kernel list lacks", i, what,
                   symbol);
  auto dtypes = k->arg_dtypes();
  auto sizes = k->arg_nbytes();
  uint32_t takes = dtypes ? dtypes->size() : 0;
  if (nargs == 0)  // every kernel takes at least its output
    return cb_fail(CB_ERR_CORRUPT, "plan step %u calls %s kernel '%s' with no arguments", i, what, symbol);
  if (takes != nargs || (sizes ? sizes->size() : 0) != nargs)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u calls %s kernel '%s' with %u arguments; it takes %u", i, what, symbol,
                   nargs, takes);
  // the verifier aligns a vector's length (4 bytes), not its 8-byte elements
  if (reinterpret_cast<uintptr_t>(sizes->Data()) % alignof(uint64_t) != 0)
    return cb_fail(CB_ERR_CORRUPT, "kernel '%s' has a misaligned argument size list", symbol);
  for (uint32_t a = 0; a < nargs; a++) {
    const cb_tensor_desc* t = &m->tensors[args[a]];
    if (static_cast<uint8_t>(dtypes->Get(a)) != t->dtype || sizes->Get(a) != t->nbytes)
      return cb_fail(CB_ERR_CORRUPT,
                     "plan step %u passes tensor '%s' as argument %u of %s kernel '%s', which was compiled for "
                     "another dtype or size", i, t->name, a, what, symbol);
  }
  return CB_OK;
}

// Every kernel call of a CPU plan against Bundle.kernels, which every CPU bundle has.
cb_status check_calls(const fbs::Bundle* b, const cb_model* m) {
  if (m->gpu_api[0]) return CB_OK;
  if (!b->kernels()) return cb_fail(CB_ERR_CORRUPT, "CPU bundle lacks its kernel list");
  for (uint32_t i = 0; i < m->nsteps; i++) {
    const cb_step_desc* st = &m->steps[i];
    cb_status s = check_call(b, m, i, "execute", st->kernel, st->args, st->nargs);
    if (!s && st->transform && strcmp(st->transform, CB_WIDEN_F16) != 0 && strcmp(st->transform, CB_WIDEN_I8) != 0)
      s = check_call(b, m, i, "transform", st->transform, st->transform_args, st->ntransform_args);
    if (!s && st->warm_kernel) s = check_call(b, m, i, "warm", st->warm_kernel, st->warm_args, st->nwarm_args);
    if (s) return s;
  }
  return CB_OK;
}

// The header verified as a FlatBuffer of this schema with every required
// field; its root table in `out`.
cb_status verify_header(const uint8_t* header, uint64_t header_size, uint32_t version, const fbs::Bundle** out) {
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 16;
  opts.max_tables = 10000000;
  flatbuffers::Verifier verifier(header, header_size, opts);
  // the identifier sits at bytes 4..7: a shorter header has none (and is not read past its end)
  if (header_size < sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength ||
      !fbs::BundleBufferHasIdentifier(header))
    return cb_fail(CB_ERR_BAD_MAGIC, "header has no coldbrew file identifier");
  if (!fbs::VerifyBundleBuffer(verifier))
    return cb_fail(CB_ERR_CORRUPT, "bundle header failed FlatBuffer verification");
  const fbs::Bundle* b = fbs::GetBundle(header);
  if (b->schema_version() != version || version < CB_SCHEMA_MIN_VERSION || cb_is_index_version(version) || version > CB_SCHEMA_VERSION)
    return cb_fail(CB_ERR_VERSION,
                   "bundle header says schema version %u (its preamble %u), this runtime reads %u to %u",
                   b->schema_version(), version, CB_SCHEMA_MIN_VERSION, CB_SCHEMA_VERSION);
  if (!b->target() || !b->target()->triple() || !b->tensors() || !b->inputs() || !b->outputs() ||
      !b->layers() || !b->plan() || !b->plan()->steps() || !b->segments())
    return cb_fail(CB_ERR_CORRUPT, "bundle header lacks a required field");
  *out = b;
  return CB_OK;
}

// The CPU the code needs: triple, cpu and features (checked by target.c); the GPU API, if any.
cb_status parse_target(const fbs::Bundle* b, cb_model* m) {
  m->triple = b->target()->triple()->c_str();
  m->cpu = b->target()->cpu() ? b->target()->cpu()->c_str() : "";
  auto feats = b->target()->features();
  m->nfeatures = feats ? feats->size() : 0;
  m->features = alloc_array<const char*>(m->nfeatures);
  if (!m->features) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nfeatures; i++) m->features[i] = feats->Get(i)->c_str();
  m->gpu_api = b->target()->gpu_class() ? b->target()->gpu_class()->c_str() : "";
  if (m->gpu_api[0] && strcmp(m->gpu_api, "vulkan") != 0)
    return cb_fail(CB_ERR_TARGET, "bundle is for a '%s' GPU; this runtime runs Vulkan", m->gpu_api);
  return CB_OK;
}

// Segments: every byte range inside the file.
cb_status parse_segments(const fbs::Bundle* b, uint64_t file_size, cb_model* m) {
  m->nsegments = b->segments()->size();
  m->segments = alloc_array<cb_segment_desc>(m->nsegments);
  if (!m->segments) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nsegments; i++) {
    const fbs::Segment* s = b->segments()->Get(i);
    if (!cb_in_bounds(s->offset(), s->size(), file_size))
      return cb_fail(CB_ERR_CORRUPT, "segment %u [%llu, +%llu) lies outside the %llu-byte file", i,
                     (unsigned long long)s->offset(), (unsigned long long)s->size(),
                     (unsigned long long)file_size);
    if (s->offset() % 64 != 0) return cb_fail(CB_ERR_CORRUPT, "segment %u is not 64-byte aligned", i);
    // decoded code becomes one shared object in memory: far beyond any real one is damage
    const uint64_t kMaxCode = 1ull << 32;
    if (s->kind() == fbs::SegmentKind::cpu_code_lz4 && (s->raw_size() == 0 || s->raw_size() > kMaxCode))
      return cb_fail(CB_ERR_CORRUPT, "segment %u: compressed code of %llu bytes decoded", i,
                     (unsigned long long)s->raw_size());
    m->segments[i] = {static_cast<uint8_t>(s->kind()), s->offset(), s->size(), s->checksum(), s->raw_size()};
  }
  return CB_OK;
}

// Tensor `i`: its byte size recomputed with checked arithmetic, its storage
// (segment, arena or prepared area) in bounds and aligned.
cb_status parse_tensor(const fbs::Tensor* t, uint32_t i, cb_model* m) {
  cb_tensor_desc* d = &m->tensors[i];
  d->name = t->name() ? t->name()->c_str() : "";
  d->dtype = static_cast<uint8_t>(t->dtype());
  d->kind = static_cast<uint8_t>(t->kind());
  uint64_t n = cb_dtype_size(d->dtype);
  if (n == 0) return cb_fail(CB_ERR_CORRUPT, "tensor %u has an unknown dtype", i);
  static const int64_t kScalarShape[1] = {1};
  d->ndim = t->shape() ? static_cast<int32_t>(t->shape()->size()) : 0;
  d->shape = t->shape() ? t->shape()->data() : kScalarShape;
  if (d->ndim > CB_MAX_NDIM) return cb_fail(CB_ERR_CORRUPT, "tensor %u has %d dimensions", i, d->ndim);
  d->nprogram = t->shape_program() ? t->shape_program()->size() : 0;
  d->program = t->shape_program() ? t->shape_program()->data() : nullptr;
  // the verifier aligns a vector's length (4 bytes), not its 8-byte elements
  if (reinterpret_cast<uintptr_t>(d->shape) % alignof(int64_t) != 0 ||
      reinterpret_cast<uintptr_t>(d->program) % alignof(int64_t) != 0)
    return cb_fail(CB_ERR_CORRUPT, "tensor %u has a misaligned shape or shape program", i);
  if (!t->bounds() != (d->kind != CB_KIND_DIM))
    return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s'): a dim tensor has a range, no other tensor has one", i, d->name);
  if (const fbs::Range* r = t->bounds()) {  // a dim: no bytes, checked with the inputs (cb_shapes_check)
    d->range = {r->min(), r->max(), r->step(), r->typical(), r->input(), r->axis(), r->count()};
    if (d->ndim || d->dtype != CB_I64 || t->nbytes())
      return cb_fail(CB_ERR_CORRUPT, "dim tensor %u ('%s') is not an int64 of shape [] and no bytes", i, d->name);
    return CB_OK;
  }
  for (int32_t k = 0; k < d->ndim; k++) {
    if (d->shape[k] < 0 || !checked_mul(n, static_cast<uint64_t>(d->shape[k]), &n))
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') has an invalid shape", i, d->name);
  }
  if (n != t->nbytes())
    return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') size %llu does not match its shape (%llu)", i,
                   d->name, (unsigned long long)t->nbytes(), (unsigned long long)n);
  d->nbytes = d->stored = n;
  if (cb_status st = parse_relayout(t, i, m); st || (n = d->stored, false)) return st;
  d->arena_offset = t->arena_offset();
  d->segment = t->segment();
  d->segment_offset = t->segment_offset();
  d->checksum = t->checksum();
  if (d->kind == CB_KIND_WEIGHT) {
    if (d->segment >= m->nsegments || !cb_in_bounds(d->segment_offset, n, m->segments[d->segment].size))
      return cb_fail(CB_ERR_CORRUPT, "weight tensor %u ('%s') lies outside its segment", i, d->name);
    if (d->segment_offset % 64 != 0)
      return cb_fail(CB_ERR_CORRUPT, "weight tensor %u ('%s') is not 64-byte aligned", i, d->name);
  } else if (d->kind == CB_KIND_PREPARED) {
    if (!cb_in_bounds(d->arena_offset, n, m->prepared_size) || d->arena_offset % 64 != 0)
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') lies outside the prepared area", i, d->name);
  } else if (d->kind <= CB_KIND_INTERMEDIATE) {
    if (!cb_in_bounds(d->arena_offset, n, m->arena_size) || d->arena_offset % 64 != 0)
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') lies outside the arena", i, d->name);
  } else {
    return cb_fail(CB_ERR_CORRUPT, "tensor %u has an unknown kind", i);
  }
  return CB_OK;
}

// Tensors, and the arena and prepared area they live in.
cb_status parse_tensors(const fbs::Bundle* b, cb_model* m) {
  m->arena_size = b->plan()->arena_size();
  m->prepared_size = b->plan()->prepared_size();
  // sessions allocate these (rounded up): sizes near 2^64 would wrap to a tiny block
  const uint64_t kMaxArea = 1ull << 48;
  if (m->arena_size > kMaxArea || m->prepared_size > kMaxArea)
    return cb_fail(CB_ERR_CORRUPT, "plan asks for a %llu-byte arena and %llu prepared bytes",
                   (unsigned long long)m->arena_size, (unsigned long long)m->prepared_size);
  m->threads = b->plan()->threads();
  m->weight_checksums = b->weight_checksums();
  m->ntensors = b->tensors()->size();
  m->tensors = alloc_array<cb_tensor_desc>(m->ntensors);
  if (!m->tensors) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->ntensors; i++)
    if (cb_status st = parse_tensor(b->tensors()->Get(i), i, m)) return st;
  return CB_OK;
}

// Inputs and outputs: tensors of those kinds.
cb_status parse_io(const fbs::Bundle* b, cb_model* m) {
  auto check_io = [&](const flatbuffers::Vector<uint32_t>* v, uint8_t kind, const char* what) {
    for (uint32_t i = 0; i < v->size(); i++)
      if (v->Get(i) >= m->ntensors || m->tensors[v->Get(i)].kind != kind)
        return cb_fail(CB_ERR_CORRUPT, "%s %u names an invalid tensor", what, i);
    return CB_OK;
  };
  m->ninputs = b->inputs()->size();
  m->inputs = b->inputs()->data();
  m->noutputs = b->outputs()->size();
  m->outputs = b->outputs()->data();
  if (cb_status s = check_io(b->inputs(), CB_KIND_INPUT, "input")) return s;
  if (cb_status s = check_io(b->outputs(), CB_KIND_OUTPUT, "output")) return s;
  return CB_OK;
}

// Every index of `v` names one of `n` tensors.
static bool in_range(const flatbuffers::Vector<uint32_t>* v, uint32_t n) {
  for (uint32_t a = 0; a < v->size(); a++)
    if (v->Get(a) >= n) return false;
  return true;
}

// A CPU step's own fields: its execute kernel; a warm alternate's kernel and
// arguments; a branch step's guard (compiler/ir/branches.py): one bool value
// that a step or the caller writes, never a weight, and the earlier step
// writing it, if any (an If inside a branch: its condition's step may be skipped).
static cb_status parse_cpu(const fbs::CpuStep* c, uint32_t i, cb_model* m) {
  cb_step_desc* d = &m->steps[i];
  if (!c->kernel() || c->kernel()->size() == 0) return cb_fail(CB_ERR_CORRUPT, "plan step %u has no kernel", i);
  d->kernel = c->kernel()->c_str();
  if (const fbs::WarmAlternate* w = c->warm()) {
    if (!w->kernel() || w->kernel()->size() == 0 || !w->args() || w->args()->size() == 0 ||
        !in_range(w->args(), m->ntensors))
      return cb_fail(CB_ERR_CORRUPT, "plan step %u has a warm alternate without a kernel or valid arguments", i);
    d->warm_variant = w->variant() ? w->variant()->c_str() : "";
    d->warm_kernel = w->kernel()->c_str();
    d->nwarm_args = w->args()->size();
    d->warm_args = w->args()->data();
    m->nwarm++;
  }
  const fbs::Guard* g = c->guard();
  if (!g) return CB_OK;
  d->guard = g->tensor();
  d->guard_value = g->value();
  for (uint32_t j = 0; j < i; j++)
    for (uint32_t a = m->steps[j].nargs - m->steps[j].nouts; a < m->steps[j].nargs; a++)
      if (m->steps[j].args[a] == g->tensor()) d->guard_writer = j;
  const cb_tensor_desc* t = g->tensor() < m->ntensors ? &m->tensors[g->tensor()] : nullptr;
  if (!t || t->dtype != CB_BOOL || t->nbytes != 1 || t->kind == CB_KIND_WEIGHT || t->kind == CB_KIND_PREPARED)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u: its guard is not a tensor of one bool that a run computes", i);
  return CB_OK;
}

// Plan step `i`: its kind (the bundle's: CPU or GPU), its layer, its weight
// transform and every argument checked, then its kind's own fields.
cb_status parse_step(const fbs::Bundle* b, const fbs::Step* s, uint32_t i, cb_model* m) {
  bool gpu = m->gpu_api[0] != 0;
  if (!s->kind() || s->kind_type() != (gpu ? fbs::StepKind::GpuStep : fbs::StepKind::CpuStep))
    return cb_fail(CB_ERR_CORRUPT, "plan step %u is not a %s step (its kind %u of 0 none, 1 CPU, 2 GPU)", i,
                   gpu ? "GPU" : "CPU", static_cast<unsigned>(s->kind_type()));
  if (s->layer() >= b->layers()->size())
    return cb_fail(CB_ERR_CORRUPT, "plan step %u names layer %u of %u", i, s->layer(), b->layers()->size());
  const fbs::Layer* l = b->layers()->Get(s->layer());
  if (!l->args()) return cb_fail(CB_ERR_CORRUPT, "plan step %u has no arguments", i);
  if (!in_range(l->args(), m->ntensors))
    return cb_fail(CB_ERR_CORRUPT, "layer %u: an argument names tensor %u or more", s->layer(), m->ntensors);
  cb_step_desc* d = &m->steps[i];
  d->layer_name = l->name() ? l->name()->c_str() : "";
  d->variant = s->variant() ? s->variant()->c_str() : "";
  d->prep_queue = s->prep_queue();
  if (s->prep_queue() > m->prep_queues) m->prep_queues = s->prep_queue();
  d->nargs = l->args()->size();
  /* at most every argument (the kernel-call check names a wrong count) */
  d->nouts = l->num_outputs() < d->nargs ? l->num_outputs() : d->nargs;
  d->args = l->args()->data();
  d->guard = d->guard_writer = -1;
  d->loop_start = d->loop_end = -1;
  auto targs = s->transform_args();
  bool has_transform = s->transform() && s->transform()->size() > 0;
  if (has_transform != (targs && targs->size() > 0))
    return cb_fail(CB_ERR_CORRUPT, "plan step %u has a transform kernel without arguments or the reverse", i);
  if (has_transform) {
    if (!in_range(targs, m->ntensors))
      return cb_fail(CB_ERR_CORRUPT, "plan step %u: a transform argument names tensor %u or more", i, m->ntensors);
    d->transform = s->transform()->c_str();
    d->ntransform_args = targs->size();
    d->transform_args = targs->data();
  }
  return gpu ? CB_OK : parse_cpu(s->kind_as_CpuStep(), i, m); /* a GPU step's dispatches: model_gpu.cc */
}

cb_status parse_steps(const fbs::Bundle* b, cb_model* m) {
  auto steps = b->plan()->steps();
  m->nsteps = steps->size();
  m->steps = alloc_array<cb_step_desc>(m->nsteps);
  if (!m->steps) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nsteps; i++)
    if (cb_status st = parse_step(b, steps->Get(i), i, m)) return st;
  return CB_OK;
}

// Whether step `k` writes tensor `t`.
static bool writes(const cb_model* m, uint32_t k, uint32_t t) {
  const cb_step_desc* s = &m->steps[k];
  for (uint32_t a = s->nargs - s->nouts; a < s->nargs; a++)
    if (s->args[a] == t) return true;
  return false;
}

// Whether tensor `t` is one value of `dtype` that a run computes (not a weight, not sized at run time).
static bool scalar(const cb_model* m, uint32_t t, uint8_t dtype) {
  const cb_tensor_desc* d = &m->tensors[t];
  return d->dtype == dtype && d->nbytes == cb_dtype_size(dtype) && !d->nprogram &&
         (d->kind == CB_KIND_INTERMEDIATE || d->kind == CB_KIND_OUTPUT);
}

// Plan.loops (schema 6, CPU bundles): each loop's steps in order and inside
// the plan, none inside another; its state written by its start step (the
// iteration number, the trip count, the condition, the carried values the
// body reads), its scan outputs by its end step; each carried pair and each
// scan pair of one dtype and fitting (a scan output `most` rows of its value).
cb_status parse_loops(const fbs::Bundle* b, cb_model* m, uint32_t version) {
  auto loops = b->plan()->loops();
  if (!loops || loops->size() == 0) return CB_OK;
  if (version < 6 || m->gpu_api[0])
    return cb_fail(CB_ERR_CORRUPT, "the plan has loops, which a %s bundle cannot hold",
                   m->gpu_api[0] ? "GPU" : "version-5");
  m->nloops = loops->size();
  m->loops = alloc_array<cb_loop_desc>(m->nloops);
  if (!m->loops) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t k = 0; k < m->nloops; k++) {
    const fbs::Loop* l = loops->Get(k);
    cb_loop_desc* d = &m->loops[k];
    d->name = l->name() ? l->name()->c_str() : "";
    auto cf = l->carried_from(), ct = l->carried_to(), sf = l->scan_from(), st = l->scan_to();
    bool ok = l->start() < l->end() && l->end() < m->nsteps && (k == 0 || l->start() > m->loops[k - 1].end) &&
              l->iteration() < m->ntensors && l->trip() < m->ntensors && l->cond() < m->ntensors && cf && ct &&
              cf->size() == ct->size() && cf->size() >= 1 && in_range(cf, m->ntensors) && in_range(ct, m->ntensors) &&
              (!sf || (st && sf->size() == st->size() && in_range(sf, m->ntensors) && in_range(st, m->ntensors))) &&
              (sf && sf->size() ? l->most() >= 1 : l->most() >= -1);
    if (!ok) return cb_fail(CB_ERR_CORRUPT, "loop %u ('%s'): its steps or tensors are out of place", k, d->name);
    d->start = l->start(), d->end = l->end(), d->iteration = l->iteration(), d->trip = l->trip();
    d->cond = l->cond(), d->most = l->most(), d->at_least_once = l->at_least_once();
    d->ncarried = cf->size(), d->carried_from = cf->data(), d->carried_to = ct->data();
    d->nscans = sf ? sf->size() : 0, d->scan_from = sf ? sf->data() : nullptr, d->scan_to = st ? st->data() : nullptr;
    ok = scalar(m, d->iteration, CB_I64) && scalar(m, d->trip, CB_I64) && scalar(m, d->cond, CB_BOOL) &&
         writes(m, d->start, d->iteration) && writes(m, d->start, d->trip) && ct->Get(0) == d->cond;
    for (uint32_t j = 0; ok && j < d->ncarried; j++) {
      const cb_tensor_desc *f = &m->tensors[d->carried_from[j]], *t = &m->tensors[d->carried_to[j]];
      ok = f->dtype == t->dtype && f->nbytes == t->nbytes && f->nprogram == t->nprogram && writes(m, d->start, d->carried_to[j]) &&
           f->kind != CB_KIND_WEIGHT && f->kind != CB_KIND_PREPARED && f->kind != CB_KIND_DIM;
    }
    for (uint32_t j = 0; ok && j < d->nscans; j++) {
      const cb_tensor_desc *f = &m->tensors[d->scan_from[j]], *t = &m->tensors[d->scan_to[j]];
      ok = f->dtype == t->dtype && f->kind != CB_KIND_WEIGHT && f->kind != CB_KIND_PREPARED && f->kind != CB_KIND_DIM &&
           t->kind == CB_KIND_INTERMEDIATE && writes(m, d->end, d->scan_to[j]) && f->nbytes <= t->nbytes / (uint64_t)d->most &&
           (uint64_t)d->most <= t->nbytes;
    }
    if (!ok) return cb_fail(CB_ERR_CORRUPT, "loop %u ('%s'): its state or a carried or scan value does not match", k, d->name);
    m->steps[d->start].loop_start = (int32_t)k;
    m->steps[d->end].loop_end = (int32_t)k;
  }
  return CB_OK;
}

cb_status parse(const uint8_t* header, uint64_t header_size, uint64_t file_size, uint32_t version, cb_model* m) {
  const fbs::Bundle* b = nullptr;
  cb_status st = verify_header(header, header_size, version, &b);
  if (st) return st;
  if ((st = parse_target(b, m)) || (st = parse_segments(b, file_size, m)) || (st = parse_tensors(b, m)) ||
      (st = parse_io(b, m)) || (st = cb_shapes_check(m, version)) || (st = parse_steps(b, m)) || (st = cb_counts_check(m)) || (st = check_transforms(b, m)) || (st = parse_loops(b, m, version)) ||
      (st = check_calls(b, m)))
    return st;
  m->warm_threads = b->plan()->warm_threads();
  st = read_shares(b->plan()->exec_shares(), m->threads, "exec_shares", &m->exec_shares);
  if (st) return st;
  return read_shares(b->plan()->warm_exec_shares(), m->warm_threads ? m->warm_threads : m->threads,
                     "warm_exec_shares", &m->warm_exec_shares);
}

}  // namespace

extern "C" cb_status cb_model_parse(const uint8_t* header, uint64_t header_size, uint64_t file_size,
                                    uint32_t version, cb_model* out) {
  memset(out, 0, sizeof(*out));
  cb_status s = parse(header, header_size, file_size, version, out);
  if (s != CB_OK) cb_model_free(out);
  return s;
}

extern "C" void cb_model_free(cb_model* m) {
  cb_free(m->features);
  cb_free(m->segments);
  cb_free(m->tensors);
  cb_free(m->steps);
  cb_free(m->shaders);
  cb_free(m->dispatches);
  cb_free(m->loops);
  memset(m, 0, sizeof(*m));
}
