"""Dense / MatMul with constant weights: out[m, n] = sum_k x[m, k] * w[k, n].

packed_gemm   weights packed to [N / nb, K, nb]: nb consecutive outputs per load
int8_dot      a quantized model's layer: its int8 weights times its activations'
              integers, 64 products per instruction (AVX-512 VNNI)
int8_dot_k    the same for layers of under 16 outputs, the products along K
pair_dot      int8_dot without VNNI (AVX2): the integers widened to int16, 16 products per instruction
int8_tiles    the same in AMX tiles: 16 x 16 outputs x 64 products per instruction
"""
import numpy as np
import tvm
from tvm import s_tir, te, tirx

from .contract import ANCHOR, Variant, register, simplified
from .generic import TILE_SCOPE, blocks_in_order, generic_block, multiple
from .schedule import attach_epilogue, block_name, intensity, padding_efficiency, ranked, register_blocks


class PackedGemm(Variant):
    """mb rows of x x nb outputs (a multiple of the vector) per register block."""

    name = "dense.packed_gemm"
    op = "dense"
    symbolic = True  # rows sized at run time: the last row block padded where mb does not divide them

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
        nb, rows, row = params["nb"], _whole_blocks(spec, params["mb"]), spec.x_row
        k = te.reduce_axis((0, spec.k), "k")
        np_ = (spec.n + nb - 1) // nb * nb
        if rows is not spec.m:  # the last block reads the last row again
            row = lambda i: spec.x_row(tirx.min(i, spec.m - 1))  # noqa: E731
        anchor = te.compute((rows, np_), lambda i, j: te.sum(x[row(i) + (k,)] * wt[j // nb, k, j % nb], axis=k),
                            name=ANCHOR)
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


def _whole_blocks(spec, mb):
    """The rows a dense variant computes: spec.m, or where rows sized at run
    time are not a multiple of mb at every size, whole blocks of mb at each
    size (cropped after: no row's test in the reduction, 2.5x slower), as
    ((m - 1) // mb + 1) * mb: TVM proves that form covers m (not round_up's)."""
    if spec.batch or multiple(spec.m, mb):
        return spec.m
    return simplified((tirx.floordiv(spec.m - 1, mb) + 1) * mb)


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
    symbolic = True  # rows sized at run time: whole row blocks at each size (_whole_blocks)
    per = 4  # products per int32 lane
    lanes = 16  # int32 lanes of one instruction

    def applies(self, spec):  # fewer outputs than one instruction's 16 lanes: not worth packing
        return self.isa.int8_dot and spec.in_scale > 0 and spec.n >= 16

    def transformed_shape(self, spec, params):
        nb, per = params["nb"], self.per
        return ((spec.n + nb - 1) // nb, (spec.k + per - 1) // per, nb, per)

    def transform(self, spec, params):
        nb, per = params["nb"], self.per

        def pack(w):
            def value(no, ko, ni, ki):
                n, k = no * nb + ni, ko * per + ki
                inside = tirx.all(n < spec.n, k < spec.k)
                return tirx.if_then_else(inside, w[tirx.min(k, spec.k - 1), tirx.min(n, spec.n - 1)],
                                         tirx.const(0, w.dtype))
            return te.compute(self.transformed_shape(spec, params), value, name="cb_pack")
        return pack

    def compute(self, spec, x, wt, params, scale):
        per = self.per
        nb, kp, rows = params["nb"], (spec.k + per - 1) // per * per, _whole_blocks(spec, params["mb"])
        xq = _integer_rows(spec, x, kp, None if rows is spec.m else rows, "uint8" if per == 4 else "int16")
        k = te.reduce_axis((0, kp), "k")
        np_ = (spec.n + nb - 1) // nb * nb
        acc = te.compute((rows, np_), lambda i, j: te.sum(
            xq[i, k].astype("int32") * wt[j // nb, k // per, j % nb, k % per].astype("int32"), axis=k), name=ANCHOR)
        return te.compute(spec.output_shape, lambda *ix: acc[spec.out_row(ix[:-1]), ix[-1]].astype("float32")
                          * scale[0, ix[-1]] + scale[1, ix[-1]], name="cb_out")

    def space(self, spec):
        lanes = self.lanes
        blocks = [(mb, v) for mb, v in register_blocks(self.isa, (1, 2, 4, 8), 4) if spec.row_block(mb)]
        return [{"mb": mb, "nb": v * lanes} for mb, v in
                ranked([(intensity(mb, v) * padding_efficiency((spec.n, v * lanes)), (mb, v)) for mb, v in blocks])]

    def schedule(self, sch, block, spec, params):
        mb, nb = params["mb"], params["nb"]
        rows = _rows_pass(sch, sch.get_producers(block)[0], self.isa.lanes)
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, mb])
        jo, ji = sch.split(j, [None, nb])
        jv, jl = sch.split(ji, [None, self.lanes])
        ko, kl = sch.split(k, [None, self.per])
        sch.reorder(jo, io, ko, ii, jv, jl, kl)
        par = sch.fuse(jo, io)
        sch.parallel(par)
        attach_epilogue(sch, block, par, self.isa.lanes)
        sch.unroll(ii)
        sch.unroll(jv)
        sch.decompose_reduction(block, ko)
        sch.annotate(sch.blockize(jl), INT8_DOT, 1)
        rows()

    def finish(self, func):
        return func.with_body(rewritten(func.body, _vpdpbusd if self.per == 4 else pair_update))


class PairDot(Int8Dot):
    """Int8Dot where there is no VNNI (AVX2): the activations' u8 and the
    weights' s8 widened to int16, two products summed into each int32 lane
    per instruction (vpmaddwd, exact: 255 x 128 x 2 fits), 8 lanes; weights
    packed [N / nb, K / 2, nb, 2]."""

    name = "dense.pair_dot"
    per, lanes = 2, 8

    def applies(self, spec):
        return self.isa.isa in ("avx2", "avx512") and spec.in_scale > 0 and spec.n >= 8


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


def pair_update(block):
    """A blockized lanes x 2 update (C[n] += s16 A[k] x B[n, k], B s8 or
    s16) as one vpmaddwd: the two A values broadcast, B's lanes x 2 values
    one load (s8 widened); 8 lanes (AVX2) or 16 (AVX-512 BW)."""
    store = block.body.body.body.block.body
    first, second = (_at(block, n) for n in (0, 1))
    loads = [store.value.b.a.value, store.value.b.b.value]  # C + Cast(A) * Cast(B)
    moves = [any(_nonzero(p - q) for p, q in zip(first(t.indices), second(t.indices))) for t in loads]
    a, b = (loads[1], loads[0]) if moves[0] else (loads[0], loads[1])
    lanes = int(block.body.extent)
    c = first(store.indices)
    two = a.source.vload(first(a.indices), "int16x2")
    dot = store.buffer.vload(c, f"int32x{lanes}") + vpmaddwd(two, b.source.vload(first(b.indices),
                                                                              f"{b.source.dtype}x{2 * lanes}"))
    return tirx.BufferStore(store.buffer, dot, c[:-1] + [tirx.Ramp(c[-1], 1, lanes)])


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


def vpmaddwd(two, weights):
    """In each int32 lane, the two int16 `two` (int16x2, broadcast to every
    lane) times that lane's two values of `weights` (int8 widened, or
    int16; 2 x lanes of them), summed: one vpmaddwd, AVX2's for 8 lanes,
    AVX-512 BW's for 16 (exact for 8-bit values: no product pair leaves 32 bits)."""
    lanes = weights.ty.dtype.lanes // 2
    both = tirx.reinterpret(f"int16x{2 * lanes}", tirx.Broadcast(tirx.reinterpret("int32", two), lanes))
    name = "llvm.x86.avx2.pmadd.wd" if lanes == 8 else "llvm.x86.avx512.pmaddw.d.512"
    return tirx.call_llvm_pure_intrin(f"int32x{lanes}", name, both, tirx.Cast(f"int16x{2 * lanes}", weights))


def rewritten(stmt, body_of, mark=INT8_DOT):
    """`stmt` with every block annotated `mark` replaced: its body by
    body_of(block), or where that returns (body, buffers), also the
    buffers it allocates; its init dropped (the loops and blocks on the way
    rebuilt, the rest shared)."""
    from tvm import s_tir

    if isinstance(stmt, s_tir.SBlockRealize):
        blk = stmt.block
        marked = blk.annotations is not None and mark in blk.annotations
        body = body_of(blk) if marked else rewritten(blk.body, body_of, mark)
        body, allocs = body if isinstance(body, tuple) else (body, [])
        if body.same_as(blk.body):
            return stmt
        notes = {k: v for k, v in blk.annotations.items() if k != mark} if blk.annotations else {}
        new = s_tir.SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, body, None if marked else blk.init,
                           list(blk.alloc_buffers) + allocs, blk.match_buffers, notes)
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, new)
    if isinstance(stmt, tirx.For):
        body = rewritten(stmt.body, body_of, mark)
        return stmt if body.same_as(stmt.body) else tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                                                             stmt.thread_binding, stmt.annotations)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [rewritten(s, body_of, mark) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    return stmt


register(Int8Dot.name, Int8Dot)
register(PairDot.name, PairDot)


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


def _integer_rows(spec, x, kp, mp=None, dtype="uint8"):
    """x's rows as the u8 integers an integer variant multiplies, K padded
    with zeros to kp (and the rows to mp): the model's uint8 themselves where no padding is
    needed (the products then read them in place), its int8 plus 128, or
    floats on the grid turned back into q + in_shift; in `dtype` (int16:
    widened once per row rather than per product, pair_dot)."""
    if dtype != "uint8":
        narrow = _integer_rows(spec, x, kp, mp)
        return te.compute(narrow.shape, lambda m, k: narrow[m, k].astype(dtype), name="cb_quant")
    if x.dtype == "uint8" and kp == spec.k and mp is None:
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
    if mp is None:
        return te.compute((spec.m, kp), integer, name="cb_quant")
    return te.compute((mp, kp), lambda m, k: tirx.if_then_else(
        m < spec.m, integer(tirx.min(m, spec.m - 1), k), tirx.const(0, "uint8")), name="cb_quant")


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
        return func.with_body(rewritten(func.body, _vpdpbusd))


register(Int8DotK.name, Int8DotK)


INT8_TILES = "cb_int8_tiles"  # annotation of the output tile blocks finish() writes as AMX code
TILE = 16  # an AMX tile: 16 rows of 64 bytes (A: 16 rows x 64 k; B: 16 k/4 x 16 outputs x 4; C: 16 x 16 int32)


class Int8Tiles(Variant):
    """Int8Dot on AMX tiles (Sapphire Rapids and later): each output tile of
    2 x 2 accumulator tiles (32 rows x 32 outputs, int32) runs the whole
    reduction in tile registers, per 64 values of K two row tiles of the
    integers and two weight tiles loaded, four tdpbusd (16 x 16 outputs x
    64 products each). Rows padded to 32 and K to 64 with zeros by the row
    pass (or read in place: the model's uint8 already whole tiles); weights
    packed [N / 16, K / 4, 16, 4], as one B tile wants them (Int8Dot's
    packing with 16 outputs per block, K padded to 64). The sums are exact;
    the epilogue (Int8Dot's factors, FuseOps' ops) is one pass after."""

    name = "dense.int8_tiles"
    op = "dense"
    integer = True
    rows, cols = 2, 2  # accumulator tiles per output tile
    per = 4  # products per int32 lane (Int8Dot's packing)

    def applies(self, spec):
        # at least two output tiles' rows and columns: smaller layers pad the tiles more than they gain
        return self.isa.int8_tiles and spec.in_scale > 0 and spec.m >= 2 * self.rows * TILE and spec.n >= 32

    def _padded(self, spec):
        return (-(-spec.m // (self.rows * TILE)) * self.rows * TILE, -(-spec.n // (self.cols * TILE)) * self.cols * TILE,
                -(-spec.k // 64) * 64)

    def transformed_shape(self, spec, params):
        _, np_, kp = self._padded(spec)
        return (np_ // TILE, kp // 4, TILE, 4)

    def transform(self, spec, params):
        return Int8Dot.transform(self, spec, {"nb": TILE})

    def compute(self, spec, x, wt, params, scale):
        mp, np_, kp = self._padded(spec)
        xq = _integer_rows(spec, x, kp, None if mp == spec.m else mp)
        k = te.reduce_axis((0, kp), "k")
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            xq[i, k].astype("int32") * wt[j // TILE, k // 4, j % TILE, k % 4].astype("int32"), axis=k), name=ANCHOR)
        return te.compute(spec.output_shape, lambda *ix: acc[spec.out_row(ix[:-1]), ix[-1]].astype("float32")
                          * scale[0, ix[-1]] + scale[1, ix[-1]], name="cb_out")

    def space(self, spec):
        return [{}]

    def schedule(self, sch, block, spec, params):
        rows = _rows_pass(sch, sch.get_producers(block)[0], self.isa.lanes)
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, self.rows * TILE])
        jo, ji = sch.split(j, [None, self.cols * TILE])
        sch.reorder(jo, io, ii, ji, k)  # consecutive tiles share their weights
        par = sch.fuse(jo, io)
        sch.parallel(par)
        _epilogue_apart(sch, block, self.isa.lanes)
        sch.annotate(sch.blockize(ii), INT8_TILES, spec.m)  # finish() stores the rows under spec.m
        rows()

    def finish(self, func):
        return func.with_body(rewritten(func.body, self._tile_code, INT8_TILES))

    def _tile_code(self, block):
        """One output tile as AMX code: configure the tiles, zero the
        accumulators, run K in steps of 64, store the accumulators."""
        acc_region = block.writes[0]
        acc, (ri, rj) = acc_region.source, acc_region.region
        xq = next(r.source for r in block.reads if r.source.dtype == "uint8")
        wt = next(r.source for r in block.reads if r.source.dtype == "int8")
        i0, j0 = ri.min, rj.min
        kp = int(xq.shape[-1])
        cfg = tirx.decl_buffer((64,), "uint8", name="cb_tile_config", scope=TILE_SCOPE)
        a_tiles, b_tiles = list(range(4, 4 + self.rows)), list(range(6, 6 + self.cols))
        config = [0] * 64
        config[0] = 1  # palette 1
        for t in range(8):  # every tile 16 rows of 64 bytes
            config[16 + 2 * t], config[48 + t] = 64, TILE
        stmts = [tirx.BufferStore(cfg, tirx.const(v, "uint8"), [b]) for b, v in enumerate(config)]

        def call(name, *args):
            return tirx.Evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))

        def tile(t):
            return tirx.const(t, "int8")

        def addr(buf, *index):
            return tirx.address_of(tirx.BufferLoad(buf, list(index)))

        stmts.append(call("ldtilecfg", addr(cfg, 0)))
        stmts += [call("tilezero", tile(c)) for c in range(self.rows * self.cols)]
        ko = tirx.Var("ko", "int64")
        lead = [0] * (len(xq.shape) - 2)
        step = [call("tileloadd64", tile(a), addr(xq, *lead, i0 + r * TILE, ko * 64), tirx.const(kp, "int64"))
                for r, a in enumerate(a_tiles)]
        step += [call("tileloadd64", tile(b), addr(wt, j0 // TILE + c, ko * TILE, 0, 0), tirx.const(64, "int64"))
                 for c, b in enumerate(b_tiles)]
        step += [call("tdpbusd", tile(r * self.cols + c), tile(a), tile(b))
                 for r, a in enumerate(a_tiles) for c, b in enumerate(b_tiles)]
        stmts.append(tirx.For(ko, tirx.const(0, "int64"), tirx.const(kp // 64, "int64"), tirx.ForKind.SERIAL,
                              tirx.SeqStmt(step)))
        # the accumulators through a scratch tile into acc: stores TVM sees
        # (it sizes acc by them), the rows past the layer's left out
        th, tw = self.rows * TILE, self.cols * TILE
        scratch = tirx.decl_buffer((th, tw), "int32", name="cb_tile_sums", scope=TILE_SCOPE)
        stmts += [call("tilestored64", tile(r * self.cols + c), addr(scratch, r * TILE, c * TILE),
                       tirx.const(tw * 4, "int64"))
                  for r in range(self.rows) for c in range(self.cols)]
        stmts.append(call("tilerelease"))
        r, c = tirx.Var("r", "int64"), tirx.Var("c", "int64")
        copy = tirx.BufferStore(acc, tirx.BufferLoad(scratch, [r, c]), [i0 + r, j0 + c])
        valid = int(block.annotations[INT8_TILES])  # the layer's rows (the schedule's annotation)
        stmts.append(tirx.For(r, tirx.const(0, "int64"), tirx.const(th, "int64"), tirx.ForKind.SERIAL, tirx.IfThenElse(
            i0 + r < valid, tirx.For(c, tirx.const(0, "int64"), tirx.const(tw, "int64"), tirx.ForKind.VECTORIZED, copy),
            None)))
        return tirx.SeqStmt(stmts), [cfg, scratch]


register(Int8Tiles.name, Int8Tiles)
