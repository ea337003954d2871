"""conv2d variants (NCHW activations, OIHW raw weights).

direct          plain layout, weights as ONNX stores them (identity transform)
packed_direct   output channels of the weights blocked by the tile's kb (contiguous loads)
im2col_gemm     column matrix per output tile + packed GEMM
gemm_1x1        1x1 / stride 1 / no pad: the input already is the column matrix
im2col_gemm_kvec, gemm_1x1_kvec
                the same GEMMs with output channels in the vector lanes, for
                narrow outputs (7, 13, 14 columns) where width vectors waste lanes
winograd_f2/f4/f6   F(m x m, 3 x 3) for 3x3 stride-1 convs: weights transformed to
                the Winograd domain, batched GEMM in it (F6 on outputs >= 12 x 12 only)
depthwise_direct   one filter per channel, vectorized along the output width

Every tile size comes from the variant's vector unit (self.isa): widths are
multiples of its fp32 lanes, register blocks fit its register file
(schedule.register_blocks), and each variant's space lists the blocks
that fit, the register/cache model's pick first.
"""
import numpy as np
from tvm import s_tir, te, tirx

from .contract import ANCHOR, ConvSpec, Variant, register
from .generic import TILE_SCOPE, blocks_in_order, generic_block, vectorize_inner
from .schedule import (PAD, attach_epilogue, block_name, intensity, l1_fit, pad_pass, padding_efficiency, ranked,
                       register_blocks, round_up)



def _pad(x, spec, extra_h=0, extra_w=0):
    """Zero-pad the input by the conv's pads, plus `extra_*` at the bottom /
    right so that padded (tile-aligned) output extents read in bounds."""
    pt, pl, pb, pr = spec.pad
    pb, pr = pb + extra_h, pr + extra_w
    if not any((pt, pl, pb, pr)):
        return x
    n, c, h, w = spec.n, spec.c, spec.h, spec.w
    return te.compute(
        (n, c, h + pt + pb, w + pl + pr),
        lambda i, j, y, z: tirx.if_then_else(
            tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl), x[i, j, y - pt, z - pl], tirx.const(0, spec.dtype)),
        name=PAD)


