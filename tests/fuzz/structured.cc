// Structure-aware mutation of coldbrew bundles for libFuzzer (linked into
// the *_structured fuzz targets by tests/fuzz/fuzz.py).
//
// A random byte flip almost never survives the header checksum, so the
// plain targets mostly exercise the door. Here a mutation picks one field of
// the FlatBuffer header (a scalar, a vector's element or length, a table or
// vector offset, a string's bytes) or a range of weight bytes, changes it,
// and then recomputes every checksum (weights, segments, header) and the
// declared file size, so the deeper checks, the session and the run see it.
//
// The CPU code segment is never mutated, and no mutation points a segment
// at other bytes as code: a bundle's code runs as native code, which is
// trusted only through its checksum (accident) and signature (intent), not
// through parsing.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <random>
#include <vector>

#include "bundle_generated.h"
#include "bundle/model.h"

namespace fbs = coldbrew::schema;

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

struct Slot {
  uint8_t* p;
  int width;  // bytes: 1, 4 or 8
};

struct Walk {
  std::vector<Slot> slots;
  std::vector<std::pair<uint8_t*, size_t>> strings;  // string bytes (not their terminator)

  // Generated tables inherit flatbuffers::Table privately; a table is one at its own address.
  template <typename Tab>
  static const flatbuffers::Table* table(const Tab* t) { return reinterpret_cast<const flatbuffers::Table*>(t); }
  template <typename Tab>
  void field(const Tab* t, flatbuffers::voffset_t vt, int width) {
    if (const uint8_t* p = t ? table(t)->GetAddressOf(vt) : nullptr) slots.push_back({const_cast<uint8_t*>(p), width});
  }
  // A vector field: its offset, its length and each element.
  template <typename Tab, typename T>
  void vec(const Tab* t, flatbuffers::voffset_t vt, const flatbuffers::Vector<T>* v) {
    field(t, vt, 4);
    if (!v) return;
    slots.push_back({const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(v)), 4});
    if (sizeof(T) <= 8)
      for (uint32_t i = 0; i < v->size(); i++)
        slots.push_back({const_cast<uint8_t*>(v->Data() + i * sizeof(T)), static_cast<int>(sizeof(T))});
  }
  template <typename Tab>
  void str(const Tab* t, flatbuffers::voffset_t vt, const flatbuffers::String* s) {
    field(t, vt, 4);
    if (s && s->size()) strings.push_back({const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(s->data())), s->size()});
  }
  template <typename Tab, typename T>
  void tables(const Tab* t, flatbuffers::voffset_t vt, const flatbuffers::Vector<flatbuffers::Offset<T>>* v) {
    field(t, vt, 4);
    if (v) slots.push_back({const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(v)), 4});
  }
};

const fbs::Bundle* header(uint8_t* data, size_t size, uint64_t* hdr_off, uint64_t* hdr_size) {
  if (size < CB_PREAMBLE_SIZE || memcmp(data, CB_MAGIC, 8) != 0) return nullptr;
  uint32_t off;
  uint64_t n;
  memcpy(&off, data + 12, 4);
  memcpy(&n, data + 16, 8);
  // the runtime refuses a header that is not 8-byte aligned; the verifier reads it in place
  if (off < CB_PREAMBLE_SIZE || off % 8 || off > size || n > size - off) return nullptr;
  flatbuffers::Verifier v(data + off, n);
  if (!fbs::VerifyBundleBuffer(v)) return nullptr;
  *hdr_off = off, *hdr_size = n;
  return fbs::GetBundle(data + off);
}

bool is_code(const fbs::Segment* s) {
  return s->kind() == fbs::SegmentKind::cpu_code || s->kind() == fbs::SegmentKind::cpu_code_lz4;
}

