// A multi-target bundle's index (schema 7): its sections verified and
// described for the open's choice (open.c pick_section).
#include "bundle_generated.h"
#include "bundle/model.h"

namespace fbs = coldbrew::schema;

extern "C" cb_status cb_index_parse(const uint8_t* header, uint64_t header_size, uint64_t file_size,
                                    cb_section_desc** out, uint32_t* n) {
  flatbuffers::Verifier verifier(header, header_size);
  if (header_size < 8 || !fbs::BundleBufferHasIdentifier(header) || !fbs::VerifyBundleBuffer(verifier))
    return cb_fail(CB_ERR_CORRUPT, "bundle index failed FlatBuffer verification");
  auto secs = fbs::GetBundle(header)->sections();
  if (fbs::GetBundle(header)->schema_version() != CB_INDEX_VERSION || !secs || secs->size() == 0)
    return cb_fail(CB_ERR_CORRUPT, "a version %u bundle without sections", CB_INDEX_VERSION);
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
        s->schema_version() == CB_INDEX_VERSION || s->schema_version() > CB_SCHEMA_VERSION) {
      cb_free(d);
      return cb_fail(CB_ERR_CORRUPT, "bundle section %u is malformed or lies outside the file", k);
    }
    d[k] = {s->name()->c_str(), t->triple()->c_str(), t->cpu() ? t->cpu()->c_str() : "",
            t->gpu_class() ? t->gpu_class()->c_str() : "", 0, names, s->header_offset(), s->header_size(),
            s->header_checksum(), s->schema_version()};
    for (uint32_t i = 0; t->features() && i < t->features()->size(); i++) names[d[k].nfeatures++] = t->features()->Get(i)->c_str();
    names += d[k].nfeatures;
  }
  *out = d;
  *n = secs->size();
  return CB_OK;
}
