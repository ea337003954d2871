/* Shapes set at run time (schema 5): a session's dims (each dim tensor's
 * value / step), every tensor with a shape program at its current shape
 * (its DLTensor's, which kernels read) and bytes, set by an input's shape;
 * the kernels' arguments, dims among them by value. */
#include <string.h>

#include "exec/session.h"

/* Arguments `ids`: tensors as pointers to the session's descriptions, dims
 * as tvm-ffi ints holding their value (only those where `dims_only`). */
static uint32_t bind(cb_session* s, const uint32_t* ids, uint32_t n, cb_ffi_any* out, int dims_only) {
  for (uint32_t a = 0; a < n; a++) {
    if (s->bundle->model.tensors[ids[a]].kind == CB_KIND_DIM)
      out[a].type_index = CB_FFI_INT, out[a].v_int64 = s->dims[ids[a]];
    else if (!dims_only)
      out[a].type_index = CB_FFI_DLTENSOR_PTR, out[a].v_ptr = &s->tensors[ids[a]];
  }
  return n;
}

/* Every step's execute, transform and warm arguments. */
static void bind_steps(cb_session* s, int dims_only) {
  const cb_model* m = &s->bundle->model;
  uint32_t k = 0, kt = 0, ka = 0;
  for (uint32_t i = 0; i < m->nsteps; i++) {
    const cb_step_desc* sd = &m->steps[i];
    s->arg_start[i] = k, s->targ_start[i] = kt, s->aarg_start[i] = ka;
    k += bind(s, sd->args, sd->nargs, &s->args[k], dims_only);
    kt += bind(s, sd->transform_args, sd->ntransform_args, &s->targs[kt], dims_only);
    ka += bind(s, sd->warm_args, sd->nwarm_args, &s->aargs[ka], dims_only);
  }
  s->arg_start[m->nsteps] = k, s->targ_start[m->nsteps] = kt, s->aarg_start[m->nsteps] = ka;
}

/* Every shape program evaluated at `dims`: each must fit the bytes the
 * bundle planned for its tensor (its largest); with `commit`, each tensor
 * takes its shape and bytes (after a check of the same dims: it cannot fail). */
static cb_status eval_all(cb_session* s, const int64_t* dims, int commit) {
  const cb_model* m = &s->bundle->model;
  int64_t shape[CB_MAX_NDIM];
  for (uint32_t t = 0; t < m->ntensors; t++) {
    const cb_tensor_desc* d = &m->tensors[t];
    uint64_t n = 0;
    if (!d->nprogram) continue;
    cb_status st = cb_shape_eval(m, t, dims, shape);
    if (st) return st;
    if (!cb_shape_bytes(d, shape, &n) || n > d->nbytes)
      return cb_fail(CB_ERR_CORRUPT, "tensor '%s' would need more than the %llu bytes the bundle planned for it",
                     d->name, (unsigned long long)d->nbytes);
    if (commit) memcpy(s->tensors[t].shape, shape, sizeof(int64_t) * (size_t)d->ndim), s->nbytes[t] = n;
  }
  return CB_OK;
}

cb_status cb_shapes_start(cb_session* s) {
  const cb_model* m = &s->bundle->model;
  int64_t* place = s->shapes;
  for (uint32_t t = 0; t < m->ntensors; t++) {
    const cb_tensor_desc* d = &m->tensors[t];
    s->nbytes[t] = d->nbytes;
    if (d->kind == CB_KIND_DIM) s->dims[t] = d->range.typical / d->range.step;
    if (d->nprogram) s->tensors[t].shape = place, place += d->ndim;
  }
  cb_status st = eval_all(s, s->dims, 0);
  if (st) return st;
  eval_all(s, s->dims, 1);
  cb_shapes_keep_outputs(s);
  bind_steps(s, 0);
  return CB_OK;
}

