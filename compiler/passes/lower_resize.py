"""Lowering of `relax.image.resize2d` with method nearest_neighbor, used by fuse_layers.

coldbrew lowers nearest resize itself: TVM's topi computes the source
coordinate as `(y + 0.5) * (in/out) - 0.5` in float32, which LLVM contracts
into an FMA, so exact ties (e.g. 0.5 for a 2->7 resize) land off by one ulp
and round the wrong way. Here the source index is exact integer arithmetic on
the rational scale out/in, following ONNX Resize. Linear/cubic resizes, and
tf_crop_and_resize (float roi), keep TVM's lowering.
"""
from tvm import relax, te, tirx
from tvm.ir import Op


def _ratio(n_in, n_out):
    """(a, b) with a / b = n_in / n_out: the sizes themselves, or where one
    set at run time is a whole multiple of the other at every size (a page's
    features upsampled by 4) that multiple and 1, so the source index
    divides by a constant, not by a size (a division per pixel)."""
    from tvm.sym import Analyzer

    if isinstance(n_in, int) and isinstance(n_out, int):
        return n_in, n_out
    ana = Analyzer()
    for big, small, flip in ((n_out, n_in, False), (n_in, n_out, True)):
        k = ana.simplify(tirx.floordiv(big, small))
        if isinstance(k, tirx.IntImm) and k.value >= 1 and ana.can_prove(tirx.EQ(big, k * small)):
            return (k.value, 1) if flip else (1, k.value)
    return n_in, n_out


def _src_index(y, n_in, n_out, coord_mode, rounding):
    """ONNX nearest source index for output index `y` along one axis, clamped to [0, n_in)."""
    y = y.astype("int64")
    clamp, (n_in, n_out) = n_in, _ratio(n_in, n_out)  # the fractions below depend on the ratio alone
    # Source coordinate as the exact fraction num / den, den > 0.
    if coord_mode in ("half_pixel", "pytorch_half_pixel"):
        if coord_mode == "pytorch_half_pixel" and n_out == 1:
            num, den = tirx.const(0, "int64"), 1
        else:  # (y + 0.5) * in / out - 0.5
            num, den = (2 * y + 1) * n_in - n_out, 2 * n_out
    elif coord_mode == "align_corners":
        num, den = (tirx.const(0, "int64"), 1) if n_out == 1 else (y * (n_in - 1), n_out - 1)
    elif coord_mode == "asymmetric":
        num, den = y * n_in, n_out
    else:  # tf_half_pixel_for_nearest: (y + 0.5) * in / out
        num, den = (2 * y + 1) * n_in, 2 * n_out
    if rounding == "":  # topi's default
        rounding = "round" if coord_mode == "align_corners" else "floor"
    fdiv = tirx.floordiv
    if rounding == "floor":
        idx = fdiv(num, den)
    elif rounding == "ceil":
        idx = fdiv(num + den - 1, den)
    elif rounding == "round_prefer_floor":  # ceil(x - 1/2)
        idx = fdiv(2 * num + den - 1, 2 * den)
    else:  # round_prefer_ceil, round (same after clamping): floor(x + 1/2)
        idx = fdiv(2 * num + den, 2 * den)
    return tirx.max(tirx.min(idx, clamp - 1), 0)


_COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_half_pixel_for_nearest", "tf_half_pixel_for_nn")
_ROUNDINGS = ("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def legalize_resize2d(bb, call):
    """Sizes set at run time (symbolic extents) are taken in the simplifier's
    form, as Relax gives the output's type (fused functions must agree on
    their buffers' shapes), in the modes whose index needs no test of the
    size itself."""
    from tvm.sym import Analyzer

    a, out_dtype = call.attrs, str(call.ty.dtype)
    in_shape = getattr(call.args[0].ty, "shape", None)
    size = getattr(call.args[1], "values", None)
    known = isinstance(in_shape, relax.ShapeExpr) and size is not None
    static = known and all(isinstance(d, tirx.IntImm) for d in list(in_shape.values) + list(size))
    simplify = Analyzer().simplify
    if known and not static:
        size = [simplify(d) for d in size]
        call = bb.normalize(relax.Call(call.op, [call.args[0], relax.ShapeExpr(size), *call.args[2:]], call.attrs,
                                       call.ty_args))
    if not (a.method == "nearest_neighbor" and a.layout == "NCHW" and known
            and (static or a.coordinate_transformation_mode in ("half_pixel", "asymmetric", "tf_half_pixel_for_nearest"))
            and a.coordinate_transformation_mode in _COORD_MODES and a.rounding_method in _ROUNDINGS):
        return Op.get("relax.image.resize2d").get_attr("FLegalize")(bb, call)
    in_h, in_w = (int(d) if static else simplify(d) for d in in_shape.values[2:])
    out_h, out_w = (int(d) if static else d for d in size)
    mode, rnd = str(a.coordinate_transformation_mode), str(a.rounding_method)

    def fn(x):
        def pixel(n, c, y, w):
            v = x[n, c, _src_index(y, in_h, out_h, mode, rnd), _src_index(w, in_w, out_w, mode, rnd)]
            return v if out_dtype == x.dtype else v.astype(out_dtype)
        return te.compute((x.shape[0], x.shape[1], out_h, out_w), pixel, name="resize")

    return bb.call_te(fn, call.args[0], primfunc_name_hint="resize2d")
