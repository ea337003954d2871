"""Operators whose kernels are sequential loops, written with TVM's TIR IR
builder (TVM's own lowerings of them call functions the coldbrew runtime
does not have, or none is registered): CumSum's running sum and TopK's
selection. Each row is independent and the rows run in parallel.

Reference: `topk_reference` (numpy) beside the kernel; CumSum is numpy's
cumsum with ONNX's `exclusive`.
"""
import numpy as np

from ..kernels.generic import TILE_SCOPE


def _rows(shape, axis):
    """(rows before the axis, axis length, stride of the axis)."""
    def size(d):  # a number, or a size set at run time
        return int(d) if hasattr(d, "value") or isinstance(d, int) else d

    before, after = 1, 1
    for i, d in enumerate(shape):
        if i < axis:
            before *= size(d)
        elif i > axis:
            after *= size(d)
    return before, size(shape[axis]), after


def cumsum_te(data, axis, dtype, exclusive):
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    dtype = dtype or str(data.dtype)
    axis = axis % len(data.shape)
    before, n, after = _rows(data.shape, axis)

    def ir(src, dst):
        with IRBuilder() as ib:
            x, y = T.buffer_proxy(src), T.buffer_proxy(dst)
            with T.parallel(0, before * after) as row:
                base = row // after * n * after + row % after
                acc = T.decl_buffer([1], dtype, scope=TILE_SCOPE)
                a = T.buffer_proxy(acc)
                a[0] = tirx.const(0, dtype)
                with T.serial(0, n) as k:
                    v = T.Cast(dtype, x[base + k * after]) if dtype != str(data.dtype) else x[base + k * after]
                    if exclusive:
                        y[base + k * after] = a[0]
                        a[0] = a[0] + v
                    else:
                        a[0] = a[0] + v
                        y[base + k * after] = a[0]
            return ib.get()

    return te.extern([data.shape], [data], lambda ins, outs: ir(ins[0], outs[0]), dtype=dtype, name="cb_cumsum")


def topk_te(data, k, axis, largest, index_dtype, wanted=None):
    """Values and indices of the k largest (smallest) entries along `axis`,
    best first; of equal values the lower index first (ONNX's rule).
    Insertion into the output row, which is kept sorted: O(n k) per row,
    one pass over the input. `wanted`: a one-value tensor, the k a run
    asks for (a TopK whose k the data sets, compiler/kernels/counted.py),
    its count (at most k) a third output."""
    from tvm import te
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    axis = axis % len(data.shape)
    before, n, after = _rows(data.shape, axis)
    out_shape = [data.shape[i] if i != axis else k for i in range(len(data.shape))]

    def better(a, b):
        return a > b if largest else a < b

    def ir(src, vals, idxs, want=None, cnt=None):
        with IRBuilder() as ib:
            x, v, ix = T.buffer_proxy(src), T.buffer_proxy(vals), T.buffer_proxy(idxs)
            if want is not None:
                with T.serial(0, 1):
                    c, w = T.buffer_proxy(cnt), T.buffer_proxy(want)
                    c[0] = T.min(T.max(T.Cast("int64", w[0]), T.int64(0)), T.int64(k))
                    rows(x, v, ix)
                return ib.get()
            rows(x, v, ix)
            return ib.get()

    def rows(x, v, ix):
        with T.parallel(0, before * after) as row:
            base = row // after * n * after + row % after
            obase = row // after * k * after + row % after
            count = T.buffer_proxy(T.decl_buffer([1], "int32", scope=TILE_SCOPE))
            pos = T.buffer_proxy(T.decl_buffer([1], "int32", scope=TILE_SCOPE))
            count[0] = 0
            with T.serial(0, n) as e:
                val = x[base + e * after]
                with T.If(T.Or(count[0] < k, better(val, v[obase + (k - 1) * after]))):
                    with T.Then():
                        pos[0] = T.min(count[0], k - 1)
                        with T.While(T.And(pos[0] > 0, better(val, v[obase + (pos[0] - 1) * after]))):
                            v[obase + pos[0] * after] = v[obase + (pos[0] - 1) * after]
                            ix[obase + pos[0] * after] = ix[obase + (pos[0] - 1) * after]
                            pos[0] = pos[0] - 1
                        v[obase + pos[0] * after] = val
                        ix[obase + pos[0] * after] = T.Cast(index_dtype, e)
                        count[0] = count[0] + 1

    if wanted is not None:
        return te.extern([out_shape, out_shape, (1,)], [data, wanted], lambda ins, outs: ir(ins[0], *outs[:2], ins[1],
                                                                                           outs[2]),
                         dtype=[str(data.dtype), index_dtype, "int64"], name="cb_topk")
    return te.extern([out_shape, out_shape], [data], lambda ins, outs: ir(ins[0], outs[0], outs[1]),
                     dtype=[str(data.dtype), index_dtype], name="cb_topk")


def legalize_cumsum(bb, call):
    a = call.attrs
    axis = int(a.axis) if a.axis is not None else None
    x = call.args[0]
    if axis is None:  # the flattened input (ONNX always gives an axis)
        from tvm import relax

        x = bb.normalize(relax.op.reshape(x, [-1]))
        axis = 0
    dtype = str(a.dtype) if a.dtype is not None and str(a.dtype) not in ("", "void") else None
    return bb.call_te(cumsum_te, x, axis, dtype, bool(a.exclusive),
                      primfunc_name_hint="cumsum")


def legalize_topk(bb, call):
    from tvm import relax

    a = call.attrs
    out = bb.call_te(topk_te, call.args[0], int(a.k), int(a.axis), bool(a.largest), str(a.dtype),
                     primfunc_name_hint="topk")
    if a.ret_type == "both":
        return out
    return relax.TupleGetItem(out, 0 if a.ret_type == "values" else 1)


def topk_reference(x, k, axis, largest=True):
    """numpy: the k best along `axis`, ties by lower index first."""
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)
