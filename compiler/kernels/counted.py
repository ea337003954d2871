"""Operators whose output's size depends on the data: NonZero, Compress,
NonMaxSuppression, Unique.

Each is one sequential kernel (TVM's TIR IR builder) that writes its
outputs at their bound (the most entries the data could give, or the
user's --bound) and, as its last output, the count it found (one int64).
The count is a size set at run time (a counted Dim, compiler/options.py):
the runtime reads it once the kernel has run and sizes every later tensor
by it (runtime/src/exec/shapes.c), and `take` gives the first `count`
entries of each bounded output (its layout for that count). A kernel never
writes past its bound; a count above it fails the run, naming the bound.

References (numpy, ONNX's definitions) beside each kernel.
"""
import numpy as np

from .generic import TILE_SCOPE

COUNTS = "cb_counts"  # a counting kernel's PrimFunc attribute: the variable of the size it counts


def _prod(extents):
    out = 1
    for e in extents:
        out = out * e
    return out


def _local(T, dtype, n=1):
    return T.buffer_proxy(T.decl_buffer([n], dtype, scope=TILE_SCOPE))


def _true(tirx, v, dtype):
    """Whether value `v` of `dtype` is non-zero (a bool is itself)."""
    return v if str(dtype) == "bool" else v != tirx.const(0, dtype)


def take(buf, shape):
    """The first entries of a bounded output: `shape` (the count on its
    counted axis) of `buf` (the bound there)."""
    from tvm import te

    return te.compute(shape, lambda *i: buf(*i), name="cb_take")


def nonzero_te(x, bound):
    """(indices [rank, bound], count [1]): the coordinates of the non-zero
    entries of `x` in row-major order, one column each."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape, rank = list(x.shape), max(len(x.shape), 1)

    def ir(src, out, cnt):
        with IRBuilder() as ib:
            s, o, c = T.buffer_proxy(src), T.buffer_proxy(out), T.buffer_proxy(cnt)
            with T.serial(0, 1):
                n = _local(T, "int64")
                n[0] = tirx.const(0, "int64")
                with T.serial(0, _prod(shape)) as e:
                    with T.If(_true(tirx, s[e], x.dtype)):
                        with T.Then():
                            with T.If(n[0] < bound):
                                with T.Then():
                                    stride = 1
                                    for d in reversed(range(len(shape))):
                                        o[d * bound + n[0]] = T.Cast("int64", e // stride % shape[d])
                                        stride = stride * shape[d]
                                    if not shape:
                                        o[n[0]] = tirx.const(0, "int64")
                            n[0] = n[0] + 1
                c[0] = n[0]
            return ib.get()

    return te.extern([(rank, bound), (1,)], [x], lambda i, o: ir(i[0], o[0], o[1]), dtype=["int64", "int64"],
                     name="cb_nonzero")


def nonzero_reference(x):
    return np.array(np.nonzero(x), dtype=np.int64).reshape(max(x.ndim, 1), -1)


def range_te(start, limit, delta, bound):
    """(values [bound], count [1]): ONNX Range of scalars (each a [1]
    tensor) known at run time only: max(ceil((limit - start) / delta), 0)
    values start, start + delta, ..."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    dtype = str(start.dtype)

    def ir(a, z, d, out, cnt):
        with IRBuilder() as ib:
            a, z, d, o, c = (T.buffer_proxy(b) for b in (a, z, d, out, cnt))
            with T.serial(0, 1):
                span = T.Cast("float64", z[0] - a[0]) / T.Cast("float64", d[0])
                c[0] = T.max(T.Cast("int64", T.ceil(span)), tirx.const(0, "int64"))
                with T.serial(0, T.min(c[0], tirx.const(bound, "int64"))) as i:
                    o[i] = a[0] + T.Cast(dtype, i) * d[0]
            return ib.get()

    return te.extern([(bound,), (1,)], [start, limit, delta], lambda i, o: ir(*i, *o), dtype=[dtype, "int64"],
                     name="cb_range")


def clamped(v, dim):
    """An ONNX Slice index: negative ones count from the end; clamped to the axis."""
    from tvm import tirx

    v = tirx.Cast("int64", v)
    v = tirx.Select(v < 0, v + dim, v)
    return tirx.max(tirx.min(v, dim), tirx.const(0, "int64"))


