"""conv2d variants (NCHW activations, OIHW raw weights).

direct          plain layout, weights as ONNX stores them (identity transform)
packed_direct   output channels of the weights blocked by KB (contiguous loads)
im2col_gemm     column matrix per output tile + packed GEMM
gemm_1x1        1x1 / stride 1 / no pad: the input already is the column matrix
winograd_f2/f4/f6   F(m x m, 3 x 3) for 3x3 stride-1 convs: weights transformed to
                the Winograd domain, batched GEMM in it
depthwise_direct   one filter per channel, vectorized along the output width
"""
import numpy as np
from tvm import te, tirx

from . import ANCHOR, ConvSpec, Variant, register
from .schedule_util import VEC, attach_epilogue, vectorize_inner

KB = 8  # output-channel block of packed weights


def _round(n, m):
    return (n + m - 1) // m * m


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
        name="cb_pad")


def _split_tile(sch, loop, factor):
    return sch.split(loop, [None, factor])


def _crop(anchor, spec):
    """The layer's true output, read from the anchor's tile-aligned one."""
    return te.compute((spec.n, spec.k, spec.out_h, spec.out_w), lambda n, k, y, z: anchor[n, k, y, z], name="cb_out")


def _extra_w(spec, ow_padded):
    need = (ow_padded - 1) * spec.stride[1] + (spec.s - 1) * spec.dilation[1] + 1
    return max(0, need - (spec.w + spec.pad[1] + spec.pad[3]))


def _zb(spec, params, default=16):
    """Width tile: the parameter, but no wider than the output rounded to a vector."""
    return min(params.get("zb", default), _round(spec.out_w, VEC))


def _extent(sch, loop):
    return int(sch.get(loop).extent)


class _Direct(Variant):
    op = "conv2d"

    def applies(self, spec):
        return not spec.depthwise

    def _weight(self, wt, k, c, r, s):
        return wt[k, c, r, s]

    def compute(self, spec, x, wt, params):
        kb, zb = params.get("kb", 4), _zb(spec, params)
        kp, owp = _round(spec.k, kb), _round(spec.out_w, zb)
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
                * self._weight(wt, tirx.min(k, last), rc, rr, rs), axis=[rc, rr, rs]),
            name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        return [{"kb": 4, "zb": 16}, {"kb": 8, "zb": 8}, {"kb": 4, "zb": 8}, {"kb": 2, "zb": 32}]

    def schedule(self, sch, block, spec, params):
        kb, zb = params.get("kb", 4), _zb(spec, params)
        n, k, y, z, rc, rr, rs = sch.get_loops(block)
        ko, ki = _split_tile(sch, k, kb)
        zo, zi = _split_tile(sch, z, zb)
        sch.reorder(n, ko, y, zo, rc, rr, rs, ki, zi)
        par = sch.fuse(n, ko, y)
        sch.parallel(par)
        attach_epilogue(sch, block, zo)
        sch.unroll(ki)
        if zb % VEC == 0 and zb > VEC:
            zio, ziv = sch.split(zi, [None, VEC])
            sch.unroll(zio)
            sch.vectorize(ziv)
        elif zb <= 16:
            sch.vectorize(zi)
        sch.unroll(rs)
        sch.decompose_reduction(block, rc)


class Direct(_Direct):
    name = "conv2d.direct"


