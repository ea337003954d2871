"""conv2d variants on blocked activations (NCHW{b}c, b = the vector's fp32
lanes; compiler/passes/block_layout.py decides which layers use them).

blocked            output blocked; input blocked, or NCHW where its channels
                   are not a multiple of b (a first layer's 3 channels).
                   A tile is kvb output channel blocks x zt output columns of
                   one row: kvb * zt accumulator vectors. Per input channel
                   and filter tap the tile loads kvb weight vectors (b output
                   channels each) and broadcasts zt input values, so no
                   stride, width or channel count wastes a lane
depthwise_blocked  one filter per channel, the b channels of a block in the
                   lanes: every tap is one vector load, whatever the stride
winograd_f{2,4,6}_blocked
                   F(m x m, 3 x 3) with the b channels of a block in the
                   lanes of every transform (3x3 stride 1): a Winograd-domain
                   GEMM of tt tiles x kvb output channel blocks per element
im2col_blocked     a GEMM over (channel, tap) with a packed weight panel:
                   parallel over output row tiles, the tile's column matrix
                   copied once and reused by every output channel block
gemm_1x1_blocked   the same GEMM on 1x1 stride-1 layers, the input read in
                   place as the column matrix
pair_blocked       blocked on a quantized layer's integers (ConvSpec.in_scale):
                   input and weights as int16, two products per int32 lane
                   (vpmaddwd), exact

Weights are packed so that a tile's weight vectors are contiguous:
[K / b, C / cb, R, S, cb, b], cb = the input's channel block (1 for NCHW).
"""
from tvm import s_tir, te, tirx

from .contract import ANCHOR, Variant, simplified, register
from .conv import Winograd, lincomb, scatter_pass, winograd_matrices
from .dense import INT8_DOT, pair_update, rewritten
from .generic import TILE_SCOPE, multiple, proved, vectorize_inner
from .schedule import (PAD, attach_epilogue, fuse_parallel, intensity, l1_fit, pad_pass, pad_stage, padding_efficiency, ranked,
                       register_blocks, round_up, streamed_cost)


def _padded_extents(spec, owp):
    """(rows, columns) of the input padded by the conv's pads and at the
    right wide enough for `owp` output columns, and the columns owp reads."""
    pt, pl, pb, pr = spec.pad
    need, wide = (owp - 1) * spec.stride[1] + (spec.s - 1) * spec.dilation[1] + 1, spec.w + pl + pr
    wp = simplified(wide + (owp - spec.out_w) * spec.stride[1]) if spec.symbolic else max(need, wide)
    return spec.h + pt + pb, wp, need


def _padded(x, spec, owp):
    """x (NCHW or blocked) zero-padded by the conv's pads, and at the right
    wide enough for `owp` output columns; x itself when nothing is added.
    Sized at run time: the padded input and the columns owp reads past
    out_w's (which read none past it), a width TVM proves wide enough."""
    pt, pl = spec.pad[:2]
    hp, wp, need = _padded_extents(spec, owp)
    if not any(spec.pad) and proved(need <= spec.w):
        return x
    shape = list(spec.input_shape)
    shape[2], shape[3] = hp, wp

    def value(n, c, y, z, *lane):
        inside = tirx.all(y >= pt, y < spec.h + pt, z >= pl, z < spec.w + pl)
        return tirx.if_then_else(inside, x[(n, c, y - pt, z - pl, *lane)], tirx.const(0, spec.dtype))

    return te.compute(shape, value, name=PAD)


class _AnchorRow:
    """The anchor's row: out_w padded to whole tiles of zt, one axis (`exact`: out_w itself, its
    last tile partial: row_tail); sized at run time where zt does not divide out_w at every size,
    two (tiles, zt), which TVM proves cover the row (one axis of W * 4 it did not: the epilogue was
    a pass of its own). `padded`: ceil(out_w / zt) * zt in the form it proves >= out_w (a pad stage
    made wide enough: _input): tiles x zt, not round_up's."""

    def __init__(self, spec, zt, exact=False):
        self.zt, self.split = zt, spec.symbolic and not multiple(spec.out_w, zt)
        tiles = simplified(tirx.floordiv(spec.out_w - 1, zt) + 1)
        self.padded = (simplified(tiles * zt) if self.split else
                       spec.out_w if spec.symbolic or exact else round_up(spec.out_w, zt))
        self.axes = (tiles, zt) if self.split else (self.padded,)

    def compute(self, spec, value, kblocks=None):
        """The anchor, value(n, ko, y, z, ki) at every column z of the axes
        and every one of `kblocks` output channel blocks (spec's, or more:
        whole panels, channel_blocks), cropped to out_w and spec's channels."""
        zt, split = self.zt, self.split
        kblocks = kblocks or spec.k // spec.out_block
        anchor = te.compute((spec.n, kblocks, spec.out_h, *self.axes, spec.out_block),
                            lambda n, ko, y, *zz: value(n, ko, y, zz[0] * zt + zz[1] if split else zz[0], zz[-1]),
                            name=ANCHOR)
        if not split and proved(self.padded == spec.out_w) and kblocks == spec.k // spec.out_block:
            return anchor
        return te.compute(spec.output_shape, lambda n, k, y, z, *lane: anchor[
            (n, k, y, *((tirx.floordiv(z, zt), tirx.floormod(z, zt)) if split else (z,)), *lane)], name="cb_out")


