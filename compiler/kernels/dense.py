"""Dense / MatMul with constant weights: out[m, n] = sum_k x[m, k] * w[k, n].

packed_gemm   weights packed to [N / nb, K, nb]: nb consecutive outputs per load
int8_dot      a quantized model's layer: its int8 weights times its activations'
              integers, 64 products per instruction (AVX-512 VNNI)
"""
import numpy as np
import tvm
from tvm import s_tir, te, tirx

from .contract import ANCHOR, Variant, register
from .schedule_util import (attach_epilogue, block_name, blocks_in_order, generic_block, intensity, padding_efficiency,
                            ranked, register_blocks)


class PackedGemm(Variant):
    """mb rows of x x nb outputs (a multiple of the vector) per register block."""

    name = "dense.packed_gemm"
    op = "dense"

    def transformed_shape(self, spec, params):
        nb = params["nb"]
        return ((spec.n + nb - 1) // nb, spec.k, nb)

    def transform(self, spec, params):
        nb = params["nb"]
        return lambda w: te.compute(
            self.transformed_shape(spec, params),
            lambda no, k, ni: tirx.if_then_else(no * nb + ni < spec.n, w[k, tirx.min(no * nb + ni, spec.n - 1)],
                                                tirx.const(0, spec.dtype)),
            name="cb_pack")

    def compute(self, spec, x, wt, params):
        nb = params["nb"]
        k = te.reduce_axis((0, spec.k), "k")
        np_ = (spec.n + nb - 1) // nb * nb
        anchor = te.compute((spec.m, np_), lambda i, j: te.sum(x[spec.x_row(i) + (k,)] * wt[j // nb, k, j % nb],
                                                                 axis=k), name=ANCHOR)
        return te.compute(spec.output_shape, lambda *ix: anchor[spec.out_row(ix[:-1]), ix[-1]], name="cb_out")

    def space(self, spec):
        # rows must divide m (no row padding); a single row (a classifier)
        # streams the weights once, so its blocks are a few vectors wide
        lanes = self.isa.lanes
        blocks = [(mb, v) for mb, v in register_blocks(self.isa, (1, 2, 4, 8), 4) if spec.row_block(mb)]
        return [{"mb": mb, "nb": v * lanes} for mb, v in
                ranked([(intensity(mb, v) * padding_efficiency((spec.n, v * lanes)), (mb, v)) for mb, v in blocks])]

    def schedule(self, sch, block, spec, params):
        mb, nb, lanes = params["mb"], params["nb"], self.isa.lanes
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, mb])
        jo, ji = sch.split(j, [None, nb])
        jio, jiv = sch.split(ji, [None, lanes])
        sch.reorder(jo, io, k, ii, jio, jiv)
        par = sch.fuse(jo, io)
        sch.parallel(par)
        attach_epilogue(sch, block, par, lanes)
        sch.unroll(ii)
        sch.unroll(jio)
        sch.vectorize(jiv)
        sch.decompose_reduction(block, k)


register(PackedGemm.name, PackedGemm)


INT8_DOT = "cb_int8_dot"  # annotation of the blocks finish() turns into vpdpbusd