class PackedDirect(_Direct):
    name = "conv2d.packed_direct"

    def transformed_shape(self, spec):
        return ((spec.k + KB - 1) // KB, spec.c // spec.groups, spec.r, spec.s, KB)

    def transform(self, spec):
        return lambda w: te.compute(
            self.transformed_shape(spec),
            lambda ko, c, r, s, ki: tirx.if_then_else(ko * KB + ki < spec.k, w[tirx.min(ko * KB + ki, spec.k - 1), c, r, s],
                                                     tirx.const(0, spec.dtype)),
            name="cb_pack")

    def _weight(self, wt, k, c, r, s):
        return wt[k // KB, c, r, s, k % KB]

    def space(self, spec):
        return [{"kb": 8, "zb": 8}, {"kb": 4, "zb": 16}, {"kb": 8, "zb": 16}, {"kb": 2, "zb": 32}]


class _Gemm(Variant):
    """out[n, k, y, z] = sum_q wt[k // KB, q, k % KB] * col[n, q, y, z], q = (c, r, s).

    Tiles are KB-blocked output channels x one output row x ZT columns; the
    column tile (all q for one row segment) is packed right before the channel
    blocks that reuse it, and the epilogue runs on each finished tile."""

    op = "conv2d"

    def transformed_shape(self, spec):
        return ((spec.k + KB - 1) // KB, spec.c * spec.r * spec.s, KB)

    def transform(self, spec):
        rs = spec.r * spec.s
        return lambda w: te.compute(
            self.transformed_shape(spec),
            lambda ko, q, ki: tirx.if_then_else(
                ko * KB + ki < spec.k, w[tirx.min(ko * KB + ki, spec.k - 1), q // rs, (q // spec.s) % spec.r, q % spec.s],
                tirx.const(0, spec.dtype)),
            name="cb_pack")

    def _zt(self, spec, params):
        zt = params.get("zt", 16)
        return VEC if spec.out_w <= VEC or spec.out_w % 16 == VEC else zt

    def _column(self, spec, x, owp):
        raise NotImplementedError

    def compute(self, spec, x, wt, params):
        owp = _round(spec.out_w, self._zt(spec, params))
        col = self._column(spec, x, owp)
        q = te.reduce_axis((0, spec.c * spec.r * spec.s), "q")
        anchor = te.compute((spec.n, _round(spec.k, KB), spec.out_h, owp),
                            lambda n, k, y, z: te.sum(wt[k // KB, q, k % KB] * col[n, q, y, z], axis=q), name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        return [{"kb": 4, "zt": 16}, {"kb": 8, "zt": 8}, {"kb": 2, "zt": 16}, {"kb": 8, "zt": 16}]

    def schedule(self, sch, block, spec, params):
        kb, zt = params.get("kb", 4), self._zt(spec, params)
        if zt == VEC:
            kb = max(kb, 8)  # keep 8 accumulators in flight
        n, k, y, z, q = sch.get_loops(block)
        ko, ki = _split_tile(sch, k, kb)
        zo, zi = _split_tile(sch, z, zt)
        zio, ziv = sch.split(zi, [None, VEC])
        sch.reorder(n, y, zo, ko, q, ki, zio, ziv)
        par = sch.fuse(n, y, zo)
        sch.parallel(par)
        col = sch.get_sblock("cb_col")
        sch.compute_at(col, par, preserve_unit_loops=True)
        vectorize_inner(sch, col)
        attach_epilogue(sch, block, ko)
        sch.unroll(ki)
        sch.unroll(zio)
        sch.vectorize(ziv)
        sch.decompose_reduction(block, q)


class Im2colGemm(_Gemm):
    name = "conv2d.im2col_gemm"

    def applies(self, spec):
        return spec.groups == 1

    def _column(self, spec, x, owp):
        p = _pad(x, spec, extra_w=_extra_w(spec, owp))
        rs, s = spec.r * spec.s, spec.s
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        return te.compute(
            (spec.n, spec.c * rs, spec.out_h, owp),
            lambda n, q, y, z: p[n, q // rs, y * sh + ((q // s) % spec.r) * dh, z * sw + (q % s) * dw],
            name="cb_col")


class Gemm1x1(_Gemm):
    name = "conv2d.gemm_1x1"

    def applies(self, spec):
        return (spec.groups == 1 and spec.r == 1 and spec.s == 1 and spec.stride == (1, 1)
                and not any(spec.pad))

    def _column(self, spec, x, owp):
        # no im2col: the column matrix is the input itself, copied tile by tile
        last = spec.out_w - 1
        return te.compute((spec.n, spec.c, spec.out_h, owp), lambda n, q, y, z: x[n, q, y, tirx.min(z, last)],
                          name="cb_col")


def _winograd_matrices(m, r=3):
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + r - 2), m, r)
    return np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(g, np.float32)


def _const(mat, name):
    rows, cols = mat.shape

    def value(i, j):
        expr = tirx.const(0.0, "float32")
        for a in range(rows):
            for b in range(cols):
                if mat[a, b] != 0:
                    expr = tirx.Select(tirx.all(i == a, j == b), tirx.const(float(mat[a, b]), "float32"), expr)
        return expr

    return te.compute((rows, cols), value, name=name)


class Winograd(Variant):
    """F(m x m, 3 x 3): U = G g G^T (transform), V = B^T d B, M = U . V summed
    over input channels (the anchor: a batched GEMM), Y = A^T M A."""

    op = "conv2d"

    def __init__(self, m):
        self.m = m
        self.alpha = m + 2
        self.name = f"conv2d.winograd_f{m}"

    def applies(self, spec):
        return (spec.groups == 1 and spec.r == 3 and spec.s == 3 and spec.stride == (1, 1)
                and spec.dilation == (1, 1) and spec.out_h >= self.m and spec.out_w >= self.m)

    def transformed_shape(self, spec):
        return (self.alpha * self.alpha, (spec.k + KB - 1) // KB, spec.c, KB)

    def transform(self, spec):
        _, _, g = _winograd_matrices(self.m)
        alpha = self.alpha

        def fn(w):
            G = _const(g, "cb_G")
            r1 = te.reduce_axis((0, 3), "r1")
            r2 = te.reduce_axis((0, 3), "r2")
            def u_value(e, ko, c, ki):
                k = ko * KB + ki
                valid = tirx.Select(k < spec.k, tirx.const(1, spec.dtype), tirx.const(0, spec.dtype))
                return te.sum(G[e // alpha, r1] * w[tirx.min(k, spec.k - 1), c, r1, r2] * G[e % alpha, r2] * valid,
                              axis=[r1, r2])

            return te.compute(
                self.transformed_shape(spec), u_value,
                name="cb_wino_u")
        return fn

    def _tiles(self, spec):
        m = self.m
        nh, nw = (spec.out_h + m - 1) // m, (spec.out_w + m - 1) // m
        return nh, nw, spec.n * nh * nw

    def compute(self, spec, x, wt, params):
        m, alpha = self.m, self.alpha
        a, b, _ = _winograd_matrices(m)
        nh, nw, tiles = self._tiles(spec)
        tiles_p = _round(tiles, self._tt(spec, params))
        pt, pl = spec.pad[0], spec.pad[1]
        hp, wp = nh * m + 2, nw * m + 2  # padded so every tile is whole
        h, w = spec.h, spec.w
        d = te.compute(
            (spec.n, spec.c, hp, wp),
            lambda n, c, y, z: tirx.if_then_else(
                tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl), x[n, c, y - pt, z - pl], tirx.const(0, spec.dtype)),
            name="cb_pad")
        B = _const(b, "cb_B")
        A = _const(a, "cb_A")
        r1 = te.reduce_axis((0, alpha), "r1")
        r2 = te.reduce_axis((0, alpha), "r2")

        def tile_origin(t):
            t = tirx.min(t, tiles - 1)  # tiles past the last are computed and dropped
            n, rest = t // (nh * nw), t % (nh * nw)
            return n, (rest // nw) * m, (rest % nw) * m

        def v_value(e, c, t):
            n, y0, z0 = tile_origin(t)
            return te.sum(B[r1, e // alpha] * d[n, c, y0 + r1, z0 + r2] * B[r2, e % alpha], axis=[r1, r2])

        V = te.compute((alpha * alpha, spec.c, tiles_p), v_value, name="cb_wino_v")
        rc = te.reduce_axis((0, spec.c), "rc")
        M = te.compute((alpha * alpha, _round(spec.k, KB), tiles_p),
                       lambda e, k, t: te.sum(wt[e, k // KB, rc, k % KB] * V[e, rc, t], axis=rc), name=ANCHOR)
        s1 = te.reduce_axis((0, alpha), "s1")
        s2 = te.reduce_axis((0, alpha), "s2")
        return te.compute(
            (spec.n, spec.k, spec.out_h, spec.out_w),
            lambda n, k, y, z: te.sum(
                A[s1, y % m] * M[s1 * alpha + s2, k, n * nh * nw + (y // m) * nw + z // m] * A[s2, z % m],
                axis=[s1, s2]),
            name="cb_wino_y")

    def space(self, spec):
        return [{"kb": 4, "tt": 16}, {"kb": 8, "tt": 8}, {"kb": 2, "tt": 32}]

    def _tt(self, spec, params):
        return min(params.get("tt", 16), _round(self._tiles(spec)[2], VEC))

    def schedule(self, sch, block, spec, params):
        kb, tt = params.get("kb", 4), self._tt(spec, params)
        # input transform: one parallel pass, transform loops unrolled
        v = sch.get_sblock("cb_wino_v")
        e, c, t, r1, r2 = sch.get_loops(v)
        sch.reorder(c, t, e, r1, r2)
        sch.parallel(c)
        sch.unroll(e)
        sch.unroll(r1)
        sch.unroll(r2)
        sch.decompose_reduction(v, r1)
        # batched GEMM
        e, k, t, rc = sch.get_loops(block)
        ko, ki = _split_tile(sch, k, kb)
        to, ti = _split_tile(sch, t, tt)
        tio, tiv = sch.split(ti, [None, VEC]) if tt % VEC == 0 else (None, ti)
        sch.reorder(*([e, to, ko, rc, ki] + ([tio] if tio is not None else []) + [tiv]))
        par = sch.fuse(e, to)
        sch.parallel(par)
        cw = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(cw, ko)
        sch.unroll(ki)
        if tio is not None:
            sch.unroll(tio)
        sch.vectorize(tiv)
        sch.decompose_reduction(block, rc)
        # output transform (+ fused epilogue), parallel over (n, k)
        y = sch.get_sblock("cb_wino_y")
        n, k, yy, zz, s1, s2 = sch.get_loops(y)
        par = sch.fuse(n, k)
        sch.parallel(par)
        attach_epilogue(sch, y, yy)
        sch.unroll(s1)
        sch.unroll(s2)
        sch.decompose_reduction(y, s1)


class DepthwiseDirect(Variant):
    name = "conv2d.depthwise_direct"
    op = "conv2d"

    def applies(self, spec):
        return spec.depthwise

    def transformed_shape(self, spec):
        return (spec.k, spec.r * spec.s)

    def transform(self, spec):
        return lambda w: te.compute(self.transformed_shape(spec),
                                    lambda k, q: w[k, 0, q // spec.s, q % spec.s], name="cb_pack")

    def compute(self, spec, x, wt, params):
        owp = _round(spec.out_w, _zb(spec, params))
        p = _pad(x, spec, extra_w=_extra_w(spec, owp))
        rr = te.reduce_axis((0, spec.r), "rr")
        rs = te.reduce_axis((0, spec.s), "rs")
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        anchor = te.compute(
            (spec.n, spec.k, spec.out_h, owp),
            lambda n, k, y, z: te.sum(p[n, k, y * sh + rr * dh, z * sw + rs * dw] * wt[k, rr * spec.s + rs],
                                      axis=[rr, rs]),
            name=ANCHOR)
        return _crop(anchor, spec)

    def space(self, spec):
        return [{"zb": 16}, {"zb": 8}, {"zb": 32}]

    def schedule(self, sch, block, spec, params):
        zb = _zb(spec, params)
        n, k, y, z, rr, rs = sch.get_loops(block)
        zo, zi = _split_tile(sch, z, zb)
        sch.reorder(n, k, y, zo, rr, rs, zi)
        par = sch.fuse(n, k)
        sch.parallel(par)
        attach_epilogue(sch, block, zo)
        sch.unroll(rr)
        sch.unroll(rs)
        if zb % VEC == 0 and zb > VEC:
            zio, ziv = sch.split(zi, [None, VEC])
            sch.unroll(zio)
            sch.vectorize(ziv)
        else:
            sch.vectorize(zi)
        sch.decompose_reduction(block, rr)


for _v in (Direct(), PackedDirect(), Im2colGemm(), Gemm1x1(), Winograd(2), Winograd(4), Winograd(6),
           DepthwiseDirect()):
    register(_v)

__all__ = ["ConvSpec"]