def _phase_split(x, spec, owp):
    """The zero-padded input split into `sw` column phases,
    pd[n, c, y, phase, j] = padded[n, c, y, j * sw + phase], wide enough for
    `owp` output columns, so that a strided conv's taps read contiguous
    vectors; the padded copy also spares the column tiles' vector copies a
    per-element bounds test. Returns tap(n, c, y, z, r, s): the input value
    output (y, z) meets at filter tap (r, s)."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    pt, pl = spec.pad[0], spec.pad[1]
    hp = spec.h + spec.pad[0] + spec.pad[2]
    wq = owp + ((spec.s - 1) * dw) // sw + 1  # columns per phase that the tiles read
    pd = te.compute(
        (spec.n, spec.c, hp, sw, wq),
        lambda n, c, y, ph, j: tirx.if_then_else(
            tirx.all(y >= pt, y < spec.h + pt, j * sw + ph >= pl, j * sw + ph < spec.w + pl),
            x[n, c, tirx.min(tirx.max(y - pt, 0), spec.h - 1), tirx.min(tirx.max(j * sw + ph - pl, 0), spec.w - 1)],
            tirx.const(0, spec.dtype)),
        name=PAD)
    return lambda n, c, y, z, r, s: pd[n, c, y * sh + r * dh, (s * dw) % sw, z + (s * dw) // sw]


def _split_tile(sch, loop, factor):
    return sch.split(loop, [None, factor])


def _crop(anchor, spec):
    """The layer's true output, read from the anchor's tile-aligned one."""
    return te.compute((spec.n, spec.k, spec.out_h, spec.out_w), lambda n, k, y, z: anchor[n, k, y, z], name="cb_out")


def _extra_w(spec, ow_padded):
    need = (ow_padded - 1) * spec.stride[1] + (spec.s - 1) * spec.dilation[1] + 1
    return max(0, need - (spec.w + spec.pad[1] + spec.pad[3]))


def _zb(spec, params, lanes):
    """Width tile: the parameter, but no wider than the output rounded to a vector."""
    return min(params["zb"], round_up(spec.out_w, lanes))


# A width tile that does not divide an unpadded layer's rows makes the
# kernel copy its whole input first (the rows padded to whole tiles): a
# pass over the input the layer otherwise skips. A 16 -> 4 1 x 1 conv on
# 160 x 160 (a transposed conv's phases): 64-wide tiles 0.14 ms, 32-wide
# 0.08 ms (AVX-512, 2 threads).
COPY_PENALTY = 0.5


def _copies_input(spec, width):
    return not any(spec.pad) and spec.out_w % width != 0


def _vector_widths(spec, lanes, blocks, score):
    """Parameter dicts of width-vectorized tiles: `blocks` are (rows, vectors)
    register blocks, `score(rows, width)` ranks them, less COPY_PENALTY for a
    width that makes an unpadded layer copy its input; widths wider than the
    output (rounded to a vector) are left out."""
    fit = [(r, v) for r, v in blocks if v == 1 or (v - 1) * lanes < spec.out_w]
    return ranked([(score(r, v * lanes) * (COPY_PENALTY if _copies_input(spec, v * lanes) else 1.0), (r, v * lanes))
                   for r, v in fit])


class _Direct(Variant):
    op = "conv2d"

    def applies(self, spec):
        return not spec.depthwise

    def _weight(self, wt, k, c, r, s, params):
        return wt[k, c, r, s]

    def compute(self, spec, x, wt, params):
        kb, zb = params["kb"], _zb(spec, params, self.isa.lanes)
        kp, owp = round_up(spec.k, kb), round_up(spec.out_w, zb)
        p = _pad(x, spec, extra_w=_extra_w(spec, owp))
        cpg, kpg = spec.c // spec.groups, spec.k // spec.groups
        rc = te.reduce_axis((0, cpg), "rc")
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        last = spec.k - 1
        anchor = te.compute(
            (spec.n, kp, spec.out_h, owp),
            lambda n, k, y, z: te.sum(
                p[n, (tirx.min(k, last) // kpg) * cpg + rc, y * sh + rr * dh, z * sw + rs * dw]
                * self._weight(wt, tirx.min(k, last), rc, rr, rs, params), axis=[rc, rr, rs]),
            name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        # kb output channels x zb columns; the reduction over (c, r, s) is
        # short per step, so the blocks stay small (at most 8 channels)
        kpg = spec.k // spec.groups
        blocks = register_blocks(self.isa, (2, 4, 8), 4)
        ranks = _vector_widths(spec, self.isa.lanes, blocks,
                               lambda kb, zb: intensity(kb, zb // self.isa.lanes)
                               * padding_efficiency((kpg, kb), (spec.out_w, zb)))
        return [{"kb": kb, "zb": zb} for kb, zb in ranks]

    def schedule(self, sch, block, spec, params):
        lanes = self.isa.lanes
        kb, zb = params["kb"], _zb(spec, params, lanes)
        n, k, y, z, rc, rr, rs = sch.get_loops(block)
        ko, ki = _split_tile(sch, k, kb)
        zo, zi = _split_tile(sch, z, zb)
        sch.reorder(n, ko, y, zo, rc, rr, rs, ki, zi)
        par = sch.fuse(n, ko, y)
        sch.parallel(par)
        pad_pass(sch, lanes)
        attach_epilogue(sch, block, zo, lanes)
        sch.unroll(ki)
        if zb % lanes == 0 and zb > lanes:
            zio, ziv = sch.split(zi, [None, lanes])
            sch.unroll(zio)
            sch.vectorize(ziv)
        else:
            sch.vectorize(zi)
        sch.unroll(rs)
        sch.decompose_reduction(block, rc)


class Direct(_Direct):
    name = "conv2d.direct"


class PackedDirect(_Direct):
    """direct with the weights packed in blocks of the tile's kb output channels."""

    name = "conv2d.packed_direct"

    def transformed_shape(self, spec, params):
        kb = params["kb"]
        return ((spec.k + kb - 1) // kb, spec.c // spec.groups, spec.r, spec.s, kb)

    def transform(self, spec, params):
        kb = params["kb"]
        return lambda w: te.compute(
            self.transformed_shape(spec, params),
            lambda ko, c, r, s, ki: tirx.if_then_else(ko * kb + ki < spec.k, w[tirx.min(ko * kb + ki, spec.k - 1), c, r, s],
                                                     tirx.const(0, spec.dtype)),
            name="cb_pack")

    def _weight(self, wt, k, c, r, s, params):
        kb = params["kb"]
        return wt[k // kb, c, r, s, k % kb]


class _Gemm(Variant):
    """out[n, k, y, z] = sum_q wt[k // kb, q, k % kb] * col[n, q, y, z], q = (c, r, s).

    Tiles are kb output channels x one output row x zt columns (zt a multiple
    of the vector): kb x zt / lanes accumulators, the register block. The
    weights are packed in blocks of kb channels, so one tile's weights are
    contiguous. The column tile (all q for one row segment) is packed right
    before the channel blocks that reuse it, and the epilogue runs on each
    finished tile."""

    op = "conv2d"

    def transformed_shape(self, spec, params):
        b = self._kb(params)
        return ((spec.k + b - 1) // b, spec.c * spec.r * spec.s, b)

    def transform(self, spec, params):
        rs, b = spec.r * spec.s, self._kb(params)
        return lambda w: te.compute(
            self.transformed_shape(spec, params),
            lambda ko, q, ki: tirx.if_then_else(
                ko * b + ki < spec.k, w[tirx.min(ko * b + ki, spec.k - 1), q // rs, (q // spec.s) % spec.r, q % spec.s],
                tirx.const(0, spec.dtype)),
            name="cb_pack")

    def _kb(self, params):
        return params["kb"]

    def _zt(self, spec, params):
        return min(params["zt"], round_up(spec.out_w, self.isa.lanes))

    def _column(self, spec, x, owp):
        raise NotImplementedError

    def compute(self, spec, x, wt, params):
        kb = self._kb(params)
        owp = round_up(spec.out_w, self._zt(spec, params))
        col = self._column(spec, x, owp)
        q = te.reduce_axis((0, spec.c * spec.r * spec.s), "q")
        anchor = te.compute((spec.n, round_up(spec.k, kb), spec.out_h, owp),
                            lambda n, k, y, z: te.sum(wt[k // kb, q, k % kb] * col[n, q, y, z], axis=q), name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        # FMAs per load of the register block, less the padding it adds to
        # the channels and the row
        blocks = register_blocks(self.isa, (4, 6, 8, 12, 16, 24), 4)
        lanes, q = self.isa.lanes, spec.c * spec.r * spec.s

        def ranks(order):
            # order "channels" rereads a kb x q weight panel for every
            # column tile; "rows" blocks its column tile by qb instead
            return _vector_widths(spec, lanes, blocks,
                                  lambda kb, zt: intensity(kb, zt // lanes)
                                  * padding_efficiency((spec.k, kb), (spec.out_w, zt))
                                  * (l1_fit(self.isa, 4 * kb * q) if order == "channels" else 1.0))

        return _with_orders(spec, lambda order: [{"kb": kb, "zt": zt, "qb": self._qb(spec, zt if order == "rows" else kb)}
                                                 for kb, zt in ranks(order)])

    def _qb(self, spec, width):
        """The reduction block: the whole reduction when the operand a tile
        rereads (order "rows": the q x zt column tile; "channels": the q x kb
        weight panel, `width` floats per step) fits half of L1, else the
        largest divisor of q whose panel does (0: no blocking)."""
        q, fit = spec.c * spec.r * spec.s, self.isa.l1d_kb * 1024 // 2 // (4 * width)
        if q <= fit:
            return 0
        return max((d for d in range(8, fit + 1) if q % d == 0), default=0)

    def _parallel_tiles(self, sch, block, spec, params, outer, tile):
        """Run the fused `outer` loops in parallel and fuse the epilogue at
        loop `tile` (None: the parallel loop). Order "rows": the column tile is packed once per
        parallel iteration (right before the channel blocks that reuse it).
        Order "channels": the column matrix is packed whole first, in its own
        parallel pass (or not at all where it is the input itself)."""
        par = sch.fuse(*outer)
        sch.parallel(par)
        pad_pass(sch, self.isa.lanes)
        col = sch.get_sblock("cb_col")
        if _order(params) == "rows":
            sch.compute_at(col, par, preserve_unit_loops=True)
            vectorize_inner(sch, col, self.isa.lanes)
        elif self._column_is_input(spec, params):
            sch.compute_inline(col)
        else:
            generic_block(sch, col, self.isa.lanes)
        attach_epilogue(sch, block, par if tile is None else tile, self.isa.lanes)

    def _column_is_input(self, spec, params):
        return False

    def schedule(self, sch, block, spec, params):
        kb, zt = self._kb(params), self._zt(spec, params)
        n, k, y, z, q = sch.get_loops(block)
        ko, ki = _split_tile(sch, k, kb)
        zo, zi = _split_tile(sch, z, zt)
        qb = params.get("qb", 0)
        if _order(params) == "rows" and qb:
            # the reduction in blocks of qb: every channel block runs over
            # one qb x zt panel of the column tile while it is in L1, the
            # row tile's partial sums wait in memory between panels
            qo, qi = sch.split(q, [None, qb])
            sch.reorder(n, y, zo, qo, ko, qi, ki, zi)
            self._parallel_tiles(sch, block, spec, params, [n, y, zo], None)
            first = qo
        elif _order(params) == "rows":
            sch.reorder(n, y, zo, ko, q, ki, zi)
            self._parallel_tiles(sch, block, spec, params, [n, y, zo], ko)
            first = q
        elif qb:
            # every column tile runs over one qb x kb weight panel while it
            # is in L1; the channel block's partial sums wait in memory
            qo, qi = sch.split(q, [None, qb])
            sch.reorder(n, ko, qo, y, zo, qi, ki, zi)
            self._parallel_tiles(sch, block, spec, params, [n, ko], None)
            first = qo
        else:
            sch.reorder(n, ko, y, zo, q, ki, zi)
            self._parallel_tiles(sch, block, spec, params, [n, ko, y], zo)
            first = q
        sch.unroll(ki)
        _vectorize(sch, zi, zt, self.isa.lanes)
        sch.decompose_reduction(block, first)


class Im2colGemm(_Gemm):
    name = "conv2d.im2col_gemm"

    def applies(self, spec):
        return spec.groups == 1

    def _column(self, spec, x, owp):
        # rows of the column matrix are contiguous runs of the phase-split
        # input: the tile is packed with plain vector copies
        tap = _phase_split(x, spec, owp)
        rs, s = spec.r * spec.s, spec.s
        return te.compute((spec.n, spec.c * rs, spec.out_h, owp),
                          lambda n, q, y, z: tap(n, q // rs, y, z, (q // s) % spec.r, q % s), name="cb_col")


class Gemm1x1(_Gemm):
    name = "conv2d.gemm_1x1"

    def _column_is_input(self, spec, params):
        return spec.out_w % self._zt(spec, params) == 0  # rows not padded: the copy is the identity

    def applies(self, spec):
        return (spec.groups == 1 and spec.r == 1 and spec.s == 1 and spec.stride == (1, 1)
                and not any(spec.pad))

    def _column(self, spec, x, owp):
        # no im2col: the column matrix is the input itself, copied tile by
        # tile (or read in place: _column_is_input)
        last = spec.out_w - 1
        return te.compute((spec.n, spec.c, spec.out_h, owp), lambda n, q, y, z: x[n, q, y, tirx.min(z, last)],
                          name="cb_col")


def _order(params):
    return params.get("order", "rows")


def _with_orders(spec, blocks):
    """The register blocks `blocks(order)` ranks for the loop order that
    streams the smaller operand ("rows": every output row tile runs over all
    the weights, which suits layers with more pixels than output channels;
    "channels": every block of output channels runs over all the pixels, so
    the weights are read once), then the best two in the other order."""
    first, second = ("channels", "rows") if spec.k > spec.out_h * spec.out_w else ("rows", "channels")
    return ([{**b, "order": first} for b in blocks(first)]
            + [{**b, "order": second} for b in blocks(second)[:2]])


def channel_vectors(spec, lanes):
    """Vectors of `lanes` output channels a layer needs (the last one padded)."""
    return (spec.k + lanes - 1) // lanes


class _GemmK(_Gemm):
    """The GEMM with output channels in the vector lanes:
    out[n, k, y, z] = sum_q wt[k // lanes, q, k % lanes] * col[n, q, y, z].

    For narrow outputs (7, 13, 14 columns) a width-vectorized tile wastes
    lanes; here a tile is kvb channel vectors x zt columns of one output row
    (any zt), each column value broadcast from the packed column tile: the
    register block is zt broadcasts x kvb vectors. The tile is accumulated
    channel-innermost and transposed back to NCHW by the epilogue. The
    parallel loop runs over rows, column tiles and ks channel groups, so a
    7-row output still gives every thread work."""

    def _kb(self, params):
        return self.isa.lanes

    def _zt(self, spec, params):
        return min(params["zt"], spec.out_w)

    def _kvb(self, spec, params):
        return next(b for b in (params["kvb"], 2, 1) if channel_vectors(spec, self.isa.lanes) % b == 0)

    def _ks(self, spec, params):
        groups = channel_vectors(spec, self.isa.lanes) // self._kvb(spec, params)
        rows = spec.n * spec.out_h * (round_up(spec.out_w, self._zt(spec, params)) // self._zt(spec, params))
        ks = params.get("ks", 2 if rows < 16 else 1)
        return next(d for d in range(min(ks, groups), 0, -1) if groups % d == 0)

    def compute(self, spec, x, wt, params):
        lanes, zt = self.isa.lanes, self._zt(spec, params)
        owp = round_up(spec.out_w, zt)
        col = self._column(spec, x, owp)
        q = te.reduce_axis((0, spec.c * spec.r * spec.s), "q")
        anchor = te.compute((spec.n, channel_vectors(spec, lanes), spec.out_h, owp, lanes),
                            lambda n, ko, y, z, ki: te.sum(wt[ko, q, ki] * col[n, q, y, z], axis=q), name=ANCHOR)
        return te.compute((spec.n, spec.k, spec.out_h, spec.out_w),
                          lambda n, k, y, z: anchor[n, k // lanes, y, z, k % lanes], name="cb_out")

    def space(self, spec):
        cv = channel_vectors(spec, self.isa.lanes)
        blocks = [(zt, kvb) for zt, kvb in register_blocks(self.isa, range(1, 15), 4)
                  if cv % kvb == 0 and zt <= spec.out_w]
        panel = 4 * self.isa.lanes * spec.c * spec.r * spec.s  # weight bytes per channel vector

        def ranks(order):
            # order "channels" rereads a kvb-vector weight panel for every column tile
            return [{"kvb": kvb, "zt": zt, "qb": self._qb(spec, kvb * self.isa.lanes) if order == "channels" else 0}
                    for zt, kvb in ranked([(intensity(zt, kvb) * padding_efficiency((spec.out_w, zt))
                             * (l1_fit(self.isa, kvb * panel) if order == "channels" else 1.0), (zt, kvb))
                            for zt, kvb in blocks])]

        return _with_orders(spec, ranks)

    def schedule(self, sch, block, spec, params):
        zt, kvb, ks = self._zt(spec, params), self._kvb(spec, params), self._ks(spec, params)
        n, ko, y, z, ki, q = sch.get_loops(block)
        qb, first = params.get("qb", 0), q
        if _order(params) == "rows":
            kg, kb = sch.split(ko, [ks, None])
            kbo, kbi = sch.split(kb, [None, kvb])
            zo, zi = _split_tile(sch, z, zt)
            sch.reorder(n, kg, y, zo, kbo, q, kbi, zi, ki)
            self._parallel_tiles(sch, block, spec, params, [n, kg, y, zo], kbo)
        elif qb:
            # deep reductions: every column tile runs over one weight panel
            # of qb steps while it is in L1, partial sums wait in memory
            kbo, kbi = sch.split(ko, [None, kvb])
            zo, zi = _split_tile(sch, z, zt)
            first, qi = sch.split(q, [None, qb])
            sch.reorder(n, kbo, first, y, zo, qi, kbi, zi, ki)
            self._parallel_tiles(sch, block, spec, params, [n, kbo], None)
        else:
            kbo, kbi = sch.split(ko, [None, kvb])
            zo, zi = _split_tile(sch, z, zt)
            sch.reorder(n, kbo, y, zo, q, kbi, zi, ki)
            self._parallel_tiles(sch, block, spec, params, [n, kbo, y], zo)
        if kvb <= zt:
            # the unrolled block keeps its smaller operand set live: kvb
            # weight vectors across the zt broadcasts (LLVM keeps the order)
            sch.reorder(zi, kbi)
        sch.unroll(kbi)
        sch.unroll(zi)
        sch.vectorize(ki)
        sch.decompose_reduction(block, first)


class Im2colGemmK(_GemmK, Im2colGemm):
    name = "conv2d.im2col_gemm_kvec"


class Gemm1x1K(_GemmK, Gemm1x1):
    name = "conv2d.gemm_1x1_kvec"


def winograd_matrices(m, r=3):
    """F(m x m, r x r)'s Cook-Toom matrices A, B and G (float32)."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + r - 2), m, r)
    return np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(g, np.float32)


def lincomb(mat, col, term):
    """sum_r mat[r, col] * term(r) for a symbolic column index `col`.

    One explicit sum per column over its nonzero entries only (+-1 become
    adds / subtracts), picked by an if_then_else chain on `col`. The
    schedules unroll the loop that `col` comes from, so every copy of the
    body sees a constant `col` and the simplifier folds the chain to one short
    sum: no constant-matrix buffers, no multiplications by zero, small
    expressions. (if_then_else rather than Select: the vectorizer keeps its
    scalar condition, while a Select's is broadcast to a vector and then
    never folds.)"""

    def column(j):
        # positive coefficients first, so that a sum starts without a negation
        rows = sorted((r for r in range(mat.shape[0]) if mat[r, j] != 0), key=lambda r: mat[r, j] < 0)
        expr = None
        for r in rows:
            v, t = float(mat[r, j]), term(r)
            if expr is None:
                expr = t if v == 1.0 else t * tirx.const(v, "float32")
            elif v == 1.0:
                expr = expr + t
            elif v == -1.0:
                expr = expr - t
            else:
                expr = expr + t * tirx.const(v, "float32")
        return expr if expr is not None else tirx.const(0.0, "float32")

    expr = column(mat.shape[1] - 1)
    for j in reversed(range(mat.shape[1] - 1)):
        expr = tirx.if_then_else(col == j, column(j), expr)
    return expr


class Winograd(Variant):
    """F(m x m, 3 x 3) on alpha x alpha input tiles, alpha = m + 2.

    weight transform  U[e, k // kb, c, k % kb] = (G g G^T)[i, j], e = i * alpha + j
    input transform   V[e, c, t] = (B^T d_t B)[i, j] for input tile d_t
    anchor            M[e, k, t] = sum_c U[e, k, c] V[e, c, t]  (alpha^2 GEMMs)
    output transform  Y[k, i, j, t] = (A^T M[:, k, t] A)[i, j], then scattered to NCHW

    Tiles t run over (image, tile row, tile column), padded to a multiple of
    the GEMM's tile width `tt`. Every transform is written as two 1-D passes
    (columns, then rows) of explicit sums over the nonzero matrix entries
    (lincomb), unrolled and vectorized across tt tiles.

    Schedule: the input transform is one parallel pass over (channel, tile
    block). The GEMM runs per (tile block, kb output channels), all alpha^2 of
    them, with a register accumulator per e; the output transform of that
    (tile block, channel block) follows at once, on M still in cache. The
    scatter to NCHW (not an affine map of the tiles) and the fused epilogue
    are one last parallel pass over the output."""

    transform_rearranges = False  # U = G g G^T computes new values

    op = "conv2d"

    def __init__(self, isa, m):
        super().__init__(isa)
        self.m = m
        self.alpha = m + 2
        self.name = f"conv2d.winograd_f{m}"

    def applies(self, spec):
        # F(6x6) needs two whole tiles per side: on smaller outputs (7x7, 8x8)
        # it computes 12x12 (2.3-2.9x the work) from 64/9 times the weights,
        # and loses to the GEMM variants on every layer measured
        least = 2 * self.m if self.m == 6 else self.m
        return (spec.groups == 1 and spec.r == 3 and spec.s == 3 and spec.stride == (1, 1)
                and spec.dilation == (1, 1) and spec.out_h >= least and spec.out_w >= least)

    def transformed_shape(self, spec, params):
        kb = params["kb"]
        return (self.alpha * self.alpha, (spec.k + kb - 1) // kb, spec.c, kb)

    def transform(self, spec, params):
        gm = winograd_matrices(self.m)[2].T  # G^T: 3 x alpha
        alpha, kmax, kb = self.alpha, spec.k - 1, params["kb"]
        kp = round_up(spec.k, kb)

        def fn(w):
            # U = G g G^T in two passes: (G g)[i, r2], then its rows times G^T
            gg = te.compute((spec.c, alpha, 3, kp),
                            lambda c, i, r2, k: lincomb(gm, i, lambda r1: w[tirx.min(k, kmax), c, r1, r2]),
                            name="cb_wino_gg")

            def u_value(e, ko, c, ki):
                k = ko * kb + ki
                u = lincomb(gm, e % alpha, lambda r2: gg[c, e // alpha, r2, k])
                return tirx.Select(k <= kmax, u, tirx.const(0.0, spec.dtype))  # zero filters pad k to kb

            return te.compute(self.transformed_shape(spec, params), u_value, name="cb_wino_u")

        return fn

    def schedule_transform(self, sch):
        # parallel over (output-channel block, input channel); G g for the
        # kb filters in a local buffer, then the alpha^2 entries, vectorized
        # over the kb filters
        u = sch.get_sblock("cb_wino_u")
        e, ko, c, ki = sch.get_loops(u)
        i, j = sch.split(e, [self.alpha, self.alpha])
        sch.reorder(ko, c, i, j, ki)
        par = sch.fuse(ko, c)
        sch.parallel(par)
        sch.unroll(j)
        sch.vectorize(ki)
        gg = sch.get_sblock("cb_wino_gg")
        sch.compute_at(gg, par)
        sch.set_scope(gg, 0, TILE_SCOPE)
        i, r2, k = sch.get_loops(gg)[-3:]
        sch.reorder(r2, i, k)
        sch.unroll(i)
        sch.vectorize(k)
        return True

    def _tiles(self, spec):
        m = self.m
        nh, nw = (spec.out_h + m - 1) // m, (spec.out_w + m - 1) // m
        return nh, nw, spec.n * nh * nw

    def _tt(self, spec, params):
        return min(params["tt"], round_up(self._tiles(spec)[2], self.isa.lanes))

    def space(self, spec):
        # kb output channels x tt tiles (a multiple of the vector): the
        # register block of each of the alpha^2 GEMMs. The block of M a task
        # keeps, alpha^2 x kb x tt floats, should stay in L1 (F(2x2) affords
        # the widest tiles, F(6x6) the narrowest)
        lanes, tiles = self.isa.lanes, self._tiles(spec)[2]
        l1 = self.isa.l1d_kb * 1024

        def score(kb, tt):
            fits = 1.0 if self.alpha ** 2 * kb * tt * 4 <= l1 else 0.5
            return intensity(kb, tt // lanes) * fits * padding_efficiency((spec.k, kb), (tiles, tt))

        blocks = [(kb, v * lanes) for kb, v in register_blocks(self.isa, (4, 6, 8, 12, 16), 2)
                  if v == 1 or (v - 1) * lanes < tiles]
        return [{"kb": kb, "tt": tt} for kb, tt in ranked([(score(kb, tt), (kb, tt)) for kb, tt in blocks])]

    def compute(self, spec, x, wt, params):
        m, alpha = self.m, self.alpha
        a, b, _ = winograd_matrices(m)
        nh, nw, tiles = self._tiles(spec)
        tp = round_up(tiles, self._tt(spec, params))
        kb = params["kb"]
        kp = round_up(spec.k, kb)
        pt, pl = spec.pad[0], spec.pad[1]
        h, w = spec.h, spec.w
        d = te.compute(  # padded so that every tile is whole
            (spec.n, spec.c, nh * m + 2, nw * m + 2),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl), x[n, c, y - pt, z - pl], tirx.const(0, spec.dtype)),
            name=PAD)

        def tile(t):
            t = tirx.min(t, tiles - 1)  # tiles past the last are computed and dropped
            return t // (nh * nw), (t % (nh * nw)) // nw * m, t % nw * m

        def bd(c, i, s, t):  # (B^T d)[i, s]
            n, y0, z0 = tile(t)
            return lincomb(b, i, lambda r: d[n, c, y0 + r, z0 + s])

        bd = te.compute((spec.c, alpha, alpha, tp), bd, name="cb_wino_bd")
        v = te.compute((alpha * alpha, spec.c, tp),
                       lambda e, c, t: lincomb(b, e % alpha, lambda s: bd[c, e // alpha, s, t]), name="cb_wino_v")
        rc = te.reduce_axis((0, spec.c), "rc")
        mm = te.compute((alpha * alpha, kp, tp),
                        lambda e, k, t: te.sum(wt[e, k // kb, rc, k % kb] * v[e, rc, t], axis=rc), name=ANCHOR)
        ma = te.compute((kp, alpha, m, tp),  # (M A)[s1, j]
                        lambda k, s1, j, t: lincomb(a, j, lambda s2: mm[s1 * alpha + s2, k, t]), name="cb_wino_ma")
        y = te.compute((kp, m, m, tp),  # (A^T M A)[i, j]
                       lambda k, i, j, t: lincomb(a, i, lambda s1: ma[k, s1, j, t]), name="cb_wino_y")
        return te.compute(
            (spec.n, spec.k, spec.out_h, spec.out_w),
            lambda n, k, yy, zz: y[k, yy % m, zz % m, n * nh * nw + yy // m * nw + zz // m], name="cb_out")

    def schedule(self, sch, block, spec, params):
        tt, kb, lanes = self._tt(spec, params), params["kb"], self.isa.lanes
        alpha = self.alpha
        pad_pass(sch, lanes)

        # input transform, parallel over (channel, tile block). Each pass
        # unrolls the index its sums are selected by (lincomb) and loops
        # over the other one: short bodies, short compiles.
        v = sch.get_sblock("cb_wino_v")
        e, c, t = sch.get_loops(v)
        to, ti = sch.split(t, [None, tt])
        ei, ej = sch.split(e, [alpha, alpha])
        sch.reorder(c, to, ei, ej, ti)
        par = sch.fuse(c, to)
        sch.parallel(par)
        sch.unroll(ej)
        _vectorize(sch, ti, tt, lanes)
        bd = sch.get_sblock("cb_wino_bd")  # B^T d: alpha x alpha x tt per task
        sch.compute_at(bd, par)
        sch.set_scope(bd, 0, TILE_SCOPE)
        i, s, bt = sch.get_loops(bd)[-3:]
        sch.reorder(s, i, bt)
        sch.unroll(i)
        _vectorize(sch, bt, tt, lanes)

        # the output transform's tiles set the loop nest: parallel over
        # (tile block, kb output channels); the GEMM and the first transform
        # pass of that tile are computed inside it (compute_at: the second
        # pass reads the first at constant rows, which reverse_compute_at
        # cannot attach)
        y = sch.get_sblock("cb_wino_y")
        k, i, j, t = sch.get_loops(y)
        ko, ki = sch.split(k, [None, kb])
        to, ti = sch.split(t, [None, tt])
        sch.reorder(to, ko, ki, i, j, ti)
        par = sch.fuse(to, ko)
        sch.parallel(par)
        ma = sch.get_sblock("cb_wino_ma")
        sch.compute_at(ma, par)
        sch.set_scope(ma, 0, TILE_SCOPE)
        sch.compute_at(block, par, preserve_unit_loops=True)  # keeps rc when C == 1
        _, s1, j, bt = sch.get_loops(ma)[-4:]  # M A: loop over s1, unroll j
        sch.unroll(j)
        _vectorize(sch, bt, tt, lanes)
        _, i, j, bt = sch.get_loops(y)[-4:]  # A^T (M A): loop over j, unroll i
        sch.reorder(j, i, bt)
        sch.unroll(i)
        _vectorize(sch, bt, tt, lanes)

        # batched GEMM of the tile: for each e a kb x tt register tile
        # accumulated over the input channels, then kept in M (local)
        e, ki, ti, rc = sch.get_loops(block)[-4:]
        sch.reorder(e, rc, ki, ti)
        acc = sch.cache_write(block, 0, TILE_SCOPE)
        sch.reverse_compute_at(acc, e)
        sch.set_scope(acc, 0, TILE_SCOPE)  # M: alpha^2 x kb x tt per task
        sch.unroll(ki)
        _vectorize(sch, ti, tt, lanes)
        sch.decompose_reduction(block, rc)
        ai, at = sch.get_loops(acc)[-2:]
        sch.unroll(ai)
        _vectorize(sch, at, tt, lanes)

        # scatter to NCHW + fused epilogue: one parallel pass over the output
        scatter_pass(sch, "cb_wino_y", lanes)


def scatter_pass(sch, last, lanes):
    """The stages after `last` (a scatter of Winograd's tiles to the output
    layout, not an affine map of them, and the fused epilogue) inlined into
    the final one: one parallel pass over the output."""
    order = blocks_in_order(sch)
    names = [block_name(sch, b) for b in order]
    after = order[names.index(last) + 1:]
    for b in after[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            pass
    for b in after:
        try:
            sch.get_loops(b)
        except Exception:
            continue  # inlined
        generic_block(sch, b, lanes)


def _vectorize(sch, loop, extent, lanes):
    """Vectorize a tile loop of `extent` elements in pieces of one vector
    register (`lanes`), unrolled; an extent that is not a multiple of the
    vector is vectorized whole."""
    if extent % lanes:
        sch.vectorize(loop)
        return
    if extent > lanes:
        lo, loop = sch.split(loop, [None, lanes])
        sch.unroll(lo)
    sch.vectorize(loop)


class DepthwiseDirect(Variant):
    name = "conv2d.depthwise_direct"
    op = "conv2d"

    def applies(self, spec):
        return spec.depthwise

    def transformed_shape(self, spec, params):
        return (spec.k, spec.r * spec.s)

    def transform(self, spec, params):
        return lambda w: te.compute(self.transformed_shape(spec, params),
                                    lambda k, q: w[k, 0, q // spec.s, q % spec.s], name="cb_pack")

    def compute(self, spec, x, wt, params):
        """The padded input, split into column phases (_phase_split)."""
        owp = round_up(spec.out_w, self._zb(spec, params))
        tap = _phase_split(x, spec, owp)
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        anchor = te.compute(
            (spec.n, spec.k, spec.out_h, owp),
            lambda n, k, y, z: te.sum(tap(n, k, y, z, rr, rs) * wt[k, rr * spec.s + rs], axis=[rr, rs]),
            name=ANCHOR)
        return _crop(anchor, spec)

    def _zb(self, spec, params):
        return min(params["zb"], round_up(spec.out_w, self.isa.lanes // 2))

    def space(self, spec):
        # one accumulator vector per column block, one load per tap: the
        # width that pads the row least, one whole vector where it ties
        lanes = self.isa.lanes
        widths = [lanes, 2 * lanes] + ([lanes // 2] if lanes >= 8 else [])
        return [{"zb": zb} for zb in ranked([(padding_efficiency((spec.out_w, zb)) - 0.01 * (zb != lanes), zb)
                                              for zb in widths])]

    def schedule(self, sch, block, spec, params):
        lanes = self.isa.lanes
        zb = self._zb(spec, params)
        n, k, y, z, rr, rs = sch.get_loops(block)
        zo, zi = _split_tile(sch, z, zb)
        sch.reorder(n, k, y, zo, rr, rs, zi)
        par = sch.fuse(n, k)
        sch.parallel(par)
        pad = sch.get_sblock(PAD)
        sch.compute_at(pad, par, preserve_unit_loops=True)  # one channel's plane, right before use
        vectorize_inner(sch, pad, lanes)
        attach_epilogue(sch, block, zo, lanes)
        sch.unroll(rr)
        sch.unroll(rs)
        _vectorize(sch, zi, zb, lanes)
        sch.decompose_reduction(block, rr)


for _cls in (Direct, PackedDirect, Im2colGemm, Gemm1x1, Im2colGemmK, Gemm1x1K, DepthwiseDirect):
    register(_cls.name, _cls)
for _m in (2, 4, 6):
    register(f"conv2d.winograd_f{_m}", lambda isa, m=_m: Winograd(isa, m))

__all__ = ["ConvSpec"]