class Int8Dot(Variant):
    """The model's int8 weights times its quantized activations, four
    u8 x s8 products summed into each int32 lane per instruction (AVX-512
    VNNI vpdpbusd): the layer's input is on a DequantizeLinear's grid
    (DenseSpec.in_scale), so each row is turned back into its integers
    (u8: q + in_shift) once, the sums are exact, and each output is
    acc x (in_scale x w_scale) - in_shift x colsum(w) x (in_scale x w_scale),
    the two per-output factors one [2, N] argument. Weights packed
    [N / nb, K / 4, nb, 4]: one instruction reads nb = 16 outputs x 4 k."""

    name = "dense.int8_dot"
    op = "dense"
    integer = True

    def applies(self, spec):  # fewer outputs than one instruction's 16 lanes: not worth packing
        return self.isa.int8_dot and spec.in_scale > 0 and spec.n >= 16

    def transformed_shape(self, spec, params):
        nb = params["nb"]
        return ((spec.n + nb - 1) // nb, (spec.k + 3) // 4, nb, 4)

    def transform(self, spec, params):
        nb = params["nb"]

        def pack(w):
            def value(no, ko, ni, ki):
                n, k = no * nb + ni, ko * 4 + ki
                inside = tirx.all(n < spec.n, k < spec.k)
                return tirx.if_then_else(inside, w[tirx.min(k, spec.k - 1), tirx.min(n, spec.n - 1)],
                                         tirx.const(0, w.dtype))
            return te.compute(self.transformed_shape(spec, params), value, name="cb_pack")
        return pack

    def compute(self, spec, x, wt, params, scale):
        nb, kp = params["nb"], (spec.k + 3) // 4 * 4
        xq = _integer_rows(spec, x, kp)
        k = te.reduce_axis((0, kp), "k")
        np_ = (spec.n + nb - 1) // nb * nb
        acc = te.compute((spec.m, np_), lambda i, j: te.sum(
            xq[i, k].astype("int32") * wt[j // nb, k // 4, j % nb, k % 4].astype("int32"), axis=k), name=ANCHOR)
        return te.compute(spec.output_shape, lambda *ix: acc[spec.out_row(ix[:-1]), ix[-1]].astype("float32")
                          * scale[0, ix[-1]] + scale[1, ix[-1]], name="cb_out")

    def space(self, spec):
        lanes = 16  # int32 lanes of one vpdpbusd
        blocks = [(mb, v) for mb, v in register_blocks(self.isa, (1, 2, 4, 8), 4) if spec.row_block(mb)]
        return [{"mb": mb, "nb": v * lanes} for mb, v in
                ranked([(intensity(mb, v) * padding_efficiency((spec.n, v * lanes)), (mb, v)) for mb, v in blocks])]

    def schedule(self, sch, block, spec, params):
        mb, nb = params["mb"], params["nb"]
        rows = _rows_pass(sch, sch.get_producers(block)[0], self.isa.lanes)
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, mb])
        jo, ji = sch.split(j, [None, nb])
        jv, j16 = sch.split(ji, [None, 16])
        ko, k4 = sch.split(k, [None, 4])
        sch.reorder(jo, io, ko, ii, jv, j16, k4)
        par = sch.fuse(jo, io)
        sch.parallel(par)
        attach_epilogue(sch, block, par, self.isa.lanes)
        sch.unroll(ii)
        sch.unroll(jv)
        sch.decompose_reduction(block, ko)
        sch.annotate(sch.blockize(j16), INT8_DOT, 1)
        rows()

    def finish(self, func):
        return func.with_body(_rewritten(func.body, _vpdpbusd))


def reference(spec, x, w, scale):
    """numpy: Int8Dot's (and Int8DotK's) output from x on its grid, int8 w [K, N] and the
    [2, N] factors, the sums exact."""
    q = np.rint(np.asarray(x, np.float64).reshape(spec.m, spec.k) / spec.in_scale) + spec.in_shift
    acc = q @ np.asarray(w, np.float64)
    return (acc * scale[0] + scale[1]).astype(np.float32).reshape(spec.output_shape)


def int8_dot_factors(spec, w, w_scale):
    """Int8Dot's [2, N] per-output factors for int8 weights w [K, N] with
    scales w_scale [N]: the product of the two scales, and the in_shift
    correction (the shifted integers added in_shift x the column sum)."""
    s = spec.in_scale * np.asarray(w_scale, np.float64)
    colsum = np.asarray(w, np.int64).sum(axis=0)
    return np.stack([s, -spec.in_shift * colsum * s]).astype(np.float32)


def _reads_uint8_in_place(block):
    """Whether Int8Dot's row block only copies the model's uint8 (no cast,
    no padding): then the products read them where they lie."""
    store = block.body
    return isinstance(store, tirx.stmt.BufferStore) and isinstance(store.value, tvm.ir.TensorLoad)


def _vpdpbusd(block):
    """A blockized 16 x 4 update (C[n] += u8 A[k] x s8 B[n, k]) as one
    vpdpbusd: the four A bytes broadcast (or, where A moves with the lane,
    Int8DotK's, its 64 bytes one load), the 64 B bytes one load."""
    loop_n = block.body
    realize = loop_n.body.body
    store = realize.block.body
    first, second = (_at(block, n) for n in (0, 1))  # the element at k = 0 and n = 0, 1
    loads = [store.value.b.a.value, store.value.b.b.value]  # C + Cast(A) * Cast(B)
    a = next(t for t in loads if t.source.dtype == "uint8")
    b = next(t for t in loads if t.source.dtype == "int8")
    along = any(_nonzero(p - q) for p, q in zip(first(a.indices), second(a.indices)))
    c = first(store.indices)
    dot = vpdpbusd(store.buffer.vload(c, "int32x16"), a.source.vload(first(a.indices), "uint8x64" if along
                                                                      else "uint8x4"),
                   b.source.vload(first(b.indices), "int8x64"))
    return tirx.BufferStore(store.buffer, dot, c[:-1] + [tirx.Ramp(c[-1], 1, 16)])


def _nonzero(expr):
    from tvm.sym.analyzer import Analyzer

    d = Analyzer().simplify(expr)
    return not (isinstance(d, tirx.IntImm) and d.value == 0)


def _at(block, n):
    """Simplifies an index of a blockized 16 x 4 update's body at lane n, k 0."""
    from tvm.sym.analyzer import Analyzer

    loop_n = block.body
    loop_k = loop_n.body
    realize = loop_k.body
    ana = Analyzer()
    ana.bind(loop_n.loop_var, n)
    ana.bind(loop_k.loop_var, 0)
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        ana.bind(iv.var, ana.simplify(value))
    return lambda index: [ana.simplify(e) for e in index]


def vpdpbusd(acc, four, weights):
    """acc (int32x16) plus, in each lane, the four u8 `four` (uint8x4,
    broadcast to every lane; or uint8x64, four per lane) times that lane's
    four s8 of `weights` (int8x64): one AVX-512 VNNI instruction (the
    integer variants' only one)."""
    if str(four.ty) == "uint8x64":
        four = tirx.reinterpret("int8x64", four)
    else:
        four = tirx.reinterpret("int8x64", tirx.Broadcast(tirx.reinterpret("int32", four), 16))
    return tirx.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, four, weights)


def _rewritten(stmt, body_of):
    """`stmt` with the body of every block annotated INT8_DOT replaced by
    body_of(block) (the loops and blocks on the way rebuilt, the rest shared)."""
    from tvm import s_tir

    if isinstance(stmt, s_tir.SBlockRealize):
        blk = stmt.block
        marked = blk.annotations is not None and INT8_DOT in blk.annotations
        body = body_of(blk) if marked else _rewritten(blk.body, body_of)
        if body.same_as(blk.body):
            return stmt
        notes = {k: v for k, v in blk.annotations.items() if k != INT8_DOT} if blk.annotations else {}
        new = s_tir.SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, body, blk.init, blk.alloc_buffers,
                           blk.match_buffers, notes)
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, new)
    if isinstance(stmt, tirx.For):
        body = _rewritten(stmt.body, body_of)
        return stmt if body.same_as(stmt.body) else tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                                                             stmt.thread_binding, stmt.annotations)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rewritten(s, body_of) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    return stmt


