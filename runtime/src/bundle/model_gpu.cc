// A GPU bundle's part of the header checks (model.cc does the rest): its
// shaders inside the one SPIR-V segment, every step's dispatches and
// first-run dispatches, and the weight transforms the runtime runs for it.
#include <string.h>

#include "bundle_generated.h"
#include "bundle/model.h"

namespace fbs = coldbrew::schema;

namespace {

// A GPU step's weight transform is one the runtime runs on the CPU
// (vulkan.c): gpu.winograd_f23, raw float32 [K][C][3][3] -> [C][16][K].
cb_status check_gpu_transform(const cb_model* m, uint32_t i) {
  const cb_step_desc* st = &m->steps[i];
  if (!st->transform) return CB_OK;
  if (strcmp(st->transform, CB_GPU_WINOGRAD_F23) != 0)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u names GPU weight transform '%s', which this runtime does not have", i,
                   st->transform);
  if (st->ntransform_args != 2) return cb_fail(CB_ERR_CORRUPT, "plan step %u: its transform takes 2 tensors", i);
  const cb_tensor_desc* raw = &m->tensors[st->transform_args[0]];
  const cb_tensor_desc* out = &m->tensors[st->transform_args[1]];
  if (raw->kind != CB_KIND_WEIGHT || raw->nrelayout || out->kind != CB_KIND_PREPARED || raw->dtype != out->dtype ||
      raw->ndim != 4 || raw->shape[2] != 3 || raw->shape[3] != 3 ||
      out->nbytes != (uint64_t)raw->shape[0] * (uint64_t)raw->shape[1] * 16u * 4u || raw->nbytes * 16 != out->nbytes * 9)
    return cb_fail(CB_ERR_CORRUPT, "plan step %u: its Winograd transform's tensors have the wrong kinds or shapes", i);
  return CB_OK;
}

// One shader of the SPIR-V segment: inside it, with a sane workgroup.
cb_status parse_shader(const fbs::Shader* sh, const cb_segment_desc* spirv, uint32_t i, cb_shader_desc* d) {
  if (!cb_in_bounds(sh->offset(), sh->size(), spirv->size) || sh->offset() % 4 || sh->size() % 4 || sh->size() < 20)
    return cb_fail(CB_ERR_CORRUPT, "shader %u lies outside the SPIR-V segment", i);
  auto ls = sh->local_size();
  if (!ls || ls->size() != 3 || sh->bindings() > 64)
    return cb_fail(CB_ERR_CORRUPT, "shader %u has an invalid workgroup size or binding count", i);
  uint64_t invocations = 1;
  for (uint32_t k = 0; k < 3; k++) {
    d->local_size[k] = ls->Get(k);
    invocations *= d->local_size[k];
  }
  if (invocations == 0 || invocations > 1024)
    return cb_fail(CB_ERR_CORRUPT, "shader %u has a workgroup of %llu invocations", i,
                   (unsigned long long)invocations);
  d->name = sh->name() ? sh->name()->c_str() : "";
  d->offset = spirv->offset + sh->offset();
  d->size = sh->size();
  d->bindings = sh->bindings();
  return CB_OK;
}

// Dispatch `j` of step `i` (`what`: "dispatch" or "first-run dispatch"): a
// shader of the bundle, a grid in Vulkan's limits, one valid tensor per
// binding, push constants that fit.
cb_status parse_dispatch(const fbs::Dispatch* d, const cb_model* m, uint32_t i, uint32_t j, const char* what,
                         cb_dispatch_desc* out) {
  if (d->shader() >= m->nshaders)
    return cb_fail(CB_ERR_CORRUPT, "step %u %s %u names shader %u of %u", i, what, j, d->shader(), m->nshaders);
  auto grid = d->grid();
  auto binds = d->bindings();
  if (!grid || grid->size() != 3 || !binds || binds->size() != m->shaders[d->shader()].bindings)
    return cb_fail(CB_ERR_CORRUPT, "step %u %s %u has an invalid grid or binding count", i, what, j);
  out->shader = d->shader();
  for (uint32_t a = 0; a < 3; a++) {
    out->grid[a] = grid->Get(a);
    if (out->grid[a] == 0 || out->grid[a] > 65535)
      return cb_fail(CB_ERR_CORRUPT, "step %u %s %u has a grid dimension of %u", i, what, j, out->grid[a]);
  }
  const cb_step_desc* st = &m->steps[i];
  for (uint32_t a = 0; a < binds->size(); a++) {
    uint32_t t = binds->Get(a);
    bool prepared_here = st->ntransform_args == 2 && st->transform_args[1] == t;
    if (t >= m->ntensors || (m->tensors[t].kind == CB_KIND_PREPARED && !prepared_here))
      return cb_fail(CB_ERR_CORRUPT, "step %u %s %u binds an invalid tensor", i, what, j);
  }
  out->nbindings = binds->size();
  out->bindings = binds->data();
  auto push = d->push();
  if (push && push->size() > CB_MAX_PUSH_WORDS)
    return cb_fail(CB_ERR_CORRUPT, "step %u %s %u has %u push-constant words (at most %d)", i, what, j,
                   push->size(), CB_MAX_PUSH_WORDS);
  out->npush = push ? push->size() : 0;
  out->push = push ? push->data() : nullptr;
  return CB_OK;
}