void cb_shapes_keep_outputs(cb_session* s) {
  const cb_model* m = &s->bundle->model;
  int64_t* place = s->out_shapes;
  for (uint32_t k = 0; k < m->noutputs; k++) {
    const cb_dltensor* t = &s->tensors[m->outputs[k]];
    memcpy(place, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    place += t->ndim;
    s->out_nbytes[k] = s->nbytes[m->outputs[k]];
  }
}

cb_status cb_shapes_count(cb_session* s, uint32_t step) {
  const cb_model* m = &s->bundle->model;
  const cb_step_desc* sd = &m->steps[step];
  int changed = 0;
  for (uint32_t t = 0; t < m->ntensors; t++) {
    const cb_tensor_desc* d = &m->tensors[t];
    uint32_t c = (uint32_t)d->range.count, writes = 0;
    if (d->kind != CB_KIND_DIM || d->range.count < 0) continue;
    for (uint32_t a = sd->nargs - sd->nouts; a < sd->nargs; a++) writes |= sd->args[a] == c;
    if (!writes) continue;
    int64_t v;
    memcpy(&v, s->tensors[c].data, sizeof v);
    if (v < d->range.min) /* a loop's step row of another length than its first (compiler/ir/loops.py) */
      return cb_fail(CB_ERR_INVALID_ARGUMENT, "layer '%s' found %lld entries for '%s', fewer than the %lld the bundle "
                     "was compiled for", sd->layer_name, (long long)v, d->name, (long long)d->range.min);
    if (v > d->range.max)
      return cb_fail(CB_ERR_INVALID_ARGUMENT, "layer '%s' found %lld entries for '%s', more than the %lld the bundle "
                     "holds (compile with --bound %s=N for more)", sd->layer_name, (long long)v, d->name,
                     (long long)d->range.max, d->name);
    changed |= s->dims[t] != v;
    s->dims[t] = v;
  }
  if (!changed) return CB_OK; /* the shapes are the last evaluation's (a loop's next iteration, mostly) */
  cb_status st = eval_all(s, s->dims, 0);
  if (st) return st;
  eval_all(s, s->dims, 1);
  bind_steps(s, 1);
  return CB_OK;
}

/* The dims input `index` at `shape` sets, into `dims`: each in its range. */
static cb_status carried_dims(const cb_session* s, size_t index, const int64_t* shape, int64_t* dims) {
  const cb_model* m = &s->bundle->model;
  for (uint32_t t = 0; t < m->ntensors; t++) {
    const cb_tensor_desc* r = &m->tensors[t];
    if (r->kind != CB_KIND_DIM || r->range.count >= 0 || r->range.input != index) continue;
    int64_t v = shape[r->range.axis];
    if (v < r->range.min || v > r->range.max || v % r->range.step)
      return cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' axis %u is %lld: the bundle takes %lld..%lld in steps of %lld",
                     m->tensors[m->inputs[index]].name, r->range.axis, (long long)v, (long long)r->range.min,
                     (long long)r->range.max, (long long)r->range.step);
    dims[t] = v / r->range.step;
  }
  return CB_OK;
}

cb_status cb_session_set_input_shape(cb_session* s, size_t index, const int64_t* shape, int32_t ndim) {
  if (!s || (!shape && ndim)) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and shape are required");
  const cb_model* m = &s->bundle->model;
  if (index >= m->ninputs)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input index %zu out of range (%u inputs)", index, m->ninputs);
  uint32_t t = m->inputs[index];
  const cb_tensor_desc* d = &m->tensors[t];
  if (ndim != d->ndim)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' has %d axes, not %d", d->name, d->ndim, ndim);
  if (!ndim || memcmp(shape, s->tensors[t].shape, sizeof(int64_t) * (size_t)ndim) == 0) return CB_OK;
  int64_t* dims = s->dims + m->ntensors, want[CB_MAX_NDIM];
  memcpy(dims, s->dims, sizeof(int64_t) * m->ntensors);
  cb_status st = carried_dims(s, index, shape, dims);
  if (!st && d->nprogram) st = cb_shape_eval(m, t, dims, want);
  for (int32_t a = 0; !st && a < ndim; a++) /* fixed axes, and those the other inputs set */
    if (shape[a] != (d->nprogram ? want[a] : d->shape[a]))
      st = cb_fail(CB_ERR_INVALID_ARGUMENT, "input '%s' axis %d is %lld: the bundle takes %lld there", d->name, a,
                   (long long)shape[a], (long long)(d->nprogram ? want[a] : d->shape[a]));
  if (st || (st = eval_all(s, dims, 0))) return st;
  memcpy(s->dims, dims, sizeof(int64_t) * m->ntensors);
  eval_all(s, s->dims, 1);
  bind_steps(s, 1);
  return CB_OK;
}

/* Input or output `index`'s name, dtype, shape and bytes: its current
 * shape's (an input's) or the last run's (an output's). */
static cb_status session_info(const cb_session* s, size_t index, int input, cb_tensor_info* out) {
  if (!s || !out) return cb_fail(CB_ERR_INVALID_ARGUMENT, "session and out_info are required");
  const cb_model* m = &s->bundle->model;
  uint32_t count = input ? m->ninputs : m->noutputs;
  if (index >= count)
    return cb_fail(CB_ERR_INVALID_ARGUMENT, "%s index %zu out of range (%u %ss)", input ? "input" : "output", index,
                   count, input ? "input" : "output");
  uint32_t t = input ? m->inputs[index] : m->outputs[index];
  const cb_tensor_desc* d = &m->tensors[t];
  out->name = d->name, out->dtype = (cb_dtype)d->dtype, out->ndim = d->ndim;
  out->shape = s->tensors[t].shape, out->nbytes = s->nbytes[t];
  if (!input) {
    out->shape = s->out_shapes, out->nbytes = s->out_nbytes[index];
    for (size_t k = 0; k < index; k++) out->shape += m->tensors[m->outputs[k]].ndim;
  }
  return CB_OK;
}

cb_status cb_session_input_info(const cb_session* s, size_t index, cb_tensor_info* out) {
  return session_info(s, index, 1, out);
}

cb_status cb_session_output_info(const cb_session* s, size_t index, cb_tensor_info* out) {
  return session_info(s, index, 0, out);
}