register(Int8Dot.name, Int8Dot)


def _epilogue_apart(sch, block, lanes):
    """What follows `block` (the lanes' sums, the factors, FuseOps'
    epilogue) as one pass over the outputs after it: its 16 partial sums
    per output are a few bytes next to the rows it reads."""
    after = blocks_in_order(sch)
    after = after[[block_name(sch, b) for b in after].index(block_name(sch, block)) + 1:]
    for b in after[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            pass
    generic_block(sch, after[-1], lanes)


def _tree_sum(values):
    """values[0] + ... + values[-1] added pairwise (depth log2 n)."""
    while len(values) > 1:
        values = [values[k] + values[k + 1] if k + 1 < len(values) else values[k] for k in range(0, len(values), 2)]
    return values[0]


def _integer_rows(spec, x, kp):
    """x's rows as the u8 integers an integer variant multiplies, K padded
    with zeros to kp: the model's uint8 themselves where no padding is
    needed (the products then read them in place), its int8 plus 128, or
    floats on the grid turned back into q + in_shift."""
    if x.dtype == "uint8" and kp == spec.k:
        return te.compute((spec.m, kp), lambda m, k: x[spec.x_row(m) + (k,)], name="cb_quant")
    inv = 1.0 / spec.in_scale

    def integer(m, k):  # x / in_scale is an integer: rounding only removes fp32's error
        v = x[spec.x_row(m) + (tirx.min(k, spec.k - 1),)]
        if x.dtype == "int8":  # the model's integers themselves (select_variants): q - zero + shift = q + 128
            q = tirx.Cast("uint8", v.astype("int32") + 128)
        elif x.dtype == "uint8":
            q = v
        else:
            q = tirx.round(v * inv) + float(spec.in_shift)
            q = tirx.Cast("uint8", tirx.max(tirx.min(q, 255.0), 0.0))
        return tirx.if_then_else(k < spec.k, q, tirx.const(0, "uint8"))
    return te.compute((spec.m, kp), integer, name="cb_quant")


def _rows_pass(sch, quant, lanes):
    """Schedule the row pass; in place (a copy of the model's uint8) it is
    inlined into the products instead. Returns the function that schedules
    what is left once the products are scheduled (an inlined producer must
    go before the products are blockized)."""
    if _reads_uint8_in_place(sch.get(quant)):
        sch.compute_inline(quant)
        return lambda: None

    def rest():
        m, kq = sch.get_loops(quant)
        sch.parallel(m)
        _, kv = sch.split(kq, [None, lanes])
        sch.vectorize(kv)
    return rest


class Int8DotK(Variant):
    """Int8Dot for layers of few outputs (under one instruction's 16): the
    products run along K instead, each vpdpbusd multiplying 64 bytes of a
    row by the 64 matching weight bytes of one output into 16 partial sums,
    added up once per output at the end (an attention score of one output
    over many rows reads each row once). Weights packed [N, K padded to 64]."""

    name = "dense.int8_dot_k"
    op = "dense"
    integer = True

    def applies(self, spec):
        return self.isa.int8_dot and spec.in_scale > 0 and spec.n < 16

    def transformed_shape(self, spec, params):
        return (spec.n, (spec.k + 63) // 64 * 64)

    def transform(self, spec, params):
        return lambda w: te.compute(self.transformed_shape(spec, params), lambda j, k: tirx.if_then_else(
            k < spec.k, w[tirx.min(k, spec.k - 1), j], tirx.const(0, w.dtype)), name="cb_pack")

    def compute(self, spec, x, wt, params, scale):
        kp = self.transformed_shape(spec, params)[1]
        xq = _integer_rows(spec, x, kp)
        ko, t = te.reduce_axis((0, kp // 64), "ko"), te.reduce_axis((0, 4), "t")
        part = te.compute((spec.m, spec.n, 16), lambda i, j, lane: te.sum(
            xq[i, ko * 64 + lane * 4 + t].astype("int32") * wt[j, ko * 64 + lane * 4 + t].astype("int32"),
            axis=[ko, t]), name=ANCHOR)
        acc = te.compute((spec.m, spec.n), lambda i, j: _tree_sum([part[i, j, lane] for lane in range(16)]),
                         name="cb_lanes")  # a sum of 16 values, not a loop: no chain of 16 dependent adds
        return te.compute(spec.output_shape, lambda *ix: acc[spec.out_row(ix[:-1]), ix[-1]].astype("float32")
                          * scale[0, ix[-1]] + scale[1, ix[-1]], name="cb_out")

    def space(self, spec):
        return [{}]

    def schedule(self, sch, block, spec, params):
        rows = _rows_pass(sch, sch.get_producers(block)[0], self.isa.lanes)
        i, j, lane, ko, t = sch.get_loops(block)
        sch.reorder(i, j, ko, lane, t)
        sch.parallel(i)
        _epilogue_apart(sch, block, self.isa.lanes)
        init = sch.decompose_reduction(block, ko)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.annotate(sch.blockize(lane), INT8_DOT, 1)
        rows()

    def finish(self, func):
        return func.with_body(_rewritten(func.body, _vpdpbusd))


register(Int8DotK.name, Int8DotK)
