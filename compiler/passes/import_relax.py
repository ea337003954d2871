"""Pass `import_relax`: ONNX (shapes fixed, constants folded) -> TVM Relax module.

A node TVM's importer cannot convert is a CompileError naming the node, its
operator and the importer's reason; nothing it prints reaches the terminal.
"""
import contextlib
import gc

import onnx

from ..errors import CompileError, quiet
from ..ir import branches, dims
from ..kernels import loops as loop_kernels
from ..onnx import loops, recurrent, shapes, subpixel
from ..kernels import RecurrentSpec
from ..kernels.recurrent import placeholder, size_vars
from ..onnx.loops import BOUND_KEY
from ..onnx.ops import COUNTED_OPS, graph_inputs
from ..ir.relax import extents_of, is_const

NAME = "import_relax"


def apply(model, variables=None, bounds=None):
    """The Relax module of `model`; `variables` ({Dim: tir var}) are the
    sizes of the input dimensions declared as ranges (ir/dims.py): each
    output sized by the data adds its counted Dim there, bounded by
    `bounds` ({tensor: entries}) where given."""
    from tvm.relax.frontend.onnx import from_onnx

    shapes, dtypes = {}, {}
    named = {d.name: dims.extent(d, v) for d, v in (variables or {}).items()}
    for inp in graph_inputs(model):
        tt = inp.type.tensor_type
        shapes[inp.name] = [named[d.dim_param] if d.dim_param in named else d.dim_value for d in tt.shape.dim]
        dtypes[inp.name] = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    failed, message = [], None
    counts = _Counts(variables if variables is not None else {}, bounds or {})
    with _node_watch(failed, counts), quiet():
        try:
            return from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False,
                             sanitize_input_names=False)
        except Exception as e:
            message = _message(failed[0] if failed else None, e)
            e.__traceback__ = None  # its frames hold the importer: collected here, inside quiet()
            del e
            gc.collect()
    raise CompileError(message)


