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

Weights are packed so that a tile's weight vectors are contiguous:
[K / b, C / cb, R, S, cb, b], cb = the input's channel block (1 for NCHW).
"""
from tvm import te, tirx

from .contract import ANCHOR, Variant, register
from .schedule_util import (attach_epilogue, intensity, pad_pass, pad_stage, padding_efficiency, ranked,
                            register_blocks, round_up, vectorize_inner)


def _padded(x, spec, owp):
    """x (NCHW or blocked) zero-padded by the conv's pads, and at the right
    wide enough for `owp` output columns; x itself when nothing is added."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    pt, pl, pb, _ = spec.pad
    hp = spec.h + pt + pb
    wp = max(spec.w + spec.pad[1] + spec.pad[3], (owp - 1) * sw + (spec.s - 1) * dw + 1)
    if (hp, wp) == (spec.h, spec.w):
        return x
    shape = list(spec.input_shape)
    shape[2], shape[3] = hp, wp

    def value(n, c, y, z, *lane):
        inside = tirx.all(y >= pt, y < spec.h + pt, z >= pl, z < spec.w + pl)
        return tirx.if_then_else(inside, x[(n, c, y - pt, z - pl, *lane)], tirx.const(0, spec.dtype))

    return te.compute(shape, value, name="cb_pad")


def _crop(anchor, spec):
    if int(anchor.shape[3]) == spec.out_w:
        return anchor
    return te.compute(spec.output_shape, lambda *i: anchor[i], name="cb_out")


class _OnBlocks(Variant):
    op = "conv2d"
    blocked = True


class Blocked(_OnBlocks):
    name = "conv2d.blocked"

    def applies(self, spec):
        b = self.isa.lanes
        return (spec.groups == 1 and spec.out_block == b and spec.k % b == 0
                and spec.in_block in (0, b) and spec.c % (spec.in_block or 1) == 0)

    def transformed_shape(self, spec, params):
        b, cb = self.isa.lanes, spec.in_block or 1
        return (spec.k // b, spec.c // cb, spec.r, spec.s, cb, b)

    def transform(self, spec, params):
        b, cb = self.isa.lanes, spec.in_block or 1
        return lambda w: te.compute(self.transformed_shape(spec, params),
                                    lambda ko, co, r, s, ci, ki: w[ko * b + ki, co * cb + ci, r, s], name="cb_pack")

    def compute(self, spec, x, wt, params):
        b, cb, zt = self.isa.lanes, spec.in_block or 1, params["zt"]
        owp = round_up(spec.out_w, zt)
        p = _padded(x, spec, owp)
        co = te.reduce_axis((0, spec.c // cb), "co")
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        ci = te.reduce_axis((0, cb), "ci")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation

        def tap(n, y, z):
            iy, iz = y * sh + rr * dh, z * sw + rs * dw
            return p[n, co, iy, iz, ci] if spec.in_block else p[n, co + ci, iy, iz]

        anchor = te.compute((spec.n, spec.k // b, spec.out_h, owp, b),
                            lambda n, ko, y, z, ki: te.sum(tap(n, y, z) * wt[ko, co, rr, rs, ci, ki],
                                                           axis=[co, rr, rs, ci]), name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        # zt broadcasts x kvb weight vectors; kvb divides the channel blocks
        kblocks = spec.k // self.isa.lanes
        blocks = [(zt, kvb) for zt, kvb in register_blocks(self.isa, range(1, 15), 4)
                  if kblocks % kvb == 0 and zt <= spec.out_w]
        return [{"kvb": kvb, "zt": zt} for zt, kvb in
                ranked([(intensity(zt, kvb) * padding_efficiency((spec.out_w, zt)), (zt, kvb)) for zt, kvb in blocks])]

    def schedule(self, sch, block, spec, params):
        b, kvb, zt = self.isa.lanes, params["kvb"], params["zt"]
        n, ko, y, z, ki, co, rr, rs, ci = sch.get_loops(block)
        koo, koi = sch.split(ko, [None, kvb])
        zo, zi = sch.split(z, [None, zt])
        # per input value: one broadcast, then the kvb weight vectors it meets
        sch.reorder(n, koo, y, zo, co, rr, rs, ci, zi, koi, ki)
        par = sch.fuse(n, koo, y)
        sch.parallel(par)
        pad_pass(sch, b)  # its own parallel pass, once per layer
        attach_epilogue(sch, block, zo, b)
        sch.unroll(koi)
        sch.unroll(zi)
        sch.vectorize(ki)
        sch.decompose_reduction(block, co)


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
        b, zt = self.isa.lanes, params["zt"]
        owp = round_up(spec.out_w, zt)
        p = _padded(x, spec, owp)
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        anchor = te.compute((spec.n, spec.k // b, spec.out_h, owp, b),
                            lambda n, ko, y, z, ki: te.sum(p[n, ko, y * sh + rr * dh, z * sw + rs * dw, ki]
                                                           * wt[ko, rr, rs, ki], axis=[rr, rs]), name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        # zt accumulator vectors and the taps' loads; widths that pad the row least
        most = self.isa.registers - 4
        widths = [zt for zt in (4, 7, 8, 14, 16, 6, 5, 3, 2, 1) if zt <= min(most, spec.out_w)]
        return [{"zt": zt} for zt in ranked([(padding_efficiency((spec.out_w, zt)) * min(zt, 8), zt) for zt in widths])]

    def schedule(self, sch, block, spec, params):
        b, zt = self.isa.lanes, params["zt"]
        n, ko, y, z, ki, rr, rs = sch.get_loops(block)
        zo, zi = sch.split(z, [None, zt])
        sch.reorder(n, ko, y, zo, rr, rs, zi, ki)
        par = sch.fuse(n, ko, y)
        sch.parallel(par)
        pad = pad_stage(sch)
        if pad is not None:  # the rows this output row reads, right before use
            sch.compute_at(pad, par, preserve_unit_loops=True)
            vectorize_inner(sch, pad, b)
        attach_epilogue(sch, block, zo, b)
        sch.unroll(rr)
        sch.unroll(rs)
        sch.unroll(zi)
        sch.vectorize(ki)
        sch.decompose_reduction(block, rr)


for _cls in (Blocked, DepthwiseBlocked):
    register(_cls.name, _cls)