def slice_te(x, start, end, axis, step, bound):
    """(sliced [.. bound on `axis` ..], count [1]): ONNX Slice of `x` along
    `axis` from `start` to `end` (one-value tensors the data sets; negative
    ones count from the end, both clamped to the axis) by `step` > 0; its
    first `count` entries are kernels/loops.py slice_at_reference's."""
    from tvm import te, tirx

    dim = tirx.Cast("int64", x.shape[axis])

    def at(*i):
        idx = list(i)
        idx[axis] = tirx.min(clamped(start[0], dim) + tirx.Cast("int64", i[axis]) * step, dim - 1)
        return x(*idx)

    shape = list(x.shape)
    shape[axis] = bound
    out = te.compute(shape, at, name="cb_slice")
    count = te.compute((1,), lambda _: tirx.max((clamped(end[0], dim) - clamped(start[0], dim) + step - 1) // step,
                                                 tirx.const(0, "int64")), name="cb_slice_count")
    return [out, count]


def compress_te(x, cond, axis, bound):
    """(kept [.. bound on `axis` ..], count [1]): the slices of `x` along
    `axis` whose entry in `cond` is true (a shorter `cond` keeps none past
    its end)."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape = list(x.shape)
    outer, size, inner = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
    length = cond.shape[0]

    def ir(src, flags, out, cnt):
        with IRBuilder() as ib:
            s, f, o, c = T.buffer_proxy(src), T.buffer_proxy(flags), T.buffer_proxy(out), T.buffer_proxy(cnt)
            with T.serial(0, 1):
                n = _local(T, "int64")
                n[0] = tirx.const(0, "int64")
                with T.serial(0, T.min(length, size)) as j:
                    with T.If(_true(tirx, f[j], cond.dtype)):
                        with T.Then():
                            with T.If(n[0] < bound):
                                with T.Then():
                                    with T.serial(0, outer) as a:
                                        with T.serial(0, inner) as b:
                                            o[(a * bound + n[0]) * inner + b] = s[(a * size + j) * inner + b]
                            n[0] = n[0] + 1
                c[0] = n[0]
            return ib.get()

    out = [*shape[:axis], bound, *shape[axis + 1:]]
    return te.extern([out, (1,)], [x, cond], lambda i, o: ir(i[0], i[1], o[0], o[1]), dtype=[x.dtype, "int64"],
                     name="cb_compress")


def compress_reference(x, cond, axis=None):
    return np.compress(np.asarray(cond, bool), x, axis=axis)


def nms_te(boxes, scores, limits, bound, center_point_box, max_boxes=None, iou=None, threshold=None):
    """(selected [bound, 3], count [1]): ONNX NonMaxSuppression's (batch,
    class, box) triples, by batch, then class, then descending score (equal
    scores: the lower box first). Per class the boxes over the score
    threshold are candidates; the best is taken and every candidate that
    overlaps it by an IoU over the threshold is dropped, until
    `max_output_boxes_per_class` are taken or none is left. `limits`: the
    tensors given for max_boxes, iou and threshold (each None: its
    default, or the Python value passed here)."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    nb, nbox, ncls = boxes.shape[0], boxes.shape[1], scores.shape[1]
    inputs = [boxes, scores] + [t for t in limits if t is not None]

    def ir(ins, out, cnt):
        with IRBuilder() as ib:
            bx, sc, o, c = T.buffer_proxy(ins[0]), T.buffer_proxy(ins[1]), T.buffer_proxy(out), T.buffer_proxy(cnt)
            given = iter(T.buffer_proxy(b) for b in ins[2:])
            read = [next(given)[0] if t is not None else None for t in limits]
            limit = read[0] if read[0] is not None else tirx.const(max_boxes or 0, "int64")
            overlap = read[1] if read[1] is not None else tirx.const(iou or 0.0, "float32")
            floor = read[2] if read[2] is not None else (tirx.const(threshold, "float32") if threshold is not None
                                                           else None)
            with T.serial(0, 1):
                cand = T.buffer_proxy(T.decl_buffer([nbox], "int32"))
                n, m, k, w, t, best, chosen = (_local(T, "int64") for _ in range(7))
                n[0] = tirx.const(0, "int64")
                with T.serial(0, nb * ncls) as bc:
                    b, cl = bc // ncls, bc % ncls
                    base = bc * nbox

                    def score(j):
                        return T.Cast("float32", sc[base + T.Cast("int64", j)])

                    m[0] = tirx.const(0, "int64")
                    with T.serial(0, nbox) as j:
                        keep = score(j) > floor if floor is not None else tirx.const(True, "bool")
                        with T.If(keep):
                            with T.Then():
                                cand[m[0]] = T.Cast("int32", j)
                                m[0] = m[0] + 1
                    k[0] = tirx.const(0, "int64")
                    with T.While(T.And(k[0] < T.Cast("int64", limit), m[0] > 0)):
                        best[0] = tirx.const(0, "int64")
                        t[0] = tirx.const(1, "int64")
                        with T.While(t[0] < m[0]):
                            with T.If(score(cand[t[0]]) > score(cand[best[0]])):
                                with T.Then():
                                    best[0] = t[0]
                            t[0] = t[0] + 1
                        chosen[0] = T.Cast("int64", cand[best[0]])  # a value: the compaction below moves cand's
                        sel = chosen[0]
                        with T.If(n[0] < bound):
                            with T.Then():
                                o[n[0] * 3] = T.Cast("int64", b)
                                o[n[0] * 3 + 1] = T.Cast("int64", cl)
                                o[n[0] * 3 + 2] = T.Cast("int64", sel)
                        n[0] = n[0] + 1
                        k[0] = k[0] + 1
                        w[0] = tirx.const(0, "int64")
                        t[0] = tirx.const(0, "int64")
                        with T.While(t[0] < m[0]):
                            j = cand[t[0]]
                            with T.If(T.And(t[0] != best[0],
                                            T.Not(_suppresses(T, tirx, bx, b * nbox + T.Cast("int64", sel), b * nbox + T.Cast("int64", j),
                                                              center_point_box, overlap)))):
                                with T.Then():
                                    cand[w[0]] = j
                                    w[0] = w[0] + 1
                            t[0] = t[0] + 1
                        m[0] = w[0]
                c[0] = n[0]
            return ib.get()

    return te.extern([(bound, 3), (1,)], inputs, lambda i, o: ir(i, o[0], o[1]), dtype=["int64", "int64"],
                     name="cb_nms")