def _message(node, error):
    """One sentence: the node and operator TVM's importer failed on, its
    reason (the error's last line, never the IR), what the user can do."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    reason = lines[-1] if lines else type(error).__name__
    reason = reason if len(reason) <= 300 else reason[:297] + "..."
    if node is None:
        return f"importing the ONNX graph failed: {reason}"
    op, name = node
    if isinstance(error, CompileError):  # coldbrew's own reason, with what to do
        return f"{op} node '{name}': {error}"
    return (f"{op} node '{name}': the ONNX importer cannot convert it ({reason}). If an input of it depends on a "
            f"model input, fixing that input (--input-shape NAME=DIMS, or --bind NAME=FILE.npy for a value) may "
            f"make it convertible; otherwise coldbrew does not support this form of {op} yet")


@contextlib.contextmanager
def _node_watch(failed, counts):
    """Note in `failed` the (operator, node name) whose conversion raised:
    TVM's importer hands each node's name to its converter in its
    attributes, and raises without it."""
    from tvm.relax.frontend.onnx import onnx_frontend
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    real, parse = ONNXGraphImporter._convert_operator, ONNXGraphImporter._parse_value_proto

    def node_of(self, node):  # called with each node just before its conversion
        self.cb_node = node
        return parse(self, node)

    def convert(self, op_name, inputs, attrs, opset):
        import tvm
        from tvm import relax

        try:
            if op_name == loops.SLICE_AT:  # a step's row (ir/loops.py)
                return loop_kernels.emit_slice_at(self.bb, inputs, attrs, counts, self.cb_node.output[0])
            if op_name in (loops.START, loops.END):  # a Loop the runtime runs (ir/loops.py)
                node = getattr(self, "cb_node", None)
                name = node.name.rsplit("/", 1)[0]
                if op_name == loops.START:
                    return loop_kernels.emit_start(self.bb, inputs, attrs, name)
                scans = list(node.output[int(attrs["carried"]):])
                return loop_kernels.emit_end(self.bb, inputs, attrs, name, counts, scans[0] if scans else name)
            if op_name in RANDOM:
                return _random(self.bb, op_name, inputs, attrs)
            if op_name == "TopK" and len(inputs) > 1 and not is_const(inputs[1]):  # k from the data
                return counts.convert(self.bb, op_name, inputs, attrs, getattr(self, "cb_node", None))
            if op_name == "Slice" and not all(is_const(v) for v in inputs[1:3]) and all(
                    isinstance(getattr(v, "ty", None), relax.TensorType) for v in inputs[1:3]):  # the data's place
                return counts.convert(self.bb, op_name, inputs, attrs, getattr(self, "cb_node", None))
            if op_name in COUNTED_OPS and op_name != "Range":  # a Range only where the data sets its limits
                return counts.convert(self.bb, op_name, inputs, attrs, getattr(self, "cb_node", None))
            if op_name == "Where" and branches.SELECT in (attrs.get("tvm_custom", {}).get("name") or ""):
                return branches.emit_select(self.bb, *inputs)  # an If's branches joined (ir/branches.py)
            if op_name == "Resize":
                inputs = _whole_scales(inputs)
            if op_name in _BINARY:
                inputs = _sizes_typed(self.bb, _scalars_typed(inputs), counts)
            if op_name in ("Min", "Max") and len(inputs) > 1 and not all(is_const(v) for v in inputs):
                return _named(self.bb, _pairwise(self.bb, op_name, inputs), getattr(self, "cb_node", None))
            sized = _on_sizes(self.bb, op_name, inputs, attrs, counts, getattr(self, "cb_node", None))
            if sized is not None:
                return sized
            if op_name == "Range":
                ranged = _arange(self.bb, inputs)
                if ranged is not None:
                    return _named(self.bb, ranged, getattr(self, "cb_node", None))
                if not all(is_const(x) or tvm.ir.is_prim_expr(x) for x in inputs):  # a length the data sets
                    return counts.convert(self.bb, op_name, inputs, attrs, getattr(self, "cb_node", None))
            if op_name in ("MaxPool", "AveragePool", "Conv") and attrs.get("auto_pad", b"NOTSET") in _SAME:
                attrs = _same_pads(inputs[0], attrs, inputs[1] if op_name == "Conv" else None, op_name)
                if attrs is None:  # pads that change with the size: a max pooling of its own
                    return _same_max_pool(self.bb, inputs[0], getattr(self, "cb_node", None))
            return _named(self.bb, real(self, op_name, inputs, attrs, opset), getattr(self, "cb_node", None))
        except Exception:
            if not failed:
                failed.append((op_name, attrs.get("tvm_custom", {}).get("name") or "?"))
            raise
        finally:
            counts.node = None

    ONNXGraphImporter._convert_operator, ONNXGraphImporter._parse_value_proto = convert, node_of
    real_map = onnx_frontend._get_convert_map
    onnx_frontend._get_convert_map = lambda: {**real_map(), recurrent.CELL: _Cell,
                                              **{op: _Cell for op in (*RANDOM, loops.START, loops.END, loops.SLICE_AT)}}  # those `convert` takes first
    try:
        yield
    finally:
        ONNXGraphImporter._convert_operator, ONNXGraphImporter._parse_value_proto = real, parse
        onnx_frontend._get_convert_map = real_map


RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike")


def _random(bb, op, inputs, attrs):
    """A random operator's values (kernels/random.py), seeded by its `seed`."""
    from ..kernels.random import random_te

    like = inputs[0] if op.endswith("Like") else None
    dtype = (onnx.helper.tensor_dtype_to_np_dtype(int(attrs["dtype"])).name if "dtype" in attrs else
             str(like.ty.dtype) if like is not None else "float32")
    normal = "Normal" in op
    a, b = (attrs.get("mean", 0.0), attrs.get("scale", 1.0)) if normal else (attrs.get("low", 0.0),
                                                                             attrs.get("high", 1.0))
    shape = None if like is not None else [int(d) for d in attrs["shape"]]
    args = [like] if like is not None else []
    return bb.emit_te(lambda *x: random_te(x[0] if x else None, shape, dtype, normal, float(a), float(b),
                                           int(attrs.get("seed", 0.0))), *args, primfunc_name_hint="cb_random")


