"""The kernels of a Loop the runtime runs (compiler/ir/loops.py says how
the runtime runs it) and of the Slices and Ranges at a place its iteration
sets, with numpy references:

- START (`start_te`): the loop's state before its first iteration (the
  iteration number 0, the trip count, the first condition, copies of the
  first carried values).
- END (`end_te`): the final carried values, the scan outputs' places
  (`most` rows, which the runtime writes; the kernel leaves them) and the
  iteration count.
- `slice_at_te`, `range_at_te`: a Slice or a Range at a place the data
  sets, of the length its first iteration had, with that iteration's
  length as a counted size of exactly it (the runtime fails another).

`emit_start`, `emit_end` and `emit_slice_at` call them from the importer
(passes/import_relax.py), each opaque and marked (ir/loops.py LOOP,
kernels/counted.py COUNTS).
"""
import json

import numpy as np

from ..ir.branches import OPAQUE
from ..ir.loops import LOOP
from ..ir.relax import extents_of
from .counted import COUNTS, clamped


def _scalar(x):
    """Element 0 of a tensor of one value, whatever its rank."""
    return x(*([0] * len(x.shape)))


def _copy(x, name):
    from tvm import te

    return te.compute(x.shape, lambda *i: x(*i), name=name)


def start_te(dep, limit, first, carried, most):
    """The loop's state before its first iteration; `dep` is only waited for."""
    from tvm import te, tirx

    it = te.compute((), lambda: tirx.const(0, "int64"), name="iteration")
    trip = te.compute((), lambda: (_scalar(limit).astype("int64") if limit is not None
                                   else tirx.const(most if most >= 0 else 1 << 62, "int64")), name="trip")
    def holds():
        if first is None:
            return tirx.const(True, "bool")
        v = _scalar(first)
        return v if str(first.dtype) == "bool" else v != tirx.const(0, first.dtype)

    cond = te.compute((), holds, name="cond")
    copies = [_copy(x, f"carried{k}") for k, x in enumerate(carried)]
    return [it, trip, cond, *copies]


def end_te(it, carried, scans, most):
    """The final carried values, the scan outputs' places (`most` rows;
    written by the runtime) and the iteration count."""
    from tvm import te, tirx

    finals = [_copy(x, f"final{k}") for k, x in enumerate(carried)]
    stacks = [te.extern([(most, *s.shape)], [], lambda ins, outs: tirx.Evaluate(0), dtype=[str(s.dtype)], name=f"scan{k}")
              for k, s in enumerate(scans)]
    count = te.compute((1,), lambda i: it[()], name="count")
    return [*finals, *stacks, count]


def slice_at_te(x, starts, ends, axes, steps, shape):
    """(`x` sliced, length [1]): ONNX Slice with starts and ends the data
    sets (an iteration's row), of `shape`, the length its first iteration
    had. `length` is that length on every sliced axis (else the first other
    one found): a counted size of exactly it, which the runtime checks
    after the step (a slice of another length fails the run)."""
    from tvm import te, tirx

    rank = len(x.shape)
    axes = [a % rank for a in (axes if axes is not None else range(len(shape)))][:int(starts.shape[0])]
    steps = steps if steps is not None else [1] * len(axes)

    def dim(k):
        return tirx.Cast("int64", x.shape[axes[k]])

    def at(*i):
        idx = list(i)
        for k, a in enumerate(axes):
            pos = clamped(starts[k], dim(k)) + tirx.Cast("int64", i[a]) * steps[k]
            idx[a] = tirx.min(pos, dim(k) - 1)  # in bounds whatever the check finds
        return x(*idx)

    def length(_):
        found = tirx.const(shape[axes[0]], "int64")
        for k in reversed(range(len(axes))):
            n = tirx.max((clamped(ends[k], dim(k)) - clamped(starts[k], dim(k)) + steps[k] - 1) // steps[k],
                         tirx.const(0, "int64"))
            found = tirx.Select(n != shape[axes[k]], n, found)
        return found

    return [te.compute(shape, at, name="cb_slice_at"), te.compute((1,), length, name="cb_slice_length")]


def range_at_te(start, limit, delta, length):
    """(values [length], count [1]): ONNX Range of one-value tensors the data
    sets, of the `length` its first iteration had; `count` its length at
    this iteration (checked as slice_at_te's)."""
    from tvm import te, tirx

    out = te.compute((length,), lambda i: start[0] + tirx.Cast(str(start.dtype), i) * delta[0], name="cb_range_at")
    span = tirx.Cast("float64", limit[0] - start[0]) / tirx.Cast("float64", delta[0])
    count = te.compute((1,), lambda _: tirx.max(tirx.Cast("int64", tirx.ceil(span)), tirx.const(0, "int64")),
                       name="cb_range_length")
    return [out, count]