// Every mutable place of the header, except the code segment's entry.
Walk walk(const fbs::Bundle* b) {
  Walk w;
  using B = fbs::Bundle;
  w.field(b, B::VT_SCHEMA_VERSION, 4);
  w.field(b, B::VT_WEIGHT_CHECKSUMS, 1);
  if (auto t = b->target()) {
    w.str(t, fbs::Target::VT_TRIPLE, t->triple());
    w.field(t, fbs::Target::VT_FEATURES, 4);
    if (auto f = t->features())
      for (auto s : *f)
        if (s->size()) w.strings.push_back({const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(s->data())), s->size()});
  }
  if (auto ts = b->tensors()) {
    w.tables(b, B::VT_TENSORS, ts);
    for (auto t : *ts) {
      using T = fbs::Tensor;
      w.field(t, T::VT_DTYPE, 1), w.field(t, T::VT_KIND, 1), w.field(t, T::VT_NBYTES, 8);
      w.field(t, T::VT_ARENA_OFFSET, 8), w.field(t, T::VT_SEGMENT, 4), w.field(t, T::VT_SEGMENT_OFFSET, 8);
      w.vec(t, T::VT_SHAPE, t->shape());
      w.str(t, T::VT_NAME, t->name());
    }
  }
  w.vec(b, B::VT_INPUTS, b->inputs());
  w.vec(b, B::VT_OUTPUTS, b->outputs());
  if (auto ls = b->layers()) {
    w.tables(b, B::VT_LAYERS, ls);
    for (auto l : *ls) w.vec(l, fbs::Layer::VT_ARGS, l->args()), w.field(l, fbs::Layer::VT_NUM_OUTPUTS, 4);
  }
  if (auto p = b->plan()) {
    using P = fbs::Plan;
    w.field(b, B::VT_PLAN, 4);
    w.field(p, P::VT_ARENA_SIZE, 8), w.field(p, P::VT_THREADS, 4), w.field(p, P::VT_PREPARED_SIZE, 8);
    w.field(p, P::VT_WARM_THREADS, 4);
    w.vec(p, P::VT_EXEC_SHARES, p->exec_shares()), w.vec(p, P::VT_WARM_EXEC_SHARES, p->warm_exec_shares());
    if (auto ss = p->steps()) {
      w.tables(p, P::VT_STEPS, ss);
      for (auto s : *ss) {
        using S = fbs::Step;
        w.field(s, S::VT_LAYER, 4), w.field(s, S::VT_WEIGHT_FORM, 1), w.field(s, S::VT_PREP_QUEUE, 1);
        w.field(s, S::VT_EXEC_QUEUE, 1), w.field(s, S::VT_KIND_TYPE, 1), w.field(s, S::VT_KIND, 4);
        w.vec(s, S::VT_TRANSFORM_ARGS, s->transform_args()), w.str(s, S::VT_TRANSFORM, s->transform());
        if (auto c = s->kind_as_CpuStep()) {
          w.str(c, fbs::CpuStep::VT_KERNEL, c->kernel());
          w.field(c, fbs::CpuStep::VT_GUARD, 4), w.field(c, fbs::CpuStep::VT_WARM, 4);
          if (auto g = c->guard()) w.field(g, fbs::Guard::VT_TENSOR, 4), w.field(g, fbs::Guard::VT_VALUE, 1);
          if (auto a = c->warm())
            w.vec(a, fbs::WarmAlternate::VT_ARGS, a->args()), w.str(a, fbs::WarmAlternate::VT_KERNEL, a->kernel());
        }
        auto g = s->kind_as_GpuStep();
        if (auto ds = g ? g->dispatches() : nullptr)
          for (auto d : *ds) {
            w.field(d, fbs::Dispatch::VT_SHADER, 4);
            w.vec(d, fbs::Dispatch::VT_GRID, d->grid()), w.vec(d, fbs::Dispatch::VT_BINDINGS, d->bindings());
            w.vec(d, fbs::Dispatch::VT_PUSH, d->push());
          }
      }
    }
  }
  if (auto ks = b->kernels()) {
    w.tables(b, B::VT_KERNELS, ks);
    for (auto k : *ks) {
      w.str(k, fbs::Kernel::VT_SYMBOL, k->symbol());
      w.vec(k, fbs::Kernel::VT_ARG_DTYPES, k->arg_dtypes()), w.vec(k, fbs::Kernel::VT_ARG_NBYTES, k->arg_nbytes());
    }
  }
  if (auto ss = b->segments()) {
    for (auto s : *ss) {
      if (is_code(s)) continue;
      using G = fbs::Segment;
      w.field(s, G::VT_OFFSET, 8), w.field(s, G::VT_SIZE, 8);
    }
  }
  if (auto sh = b->shaders())
    for (auto s : *sh) {
      w.field(s, fbs::Shader::VT_OFFSET, 8), w.field(s, fbs::Shader::VT_SIZE, 8);
      w.vec(s, fbs::Shader::VT_LOCAL_SIZE, s->local_size()), w.field(s, fbs::Shader::VT_BINDINGS, 4);
    }
  return w;
}

uint64_t load(const Slot& s) {
  uint64_t v = 0;
  memcpy(&v, s.p, s.width);
  return v;
}

void store(const Slot& s, uint64_t v) { memcpy(s.p, &v, s.width); }

