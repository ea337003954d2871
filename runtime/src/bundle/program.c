/* Shapes set at run time (schemas/bundle.fbs, Tensor.shape_program): a
 * tensor's program evaluated with the dims' values, its bytes, and what an
 * input axis's program says of the values the axis takes. */
#include <string.h>

#include "bundle/model.h"

uint64_t cb_dtype_size(uint8_t dtype) {
  static const uint8_t size[] = {4, 2, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1}; /* cb_dtype's order */
  return dtype < sizeof size ? size[dtype] : 0;
}

/* a op b (ADD .. MAX) into *out: 1, or 0 on an overflow or a division by zero. */
static int apply(int64_t op, int64_t a, int64_t b, int64_t* out) {
  if (op == CB_OP_ADD) return !__builtin_add_overflow(a, b, out);
  if (op == CB_OP_SUB) return !__builtin_sub_overflow(a, b, out);
  if (op == CB_OP_MUL) return !__builtin_mul_overflow(a, b, out);
  if (op == CB_OP_MIN || op == CB_OP_MAX) return *out = (a < b) == (op == CB_OP_MIN) ? a : b, 1;
  if (b == 0 || (a == INT64_MIN && b == -1)) return 0;
  int64_t q = a / b, r = a % b;
  if (r && (r < 0) != (b < 0)) q--, r += b; /* floor, not truncation */
  *out = op == CB_OP_FLOORDIV ? q : r;
  return 1;
}

cb_status cb_shape_eval(const cb_model* m, uint32_t t, const int64_t* dims, int64_t* shape) {
  const cb_tensor_desc* d = &m->tensors[t];
  const int64_t* p = d->program;
  int64_t st[CB_SHAPE_STACK];
  int32_t n = 0, axis = 0;
  const char* why = NULL;
  for (uint32_t k = 0; k < d->nprogram && !why; k++) {
    int64_t w = p[k];
    if ((w >= 0 || w == CB_OP_DIM) && n == CB_SHAPE_STACK) {
      why = "is deeper than 16 values";
    } else if (w >= 0) {
      st[n++] = w;
    } else if (w == CB_OP_DIM) {
      if (k + 1 >= d->nprogram || p[k + 1] < 0 || p[k + 1] >= m->ntensors || m->tensors[p[k + 1]].kind != CB_KIND_DIM)
        why = "names a tensor that is not a dim";
      else
        st[n++] = dims[p[++k]];
    } else if (w == CB_OP_END) {
      if (n != 1 || axis >= d->ndim) why = "does not end each axis with one value";
      else if (st[0] < 0) why = "gives a negative size";
      else shape[axis++] = st[--n];
    } else if (w == CB_OP_NEG) {
      if (n < 1 || st[n - 1] == INT64_MIN) why = "negates nothing or overflows";
      else st[n - 1] = -st[n - 1];
    } else if (w >= CB_OP_MAX) {
      if (n < 2) why = "takes a value from an empty stack";
      else if (!apply(w, st[n - 2], st[n - 1], &st[n - 2])) why = "overflows or divides by zero";
      else n--;
    } else {
      why = "has an unknown word";
    }
  }
  if (!why && (axis != d->ndim || n != 0)) why = "does not end each axis with one value";
  return why ? cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s'): its shape program %s", t, d->name, why) : CB_OK;
}

int cb_shape_bytes(const cb_tensor_desc* d, const int64_t* shape, uint64_t* out) {
  uint64_t n = cb_dtype_size(d->dtype);
  for (int32_t k = 0; k < d->ndim; k++)
    if (shape[k] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[k], &n)) return 0;
  *out = n;
  return 1;
}

/* The words of axis `axis` of d's program (*left of them up to its end). */
static const int64_t* axis_words(const cb_tensor_desc* d, uint32_t axis, uint32_t* left) {
  uint32_t k = 0;
  for (uint32_t a = 0; a < axis && k < d->nprogram; k++) {
    if (d->program[k] == CB_OP_DIM) k++;
    else if (d->program[k] == CB_OP_END) a++;
  }
  *left = k < d->nprogram ? d->nprogram - k : 0;
  return *left ? d->program + k : d->program;
}

int64_t cb_axis_dim(const cb_model* m, const cb_tensor_desc* d, uint32_t axis, int64_t* scale) {
  uint32_t n = 0;
  const int64_t* w = axis_words(d, axis, &n);
  int mul = n >= 5 && w[0] >= 0 && w[3] == CB_OP_MUL && w[4] == CB_OP_END;
  if (mul) *scale = *w++;
  else *scale = 1;
  if ((mul || (n >= 3 && w[2] == CB_OP_END)) && w[0] == CB_OP_DIM && w[1] >= 0 && w[1] < m->ntensors &&
      m->tensors[w[1]].kind == CB_KIND_DIM)
    return w[1];
  return -1;
}

void cb_axis_range(const cb_model* m, uint32_t t, uint32_t axis, int64_t* min, int64_t* max, int64_t* step) {
  const cb_tensor_desc* d = &m->tensors[t];
  uint32_t n = 0;
  const int64_t* w = axis_words(d, axis, &n);
  int64_t scale = 1, dim = d->nprogram ? cb_axis_dim(m, d, axis, &scale) : -1;
  *min = *max = d->shape[axis], *step = 1;
  if (dim >= 0 && scale == m->tensors[dim].range.step)
    *min = m->tensors[dim].range.min, *max = m->tensors[dim].range.max, *step = scale;
  else if (d->nprogram && !(n >= 2 && w[0] >= 0 && w[1] == CB_OP_END)) /* not a constant */
    *min = 0, *step = 0;
}