def emit_slice_at(bb, inputs, attrs, counts, name):
    """SLICE_AT's kernel called on the importer's values: the slice (or the
    Range), its length a counted size of exactly the first iteration's
    (`counts`: import_relax._Counts)."""
    from tvm import relax


    shape = [int(d) for d in attrs["shape"]]
    if int(attrs.get("range", 0)):
        args = [bb.normalize(relax.op.reshape(v, [1])) for v in inputs[:3]]
        ph = [_placeholder(v, n) for v, n in zip(args, ("start", "limit", "delta"))]
        outs, fixed = range_at_te(*ph, shape[0]), shape[0]
    else:
        args = list(inputs[:3])
        ph = [_placeholder(v, n) for v, n in zip(args, ("x", "starts", "ends"))]
        shape = [e if d == -1 else d for d, e in zip(shape, extents_of(args[0]))]  # an axis kept whole: x's
        axes = attrs.get("axes")
        outs = slice_at_te(*ph, axes, attrs.get("steps"), shape)
        fixed = shape[(axes[0] if axes else 0) % len(shape)]
    _, var = counts.dim(name, fixed, least=fixed)
    call = _call(bb, "cb_range_at" if int(attrs.get("range", 0)) else "cb_slice_at", ph, outs, args,
                 {COUNTS: var.name})
    counts.count_of[var.name] = bb.emit(relax.TupleGetItem(call, 1))
    return bb.emit(relax.TupleGetItem(call, 0))


def _call(bb, name, placeholders, outputs, args, marks):
    """The kernel of `outputs` over `placeholders` called on `args`, opaque
    and marked."""
    from tvm import relax, te

    func = te.create_prim_func([*placeholders, *outputs]).with_attr("op_pattern", OPAQUE)
    for k, v in marks.items():
        func = func.with_attr(k, v)
    gv = bb.add_func(func, name)
    types = [relax.TensorType([int(d) if hasattr(d, "value") else d for d in o.shape], o.dtype) for o in outputs]
    return bb.emit(relax.call_tir(gv, args, types))


def _placeholder(x, name):
    from tvm import te

    from ..errors import CompileError

    if extents_of(x) is None:
        raise CompileError(f"a value of a Loop the data stops ({name}) has a shape the importer does not know")
    return te.placeholder(extents_of(x), str(x.ty.dtype), name=name)


def emit_start(bb, inputs, attrs, name):
    """START's kernel called on the importer's values: a Tuple (iteration,
    trip, condition, carried...)."""
    from tvm import relax

    from ..errors import CompileError

    dep, limit, first, *carried = list(inputs) + [None] * (3 - len(inputs))
    if dep is not None and not isinstance(getattr(dep, "ty", None), relax.TensorType):
        dep = None  # a size: nothing to wait for
    for x in carried:
        if not isinstance(getattr(x, "ty", None), relax.TensorType):
            raise CompileError("a carried value that is a shape is not supported in a Loop the data stops yet")
    most = int(attrs.get("most", -1))
    named = [("dep", dep), ("limit", limit), ("first", first)] + [(f"init{k}", x) for k, x in enumerate(carried)]
    args = [(n, x) for n, x in named if x is not None]
    ph = {n: _placeholder(x, n) for n, x in args}
    outputs = start_te(ph.get("dep"), ph.get("limit"), ph.get("first"),
                       [ph[f"init{k}"] for k in range(len(carried))], most)
    marks = {LOOP: json.dumps({"role": "start", "loop": name, "carried": len(carried), "most": most,
                               "at_least_once": bool(int(attrs.get("at_least_once", 0)))})}
    return _call(bb, "cb_loop_start", list(ph.values()), outputs, [x for _, x in args], marks)


def emit_end(bb, inputs, attrs, name, counts, scan_name):
    """END's kernel called on the importer's values: a Tuple of the final
    carried values and the scan outputs (taken to the count, a counted
    size of `counts`, import_relax._Counts)."""
    from tvm import relax

    from ..errors import CompileError

    n, k, most = int(attrs["carried"]), int(attrs["scans"]), int(attrs["most"])
    values = list(inputs)
    it, trip, cond, v_in = values[0], values[1], values[2], values[3:3 + n]
    cond_out, v_out, scans = values[3 + n], values[4 + n:4 + 2 * n], values[4 + 2 * n:]
    if len(scans) != k or any(not isinstance(getattr(x, "ty", None), relax.TensorType)
                              for x in [it, trip, cond, *v_in, cond_out, *v_out, *scans]):
        raise CompileError("a value of its body is a shape or missing: not supported in a Loop the data stops yet")
    args = [it, trip, cond, *v_in, cond_out, *v_out, *scans]
    ph = [_placeholder(x, f"a{j}") for j, x in enumerate(args)]
    outputs = end_te(ph[0], ph[3:3 + n], ph[4 + 2 * n:], most)
    marks = {LOOP: json.dumps({"role": "end", "loop": name, "carried": n, "scans": k, "most": most,
                               "key": scan_name})}
    if k:
        d, var = counts.dim(scan_name, most)
        marks[COUNTS] = var.name
    call = _call(bb, "cb_loop_end", ph, outputs, args, marks)
    if k:
        counts.count_of[var.name] = bb.emit(relax.TupleGetItem(call, n + k))
    got = [bb.emit(relax.TupleGetItem(call, j)) for j in range(n)]
    got += [counts.take(bb, call, n + j, [var, *extents_of(s)]) for j, s in enumerate(scans)]
    return relax.Tuple(got) if len(got) != 1 else got[0]


def slice_at_reference(x, starts, ends, axes, steps):
    """numpy's slice of `x` (ONNX Slice's clamping): what slice_at_te holds
    where the length is its first iteration's."""
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a] = slice(int(s), int(e), int(st))
    return x[tuple(index)]


def range_reference(start, limit, delta):
    return np.arange(start, limit, delta)