def _anchor_loops(sch, block, zt, kvb, reductions):
    """The anchor's loops: n, ko (split into kvb-vector blocks where kvb is
    given), y, the row tile and the column in it (_AnchorRow's two axes, or
    its one split into tiles of zt), the lanes, then the reductions."""
    loops = sch.get_loops(block)
    row, rest = loops[3:-1 - reductions], loops[-1 - reductions:]
    ko = sch.split(loops[1], [None, kvb]) if kvb else [loops[1]]
    return (loops[0], *ko, loops[2], *(row if len(row) == 2 else sch.split(row[0], [None, zt])), *rest)


TAIL_REDUCTION = 64  # products per output under which a row's last tile apart costs more than its padding


def row_tail(spec, zt, isa):
    """Whether a row that tiles of zt do not divide runs its last columns as a narrower tile of
    their own rather than padded to whole tiles (docs/kernels.md, "The row's last tile"): fixed
    sizes, a padded layer (unpadded ones keep dividing tiles: copy_share), TAIL_REDUCTION products
    per output or more, a panel's output row (4 vectors x out_w, the epilogue's input) in half of L1."""
    return (not spec.symbolic and any(spec.pad) and spec.out_w > zt and spec.out_w % zt != 0
            and spec.c * spec.r * spec.s >= TAIL_REDUCTION and 16 * isa.lanes * spec.out_w <= isa.l1d_kb * 512)


def _last_tile_apart(sch, tiles, spec, whole):
    """The tile loop split into its `whole` tiles and the partial last one (whose columns past the
    row fold away as it unrolls), each copy's reduction decomposed and its rows bounded."""
    sch.loop_partition(tiles, [tirx.const(whole, str(sch.get(tiles).loop_var.ty)), None])
    copies, todo = [], [sch.get_sblock("root")]
    while todo:
        for c in sch.get_child_blocks(todo.pop()):
            (todo if sch.get_child_blocks(c) else copies).append(c)
    for c in copies:
        co = [lp for lp in sch.get_loops(c) if sch.get(lp).loop_var.name == "co"]
        if sch.get(c).name_hint.startswith(ANCHOR + "_") and co:  # not its write-back, where it has one
            sch.decompose_reduction(c, co[0])
            rows_on_the_input(sch, c, spec)()


def _input(x, spec, owp):
    """(the input the anchor reads, padded; the column a column of the
    anchor's row reads it at): itself, or sized at run time, where there is
    no pad stage to make wide enough for the padded row (one would copy the
    input), at most the last (a min per tap: PP-OCRv4 rec's depthwise
    layers 1.7x slower; a test of the column kept the tile out of registers)."""
    if not spec.symbolic or any(spec.pad):
        return _padded(x, spec, owp), lambda z: z
    p = _padded(x, spec, spec.out_w)
    return (p, lambda z: z) if proved(owp == spec.out_w) else (p, lambda z: tirx.min(z, spec.out_w - 1))


FLOPS_PER_COPIED_BYTE = 2  # per fp32 lane: a byte copied through memory costs about as long as 2 * lanes flops


def copy_share(spec, zt, lanes):
    """The time an unpadded layer's input copy takes beside its products,
    where a row tile of zt columns reads past the input's row (the input is
    then copied, padded, in a pass of its own: read and written once), else
    0. A layer with pads is copied whatever the tile."""
    if any(spec.pad) or spec.symbolic or _padded_extents(spec, round_up(spec.out_w, zt))[2] <= spec.w:
        return 0.0
    copied = 2 * spec.n * spec.c * spec.h * spec.w * 4
    flops = 2 * spec.n * spec.k * spec.c * spec.r * spec.s * spec.out_h * spec.out_w
    return copied * FLOPS_PER_COPIED_BYTE * lanes / flops


def register_space(variant, spec, fit=lambda zt: 1.0):
    """[{"kvb", "zt"}] register blocks of a convolution on the blocked
    layout, best first: zt broadcast input values x kvb weight vectors (the
    variant's `register_blocks`), ranked by arithmetic intensity, the row's
    and the channels' padding, the input's copy where the tile makes one
    (variant.copy_share) and `fit(zt)`; a weight vector counts as
    schedule.streamed_cost loads (docs/kernels.md, "Weights streamed from L2").
    kvb need not divide the channel blocks: the last panel is padded
    (channel_blocks), so 1000 classes on AVX2 (125 blocks of 8) get a
    3 x 3 block rather than 1 x 13 (squeezenet's last layer 3.1 -> 1.5 ms)."""
    kblocks = spec.k // variant.isa.lanes
    weight_cost = streamed_cost(variant.isa, spec.k * spec.c * spec.r * spec.s * variant.value_bytes)
    return [{"kvb": kvb, "zt": zt} for zt, kvb in ranked(
        [(intensity(zt, kvb, weight_cost) * padding_efficiency((spec.out_w, zt), (kblocks, kvb)) * fit(zt)
          / (1 + variant.copy_share(spec, zt)), (zt, kvb))
         for zt, kvb in variant.register_blocks(spec, [z for z in range(1, 15) if z <= spec.out_w])])]


