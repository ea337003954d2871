// The plan's Loops and size classes (plan.h): bounds-checked against the
// tensors and steps already parsed, pointing into the header.
#include "bundle/plan.h"

namespace fbs = coldbrew::schema;

bool cb_in_range(const flatbuffers::Vector<uint32_t>* v, uint32_t n) {
  for (uint32_t a = 0; a < v->size(); a++)
    if (v->Get(a) >= n) return false;
  return true;
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
cb_status cb_parse_loops(const fbs::Bundle* b, cb_model* m, uint32_t version) {
  auto loops = b->plan()->loops();
  if (!loops || loops->size() == 0) return CB_OK;
  if (version < 6 || m->gpu_api[0])
    return cb_fail(CB_ERR_CORRUPT, "the plan has loops, which a %s bundle cannot hold",
                   m->gpu_api[0] ? "GPU" : "version-5");
  m->nloops = loops->size();
  m->loops = static_cast<cb_loop_desc*>(cb_calloc(m->nloops, sizeof(cb_loop_desc)));
  if (!m->loops) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t k = 0; k < m->nloops; k++) {
    const fbs::Loop* l = loops->Get(k);
    cb_loop_desc* d = &m->loops[k];
    d->name = l->name() ? l->name()->c_str() : "";
    auto cf = l->carried_from(), ct = l->carried_to(), sf = l->scan_from(), st = l->scan_to();
    bool ok = l->start() < l->end() && l->end() < m->nsteps && (k == 0 || l->start() > m->loops[k - 1].end) &&
              l->iteration() < m->ntensors && l->trip() < m->ntensors && l->cond() < m->ntensors && cf && ct &&
              cf->size() == ct->size() && cf->size() >= 1 && cb_in_range(cf, m->ntensors) && cb_in_range(ct, m->ntensors) &&
              (!sf || (st && sf->size() == st->size() && cb_in_range(sf, m->ntensors) && cb_in_range(st, m->ntensors))) &&
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

// Plan.size_classes (sizes set at run time, CPU bundles): each bounds dim
// tensors an input sets (not counted ones) within their ranges; each arena
// tensor lies inside the class's arena, no larger than at the plan's
// largest, an input or output where the plan's offsets put it. That the
// tensors of one class do not overlap is the compiler's (a kernel writes
// only inside its arguments at their shapes, which these bound).
cb_status cb_parse_size_classes(const fbs::Bundle* b, cb_model* m, uint32_t version) {
  auto classes = b->plan()->size_classes();
  if (!classes || classes->size() == 0) return CB_OK;
  if (version < 5 || m->gpu_api[0]) return cb_fail(CB_ERR_CORRUPT, "the plan has size classes, which this bundle cannot hold");
  m->nsize_classes = classes->size();
  m->size_classes = static_cast<cb_size_class*>(cb_calloc(m->nsize_classes, sizeof(cb_size_class)));
  if (!m->size_classes) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t k = 0; k < m->nsize_classes; k++) {
    const fbs::SizeClass* c = classes->Get(k);
    cb_size_class* d = &m->size_classes[k];
    auto dims = c->dims();
    auto dim_max = c->dim_max();
    auto offsets = c->offsets(), nbytes = c->nbytes();
    bool ok = dims && dim_max && dims->size() == dim_max->size() && cb_in_range(dims, m->ntensors) && offsets &&
              nbytes && offsets->size() == m->ntensors && nbytes->size() == m->ntensors && c->arena_size() <= m->arena_size;
    for (uint32_t j = 0; ok && j < dims->size(); j++) {
      const cb_tensor_desc* t = &m->tensors[dims->Get(j)];
      ok = t->kind == CB_KIND_DIM && t->range.count < 0 && dim_max->Get(j) >= t->range.min && dim_max->Get(j) <= t->range.max;
    }
    for (uint32_t i = 0; ok && i < m->ntensors; i++) {
      const cb_tensor_desc* t = &m->tensors[i];
      uint64_t off = offsets->Get(i), n = nbytes->Get(i);
      if (t->kind != CB_KIND_INPUT && t->kind != CB_KIND_OUTPUT && t->kind != CB_KIND_INTERMEDIATE) continue;
      ok = n <= t->nbytes && off % 64 == 0 && off <= c->arena_size() && n <= c->arena_size() - off &&
           (t->kind == CB_KIND_INTERMEDIATE || off == t->arena_offset);
    }
    if (!ok) return cb_fail(CB_ERR_CORRUPT, "size class %u: its dims or tensors are out of place", k);
    d->ndims = dims->size(), d->dims = dims->data(), d->dim_max = dim_max->data();
    d->offsets = offsets->data(), d->nbytes = nbytes->data();
  }
  return CB_OK;
}