// Step `i`'s launches of one kind (`first`: its first-run ones) into `out`.
cb_status parse_launches(const fbs::GpuStep* g, const cb_model* m, uint32_t i, int first, cb_dispatch_desc* out) {
  auto ds = first ? g->first_run() : g->dispatches();
  for (uint32_t j = 0; ds && j < ds->size(); j++)
    if (cb_status st = parse_dispatch(ds->Get(j), m, i, j, first ? "first-run dispatch" : "dispatch", &out[j]))
      return st;
  return CB_OK;
}

}  // namespace

// GPU bundles: shaders inside the one SPIR-V segment, and every step's
// dispatches (shader index, grid, one tensor per binding of the shader),
// then its first-run dispatches, all in one array. A CPU bundle has none.
cb_status cb_parse_gpu(const fbs::Bundle* b, cb_model* m) {
  bool gpu = m->gpu_api[0] != 0;
  const cb_segment_desc* spirv = nullptr;
  for (uint32_t i = 0; i < m->nsegments; i++)
    if (m->segments[i].kind == CB_SEG_SPIRV) {
      if (spirv) return cb_fail(CB_ERR_CORRUPT, "bundle has more than one SPIR-V segment");
      spirv = &m->segments[i];
    }
  auto shaders = b->shaders();
  m->nshaders = shaders ? shaders->size() : 0;
  if (!gpu) return m->nshaders || spirv ? cb_fail(CB_ERR_CORRUPT, "a CPU bundle carries GPU shaders") : CB_OK;
  if (!spirv || !m->nshaders) return cb_fail(CB_ERR_CORRUPT, "GPU bundle has no shaders");
  m->shaders = static_cast<cb_shader_desc*>(cb_calloc(m->nshaders, sizeof(cb_shader_desc)));
  if (!m->shaders) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nshaders; i++)
    if (cb_status st = parse_shader(shaders->Get(i), spirv, i, &m->shaders[i])) return st;
  uint64_t total = 0;
  for (uint32_t i = 0; i < m->nsteps; i++) {
    if (cb_status ts = check_gpu_transform(m, i)) return ts;
    const fbs::GpuStep* g = b->plan()->steps()->Get(i)->kind_as_GpuStep();
    m->steps[i].ndispatches = g->dispatches() ? g->dispatches()->size() : 0;
    m->steps[i].nfirst_dispatches = g->first_run() ? g->first_run()->size() : 0;
    if (!m->steps[i].ndispatches) return cb_fail(CB_ERR_CORRUPT, "plan step %u of a GPU bundle has no dispatches", i);
    total += m->steps[i].ndispatches + m->steps[i].nfirst_dispatches;
  }
  if (total > UINT32_MAX) return cb_fail(CB_ERR_CORRUPT, "too many dispatches");
  m->dispatches = static_cast<cb_dispatch_desc*>(cb_calloc(total ? total : 1, sizeof(cb_dispatch_desc)));
  if (!m->dispatches) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  m->ndispatches = static_cast<uint32_t>(total);
  cb_dispatch_desc* at = m->dispatches;
  for (int first = 0; first < 2; first++) /* every step's dispatches, then every step's first-run ones */
    for (uint32_t i = 0; i < m->nsteps; i++) {
      cb_step_desc* st = &m->steps[i];
      if (first) st->first_dispatches = at;
      else st->dispatches = at;
      if (cb_status s = parse_launches(b->plan()->steps()->Get(i)->kind_as_GpuStep(), m, i, first, at)) return s;
      at += first ? st->nfirst_dispatches : st->ndispatches;
    }
  return CB_OK;
}