def _suppresses(T, tirx, bx, i, j, center, iou):
    """Whether box j overlaps box i by an IoU over `iou` (boxes of no
    area overlap nothing)."""
    def corners(k):
        v = [T.Cast("float32", bx[k * 4 + q]) for q in range(4)]
        if center:  # x centre, y centre, width, height
            return v[0] - v[2] / 2, v[1] - v[3] / 2, v[0] + v[2] / 2, v[1] + v[3] / 2
        return T.min(v[1], v[3]), T.min(v[0], v[2]), T.max(v[1], v[3]), T.max(v[0], v[2])  # y1 x1 y2 x2

    ax0, ay0, ax1, ay1 = corners(i)
    bx0, by0, bx1, by1 = corners(j)
    w = T.max(T.min(ax1, bx1) - T.max(ax0, bx0), tirx.const(0.0, "float32"))
    h = T.max(T.min(ay1, by1) - T.max(ay0, by0), tirx.const(0.0, "float32"))
    inter = w * h
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    zero = tirx.const(0.0, "float32")
    return T.And(T.And(inter > zero, T.And(area_a > zero, area_b > zero)), inter > iou * union)


def nms_reference(boxes, scores, max_boxes=0, iou=0.0, threshold=None, center_point_box=0):
    """numpy: ONNX NonMaxSuppression's selected indices [n, 3]."""
    def corners(b):
        if center_point_box:
            return b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
        return min(b[1], b[3]), min(b[0], b[2]), max(b[1], b[3]), max(b[0], b[2])

    def suppresses(a, b):
        ax0, ay0, ax1, ay1 = corners(a)
        bx0, by0, bx1, by1 = corners(b)
        inter = max(min(ax1, bx1) - max(ax0, bx0), 0) * max(min(ay1, by1) - max(ay0, by0), 0)
        area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
        return inter > 0 and area_a > 0 and area_b > 0 and inter > iou * (area_a + area_b - inter)

    out = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [j for j in range(len(s)) if threshold is None or s[j] > threshold]
            taken = 0
            while cand and taken < max_boxes:
                best = max(cand, key=lambda j: (s[j], -j))
                out.append((b, c, best))
                taken += 1
                cand = [j for j in cand if j != best and not suppresses(boxes[b, best], boxes[b, j])]
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def unique_te(x, axis, bound, is_sorted):
    """(values, first indices [bound], inverse [size], counts [bound],
    count [1]): the distinct slices of `x` along `axis` (None: its entries,
    flattened), in order of first appearance or ascending (`is_sorted`:
    slices compared entry by entry, in row-major order), where each first
    appears, which of them each slice is, and how often each appears.
    `values` is `x` with `bound` slices on `axis` (flattened: [bound])."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape = list(x.shape)
    if axis is None:
        outer, size, inner, out = 1, _prod(shape), 1, [bound]
    else:
        outer, size, inner = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
        out = [*shape[:axis], bound, *shape[axis + 1:]]
    row = outer * inner  # the entries of one slice

    def at(j, r):  # entry r of slice j
        return (r // inner * size + j) * inner + r % inner

    def ir(src, vals, firsts, inverse, counts, cnt):
        with IRBuilder() as ib:
            s, v, f, inv, ct, c = (T.buffer_proxy(b) for b in (src, vals, firsts, inverse, counts, cnt))
            with T.serial(0, 1):
                uf, uc, rank = (T.buffer_proxy(T.decl_buffer([size], "int64")) for _ in range(3))
                u, t, r, a, b = (_local(T, "int64") for _ in range(5))

                def differ(i, j):  # r[0]: the first entry where slices i and j differ (`row`: none)
                    r[0] = tirx.const(0, "int64")
                    with T.While(T.And(r[0] < row, s[at(i, T.min(r[0], row - 1))] == s[at(j, T.min(r[0], row - 1))])):
                        r[0] = r[0] + 1

                u[0] = tirx.const(0, "int64")
                with T.serial(0, size) as e:  # each slice: one seen before (its first: uf), or a new one
                    t[0], a[0] = tirx.const(0, "int64"), u[0]
                    with T.While(T.And(t[0] < u[0], a[0] == u[0])):
                        differ(uf[t[0]], e)
                        with T.If(r[0] == row):
                            with T.Then():
                                a[0] = t[0]
                        t[0] = t[0] + 1
                    with T.If(a[0] == u[0]):
                        with T.Then():
                            uf[u[0]], uc[u[0]] = T.Cast("int64", e), tirx.const(0, "int64")
                            u[0] = u[0] + 1
                    uc[a[0]] = uc[a[0]] + 1
                    inv[e] = a[0]
                a[0] = tirx.const(0, "int64")
                with T.While(a[0] < u[0]):  # each distinct slice's place in the output
                    rank[a[0]] = a[0]
                    if is_sorted:
                        rank[a[0]] = tirx.const(0, "int64")
                        b[0] = tirx.const(0, "int64")
                        with T.While(b[0] < u[0]):
                            differ(uf[b[0]], uf[a[0]])
                            q = T.min(r[0], row - 1)
                            with T.If(T.And(r[0] < row, s[at(uf[b[0]], q)] < s[at(uf[a[0]], q)])):
                                with T.Then():
                                    rank[a[0]] = rank[a[0]] + 1
                            b[0] = b[0] + 1
                    with T.If(rank[a[0]] < bound):
                        with T.Then():
                            k = rank[a[0]]
                            f[k], ct[k] = uf[a[0]], uc[a[0]]
                            with T.serial(0, row) as q:
                                v[(q // inner * bound + k) * inner + q % inner] = s[at(uf[a[0]], q)]
                    a[0] = a[0] + 1
                with T.serial(0, size) as e:
                    inv[e] = rank[inv[e]]
                c[0] = u[0]
            return ib.get()

    return te.extern([out, (bound,), (size,), (bound,), (1,)], [x],
                     lambda i, o: ir(i[0], *o), dtype=[x.dtype, "int64", "int64", "int64", "int64"],
                     name="cb_unique")


def unique_reference(x, axis=None, is_sorted=True):
    """numpy: ONNX Unique's (values, first indices, inverse, counts)."""
    values, firsts, inverse, counts = np.unique(x.reshape(-1) if axis is None else x, axis=axis, return_index=True,
                                                return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if not is_sorted:
        order = np.argsort(firsts, kind="stable")
        place = np.empty_like(order)
        place[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        firsts, counts, inverse = firsts[order], counts[order], place[inverse]
    return values, firsts.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)