class _Counts:
    """Outputs sized by the data (kernels/counted.py): each node's kernel,
    marked opaque and with the variable it counts (counted.COUNTS), writes
    its outputs at their bound; the node's outputs are the first `count` of
    them, `count` a variable of a counted Dim added to `variables`."""

    def __init__(self, variables, bounds):
        self.variables, self.bounds, self.node, self.count_of = variables, bounds, None, {}

    def dim(self, name, most, least=0):
        """A new counted Dim for output `name`, from `least` to its bound (the
        user's, else `most`: the most the input allows), and its variable."""
        import re

        from tvm import tirx

        from ..options import Dim

        bound = self.bounds.get(name, most)
        if bound is None:
            raise CompileError(f"how many entries '{name}' holds has no bound known at compile time: "
                               f"give one with --bound {name}=N")
        used = {v.name for v in self.variables.values()}
        var = re.sub(r"\W", "_", f"count_{name}")
        while var in used:
            var += "_"
        d = Dim(name, least, max(int(bound), least), counted=True)
        self.variables[d] = tirx.Var(var, "int64")
        return d, self.variables[d]

    def most(self, extent):
        """The largest value of `extent` over the sizes set at run time."""
        try:
            return dims.largest([extent], self.variables)[0]
        except ValueError:
            return None

    def kernel(self, bb, te_func, args, var, name):
        """The counting kernel's call (opaque, naming the variable it counts)."""
        from tvm import relax

        from ..kernels.counted import COUNTS

        call = bb.emit_te(te_func, *args, primfunc_name_hint=name)
        gv = bb.lookup_binding(call).args[0]
        bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", branches.OPAQUE).with_attr(COUNTS, var.name))
        self.count_of[var.name] = bb.emit(relax.TupleGetItem(call, len(call.ty.fields) - 1))
        return call

    def written(self, values):
        """The count tensors of the counted sizes `values` read: a kernel
        that reads such a size from its shape alone takes them as inputs it
        ignores, so the counting kernels stay and run before it."""
        from tvm.tirx.analysis import undefined_vars

        names = {v.name for e in values for v in undefined_vars(e)}
        return [t for name, t in self.count_of.items() if name in names]

    def convert(self, bb, op, inputs, attrs, node):
        import tvm
        from tvm import relax

        from ..kernels import counted

        outs = list(node.output) if node is not None else [op]
        if op == "Range":
            d, n = self.dim(outs[0], None)
            if any(tvm.ir.is_prim_expr(v) for v in inputs):
                raise CompileError("a Range over both a size and a value the data sets is not supported yet")
            scalars = [bb.normalize(relax.op.reshape(v, [1])) for v in inputs]
            call = self.kernel(bb, counted.range_te, [*scalars, d.max], n, "cb_range")
            return self.take(bb, call, 0, [n])
        x = inputs[0]
        shape = list(extents_of(x))
        size = 1
        for e in shape:
            size = size * e
        if op == "NonZero":
            d, n = self.dim(outs[0], self.most(size))
            call = self.kernel(bb, counted.nonzero_te, [x, d.max], n, "cb_nonzero")
            return self.take(bb, call, 0, [max(len(shape), 1), n])
        if op == "Compress":
            axis = attrs.get("axis")
            if axis is None:
                x, shape, axis = bb.normalize(relax.op.reshape(x, [size])), [size], 0
            axis = int(axis) % len(shape)
            cond = inputs[1]
            length = extents_of(cond)[0]
            d, n = self.dim(outs[0], min(v for v in (self.most(length), self.most(shape[axis])) if v is not None))
            call = self.kernel(bb, counted.compress_te, [x, cond, axis, d.max], n, "cb_compress")
            return self.take(bb, call, 0, [*shape[:axis], n, *shape[axis + 1:]])
        if op == "NonMaxSuppression":
            return self.nms(bb, inputs, attrs, outs[0])
        if op == "Slice":  # along one axis, from and to where the data says (ops.data_slice)
            axes = inputs[3].value.numpy().reshape(-1) if len(inputs) > 3 and inputs[3] is not None else [0]
            step = int(inputs[4].value.numpy().reshape(-1)[0]) if len(inputs) > 4 and inputs[4] is not None else 1
            axis = int(axes[0]) % len(shape)
            d, n = self.dim(outs[0], self.most((shape[axis] + step - 1) // step))
            ends = [bb.normalize(relax.op.reshape(v, [1])) for v in inputs[1:3]]
            call = self.kernel(bb, counted.slice_te, [x, *ends, axis, step, d.max], n, "cb_slice")
            return self.take(bb, call, 0, [*shape[:axis], n, *shape[axis + 1:]])
        if op == "TopK":  # k known at run time only: the best `bound` sorted, the first k of them taken
            from .lower_sequential import topk_te

            axis = int(attrs.get("axis", -1)) % len(shape)
            d, n = self.dim(outs[0], self.most(shape[axis]))
            call = self.kernel(bb, lambda v, w: topk_te(v, d.max, axis, bool(attrs.get("largest", 1)), "int64", w),
                               [x, bb.normalize(relax.op.reshape(inputs[1], [1]))], n, "cb_topk")
            sized = [*shape[:axis], n, *shape[axis + 1:]]
            return relax.Tuple([self.take(bb, call, 0, sized), self.take(bb, call, 1, sized)])
        if op == "Unique":
            axis = attrs.get("axis")
            axis = None if axis is None else int(axis) % len(shape)
            d, n = self.dim(outs[0], self.most(size if axis is None else shape[axis]))
            call = self.kernel(bb, counted.unique_te, [x, axis, d.max, bool(attrs.get("sorted", 1))], n, "cb_unique")
            values = [n] if axis is None else [*shape[:axis], n, *shape[axis + 1:]]
            return relax.Tuple([self.take(bb, call, 0, values), self.take(bb, call, 1, [n]),
                                bb.emit(relax.TupleGetItem(call, 2)), self.take(bb, call, 3, [n])])
        raise CompileError(f"{op} has no counting kernel")

    def nms(self, bb, inputs, attrs, name):
        from tvm import relax

        from ..kernels import counted

        boxes, scores, *rest = list(inputs) + [None] * (5 - len(inputs))
        limits, values = [], []
        for t, cast in zip(rest[:3], (int, float, float)):
            if t is not None and is_const(t):
                limits.append(None), values.append(cast(t.value.numpy().reshape(-1)[0]))
            else:
                limits.append(None if t is None else bb.normalize(relax.op.reshape(t, [1])))
                values.append(None)
        batch, nbox, _ = extents_of(boxes)
        ncls = extents_of(scores)[1]
        per_class = self.most(nbox) if limits[0] is not None else min(values[0] or 0, self.most(nbox))
        most = self.most(batch * ncls) * max(per_class, 0)
        d, n = self.dim(name, most)
        call = self.kernel(bb, counted.nms_te, [boxes, scores, limits, d.max, int(attrs.get("center_point_box", 0)),
                                                values[0], values[1], values[2]],
                           n, "cb_nms")
        return self.take(bb, call, 0, [n, 3])

    @staticmethod
    def take(bb, call, k, shape):
        """Output `k` of a counting kernel at `shape` (its count on the counted axis)."""
        from tvm import relax

        from ..kernels.counted import take

        return bb.emit_te(take, bb.emit(relax.TupleGetItem(call, k)), shape, primfunc_name_hint="cb_take")


def _pairwise(bb, op, inputs):
    """Min / Max of several inputs, one broadcasting elementwise op per
    further input. (The importer stacks every input broadcast to the
    output's shape: a constant bound, 0 or 255 of a DynamicQuantizeLinear
    written out, became a constant of the whole output's size, 8 MB of 255s
    read on every run of a BiLSTM tagger.) Constants alone: the importer's
    own fold."""
    from tvm import relax

    pair = relax.op.minimum if op == "Min" else relax.op.maximum
    out = inputs[0]
    for v in inputs[1:]:
        out = bb.emit(pair(out, v))
    return out


_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
           "GreaterOrEqual")


def _on_sizes(bb, op, inputs, attrs, counts, node):
    """What the importer does not do (well) with sizes set at run time: a shape's
    values cast to a tensor, a Pad by sizes, a DepthToSpace, a ConvTranspose;
    None for the rest."""
    from tvm import relax, tirx

    if op == "Cast" and node is not None and node.name.endswith(shapes.SIZES):  # a Pad's widths (onnx/shapes.py
        return relax.Tuple([inputs[0]])  # _sizes_of_values): a shape in a tuple, past TVM's check of shape inputs
    if op == "Cast" and isinstance(inputs[0], relax.ShapeExpr) and not all(
            isinstance(v, tirx.IntImm) for v in inputs[0].values):  # a shape's values as data
        return _shape_values(bb, list(inputs[0].values), onnx.helper.tensor_dtype_to_np_dtype(int(attrs["to"])).name,
                             counts.written(inputs[0].values))
    if op == "Pad" and isinstance(inputs[1], relax.Tuple):
        return _named(bb, _pad_by_sizes(bb, inputs, attrs), node)
    shape = extents_of(inputs[0])
    if op == "Slice" and shape is not None and not dims.is_static(shape):
        within = _slice_within(bb, inputs, shape, counts.variables)
        return None if within is None else _named(bb, within, node)
    if shape is None or len(shape) != 4 or dims.is_static(shape):
        return None
    if op == "DepthToSpace":
        return _depth_to_space(bb, inputs[0], shape, int(attrs["blocksize"]), attrs.get("mode", b"DCR") in (b"DCR", "DCR"))
    return _conv_transpose(bb, inputs, shape, attrs, node.output[0] if node else op) if op == "ConvTranspose" else None


def _pad_by_sizes(bb, inputs, attrs):
    """A constant Pad whose widths are sizes set at run time (a VITS
    encoder's relative positions padded to 2T - 1, or cropped where T - 5
    is negative: the reads outside the input are the pad value either way)."""
    from tvm import topi

    widths = list(inputs[1].fields[0].values)
    if attrs.get("mode", b"constant") not in (b"constant", "constant") or len(inputs) > 3 and inputs[3] is not None:
        raise CompileError("a Pad by sizes set at run time is supported in constant mode over every axis only")
    if len(inputs) > 2 and inputs[2] is not None and not is_const(inputs[2]):
        raise CompileError("a Pad by sizes set at run time needs a constant pad value")
    value = inputs[2].value.numpy().item() if len(inputs) > 2 and inputs[2] is not None else 0.0
    half = len(widths) // 2
    call = bb.emit_te(topi.nn.pad, inputs[0], widths[:half], widths[half:], value, primfunc_name_hint="cb_pad_by_sizes")
    gv = bb.lookup_binding(call).args[0]  # a kernel apart: FuseTIR cannot remap the size variables its widths bring
    bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", branches.OPAQUE).with_attr(branches.APART, True))
    return call


def _slice_within(bb, inputs, shape, variables):
    """A Slice by constants (positive steps) of axes sized at run time, each
    bound within its axis at every declared size: its strided_slice says so
    (assume_inbound), its extent end - start. TVM's importer clamps the
    bounds, min(4, t) - min(1, t) for an exporter's reflection pad, and
    TVM's buffer compaction under-allocates blocked rows of such extents.
    None where a bound is not proved within (the importer's own slice)."""
    from tvm import relax, tirx

    if not all(is_const(v) or (k < 2 and isinstance(v, relax.ShapeExpr)) for k, v in enumerate(inputs[1:])
               if v is not None):
        return None
    given = [None if k >= len(inputs) or inputs[k] is None else [int(v) if isinstance(v, tirx.IntImm) else v for v in (
        inputs[k].values if isinstance(inputs[k], relax.ShapeExpr) else inputs[k].value.numpy().reshape(-1).tolist())]
        for k in range(1, 5)]  # bounds computed from sizes (a relative position's T - 1) are in their axis, proved
    starts, ends, axes, steps = given[:2] + [given[2] or list(range(len(given[0]))), given[3] or [1] * len(given[0])]
    axes = [int(a) % len(shape) for a in axes]
    if len({len(starts), len(ends), len(axes), len(steps)}) > 1 or min(steps) <= 0 or \
            dims.is_static([shape[a] for a in axes]):
        return None
    begin = [shape[a] + b if isinstance(b, int) and b < 0 else b for b, a in zip(starts, axes)]
    end = [e if not isinstance(e, int) else shape[a] if e >= 2 ** 62 else shape[a] + e if e < 0 else e
           for e, a in zip(ends, axes)]
    conditions = [c for b, e, a in zip(begin, end, axes) for c in (b >= 0, e >= b + 1, e <= shape[a])]
    if not dims.proved([c for c in conditions if not isinstance(c, bool) or not c], list(shape), variables):
        return None
    whole = [c for e, a in zip(end, axes) for c in [e == shape[a]] if not isinstance(c, bool) or not c]
    if all(isinstance(b, int) and b == 0 for b in begin) and set(steps) == {1} and dims.proved(whole, list(shape),
                                                                                                variables):
        return inputs[0]  # every axis whole (a relative embedding padded to 2T - 1, sliced to 2T - 1)
    value = lambda v: v if isinstance(v, int) else relax.prim_value(v)  # noqa: E731
    return bb.normalize(relax.op.strided_slice(inputs[0], axes, [value(b) for b in begin], [value(e) for e in end],
                                               steps, assume_inbound=True))


def _conv_transpose(bb, inputs, shape, attrs, name):
    """A ConvTranspose over sizes set at run time as its phases' convolution (onnx/subpixel.py) and
    one kernel that interleaves them and crops the pads; None for weights set at run time, groups, dilations."""
    import numpy as np
    from tvm import relax

    bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    if (not is_const(inputs[1]) or (bias is not None and not is_const(bias)) or int(attrs.get("group", 1)) != 1
            or any(d != 1 for d in attrs.get("dilations", [1, 1])) or attrs.get("auto_pad", "NOTSET") not in (b"NOTSET", "NOTSET")):
        return None
    w, (pt, pl, pb, pr), (oph, opw) = inputs[1].value.numpy(), attrs.get("pads", [0] * 4), attrs.get("output_padding", [0] * 2)
    (sh, sw), (kh, kw), co = attrs.get("strides", [1, 1]), w.shape[2:], w.shape[1]
    mh, mw = -(-kh // sh), -(-kw // sw)
    dh, dw = max(mh - 1, -(-(kh + oph - pb) // sh) - 1), max(mw - 1, -(-(kw + opw - pr) // sw) - 1)
    phases = relax.op.nn.conv2d(inputs[0], relax.const(subpixel.phase_weights(w, (sh, sw), 1)),
                                padding=[mh - 1, mw - 1, dh, dw])
    if bias is not None:  # per phase, each output channel's
        phases = relax.op.add(bb.emit(phases), relax.const(np.tile(bias.value.numpy().reshape(-1), sh * sw)
                                                           .reshape(1, -1, 1, 1)))
    phases, (n, _, h, wd) = bb.emit(phases, name_hint=f"{name}/phases"), shape
    out = (n, co, (h - 1) * sh + kh + oph - pt - pb, (wd - 1) * sw + kw + opw - pl - pr)
    return _interleave(bb, phases, out, lambda k, py, pz: (py * sw + pz) * co + k, (sh, sw), "cb_phase_shuffle", (pt, pl))


def _interleave(bb, x, out, channel, strides, name, at=(0, 0)):
    """One injective kernel writing `out` from phases `x`: output (y, z), at (top, left) on, is phase
    channel(k, y % sh, z % sw)'s value at (y // sh, z // sw)."""
    from tvm import te, tirx

    (sh, sw), (top, left), (div, mod) = strides, at, (tirx.floordiv, tirx.floormod)
    return bb.emit_te(lambda xt: te.compute(out, lambda b, k, y, z: xt[
        b, channel(k, mod(y + top, sh), mod(z + left, sw)), div(y + top, sh), div(z + left, sw)], name=name), x,
        primfunc_name_hint=name)


def _depth_to_space(bb, x, shape, s, dcr):
    """DepthToSpace over sizes set at run time as one kernel (the importer's reshape, transpose and
    reshape stay apart over such sizes: fuse_layers; PP-OCRv4 det's head 8 ms against 3)."""
    (n, _, h, w), co = shape, shape[1] // (s * s)
    channel = lambda k, py, pz: (py * s + pz) * co + k if dcr else (k * s + py) * s + pz  # noqa: E731
    return _interleave(bb, x, (n, co, h * s, w * s), channel, (s, s), "cb_depth_to_space")


def _shape_values(bb, values, dtype, after):
    """A tensor of a shape's values (sizes set at run time among them, each
    passed to the kernel as a number); `after`: tensors it waits for."""
    from tvm import relax, te, tirx
    from tvm.tirx.analysis import undefined_vars

    variables = list({v.name: v for e in values for v in undefined_vars(e)}.values())
    waits = [te.placeholder(extents_of(t), str(t.ty.dtype), name=f"after{k}") for k, t in enumerate(after)]

    def pick(i):
        out = tirx.Cast(dtype, values[-1])
        for k in range(len(values) - 2, -1, -1):
            out = tirx.Select(i == k, tirx.Cast(dtype, values[k]), out)
        return out

    out = te.compute((tirx.IntImm("int64", len(values)),), pick, name="cb_shape")
    gv = bb.add_func(te.create_prim_func([*waits, *variables, out]), "cb_shape")
    return bb.emit(relax.call_tir(gv, [*after, *variables], relax.TensorType((len(values),), dtype)))


def _scalars_typed(inputs):
    """A constant number the importer computed from shapes (a float64 from
    a Cast of a tensor's extent) beside a tensor: a constant of the
    tensor's dtype, as ONNX's types say it is."""
    from tvm import relax, tirx

    typed = [x for x in inputs if isinstance(getattr(x, "ty", None), relax.TensorType)]
    if not typed:
        return inputs
    dtype = str(typed[0].ty.dtype)
    return [relax.const(x.value, dtype) if isinstance(x, (tirx.FloatImm, tirx.IntImm)) else x for x in inputs]


def _sizes_typed(bb, inputs, counts):
    """A size set at run time (a PrimExpr the importer made of Shape
    arithmetic) beside a tensor in an element-wise operator (a Clip's bound
    from a width): a scalar tensor of the tensor's dtype holding it. Beside
    an integer constant it stays a size (TVM's importer computes sizes so:
    a relative position's T - 5)."""
    import tvm
    from tvm import relax

    typed = [x for x in inputs if isinstance(getattr(x, "ty", None), relax.TensorType)
             and not (is_const(x) and "int" in str(x.ty.dtype))]
    if not typed or not any(tvm.ir.is_prim_expr(x) and not isinstance(x, (tvm.tirx.IntImm, tvm.tirx.FloatImm))
                            for x in inputs):
        return inputs
    dtype = str(typed[0].ty.dtype)

    def scalar(x):
        value = _shape_values(bb, [x], dtype, counts.written([x]))
        return bb.normalize(relax.op.reshape(value, []))

    return [scalar(x) if tvm.ir.is_prim_expr(x) and not isinstance(x, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) else x
            for x in inputs]


def _arange(bb, inputs):
    """A Range of integers over sizes set at run time (0 to a sequence's
    length): an arange whose length is that size's own expression (the
    importer's own Range names its length anew, and a mask made from it
    cannot meet the scores it masks); None for other Ranges."""
    import tvm
    from tvm import relax, tirx
    from tvm.sym import Analyzer
    from tvm.tirx.analysis import undefined_vars

    values = []
    for x in inputs:  # whole numbers: integers, or floats holding one (a size cast to float)
        if isinstance(x, tirx.Cast) and str(getattr(x.value, "dtype", None) or x.value.ty) in ("int32", "int64"):
            x = x.value
        if is_const(x) and x.value.numpy().size == 1 and x.value.numpy().dtype.kind in "iuf" \
                and float(x.value.numpy().reshape(())).is_integer():
            values.append(int(x.value.numpy().reshape(())))
        elif tvm.ir.is_prim_expr(x) and str(getattr(x, "dtype", None) or x.ty) in ("int32", "int64"):
            values.append(x if str(getattr(x, "dtype", None) or x.ty) == "int64" else tirx.Cast("int64", x))
        else:
            return None
    start, limit, delta = values
    if all(isinstance(v, int) for v in values) or not isinstance(delta, int) or delta <= 0:
        return None
    sizes = Analyzer()  # sizes are never negative
    for v in undefined_vars(tirx.max(limit, start) if not isinstance(limit, int) else tirx.IntImm("int64", limit)):
        sizes.bind(v, tvm.ir.Range(tirx.IntImm("int64", 0), tirx.IntImm("int64", 1 << 40)))
    count = sizes.simplify(tirx.max((limit - start + delta - 1) // delta, 0))
    dtype = str(inputs[0].ty.dtype) if is_const(inputs[0]) else "int64"
    positions = bb.normalize(relax.op.arange(0, count, 1, dtype))
    return relax.op.add(relax.op.multiply(positions, relax.const(delta, dtype)), relax.const(start, dtype)) \
        if not isinstance(start, int) or start or delta != 1 else positions


_SAME = (b"SAME_UPPER", b"SAME_LOWER", "SAME_UPPER", "SAME_LOWER")


def _same_pads(x, attrs, w=None, op="Conv"):
    """A pooling's or convolution's SAME padding as explicit pads where they
    come out the same at every size (a fixed size, or a page of 32 * h
    rows: a stride-2 window pads as at any even size); None for a
    MaxPool whose pads change with the size (import_relax's own kernel
    pads it at run time); for others a CompileError saying which step
    makes them so."""
    from tvm.sym import Analyzer
    from tvm import tirx

    shape = getattr(getattr(x, "ty", None), "shape", None)
    if shape is None:
        return attrs
    spatial = list(shape.values[2:])
    kernel = attrs.get("kernel_shape") or ([int(d) for d in w.ty.shape.values[2:]] if w is not None else None)
    if kernel is None:
        return attrs
    strides = attrs.get("strides", [1] * len(spatial))
    dilations = attrs.get("dilations", [1] * len(spatial))
    upper = attrs["auto_pad"] in (b"SAME_UPPER", "SAME_UPPER")
    begin, end, simplify = [], [], Analyzer().simplify
    for n, k, s, d in zip(spatial, kernel, strides, dilations):
        total = simplify(tirx.max(((n + s - 1) // s - 1) * s + (k - 1) * d + 1 - n, 0))
        if not isinstance(total, tirx.IntImm):
            if op == "MaxPool" and all(v == 1 for v in dilations) and not attrs.get("ceil_mode") and \
                    len(attrs.get("kernel_shape", [])) == 2 and "storage_order" not in attrs:
                return None
            raise CompileError(f"its SAME padding over a size set at run time differs from size to size (stride {s}); "
                               f"declare that input dimension with a step that is a multiple of {s}, e.g. "
                               f"[MIN:MAX:{s}]")
        t = int(total)
        begin.append(t // 2 if upper else t - t // 2)
        end.append(t - begin[-1])
    return {**attrs, "auto_pad": b"NOTSET", "pads": begin + end}


def _same_max_pool(bb, x, node):
    """A 2-D MaxPool with SAME padding over sizes set at run time: each
    window's maximum over the entries inside the input (the padding never
    wins), its first row and column where the size puts them."""
    from tvm import te, tirx

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    (kh, kw), (sh, sw) = attrs["kernel_shape"], attrs.get("strides", [1, 1])
    upper = attrs["auto_pad"] in (b"SAME_UPPER", "SAME_UPPER")

    def pool(x):
        n, c, h, w = x.shape
        oh, ow = (h + sh - 1) // sh, (w + sw - 1) // sw

        def first(o, size, k, s):
            total = tirx.max((o - 1) * s + k - size, 0)
            return total // 2 if upper else total - total // 2

        top, left = first(oh, h, kh, sh), first(ow, w, kw, sw)
        r, t = te.reduce_axis((0, kh), "r"), te.reduce_axis((0, kw), "t")
        low = tirx.min_value(x.dtype)

        def at(b, ch, i, j):
            y, z = i * sh + r - top, j * sw + t - left
            inside = tirx.all(y >= 0, y < h, z >= 0, z < w)
            return te.max(tirx.Select(inside, x[b, ch, tirx.max(tirx.min(y, h - 1), 0),
                                                tirx.max(tirx.min(z, w - 1), 0)], low), axis=[r, t])

        return te.compute((n, c, oh, ow), at, name="cb_same_max_pool")

    return _named(bb, bb.emit_te(pool, x, primfunc_name_hint="cb_same_max_pool"), node)


def _whole_scales(inputs):
    """A Resize's constant scales, where every one is a whole number, as
    integers: an extent sized at run time then scales exactly (H * 2, not
    a float product cast back)."""
    from tvm import relax

    scales = inputs[2] if len(inputs) > 2 else None
    if not is_const(scales):
        return inputs
    v = scales.value.numpy()
    if v.ndim != 1 or not v.size or (v != v.round()).any() or (v < 1).any():
        return inputs
    return [*inputs[:2], relax.ShapeExpr([int(x) for x in v]), *inputs[3:]]


def _named(bb, value, node):
    """A node's one tensor result bound to a variable named as its ONNX
    output: the passes keep the name to the layer that writes it, and the
    bundle records it (`coldbrew compare` reads onnxruntime's value of the
    same tensor)."""
    from tvm import relax

    if node is None or len(node.output) != 1:
        return value
    call = value
    if isinstance(value, relax.DataflowVar) and value.name not in node.input:  # bound by its converter: again, named
        call = bb.lookup_binding(value)
    if not isinstance(call, relax.Call) or not isinstance(getattr(call, "ty", None), relax.TensorType):
        return value
    return bb.emit(call, name_hint=node.output[0])


class _Cell:
    """The importer's converter of a recurrent cell's node (onnx/recurrent.py):
    a call of the cell's placeholder kernel (compiler/kernels/recurrent.py),
    marked opaque, on (xw, R with its bias column, h0, c0, [R's scales]),
    giving (Y, Y_h, Y_c, [h_q: h quantized, its scale and zero point])."""

    @classmethod
    def get_converter(cls, opset):
        return cls.convert

    @staticmethod
    def convert(bb, inputs, attrs, params):
        from tvm import relax

        xw, w, h0, c0, *scale = (v if isinstance(v, relax.Var) or is_const(v) else bb.emit(v) for v in inputs)
        (seq, batch, _), (dirs, _, _) = (extents_of(v) for v in (xw, w))  # seq may be sized at run time
        text = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        spec = RecurrentSpec(text["kind"], seq, batch, int(text["hidden_size"]), dirs, text["direction"] == "reverse",
                             int(text["linear_before_reset"]), text["activation"], quantize_h=bool(text["quantize_h"]))
        gv = bb.add_func(placeholder(spec).with_attr("op_pattern", branches.OPAQUE), "cb_cell")
        state = relax.TensorType((dirs, batch, spec.hidden), spec.dtype)
        scratch = relax.TensorType((dirs, batch, spec.hidden + 2), spec.dtype)  # h_q, its scale and zero point
        out = [relax.TensorType(spec.output_shape, spec.dtype), state, state] + [scratch] * spec.quantize_h
        return bb.emit(relax.call_tir(gv, [xw, w, h0, c0, *scale, *size_vars(seq)], out))


def run(c):
    c.dims = dims.variables(c.options.dims.values())
    found = {p.key[len(BOUND_KEY):]: int(p.value) for p in c.proto.metadata_props if p.key.startswith(BOUND_KEY)}
    c.mod = apply(c.proto, c.dims, {**(c.options.bounds or {}), **found})
    looped = [n.name.rsplit("/", 1)[0] for n in c.proto.graph.node if n.op_type == loops.START]
    if looped and (c.on_gpu or c.options.continuous):
        raise CompileError(f"Loops whose condition depends on the data ({', '.join(looped)}) run on CPU targets "
                           f"{'only' if c.on_gpu else 'and not in continuous mode'} yet")
    counted = [d.name for d in c.dims if d.counted]
    if counted and (c.on_gpu or c.options.continuous):
        raise CompileError(f"outputs sized by the data ({', '.join(counted)}) are not available "
                           f"{'for GPU targets' if c.on_gpu else 'in continuous mode'} yet")
    c.name = c.proto.graph.name or "model"
    return c
