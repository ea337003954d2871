// A multi-target bundle's index (schema 7): its sections verified and
// described for the open's choice (open.c pick_section).
#include "bundle_generated.h"
#include "bundle/model.h"

#include <algorithm>
#include <functional>

namespace fbs = coldbrew::schema;

extern "C" cb_status cb_index_parse(const uint8_t* header, uint64_t header_size, uint64_t file_size,
                                    cb_section_desc** out, uint32_t* n) {
  flatbuffers::Verifier verifier(header, header_size);
  if (header_size < 8 || !fbs::BundleBufferHasIdentifier(header) || !fbs::VerifyBundleBuffer(verifier))
    return cb_fail(CB_ERR_CORRUPT, "bundle index failed FlatBuffer verification");
  auto secs = fbs::GetBundle(header)->sections();
  uint32_t version = fbs::GetBundle(header)->schema_version();
  if (!cb_is_index_version(version) || !secs || secs->size() == 0)
    return cb_fail(CB_ERR_CORRUPT, "a version %u bundle without sections", version);
  uint32_t feats = 0;
  for (auto s : *secs) feats += s->target() && s->target()->features() ? s->target()->features()->size() : 0;
  cb_section_desc* d = static_cast<cb_section_desc*>(
      cb_calloc(1, secs->size() * sizeof(cb_section_desc) + (size_t)feats * sizeof(const char*)));
  if (!d) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  const char** names = reinterpret_cast<const char**>(d + secs->size());
  for (uint32_t k = 0; k < secs->size(); k++) {
    auto s = secs->Get(k);
    auto t = s->target();
    if (!s->name() || !t || !t->triple() || s->header_offset() > file_size || s->header_size() > file_size - s->header_offset() ||
        s->header_offset() % 8 || s->schema_version() < CB_SCHEMA_MIN_VERSION ||
        cb_is_index_version(s->schema_version()) || s->schema_version() > CB_SCHEMA_VERSION ||
        (s->header_raw_size() && (version == CB_INDEX_VERSION_PLAIN || s->header_raw_size() > CB_HEADER_MAX ||
                                  s->header_raw_size() > 255 * s->header_size() + 16))) {
      cb_free(d);
      return cb_fail(CB_ERR_CORRUPT, "bundle section %u is malformed or lies outside the file", k);
    }
    d[k] = {s->name()->c_str(), t->triple()->c_str(), t->cpu() ? t->cpu()->c_str() : "",
            t->gpu_class() ? t->gpu_class()->c_str() : "", 0, names, s->header_offset(), s->header_size(),
            s->header_checksum(), s->header_raw_size(), s->schema_version()};
    for (uint32_t i = 0; t->features() && i < t->features()->size(); i++) names[d[k].nfeatures++] = t->features()->Get(i)->c_str();
    names += d[k].nfeatures;
  }
  *out = d;
  *n = secs->size();
  return CB_OK;
}

// A weight of a GPU section stored relaid out (a CPU section's bytes) (Tensor.relayout, where its
// stored shape is not its own): the description checked so that laying it
// out back (vulkan_weights.c) stays inside both forms; `stored` its bytes.
// `raw` may be larger than the tensor on any axis (a CPU form padded where
// its kernels block channels): the tensor is its part from the origin.
cb_status parse_relayout(const fbs::Tensor* t, uint32_t i, cb_model* m) {
  cb_tensor_desc* d = &m->tensors[i];
  const fbs::Relayout* r = t->relayout();
  auto same = [](const flatbuffers::Vector<int64_t>* v, const int64_t* s, int32_t n) {
    return v && v->size() == static_cast<uint32_t>(n) && std::equal(v->begin(), v->end(), s);
  };
  if (!r || !r->stored() || same(r->stored(), d->shape, d->ndim)) return CB_OK;  // none, or it only says how
  uint32_t n = r->stored()->size();
  auto covers = [](const flatbuffers::Vector<int64_t>* v, const int64_t* s, int32_t n) {
    return v && v->size() == static_cast<uint32_t>(n) && std::equal(s, s + n, v->begin(), std::less_equal<int64_t>());
  };
  if (!m->gpu_api[0] || d->kind != CB_KIND_WEIGHT || d->dtype != CB_F32 || !covers(r->raw(), d->shape, d->ndim) ||
      n > CB_MAX_NDIM || !r->axes() || !r->mults() || r->axes()->size() != n || r->mults()->size() != n)
    return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s'): a weight stored relaid out is a GPU bundle's float32 weight "
                   "inside its raw shape, with one axis and step per stored axis", i, d->name);
  uint64_t bytes = 4, walk;
  for (uint32_t j = 0; j < n; j++) {
    int64_t size = r->stored()->Get(j), axis = r->axes()->Get(j), mult = r->mults()->Get(j);
    if (size < 0 || axis < 0 || axis >= d->ndim || mult < 0 || __builtin_mul_overflow(bytes, size, &bytes) ||
        __builtin_mul_overflow(static_cast<uint64_t>(mult), static_cast<uint64_t>(size), &walk) || walk > (1ull << 48))
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') has an invalid relayout", i, d->name);
  }
  d->stored = bytes, d->nrelayout = n;
  d->relayout_shape = r->stored()->data(), d->relayout_axes = r->axes()->data(), d->relayout_mults = r->mults()->data();
  if (reinterpret_cast<uintptr_t>(d->relayout_shape) % 8 || reinterpret_cast<uintptr_t>(d->relayout_axes) % 8 ||
      reinterpret_cast<uintptr_t>(d->relayout_mults) % 8)
    return cb_fail(CB_ERR_CORRUPT, "tensor %u has a misaligned relayout", i);
  return CB_OK;
}