STREAMED_INTENSITY = 32  # products per input byte under which a panel's pass over the input waits on memory
STREAMED_L2 = 8  # an input over this many L2s is read from memory on every pass (it left the last-level cache)


def rows_outer(spec, kvb, isa, value_bytes):
    """Whether a blocked convolution runs its output rows outside its
    channel panels (every panel of a row, then the next row) rather than
    inside (every row of a panel, then the next panel). Rows inside read
    the whole input from memory once per panel of kvb channel blocks,
    each byte of it feeding kvb x lanes x R x S / (stride^2 x bytes)
    products; rows outside read all the weights once per output row (from
    the caches) while the input rows one output row reads stay there.
    Rows go outside where they read fewer bytes and the input leaves the
    caches between panels: it exceeds the last-level cache (isa.l3_kb,
    where the target knows one), or it exceeds STREAMED_L2 L2s and a
    panel's pass feeds under STREAMED_INTENSITY products per byte (the
    zoo's inputs, at most 3.2 MB, stay inside). Measured on AVX2 (Zen 3,
    32 MB L3, 2 threads): 80 -> 120 at 464 x 464, stride 2 (13.5 per
    byte): 155 -> 96 ms fp32, 100 -> 65 ms int16; 160 -> 240 at 232,
    stride 2, int16 (27): 91-114 -> 67-78 ms; 128 -> 64 at 320, stride 1,
    fp32 (36 per byte, a 52 MB input): 116-150 -> 95-122 ms in three of
    four interleaved measurements; 128 -> 128 at 112 (6.4 MB, fits the
    L3): the same either way unless other tenants take the L3."""
    if spec.symbolic:
        return False
    panels = -(-spec.k // (isa.lanes * kvb))
    intensity = kvb * isa.lanes * spec.r * spec.s / (spec.stride[0] * spec.stride[1] * value_bytes)
    input_bytes = spec.n * spec.c * spec.h * spec.w * value_bytes
    weight_bytes = spec.k * spec.c * spec.r * spec.s * value_bytes
    streamed = (input_bytes > STREAMED_L2 * isa.l2_kb * 1024 and intensity < STREAMED_INTENSITY
                or 0 < isa.l3_kb * 1024 < input_bytes)
    return streamed and spec.n * spec.out_h * weight_bytes < panels * input_bytes


def channel_blocks(spec, lanes, kvb):
    """Output channel blocks a register block of kvb vectors computes: the
    spec's up to whole panels of kvb (the extra channels' weights are zero,
    their outputs cropped)."""
    return round_up(spec.k // lanes, kvb)


def _packed(w, spec, padded, k, *index):
    """w[k, index...]; where the panels are `padded` past spec's channels, 0 for those past them."""
    if not padded:
        return w[(k, *index)]
    return tirx.if_then_else(k < spec.k, w[(tirx.min(k, spec.k - 1), *index)], tirx.const(0, w.dtype))

def rows_on_the_input(sch, block, spec):
    """The anchor's loop over the filter's rows (rr) runs, at each output
    row, over the rows that land on the input rather than its top or bottom
    pads, skipping zero products (docs/kernels.md, "Border rows skip the
    padding"). The bounds follow the output row the anchor's binding
    computes (its third iteration variable) and the padded input's rows as
    the kernel has them (sized at run time, its own variable: `spec` holds
    the typical sizes there). Returns the step that bounds the loop, to run
    after the schedule's other steps (a blockize takes loops of constant
    bounds); the bounds are read now, before a blockize hides the binding."""
    pt, pb = spec.pad[0], spec.pad[2]
    if not (pt > 0 or pb > 0):
        return lambda: None
    (sh, _), (dh, _) = spec.stride, spec.dilation
    rr = next(lp for lp in sch.get_loops(block) if sch.get(lp).loop_var.name == "rr")
    loop = sch.get(rr)
    node = loop.body
    while isinstance(node, tirx.For):
        node = node.body
    padded = [r.source for r in node.block.reads if r.source.name == PAD]
    if not padded:
        return lambda: None
    dt = str(loop.loop_var.ty)
    c = lambda v: tirx.const(v, dt) if isinstance(v, int) else (v if str(v.ty) == dt else tirx.Cast(dt, v))
    y, rows = c(node.iter_values[2]), c(padded[0].shape[2])  # the anchor's (n, ko, y, ...); pt + h + pb
    first = tirx.max(c(0), tirx.floordiv(c(pt) - y * c(sh) + c(dh - 1), c(dh)))
    end = tirx.min(c(spec.r), tirx.floordiv(rows - c(pb) - y * c(sh) + c(dh - 1), c(dh)))
    extent = tirx.max(end - first, c(0))

    def bound():
        now = sch.get(rr)
        sch.state.replace(sch.get_sref(rr), tirx.For(now.loop_var, first, extent, now.kind, now.body,
                                                      now.thread_binding, now.annotations))
    return bound


class _OnBlocks(Variant):
    op = "conv2d"
    blocked = True
    symbolic = True  # rows and columns sized at run time: the row padded to whole tiles at every size
    extra_registers = 0  # registers a reduction step holds besides its block, loads and broadcast
    value_bytes = 4  # bytes of an input value and of a packed weight (fp32)

    def register_blocks(self, spec, widths):
        """(zt, kvb) register blocks this variant may run: zt columns of
        `widths`, kvb vectors within the output channel blocks, fitting
        the register file (schedule.register_blocks, extra_registers; where
        taps_innermost, the compiler keeps each column's broadcast for the
        taps that read it again: zt live, not one; counted as one, 7x7
        first layers spilled: docs/kernels.md)."""
        kblocks = spec.k // self.isa.lanes
        return [(zt, kvb) for zt, kvb in register_blocks(self.isa, widths, 4, self.extra_registers,
                                                          self.taps_innermost(spec)) if kvb <= kblocks]

    def taps_innermost(self, spec):
        return False

    def copy_share(self, spec, zt):
        """copy_share: the input's copy beside the products, for a row tile of zt."""
        return copy_share(spec, zt, self.isa.lanes)


class Blocked(_OnBlocks):
    name = "conv2d.blocked"

    def applies(self, spec):
        b = self.isa.lanes
        return (spec.groups == 1 and spec.out_block == b and spec.k % b == 0
                and spec.in_block in (0, b) and spec.c % (spec.in_block or 1) == 0)

    def taps_innermost(self, spec):
        """Whether a filter row's taps are the innermost reduction (an NCHW
        input) and adjacent columns' windows overlap (values read again)."""
        return not spec.in_block and spec.stride[1] < (spec.s - 1) * spec.dilation[1] + 1

    def transformed_shape(self, spec, params):
        b, cb = self.isa.lanes, spec.in_block or 1
        return (channel_blocks(spec, b, params["kvb"]), spec.c // cb, spec.r, spec.s, cb, b)

    def transform(self, spec, params):
        b, cb = self.isa.lanes, spec.in_block or 1
        padded = channel_blocks(spec, b, params["kvb"]) * b > spec.k
        return lambda w: te.compute(self.transformed_shape(spec, params), lambda ko, co, r, s, ci, ki: _packed(
            w, spec, padded, ko * b + ki, co * cb + ci, r, s), name="cb_pack")

    def compute(self, spec, x, wt, params):
        cb, zt = spec.in_block or 1, params["zt"]
        row = _AnchorRow(spec, zt, exact=row_tail(spec, zt, self.isa))
        p, column = _input(x, spec, row.padded)
        co = te.reduce_axis((0, spec.c // cb), "co")
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        ci = te.reduce_axis((0, cb), "ci")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation

        def tap(n, y, z):
            iy, iz = y * sh + rr * dh, column(z) * sw + rs * dw
            return p[n, co, iy, iz, ci] if spec.in_block else p[n, co + ci, iy, iz]

        return row.compute(spec, lambda n, ko, y, z, ki: te.sum(tap(n, y, z) * wt[ko, co, rr, rs, ci, ki],
                                                                axis=[co, rr, rs, ci]),
                           channel_blocks(spec, self.isa.lanes, params["kvb"]))

    def space(self, spec):
        return [{**p, "rows_outer": rows_outer(spec, p["kvb"], self.isa, self.value_bytes)}
                for p in register_space(self, spec)]

    def schedule(self, sch, block, spec, params):
        b = self.isa.lanes
        n, koo, koi, y, zo, zi, ki, co, rr, rs, ci = _anchor_loops(sch, block, params["zt"], params["kvb"], 4)
        # per input value: one broadcast, then the kvb weight vectors it meets
        outer = (y, koo) if params.get("rows_outer") else (koo, y)
        sch.reorder(n, *outer, zo, co, rr, rs, ci, zi, koi, ki)
        par = fuse_parallel(sch, n, *outer)
        pad_pass(sch, b)  # its own parallel pass, once per layer
        # (a ConvTranspose's phases carry typical sizes in `spec` over a row sized at run time: no tail)
        tail = row_tail(spec, params["zt"], self.isa) and isinstance(sch.get(zo).extent, tirx.IntImm)
        attach_epilogue(sch, block, par if tail else zo, b)  # a partial last tile: the epilogue after the row
        sch.unroll(koi)
        sch.unroll(zi)
        sch.vectorize(ki)
        if tail:
            _last_tile_apart(sch, zo, spec, spec.out_w // params["zt"])
            return
        sch.decompose_reduction(block, co)
        rows_on_the_input(sch, block, spec)()


PAIR_BOUND = 255  # |value| of an integer PairBlocked multiplies (8-bit values less a zero point)


class PairBlocked(Blocked):
    """conv2d.blocked on a quantized layer's integers: its input on a grid
    (ConvSpec.in_scale: x = in_scale * q, |q| <= 255: a ConvInteger's
    input less its zero point, a DequantizeLinear's output) and its weights
    the model's integers times a scale per output channel (|w| <= 255: 8-bit
    weights less their zero point, which need not fit int8). The input is
    turned into int16 q in the padding pass, channel pairs adjacent
    ([N, C / cb, H', W', cb]); the weights are stored int16, packed
    [K / b, C / cb, R, S, cb / 2, b, 2]. Per pair of input channels and tap
    the tile broadcasts zt pairs and multiplies them by kvb weight vectors,
    two products summed into each int32 lane (vpmaddwd: 16 products per
    AVX2 instruction, exact: 255 x 255 x 2 and every sum of up to
    PAIR_BOUND^2 x C x R x S < 2^31 fit); each output is its sum times
    in_scale x its channel's weight scale (the `scale` argument)."""

    name = "conv2d.pair_blocked"
    integer = True
    weight_dtype = "int16"
    value_bytes = 2

    def applies(self, spec):
        return (self.isa.isa in ("avx2", "avx512") and spec.in_scale > 0 and Blocked.applies(self, spec)
                and PAIR_BOUND ** 2 * spec.c * spec.r * spec.s < 2 ** 31)

    def _cb(self, spec):
        """Input channels per block of the int16 input: the vector's (the
        blocked layout's), or a narrow first layer's own, made even."""
        return spec.in_block or min(self.isa.lanes, round_up(spec.c, 2))

    def transformed_shape(self, spec, params):
        b, cb = self.isa.lanes, self._cb(spec)
        return (channel_blocks(spec, b, params["kvb"]), -(-spec.c // cb), spec.r, spec.s, cb // 2, b, 2)

    def transform(self, spec, params):
        b, cb = self.isa.lanes, self._cb(spec)

        def value(w, ko, co, r, s, cp, ki, t):
            k, c = ko * b + ki, co * cb + cp * 2 + t
            return tirx.if_then_else(tirx.all(k < spec.k, c < spec.c), w[tirx.min(k, spec.k - 1), tirx.min(c, spec.c - 1), r, s],
                                     tirx.const(0, w.dtype))
        return lambda w: te.compute(self.transformed_shape(spec, params), lambda *i: value(w, *i), name="cb_pack")

    def compute(self, spec, x, wt, params, scale):
        cb, zt = self._cb(spec), params["zt"]
        row = _AnchorRow(spec, zt)
        q = _integers16(x, spec, row.padded, cb)
        co = te.reduce_axis((0, q.shape[1]), "co")
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        cp = te.reduce_axis((0, cb // 2), "cp")
        t = te.reduce_axis((0, 2), "t")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        acc = row.compute(spec, lambda n, ko, y, z, ki: te.sum(
            q[n, co, y * sh + rr * dh, z * sw + rs * dw, cp * 2 + t].astype("int32")
            * wt[ko, co, rr, rs, cp, ki, t].astype("int32"), axis=[co, rr, rs, cp, t]),
            channel_blocks(spec, self.isa.lanes, params["kvb"]))
        return te.compute(spec.output_shape, lambda n, ko, y, z, ki: acc[n, ko, y, z, ki].astype("float32")
                          * scale[ko, ki], name="cb_scaled")

    extra_registers = 1  # a product is a register of its own before its add

    def taps_innermost(self, spec):
        return False  # a pair of channels is the innermost reduction, whatever the input's layout

    def copy_share(self, spec, zt):
        return 0.0  # the int16 input is a copy whatever the tile

    def schedule(self, sch, block, spec, params):
        b = self.isa.lanes
        n, koo, koi, y, zo, zi, ki, co, rr, rs, cp, t = _anchor_loops(sch, block, params["zt"], params["kvb"], 5)
        outer = (y, koo) if params.get("rows_outer") else (koo, y)
        sch.reorder(n, *outer, zo, co, rr, rs, cp, zi, koi, ki, t)
        fuse_parallel(sch, n, *outer)
        pad_pass(sch, b)  # the int16 conversion, its own parallel pass
        attach_epilogue(sch, block, zo, b)
        sch.unroll(koi)
        sch.unroll(zi)
        sch.decompose_reduction(block, co)
        bound_rows = rows_on_the_input(sch, block, spec)
        sch.annotate(sch.blockize(ki), INT8_DOT, 1)
        bound_rows()

    def finish(self, func):
        return func.with_body(rewritten(func.body, pair_update, INT8_DOT))


def _integers16(x, spec, owp, cb):
    """The conv's input as the int16 integers of its grid (round(x /
    in_scale)), zero-padded by the conv's pads and at the right wide enough
    for `owp` output columns, its channels in blocks of cb ([N, C / cb, H',
    W', cb], the last block padded with zeros): from NCHW or blocked x."""
    pt, pl = spec.pad[:2]
    hp, wp, _ = _padded_extents(spec, owp)
    inv, b = 1.0 / spec.in_scale, spec.in_block

    def value(n, co, y, z, ci):
        c = tirx.min(co * cb + ci, spec.c - 1)
        inside = tirx.all(y >= pt, y < spec.h + pt, z >= pl, z < spec.w + pl, co * cb + ci < spec.c)
        v = x[n, c // b, y - pt, z - pl, c % b] if b else x[n, c, y - pt, z - pl]
        return tirx.if_then_else(inside, tirx.Cast("int16", tirx.round(v * inv)), tirx.const(0, "int16"))

    return te.compute((spec.n, -(-spec.c // cb), hp, wp, cb), value, name=PAD)


class DepthwiseBlocked(_OnBlocks):
    name = "conv2d.depthwise_blocked"

    def applies(self, spec):
        b = self.isa.lanes
        return spec.depthwise and spec.in_block == spec.out_block == b and spec.c % b == 0

    def transformed_shape(self, spec, params):
        b = self.isa.lanes
        return (spec.k // b, spec.r, spec.s, b)

    def transform(self, spec, params):
        b = self.isa.lanes
        return lambda w: te.compute(self.transformed_shape(spec, params),
                                    lambda ko, r, s, ki: w[ko * b + ki, 0, r, s], name="cb_pack")

    def compute(self, spec, x, wt, params):
        row = _AnchorRow(spec, params["zt"])
        p, column = _input(x, spec, row.padded)
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        return row.compute(spec, lambda n, ko, y, z, ki: te.sum(
            p[n, ko, y * sh + rr * dh, column(z) * sw + rs * dw, ki] * wt[ko, rr, rs, ki], axis=[rr, rs]))

    def space(self, spec):
        # zt accumulator vectors and the taps' loads; widths that pad the row least
        most = self.isa.registers - 4
        widths = [zt for zt in (4, 7, 8, 14, 16, 6, 5, 3, 2, 1) if zt <= min(most, spec.out_w)]
        return [{"zt": zt} for zt in ranked([(padding_efficiency((spec.out_w, zt)) * min(zt, 8), zt) for zt in widths])]

    def schedule(self, sch, block, spec, params):
        b = self.isa.lanes
        n, ko, y, zo, zi, ki, rr, rs = _anchor_loops(sch, block, params["zt"], None, 2)
        sch.reorder(n, ko, y, zo, rr, rs, zi, ki)
        par = fuse_parallel(sch, n, ko, y)
        pad = pad_stage(sch)
        if pad is not None:  # the rows this output row reads, right before use
            try:
                sch.compute_at(pad, par, preserve_unit_loops=True)
                vectorize_inner(sch, pad, b)
            except s_tir.ScheduleError:  # sized at run time, the rows read unproved: its own pass
                pad_pass(sch, b)
        attach_epilogue(sch, block, zo, b)
        sch.unroll(rr)
        sch.unroll(rs)
        sch.unroll(zi)
        sch.vectorize(ki)
        sch.decompose_reduction(block, rr)


class _PanelGemm(_OnBlocks):
    """out[n, ko, y, z, ki] = sum_q col[n, q, y, z] * wt[ko // kvb, q, ko % kvb, ki],
    q = (input channel block, tap row, tap column, channel in block).

    Weights are packed as panels of kvb output channel blocks,
    [K / (b kvb), C / cb, R, S, cb, kvb, b]: a reduction step loads kvb
    vectors from one contiguous run. The loop order is conv2d.blocked's
    turned round: parallel over output row tiles (zt columns), and every
    output channel panel runs over the tile while its column values stay in
    L1; the epilogue follows each panel's finished tile."""

    copies_column = True

    def transformed_shape(self, spec, params):
        b, cb, kvb = self.isa.lanes, spec.in_block or 1, params["kvb"]
        return (channel_blocks(spec, b, kvb) // kvb, spec.c // cb, spec.r, spec.s, cb, kvb, b)

    def transform(self, spec, params):
        b, cb, kvb = self.isa.lanes, spec.in_block or 1, params["kvb"]
        padded = channel_blocks(spec, b, kvb) * b > spec.k
        return lambda w: te.compute(self.transformed_shape(spec, params), lambda kp, co, r, s, ci, kv, ki: _packed(
            w, spec, padded, (kp * kvb + kv) * b + ki, co * cb + ci, r, s), name="cb_pack")

    def compute(self, spec, x, wt, params):
        cb, kvb = spec.in_block or 1, params["kvb"]
        owp = (row := _AnchorRow(spec, params["zt"])).padded
        p, column = _input(x, spec, owp)
        (sh, sw), (dh, dw) = spec.stride, spec.dilation

        def tap(n, co, r, s, y, z, ci):
            iy, iz = y * sh + r * dh, column(z) * sw + s * dw
            return p[n, co, iy, iz, ci] if spec.in_block else p[n, co + ci, iy, iz]

        if self.copies_column:  # the tile's column values, contiguous per tap
            col = te.compute((spec.n, spec.c // cb, spec.r, spec.s, spec.out_h, owp, cb), tap, name="cb_col")
            tap = lambda *i: col[i]  # noqa: E731
        co = te.reduce_axis((0, spec.c // cb), "co")
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        ci = te.reduce_axis((0, cb), "ci")
        return row.compute(spec, lambda n, ko, y, z, ki: te.sum(
            tap(n, co, rr, rs, y, z, ci) * wt[ko // kvb, co, rr, rs, ci, ko % kvb, ki], axis=[co, rr, rs, ci]),
            channel_blocks(spec, self.isa.lanes, kvb))

    def space(self, spec):
        # the row tile's column values (every q for zt columns) should stay in L1 across the panels
        q = spec.c * spec.r * spec.s
        return register_space(self, spec, lambda zt: l1_fit(self.isa, 4 * q * zt))

    def schedule(self, sch, block, spec, params):
        b = self.isa.lanes
        n, koo, koi, y, zo, zi, ki, co, rr, rs, ci = _anchor_loops(sch, block, params["zt"], params["kvb"], 4)
        sch.reorder(n, y, zo, koo, co, rr, rs, ci, zi, koi, ki)
        par = fuse_parallel(sch, n, y, zo)
        pad_pass(sch, b)
        if self.copies_column:
            col = sch.get_sblock("cb_col")
            sch.compute_at(col, par, preserve_unit_loops=True)
            vectorize_inner(sch, col, b)
        attach_epilogue(sch, block, koo, b)
        sch.unroll(koi)
        sch.unroll(zi)
        sch.vectorize(ki)
        sch.decompose_reduction(block, co)


def _pointwise(spec):
    return spec.r == spec.s == 1 and spec.stride == (1, 1) and not any(spec.pad)


class Im2colBlocked(_PanelGemm):
    name = "conv2d.im2col_blocked"

    def applies(self, spec):
        return Blocked.applies(self, spec) and not _pointwise(spec)


class Gemm1x1Blocked(_PanelGemm):
    name = "conv2d.gemm_1x1_blocked"
    copies_column = False  # the (blocked) input is the column matrix

    def applies(self, spec):
        return Blocked.applies(self, spec) and _pointwise(spec) and spec.in_block == self.isa.lanes


class WinogradBlocked(Winograd):
    """F(m x m, 3 x 3) on blocked activations: conv.Winograd's transforms
    with the b channels of a block in the vector lanes (every transform
    step is a vector add of b channels, whatever the tile count).

    weight transform  U[e, k // b, c, k % b] = (G g G^T)[i, j] (Winograd's, kb = b)
    input transform   V[e, c // b, t, c % b] = (B^T d_t B)[i, j]
    anchor            M[e, ko, t, ki] = sum_c V[e, c // b, t, c % b] U[e, ko, c, ki]
    output transform  Y[ko, t, i, j, ki] = (A^T M A)[i, j], scattered to the blocked output

    The GEMM's register block is tt tiles (broadcast) x kvb weight vectors,
    as conv2d.blocked's; it runs per (tile block, kvb channel blocks) over
    every alpha^2 element, and the output transform of that block follows
    on M still in cache."""

    blocked = True

    def __init__(self, isa, m):
        super().__init__(isa, m)
        self.name = f"conv2d.winograd_f{m}_blocked"

    def applies(self, spec):
        b = self.isa.lanes
        return (super().applies(spec) and spec.in_block == spec.out_block == b
                and spec.c % b == 0 and spec.k % b == 0)

    def transformed_shape(self, spec, params):
        return super().transformed_shape(spec, {"kb": self.isa.lanes})

    def transform(self, spec, params):
        return super().transform(spec, {"kb": self.isa.lanes})

    def space(self, spec):
        tiles, kblocks = self._tiles(spec)[2], spec.k // self.isa.lanes
        block_bytes = self.alpha ** 2 * self.isa.lanes * 4  # M per tile and channel block

        def score(tt, kvb):
            return (intensity(tt, kvb) * l1_fit(self.isa, block_bytes * tt * kvb)
                    * padding_efficiency((tiles, tt)))

        blocks = [(tt, kvb) for tt, kvb in register_blocks(self.isa, (2, 3, 4, 6, 8, 12), 4)
                  if kblocks % kvb == 0 and tt <= round_up(tiles, 2)]
        return [{"kvb": kvb, "tt": tt} for tt, kvb in ranked([(score(tt, kvb), (tt, kvb)) for tt, kvb in blocks])]

    def compute(self, spec, x, wt, params):
        m, alpha, b = self.m, self.alpha, self.isa.lanes
        a, bm, _ = winograd_matrices(m)
        nh, nw, tiles = self._tiles(spec)
        tp = round_up(tiles, params["tt"])
        cb, kb = spec.c // b, spec.k // b
        pt, pl = spec.pad[0], spec.pad[1]
        h, w = spec.h, spec.w
        d = te.compute(  # padded so that every tile is whole
            (spec.n, cb, nh * m + 2, nw * m + 2, b),
            lambda n, c, y, z, l: tirx.if_then_else(
                tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl), x[n, c, y - pt, z - pl, l],
                tirx.const(0, spec.dtype)),
            name=PAD)

        def bd(c, t, i, s, l):  # (B^T d)[i, s], b channels
            t = tirx.min(t, tiles - 1)  # tiles past the last are computed and dropped
            n, y0, z0 = t // (nh * nw), (t % (nh * nw)) // nw * m, t % nw * m
            return lincomb(bm, i, lambda r: d[n, c, y0 + r, z0 + s, l])

        bd = te.compute((cb, tp, alpha, alpha, b), bd, name="cb_wino_bd")
        v = te.compute((alpha * alpha, cb, tp, b),
                       lambda e, c, t, l: lincomb(bm, e % alpha, lambda s: bd[c, t, e // alpha, s, l]),
                       name="cb_wino_v")
        rc = te.reduce_axis((0, cb), "rc")
        ri = te.reduce_axis((0, b), "ri")
        mm = te.compute((alpha * alpha, kb, tp, b),
                        lambda e, ko, t, ki: te.sum(v[e, rc, t, ri] * wt[e, ko, rc * b + ri, ki], axis=[rc, ri]),
                        name=ANCHOR)
        ma = te.compute((kb, tp, alpha, m, b),  # (M A)[s1, j]
                        lambda ko, t, s1, j, l: lincomb(a, j, lambda s2: mm[s1 * alpha + s2, ko, t, l]),
                        name="cb_wino_ma")
        y = te.compute((kb, tp, m, m, b),  # (A^T M A)[i, j]
                       lambda ko, t, i, j, l: lincomb(a, i, lambda s1: ma[ko, t, s1, j, l]), name="cb_wino_y")
        return te.compute(
            spec.output_shape,
            lambda n, ko, yy, zz, l: y[ko, n * nh * nw + yy // m * nw + zz // m, yy % m, zz % m, l], name="cb_out")

    def schedule(self, sch, block, spec, params):
        tt, kvb, b, alpha = params["tt"], params["kvb"], self.isa.lanes, self.alpha
        pad_pass(sch, b)

        # input transform, parallel over (channel block, tile block); per
        # tile B^T d in registers, then its alpha^2 elements
        v = sch.get_sblock("cb_wino_v")
        e, c, t, l = sch.get_loops(v)
        to, ti = sch.split(t, [None, tt])
        ei, ej = sch.split(e, [alpha, alpha])
        sch.reorder(c, to, ti, ei, ej, l)
        par = sch.fuse(c, to)
        sch.parallel(par)
        sch.unroll(ej)
        sch.vectorize(l)
        bd = sch.get_sblock("cb_wino_bd")
        sch.compute_at(bd, ti)
        sch.set_scope(bd, 0, TILE_SCOPE)
        i, s, bl = sch.get_loops(bd)[-3:]
        sch.reorder(s, i, bl)
        sch.unroll(i)
        sch.vectorize(bl)

        # GEMM and output transform per (tile block, kvb channel blocks)
        y = sch.get_sblock("cb_wino_y")
        ko, t, i, j, l = sch.get_loops(y)
        koo, koi = sch.split(ko, [None, kvb])
        to, ti = sch.split(t, [None, tt])
        sch.reorder(to, koo, koi, ti, j, i, l)
        par = sch.fuse(to, koo)
        sch.parallel(par)
        sch.unroll(i)
        sch.vectorize(l)
        ma = sch.get_sblock("cb_wino_ma")
        sch.compute_at(ma, par)
        sch.set_scope(ma, 0, TILE_SCOPE)
        sch.compute_at(block, par, preserve_unit_loops=True)
        s1, j, ml = sch.get_loops(ma)[-3:]
        sch.unroll(j)
        sch.vectorize(ml)

        # per element: tt broadcasts x kvb weight vectors over the channels
        e, ki, ti, kl, rc, ri = sch.get_loops(block)[-6:]
        sch.reorder(e, rc, ri, ti, ki, kl)
        acc = sch.cache_write(block, 0, TILE_SCOPE)
        sch.reverse_compute_at(acc, e)
        sch.set_scope(acc, 0, TILE_SCOPE)
        sch.unroll(ti)
        sch.unroll(ki)
        sch.vectorize(kl)
        sch.decompose_reduction(block, rc)
        al = sch.get_loops(acc)[-1]
        sch.vectorize(al)

        scatter_pass(sch, "cb_wino_y", b)  # to the blocked output + fused epilogue: one parallel pass


for _cls in (Blocked, PairBlocked, DepthwiseBlocked, Im2colBlocked, Gemm1x1Blocked):
    register(_cls.name, _cls)
for _m in (2, 4, 6):
    register(f"conv2d.winograd_f{_m}_blocked", lambda isa, m=_m: WinogradBlocked(isa, m))