/* A dim's range (1 <= min <= typical <= max, each a multiple of step >= 1)
 * and the input axis that carries it: one whose program is its value times
 * step; a counted one's (0 <= min, step 1), its tensor checked with the steps. */
static cb_status check_dim(const cb_model* m, uint32_t i) {
  const cb_tensor_desc* d = &m->tensors[i];
  int64_t lo = d->range.min, hi = d->range.max, step = d->range.step, typical = d->range.typical, scale = 0;
  int counted = d->range.count >= 0;
  if (counted && (step != 1 || lo < 0 || lo > typical || typical > hi))
    return cb_fail(CB_ERR_CORRUPT, "counted dim tensor %u ('%s') has an invalid range: %lld..%lld in steps of %lld, "
                   "typical %lld", i, d->name, (long long)lo, (long long)hi, (long long)step, (long long)typical);
  if (counted) return CB_OK;
  if (step < 1 || lo < 1 || lo > typical || typical > hi || lo % step || hi % step || typical % step)
    return cb_fail(CB_ERR_CORRUPT, "dim tensor %u ('%s') has an invalid range: %lld..%lld in steps of %lld, typical %lld",
                   i, d->name, (long long)lo, (long long)hi, (long long)step, (long long)typical);
  const cb_tensor_desc* in = d->range.input < m->ninputs ? &m->tensors[m->inputs[d->range.input]] : NULL;
  if (!in || d->range.axis >= (uint32_t)in->ndim || !in->nprogram || cb_axis_dim(m, in, d->range.axis, &scale) != i ||
      scale != step)
    return cb_fail(CB_ERR_CORRUPT, "dim tensor %u ('%s') names input %u axis %u, which does not carry it", i, d->name,
                   d->range.input, d->range.axis);
  return CB_OK;
}

/* Every dim checked, then every shape program, on an input, output or
 * intermediate, evaluated at each dim's largest value (`dims`), where it
 * must fit the tensor's `shape` (its bound over every size: a size that
 * falls as a dim grows is largest elsewhere; each run checks its own
 * shapes against the bytes planned). */
static cb_status check_programs(cb_model* m, uint32_t version, int64_t* dims) {
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    if ((d->kind == CB_KIND_DIM || d->nprogram) && (version < 5 || m->gpu_api[0]))
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') has a shape set at run time: %s", i, d->name,
                     m->gpu_api[0] ? "GPU bundles have fixed shapes" : "schema 4 has none");
    cb_status st = d->kind == CB_KIND_DIM ? check_dim(m, i) : CB_OK;
    if (st) return st;
    if (d->kind == CB_KIND_DIM) dims[i] = d->range.max / d->range.step;
  }
  int64_t shape[CB_MAX_NDIM];
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    if (!d->nprogram) continue;
    if (d->kind > CB_KIND_INTERMEDIATE)
      return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s') has a shape program, which only inputs, outputs and "
                     "intermediates have", i, d->name);
    cb_status st = cb_shape_eval(m, i, dims, shape);
    if (st) return st;
    for (int32_t a = 0; a < d->ndim; a++)
      if (shape[a] > d->shape[a])
        return cb_fail(CB_ERR_CORRUPT, "tensor %u ('%s'): its shape program gives a larger shape than its own at "
                       "the dims' largest values", i, d->name);
    m->program_axes += (uint32_t)d->ndim;
  }
  return CB_OK;
}

cb_status cb_counts_check(cb_model* m) {
  for (uint32_t i = 0; i < m->ntensors; i++) {
    const cb_tensor_desc* d = &m->tensors[i];
    if (d->kind != CB_KIND_DIM || d->range.count < 0) continue;
    int64_t c = d->range.count;
    const cb_tensor_desc* t = c < m->ntensors ? &m->tensors[c] : NULL;
    uint32_t writers = 0;
    for (uint32_t k = 0; t && k < m->nsteps; k++) {
      cb_step_desc* s = &m->steps[k];
      for (uint32_t a = s->nargs - s->nouts; a < s->nargs; a++)
        if (s->args[a] == (uint32_t)c) writers++, s->counts = 1;
    }
    if (!t || t->dtype != CB_I64 || t->nbytes != 8 || t->nprogram ||
        (t->kind != CB_KIND_INTERMEDIATE && t->kind != CB_KIND_OUTPUT) || writers != 1)
      return cb_fail(CB_ERR_CORRUPT, "counted dim tensor %u ('%s') names tensor %lld, which is not one int64 that one "
                     "step writes", i, d->name, (long long)c);
  }
  return CB_OK;
}

cb_status cb_shapes_check(cb_model* m, uint32_t version) {
  int any = 0; /* a bundle without dims needs no values */
  for (uint32_t i = 0; i < m->ntensors; i++) any |= m->tensors[i].kind == CB_KIND_DIM;
  int64_t* dims = any ? cb_calloc(m->ntensors, sizeof *dims) : NULL;
  if (any && !dims) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  cb_status st = check_programs(m, version, dims);
  cb_free(dims);
  return st;
}