void mutate_slot(std::mt19937_64& rng, const Walk& w) {
  const Slot& s = w.slots[rng() % w.slots.size()];
  uint64_t v = load(s), mask = s.width == 8 ? ~0ull : (1ull << (8 * s.width)) - 1;
  switch (rng() % 9) {
    case 0: v = 0; break;
    case 1: v = 1; break;
    case 2: v = mask; break;                       // -1
    case 3: v += 1 + rng() % 4; break;
    case 4: v -= 1 + rng() % 4; break;
    case 5: v ^= 1ull << (rng() % (8 * s.width)); break;
    case 6: v = load(w.slots[rng() % w.slots.size()]); break;  // another field's value
    case 7: v = mask >> 1 | (rng() & 1 ? 1ull : 0); break;     // near the type's limits
    default: v = v * 2 + (rng() & 64); break;
  }
  store(s, v & mask);
}

void mutate_string(std::mt19937_64& rng, const Walk& w) {
  auto& s = w.strings[rng() % w.strings.size()];
  s.first[rng() % s.second] = static_cast<uint8_t>(rng() & 1 ? 'a' + rng() % 26 : rng());
}

// Bytes of one weight or SPIR-V segment (never the code), via libFuzzer's own mutator.
void mutate_segment_bytes(std::mt19937_64& rng, uint8_t* data, size_t size) {
  uint64_t off, n;
  const fbs::Bundle* b = header(data, size, &off, &n);  // again: an earlier round may have changed it
  if (!b || !b->segments()) return;
  std::vector<const fbs::Segment*> segs;
  for (auto s : *b->segments())
    if (!is_code(s) && s->size() && s->offset() <= size && s->size() <= size - s->offset()) segs.push_back(s);
  if (segs.empty()) return;
  auto s = segs[rng() % segs.size()];
  size_t len = s->size() < 64 ? s->size() : 64, at = s->offset() + rng() % (s->size() - len + 1);
  LLVMFuzzerMutate(data + at, len, len);
}

// The weights', segments' and header's checksums and the declared size,
// made right again for whatever the (mutated) header now says.
void fix_checksums(uint8_t* data, size_t size) {
  uint64_t off = 0, n = 0;
  const fbs::Bundle* b = header(data, size, &off, &n);
  if (b && b->segments() && b->tensors()) {
    auto segs = b->segments();
    for (auto t : *b->tensors()) {
      const uint8_t* slot = Walk::table(t)->GetAddressOf(fbs::Tensor::VT_CHECKSUM);
      if (!slot || t->kind() != fbs::TensorKind::weight || t->segment() >= segs->size()) continue;
      auto s = segs->Get(t->segment());
      if (s->offset() > size || s->size() > size - s->offset() || t->segment_offset() > s->size() ||
          t->nbytes() > s->size() - t->segment_offset())
        continue;
      uint64_t c = cb_checksum64(data + s->offset() + t->segment_offset(), t->nbytes());
      memcpy(const_cast<uint8_t*>(slot), &c, 8);
    }
    for (auto s : *segs) {
      const uint8_t* slot = Walk::table(s)->GetAddressOf(fbs::Segment::VT_CHECKSUM);
      if (!slot || s->offset() > size || s->size() > size - s->offset()) continue;
      uint64_t c = cb_checksum64(data + s->offset(), s->size());
      memcpy(const_cast<uint8_t*>(slot), &c, 8);
    }
  }
  uint32_t hoff;
  uint64_t hsize, declared = size;
  memcpy(&hoff, data + 12, 4);
  memcpy(&hsize, data + 16, 8);
  if (hoff <= size && hsize <= size - hoff) {
    uint64_t c = cb_checksum64(data + hoff, hsize);
    memcpy(data + 24, &c, 8);
  }
  memcpy(data + 32, &declared, 8);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  uint64_t off = 0, n = 0;
  const fbs::Bundle* b = header(data, size, &off, &n);
  if (!b) {  // not a whole bundle (a mutation of the door itself): bytes, checksums fixed half the time
    size = LLVMFuzzerMutate(data, size, max_size);
    if (size >= CB_PREAMBLE_SIZE && rng() % 2) fix_checksums(data, size);
    return size;
  }
  Walk w = walk(b);
  unsigned rounds = 1 + rng() % 3;
  for (unsigned r = 0; r < rounds; r++) {
    unsigned pick = rng() % 100;
    if (pick < 70 && !w.slots.empty()) {
      mutate_slot(rng, w);
    } else if (pick < 80 && !w.strings.empty()) {
      mutate_string(rng, w);
    } else if (pick < 90) {
      mutate_segment_bytes(rng, data, size);
    } else {  // any header byte
      LLVMFuzzerMutate(data + off, n, n);
    }
  }
  if (rng() % 20) fix_checksums(data, size);  // now and then the checksums stay wrong, for the door
  return size;
}
