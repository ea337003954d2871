"""Single ONNX operators rewritten into equivalent nodes the Relax importer
takes and coldbrew's kernels compute exactly (run by passes/legalize_onnx.py
in the order of DECOMPOSITIONS; each leaves a node it cannot rewrite for
ops.check_static to name):

- LRN (local response normalization across channels): x / (bias + alpha /
  size * sum of x^2 over the channel window)^beta, the window's sum a Conv
  with a ones kernel over the squares.
- IsInf detecting one sign only: Equal to that infinity (Less than -inf,
  never true, when it detects neither).
- RMSNormalization: x / sqrt(mean(x^2 over the normalized axes) + epsilon)
  * scale, in float32 when stash_type asks for it (the importer's own form
  fails to lower when every axis is normalized).
- OneHot's depth (any numeric type, a scalar or one element): an int64
  scalar; its indices of other types cast to int64 (as ONNX says); its
  negative axis counted from the front; its result cast to its values'
  type (the importer computes it in float64).
- TopK with sorted=0 (any order allowed): sorted.
- Upsample (opset 7 to 9): per scaled axis a Gather of the source rows
  (nearest: floor(out / scale)), and for linear mode the weighted sum of the
  two neighbouring rows (asymmetric coordinates, as ONNX's Upsample means).
- ReverseSequence (constant lengths): per batch entry its first len steps
  reversed by a Slice with step -1, the rest kept, concatenated back; one
  Slice when every length is the whole sequence (also over a batch sized
  at run time, the lengths one constant expanded to it).
- Slice before opset 10 (bounds as attributes) and Resize at opset 10 (the
  old Upsample): Gathers of the kept or repeated rows, as above.
- Conv, ConvTranspose, MatMul and Gemm on float16 values: computed in
  float32 (their inputs cast up, the result cast back), as accumulating a
  long dot product in float16 loses digits (CPUs have no faster float16
  arithmetic; onnxruntime widens the same way).
- DynamicQuantizeLinear: its reductions and element-wise steps, as
  onnxruntime computes them (a scale of 1 for an all-zero input).
- ConvInteger: a Conv of the inputs less their zero points, cast to int32,
  in float32 where its constant weights bound every sum under 2^24 (exact,
  and a convolution variant computes it); where they bound no whole sum
  but each of a few runs of input channels, one float32 Conv per run (each
  exact) and their int32 sum; else in float64 (exact: every int32 sum is a
  float64 integer).
- MatMulInteger with constant 8-bit weights whose sums stay under 2^24: a
  float32 MatMul of the centred values (exact), cast to int32.
- Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).
- Swish: x * sigmoid(alpha * x).
- LpNormalization: x / ReduceL1 or ReduceL2 of x along the axis (0 where
  the norm is 0).
- EyeLike: the constant identity-like matrix of its input's static shape.
- MaxPool of stride 1 with a large window (a detector's SPP block: 5 x 5 to
  13 x 13): a column pool then a row pool (the max is separable; padding
  counts as -inf in both), kh + kw comparisons per output, not kh x kw.
- LayerNormalization asked for its Mean and InvStdDev outputs: computed
  from its parts (ReduceMean, Sub, Mul, Sqrt, Reciprocal), in float32 when
  stash_type asks for it.
- Mod of floats with fmod=0 (the result takes the divisor's sign): fmod,
  plus the divisor where the remainder is non-zero and its sign differs.
- ReduceMax and ReduceMin of bools: on uint8, cast back.
- Conv and ConvTranspose over one spatial axis (constant weights): the 2-D
  ones over a height of 1, between an Unsqueeze and a Squeeze; a 2-D Conv
  over a column (width and kernel width 1): the same along the width
  (Reshapes of the same bytes).
- ConvTranspose with output_shape: the pads that give that shape; then
  (2-D, constant weights) a Conv and a pixel shuffle (onnx/subpixel.py).
- Resize in the modes the TIR lowering does not implement (scales that do
  not give whole output sizes, an axes attribute, a kept aspect ratio,
  antialiasing, half_pixel_symmetric): per resized axis a constant matrix,
  the ONNX reference's own 1-D resize of the identity, applied along the
  axis (a Gather where every output row takes one input row).
- Pow with an exponent of another type: the exponent cast to the base's;
  Pow of integers: computed in float64 and cast back (exact for the
  integer results int64 can hold up to 2^53).
- Attention, RotaryEmbedding, LinearAttention, CausalConvWithState: the
  function bodies ONNX defines them by, inlined (onnx/attention.py).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from . import attention, subpixel
from .ops import drop_unread, opset_of, rewrite, types_and_shapes

_INTEGERS = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
             TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}


def lrn(model):
    g = model.graph
    if not any(n.op_type == "LRN" for n in g.node):
        return
    _, shapes = types_and_shapes(model)
    nodes = []
    for node in g.node:
        shape = shapes.get(node.input[0]) if node.op_type == "LRN" else None
        if shape is None or len(shape) != 4:
            nodes.append(node)  # not an LRN, or one check_static names
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        size, (n, c, h, w) = int(a["size"]), shape
        name, x = node.name or node.output[0], node.input[0]
        ones = numpy_helper.from_array(np.ones((1, 1, size, 1), np.float32), f"{name}/window")
        dims = {k: numpy_helper.from_array(np.array(v, np.int64), f"{name}/{k}")
                for k, v in (("flat", [n, 1, c, h * w]), ("back", [n, c, h, w]))}
        scale = numpy_helper.from_array(np.array(a.get("alpha", 1e-4) / size, np.float32), f"{name}/scale")
        bias = numpy_helper.from_array(np.array(a.get("bias", 1.0), np.float32), f"{name}/bias")
        beta = numpy_helper.from_array(np.array(a.get("beta", 0.75), np.float32), f"{name}/beta")
        g.initializer.extend([ones, scale, bias, beta, *dims.values()])
        t = [f"{name}/t{k}" for k in range(7)]
        nodes += [helper.make_node("Mul", [x, x], [t[0]]),
                  helper.make_node("Reshape", [t[0], dims["flat"].name], [t[1]]),
                  helper.make_node("Conv", [t[1], ones.name], [t[2]], pads=[(size - 1) // 2, 0, size // 2, 0]),
                  helper.make_node("Reshape", [t[2], dims["back"].name], [t[3]]),
                  helper.make_node("Mul", [t[3], scale.name], [t[4]]),
                  helper.make_node("Add", [t[4], bias.name], [t[5]]),
                  helper.make_node("Pow", [t[5], beta.name], [t[6]]),
                  helper.make_node("Div", [x, t[6]], [node.output[0]], name=name)]
    g.ClearField("node")
    g.node.extend(nodes)


def _np_type(types, name):
    return helper.tensor_dtype_to_np_dtype(types.get(name, TensorProto.FLOAT))


def isinf(model):
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
        if pos and neg:
            return [node]
        inf = add_init(f"{name}/inf", np.array(np.inf if pos else -np.inf, _np_type(types, node.input[0])))
        return [helper.make_node("Equal" if pos or neg else "Less", [node.input[0], inf], [node.output[0]], name=name)]
    rewrite(model, "IsInf", expand)


def rms_norm(model):
    types, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, scale, y = node.input[0], node.input[1], node.output[0]
        if x not in shapes:
            return [node]  # check_static names a value without a static shape
        rank, dtype = len(shapes[x]), types.get(x, TensorProto.FLOAT)
        axis = a.get("axis", -1) % rank
        work = TensorProto.FLOAT if a.get("stash_type", 1) == TensorProto.FLOAT else dtype
        t = [f"{name}/t{k}" for k in range(8)]
        out = []
        if work != dtype:
            out.append(helper.make_node("Cast", [x], [t[0]], to=work))
            x = t[0]
        axes = add_init(f"{name}/axes", np.arange(axis, rank, dtype=np.int64))
        eps = add_init(f"{name}/eps", np.array(a.get("epsilon", 1e-5), helper.tensor_dtype_to_np_dtype(work)))
        out += [helper.make_node("Mul", [x, x], [t[1]]),
                helper.make_node("ReduceMean", [t[1], axes], [t[2]], keepdims=1),
                helper.make_node("Add", [t[2], eps], [t[3]]),
                helper.make_node("Sqrt", [t[3]], [t[4]]),
                helper.make_node("Div", [x, t[4]], [t[5]])]
        if work != dtype:
            out.append(helper.make_node("Cast", [t[5]], [t[6]], to=dtype))
            t[5] = t[6]
        return out + [helper.make_node("Mul", [t[5], scale], [y], name=name)]
    rewrite(model, "RMSNormalization", expand)


def small_forms(model):
    """OneHot's depth and indices, TopK's order and Upsample's scales in the
    forms the importer takes (module docstring)."""
    g = model.graph
    consts = {t.name: t for t in g.initializer}
    types, shapes = types_and_shapes(model)
    nodes = []
    for node in g.node:
        name = node.name or node.output[0]
        if node.op_type == "OneHot" and node.input[1] in consts:
            depth = numpy_helper.to_array(consts[node.input[1]]).reshape(-1)[0]
            g.initializer.append(numpy_helper.from_array(np.array(int(depth), np.int64), f"{name}/depth"))
            node.input[1] = f"{name}/depth"
            for a in node.attribute:
                if a.name == "axis" and a.i < 0 and node.input[0] in shapes:
                    a.i %= len(shapes[node.input[0]]) + 1
            if types.get(node.input[0]) not in _INTEGERS:  # ONNX casts other indices to int64
                nodes.append(helper.make_node("Cast", [node.input[0]], [f"{name}/indices"], to=TensorProto.INT64))
                node.input[0] = f"{name}/indices"
            if types.get(node.input[2]) not in (None, TensorProto.DOUBLE):  # the importer's values are float64
                out, node.output[0] = node.output[0], f"{name}/wide"
                nodes += [node, helper.make_node("Cast", [node.output[0]], [out], to=types[node.input[2]])]
                continue
        elif node.op_type == "TopK":
            for a in node.attribute:
                if a.name == "sorted":
                    a.i = 1
        nodes.append(node)
    g.ClearField("node")
    g.node.extend(nodes)


def celu(model):
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        alpha, x, t = float(a.get("alpha", 1.0)), node.input[0], [f"{name}/t{k}" for k in range(6)]
        zero, al, one = (add_init(f"{name}/{k}", np.array(v, _np_type(types, x)))  # in x's type
                         for k, v in (("zero", 0), ("alpha", alpha), ("one", 1)))
        return [helper.make_node("Div", [x, al], [t[0]]), helper.make_node("Exp", [t[0]], [t[1]]),
                helper.make_node("Sub", [t[1], one], [t[2]]), helper.make_node("Mul", [t[2], al], [t[3]]),
                helper.make_node("Min", [t[3], zero], [t[4]]), helper.make_node("Max", [x, zero], [t[5]]),
                helper.make_node("Add", [t[5], t[4]], [node.output[0]], name=name)]
    rewrite(model, "Celu", expand)


def reverse_sequence(model):
    consts = {t.name: t for t in model.graph.initializer}
    _, shapes = types_and_shapes(model, symbolic=True)  # an axis sized at run time: None

    producers = {o: n for n in model.graph.node for o in n.output}

    def lengths(name):
        """The lengths' values: a constant's, or one constant expanded to
        the batch (an exporter's whole-sequence lengths over a batch sized
        at run time), None where neither."""
        if name in consts:
            return numpy_helper.to_array(consts[name]).astype(np.int64)
        p = producers.get(name)
        if p is None or p.op_type != "Expand":
            return None
        if p.input[0] in consts:
            return numpy_helper.to_array(consts[p.input[0]]).astype(np.int64).reshape(-1)
        g = producers.get(p.input[0])  # Gather(Shape(y), k): y's length along a fixed axis k
        s = producers.get(g.input[0]) if g is not None and g.op_type == "Gather" and g.input[1] in consts else None
        if s is None or s.op_type != "Shape" or len(s.attribute) or s.input[0] not in shapes:
            return None
        k = numpy_helper.to_array(consts[g.input[1]]).reshape(-1)
        dims = shapes[s.input[0]]
        return np.array([dims[i] for i in k.tolist()], np.int64) if all(isinstance(dims[i], int) for i in k) else None

    def expand(node, name, a, add_init):
        x, lens = node.input[0], lengths(node.input[1])
        t_axis, b_axis = a.get("time_axis", 0), a.get("batch_axis", 1)
        steps = shapes.get(x, [None] * 2)[t_axis]
        whole = lens is not None and isinstance(steps, int) and len(lens) > 0 and np.all(lens == steps)
        if not whole and (node.input[1] not in consts or None in shapes.get(x, [None])):
            return [node]  # check_static names what is not constant
        k = [0]

        def piece(src, start, end, step, axis):
            k[0] += 1
            out = f"{name}/p{k[0]}"
            ins = [add_init(f"{out}/{w}", np.array([v], np.int64))
                   for w, v in (("start", start), ("end", end), ("axis", axis), ("step", step))]
            return helper.make_node("Slice", [src] + ins, [out]), out

        if whole:  # every sequence whole (whatever the batch): one reversing Slice
            unread.append(node.input[1])
            node_, out = piece(x, -1, -steps - 1, -1, t_axis)
            return [node_, helper.make_node("Identity", [out], [node.output[0]], name=name)]
        nodes, rows = [], []
        for b, n in enumerate(lens.tolist()):
            row_node, row = piece(x, b, b + 1, 1, b_axis)
            nodes.append(row_node)
            parts = []
            if n > 0:
                rev_node, rev = piece(row, n - 1, -steps - 1, -1, t_axis)
                nodes.append(rev_node)
                parts.append(rev)
            if n < steps:
                rest_node, rest = piece(row, n, steps, 1, t_axis)
                nodes.append(rest_node)
                parts.append(rest)
            if len(parts) == 1:
                rows.append(parts[0])
            else:
                nodes.append(helper.make_node("Concat", parts, [f"{row}/joined"], axis=t_axis))
                rows.append(f"{row}/joined")
        return nodes + [helper.make_node("Concat", rows, [node.output[0]], axis=b_axis, name=name)]
    unread = []
    rewrite(model, "ReverseSequence", expand)
    drop_unread(model, unread)  # the lengths' chain, which the importer cannot take


_ACCUMULATING = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def conv1d_as_2d(model):
    """A 1-D Conv or ConvTranspose as the 2-D one over a height of 1 (the
    convolution variants are 2-D): the input and constant weights get a
    unit axis 2, the attributes a unit first entry, the output loses it."""
    consts = {t.name: t for t in model.graph.initializer}
    _, shapes = types_and_shapes(model, symbolic=True)  # a size set at run time: None
    opset = opset_of(model)

    def expand(node, name, a, add_init):
        x, w = node.input[0], node.input[1]
        if len(shapes.get(x, [])) != 3 or shapes[x][1] is None or w not in consts:
            return [node]
        attrs = dict(a)
        for k, unit in (("strides", 1), ("dilations", 1), ("kernel_shape", 1), ("output_padding", 0),
                        ("output_shape", 1)):
            if k in attrs:
                attrs[k] = [unit] + list(attrs[k])
        if "pads" in attrs:
            attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
        weights = numpy_helper.to_array(consts[w])
        w2 = add_init(f"{name}/w2d", weights.reshape(weights.shape[:2] + (1,) + weights.shape[2:]))
        unit = [] if opset < 13 else [add_init(f"{name}/axis2", np.array([2], np.int64))]
        axes = {"axes": [2]} if opset < 13 else {}
        return [helper.make_node("Unsqueeze", [x] + unit, [f"{name}/x2d"], name=f"{name}/x2d", **axes),
                helper.make_node(node.op_type, [f"{name}/x2d", w2] + list(node.input[2:]), [f"{name}/y2d"],
                                 name=f"{name}/2d", **attrs),
                helper.make_node("Squeeze", [f"{name}/y2d"] + unit, [node.output[0]], name=name, **axes)]
    for op in ("Conv", "ConvTranspose"):
        rewrite(model, op, expand)


def conv_column_as_row(model):
    """A 2-D Conv over a column (width 1, kernel width 1: a 1-D convolution
    written along the height) as the same convolution along the width, on
    the same bytes ([N, C, H, 1] is [N, C, 1, H]): the convolution variants
    tile the width."""
    consts = {t.name: t for t in model.graph.initializer}
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, w = node.input[0], node.input[1]
        xs, ws = shapes.get(x, []), shapes.get(w, [])
        if (len(xs) != 4 or xs[3] != 1 or xs[2] == 1 or w not in consts or len(ws) != 4 or ws[3] != 1
                or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
                or list(a.get("pads", [0] * 4))[1::2] != [0, 0] or list(a.get("strides", [1, 1]))[1] != 1
                or list(a.get("dilations", [1, 1]))[1] != 1):
            return [node]
        attrs = dict(a)
        for k in ("strides", "dilations", "kernel_shape"):
            if k in attrs:
                attrs[k] = [1, attrs[k][0]]
        if "pads" in attrs:
            attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][2]]
        weights = numpy_helper.to_array(consts[w])
        w2 = add_init(f"{name}/w_row", weights.reshape(ws[0], ws[1], 1, ws[2]))
        row = add_init(f"{name}/x_row", np.array([xs[0], xs[1], 1, xs[2]], np.int64))
        column = add_init(f"{name}/y_column", np.array([0, 0, -1, 1], np.int64))
        return [helper.make_node("Reshape", [x, row], [f"{name}/x_row"], name=f"{name}/x_row"),
                helper.make_node("Conv", [f"{name}/x_row", w2] + list(node.input[2:]), [f"{name}/y_row"],
                                 name=f"{name}/row", **attrs),
                helper.make_node("Reshape", [f"{name}/y_row", column], [node.output[0]], name=name)]
    rewrite(model, "Conv", expand)


def wide_accumulation(model):
    g = model.graph
    types, _ = types_and_shapes(model)
    if not any(n.op_type in _ACCUMULATING and types.get(n.input[0]) == TensorProto.FLOAT16 for n in g.node):
        return
    nodes = []
    for node in g.node:
        if node.op_type not in _ACCUMULATING or types.get(node.input[0]) != TensorProto.FLOAT16:
            nodes.append(node)
            continue
        name = node.name or node.output[0]
        for k, i in enumerate(node.input):
            if i and types.get(i) == TensorProto.FLOAT16:
                nodes.append(helper.make_node("Cast", [i], [f"{name}/in{k}_f32"], to=TensorProto.FLOAT))
                node.input[k] = f"{name}/in{k}_f32"
        out = node.output[0]
        node.output[0] = f"{name}/out_f32"
        nodes += [node, helper.make_node("Cast", [node.output[0]], [out], to=TensorProto.FLOAT16)]
    g.ClearField("node")
    g.node.extend(nodes)


def _exact_in_float32(centred):
    """Whether every sum of 8-bit inputs (differences up to 255) times these
    centred integer weights is exact in float32: |w - zero point| summed
    per output (axis 0 of a Conv's weights, columns of a MatMul's, given
    transposed) stays under 2^24 / 255."""
    return int(np.abs(centred).reshape(centred.shape[0], -1).sum(axis=1).max(initial=0)) * 255 < 2 ** 24


_EXACT = "coldbrew: an integer-valued float32 (exact sums)"


def _exact_int32(source, output, name):
    """The Cast of exact float32 sums to an integer operator's int32 output,
    marked so that `exact_casts` lets a Cast back to float read `source`."""
    node = helper.make_node("Cast", [source], [output], to=TensorProto.INT32, name=name)
    node.doc_string = _EXACT
    return node


def has_exact_sums(model):
    """Whether a ConvInteger or MatMulInteger became exact float32 sums (its
    centred weights are integers: int8 values times a scale of 1)."""
    return any(n.doc_string == _EXACT for n in model.graph.node)


def exact_casts(model):
    """A Cast to float32 of int32 values made from exact float32 sums (a
    ConvInteger or MatMulInteger computed in float32) reads the float
    values instead: the sums themselves, or, where onnxruntime's dynamic
    quantization adds its int32 bias (Cast of a Floor, reshaped) before
    dequantizing, the same Reshape and Add done in float32. The round trip
    through int32 is the identity while the values stay under 2^24 (beyond,
    the float32 sum rounds: 6e-8 relative), and the int32 conversion's
    per-element range checks go (their expressions swamp TVM's simplifier)."""
    g = model.graph
    made = {n.output[0]: n for n in g.node}
    twins, nodes = {}, []

    def twin(name, out):
        """A float32 tensor equal to int32 `name`, or None; nodes it needs go to `out`."""
        if name in twins:
            return twins[name]
        n, found = made.get(name), None
        if n is not None and n.op_type == "Cast" and n.doc_string == _EXACT:
            found = n.input[0]
        elif n is not None and n.op_type == "Cast" and made.get(n.input[0]) is not None and \
                made[n.input[0]].op_type in ("Floor", "Ceil", "Round"):
            found = n.input[0]  # integer-valued floats
        elif n is not None and n.op_type in ("Reshape", "Add", "Sub"):
            args = [twin(n.input[0], out)] + ([n.input[1]] if n.op_type == "Reshape" else [twin(n.input[1], out)])
            if None not in args:
                found = f"{name}/f32"
                out.append(helper.make_node(n.op_type, args, [found], name=f"{n.name or name}/f32"))
        twins[name] = found
        return found

    for n in g.node:
        to = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "to"), None)
        if n.op_type == "Cast" and to == TensorProto.FLOAT:
            t = twin(n.input[0], nodes)  # (a twin's nodes are kept: another Cast may read them)
            if t is not None:
                n = helper.make_node("Identity", [t], list(n.output), name=n.name)
        nodes.append(n)
    g.ClearField("node")
    g.node.extend(nodes)


def dynamic_quantize_linear(model):
    """DynamicQuantizeLinear as onnxruntime computes it: the range through
    0, scale = (max - min) / 255 (1 where the range is empty: an all-zero
    input), zero point = round(clip(0 - min / scale)), y = clip(round(x /
    scale) + zero point), rounding half to even, the quotient a division."""
    def expand(node, name, a, add_init):
        def k(tag, v):
            return add_init(f"{name}/{tag}", np.float32(v))
        p = f"{name}/"
        x, (y, scale, zero) = node.input[0], (list(node.output) + ["", "", ""])[:3]
        scale, zero = scale or p + "scale", zero or p + "zero"

        def clip(v, out):  # to [0, 255], then the rounded value as uint8
            return [helper.make_node("Max", [v, k("lo", 0)], [out + "_lo"]),
                    helper.make_node("Min", [out + "_lo", k("hi", 255)], [out + "_f"])]
        return [helper.make_node("ReduceMin", [x], [p + "min"], keepdims=0),
                helper.make_node("ReduceMax", [x], [p + "max"], keepdims=0),
                helper.make_node("Min", [p + "min", k("lo", 0)], [p + "low"]),
                helper.make_node("Max", [p + "max", k("lo", 0)], [p + "high"]),
                helper.make_node("Sub", [p + "high", p + "low"], [p + "range"]),
                helper.make_node("Div", [p + "range", k("hi", 255)], [p + "step"]),
                helper.make_node("Equal", [p + "high", p + "low"], [p + "empty"]),
                helper.make_node("Where", [p + "empty", k("one", 1), p + "step"], [scale]),
                helper.make_node("Div", [p + "low", scale], [p + "low_q"]),
                helper.make_node("Sub", [k("lo", 0), p + "low_q"], [p + "zero_f"]),
                *clip(p + "zero_f", p + "zero_c"),
                helper.make_node("Round", [p + "zero_c_f"], [p + "zero_r"]),
                helper.make_node("Cast", [p + "zero_r"], [zero], to=TensorProto.UINT8),
                helper.make_node("Div", [x, scale], [p + "x_q"]),
                helper.make_node("Round", [p + "x_q"], [p + "x_r"]),
                helper.make_node("Add", [p + "x_r", p + "zero_r"], [p + "y_z"]),
                *clip(p + "y_z", p + "y_c"),
                helper.make_node("Cast", [p + "y_c_f"], [y or p + "y"], to=TensorProto.UINT8, name=name)]
    rewrite(model, "DynamicQuantizeLinear", expand)


def conv_integer(model):
    _, shapes = types_and_shapes(model)
    consts = {t.name: t for t in model.graph.initializer}

    def expand(node, name, a, add_init):
        ins = list(node.input) + ["", ""]
        d = TensorProto.FLOAT if _conv_exact(consts, ins) else TensorProto.DOUBLE
        out = []
        for k, (v, zp) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
            wide = f"{name}/in{k}"
            out.append(helper.make_node("Cast", [v], [wide], to=d))
            if zp:
                out.append(helper.make_node("Cast", [zp], [f"{wide}/zp"], to=d))
                z = f"{wide}/zp"
                if k == 1 and shapes.get(zp, [1]) != [1] and len(shapes.get(zp, [])) == 1:  # per output channel
                    rank = len(shapes.get(ins[1], [0, 0, 0, 0]))
                    shape = add_init(f"{wide}/zp_shape", np.array([-1] + [1] * (rank - 1), np.int64))
                    out.append(helper.make_node("Reshape", [z, shape], [f"{z}/b"]))
                    z = f"{z}/b"
                out.append(helper.make_node("Sub", [wide, z], [f"{wide}/c"]))
                wide = f"{wide}/c"
            ins[k] = wide
        one_group = a.get("group", 1) == 1
        runs = _exact_runs(consts, list(node.input) + ["", ""]) if d == TensorProto.DOUBLE and one_group else None
        if runs:
            return _conv_runs(node, name, runs, a, add_init)
        conv = helper.make_node("Conv", ins[:2], [f"{name}/f64"], name=f"{name}/conv",
                                **{x.name: helper.get_attribute_value(x) for x in node.attribute})
        if d == TensorProto.FLOAT:
            return out + [conv, _exact_int32(f"{name}/f64", node.output[0], name)]
        return out + [conv, helper.make_node("Cast", [f"{name}/f64"], [node.output[0]], to=TensorProto.INT32, name=name)]
    rewrite(model, "ConvInteger", expand)


def _centred(consts, ins):
    """A ConvInteger's constant weights less their zero point (int64), or None."""
    if ins[1] not in consts or (ins[3] and ins[3] not in consts):
        return None
    w = numpy_helper.to_array(consts[ins[1]]).astype(np.int64)
    zp = numpy_helper.to_array(consts[ins[3]]).astype(np.int64) if ins[3] else np.zeros(1, np.int64)
    return w - (zp.reshape((-1,) + (1,) * (w.ndim - 1)) if zp.size > 1 else zp.reshape(()))


def _exact_runs(consts, ins, most=16):
    """For a ConvInteger of one group whose float32 sums are not all exact:
    runs [(first, end, centred weights)] of its input channels, each of whose
    sums is (_exact_in_float32), at most `most`; else None."""
    w = _centred(consts, ins)
    if w is None or w.ndim != 4:
        return None
    per = np.abs(w).sum(axis=(2, 3)) * 255  # [K, C]: each channel's share of a sum's bound
    runs, start, acc = [], 0, np.zeros(w.shape[0], np.int64)
    for c in range(w.shape[1]):
        if (acc + per[:, c]).max() >= 2 ** 24:
            if c == start:
                return None  # one channel alone is not exact
            runs.append((start, c, w[:, start:c]))
            start, acc = c, np.zeros_like(acc)
        acc += per[:, c]
    runs.append((start, w.shape[1], w[:, start:]))
    return runs if 1 < len(runs) <= most else None


def _conv_runs(node, name, runs, attrs, add_init):
    """A ConvInteger as one float32 Conv per run of input channels (the
    input less its zero point, sliced; the run's centred weights), each
    exact and cast to int32, summed in int32 (exact_casts then reads the
    float sums)."""
    x, zp = f"{name}/x32", (list(node.input) + ["", ""])[2]
    nodes = [helper.make_node("Cast", [node.input[0]], [x], to=TensorProto.FLOAT)]
    if zp:
        nodes += [helper.make_node("Cast", [zp], [f"{x}/zp"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", [x, f"{x}/zp"], [f"{x}/c"])]
        x = f"{x}/c"
    one = add_init(f"{name}/axis1", np.array([1], np.int64))
    parts = []
    for k, (lo, hi, w) in enumerate(runs):
        p = f"{name}/run{k}"
        nodes.append(helper.make_node("Slice", [x, add_init(f"{p}/lo", np.array([lo], np.int64)),
                                                add_init(f"{p}/hi", np.array([hi], np.int64)), one], [f"{p}/x"]))
        nodes.append(helper.make_node("Conv", [f"{p}/x", add_init(f"{p}/w", w.astype(np.float32))], [f"{p}/f32"],
                                      name=f"{p}/conv", **attrs))
        nodes.append(_exact_int32(f"{p}/f32", f"{p}/i32", f"{p}/cast"))
        parts.append(f"{p}/i32")
    total = parts[0]
    for k, part in enumerate(parts[1:]):
        out = node.output[0] if k == len(parts) - 2 else f"{name}/sum{k}"
        nodes.append(helper.make_node("Add", [total, part], [out], name=f"{name}/add{k}" if out != node.output[0]
                                      else name))
        total = out
    return nodes


def _conv_exact(consts, ins):
    """_exact_in_float32 for a ConvInteger with constant weights (and zero
    point, one or per output channel)."""
    w = _centred(consts, ins)
    return w is not None and _exact_in_float32(w)


def matmul_integer(model):
    """MatMulInteger with constant 8-bit weights whose |b - zero point|
    summed per column, times the largest 8-bit input difference (255),
    stay under 2^24: a float32 MatMul of a's values and b's centred ones,
    less a's zero point times b's column sums (exact: every product and
    partial sum is an integer float32 holds), cast to int32, so the dense
    variant computes it. Other forms stay as they are."""
    consts = {t.name: t for t in model.graph.initializer}
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        ins = list(node.input) + ["", ""]
        if ins[1] not in consts or (ins[3] and ins[3] not in consts) or (ins[2] and shapes.get(ins[2]) not in ([], [1])):
            return [node]  # a's zero point: one value (constant or computed, as DynamicQuantizeLinear's)
        b = numpy_helper.to_array(consts[ins[1]]).astype(np.int64)
        bz = numpy_helper.to_array(consts[ins[3]]).astype(np.int64) if ins[3] else np.zeros((), np.int64)
        if b.ndim != 2 or bz.size not in (1, b.shape[1]):
            return [node]
        centred = b - bz.reshape(-1)[None, :] if bz.size > 1 else b - bz.reshape(())
        if not _exact_in_float32(centred.T):
            return [node]
        # (a - a_zero) b_c = a b_c - a_zero x b_c's column sums: the MatMul's input
        # stays the 8-bit integers (an integer variant multiplies them as they are)
        w = add_init(f"{name}/b_f32", centred.astype(np.float32))
        out = [helper.make_node("Cast", [ins[0]], [f"{name}/a"], to=TensorProto.FLOAT),
               helper.make_node("MatMul", [f"{name}/a", w], [f"{name}/f32"], name=f"{name}/matmul")]
        y = f"{name}/f32"
        if ins[2]:
            sums = add_init(f"{name}/b_sums", centred.sum(axis=0).astype(np.float32))
            out += [helper.make_node("Cast", [ins[2]], [f"{name}/a_zero"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", [f"{name}/a_zero", sums], [f"{name}/shift"]),
                    helper.make_node("Sub", [y, f"{name}/shift"], [f"{name}/f32_c"])]
            y = f"{name}/f32_c"
        return out + [_exact_int32(y, node.output[0], name)]
    rewrite(model, "MatMulInteger", expand)


def upsample(model):
    consts = {t.name: t for t in model.graph.initializer}
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x = node.input[0]
        scales = (numpy_helper.to_array(consts[node.input[1]]) if len(node.input) > 1 and node.input[1] in consts
                  else a.get("scales"))
        if scales is None or x not in shapes:
            return [node]  # check_static names the input that is not constant
        linear = a.get("mode", b"nearest") in (b"linear", "linear", b"bilinear", "bilinear")
        out = []
        for axis, (d, sc) in enumerate(zip(shapes[x], np.asarray(scales, float))):
            n = int(np.floor(d * sc))
            if n == d:
                continue
            pos = np.arange(n) / sc
            lo = np.minimum(np.floor(pos), d - 1).astype(np.int64)
            y = f"{name}/axis{axis}"
            if not linear:
                out.append(helper.make_node("Gather", [x, add_init(f"{y}/idx", lo)], [y], axis=axis))
            else:
                hi = np.minimum(lo + 1, d - 1)
                shape = [1] * len(shapes[node.input[0]])
                shape[axis] = n
                w = np.asarray(pos - lo, np.float32).reshape(shape)
                out += [helper.make_node("Gather", [x, add_init(f"{y}/lo", lo)], [f"{y}/a"], axis=axis),
                        helper.make_node("Gather", [x, add_init(f"{y}/hi", hi)], [f"{y}/b"], axis=axis),
                        helper.make_node("Sub", [f"{y}/b", f"{y}/a"], [f"{y}/d"]),
                        helper.make_node("Mul", [f"{y}/d", add_init(f"{y}/w", w)], [f"{y}/wd"]),
                        helper.make_node("Add", [f"{y}/a", f"{y}/wd"], [y])]
            x = y
        return out + [helper.make_node("Identity", [x], [node.output[0]], name=name)]
    rewrite(model, "Upsample", expand)
    if opset_of(model) == 10:  # Resize-10 is Upsample-9 under a new name
        rewrite(model, "Resize", expand)


def slice_attributes(model):
    """Slice before opset 10 (starts, ends, axes as attributes): per sliced
    axis a Gather of the kept rows."""
    if opset_of(model) >= 10:
        return
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x = node.input[0]
        if x not in shapes:
            return [node]
        rank = len(shapes[x])
        axes = a.get("axes", list(range(len(a["starts"]))))
        out = []
        for k, (axis, start, end) in enumerate(zip(axes, a["starts"], a["ends"])):
            axis %= rank
            size = shapes[node.input[0]][axis]
            keep = np.arange(size)[slice(start, end)]
            if len(keep) == size:
                continue
            y = f"{name}/axis{axis}"
            out.append(helper.make_node("Gather", [x, add_init(f"{y}/idx", keep.astype(np.int64))], [y], axis=axis))
            x = y
        return out + [helper.make_node("Identity", [x], [node.output[0]], name=name)]
    rewrite(model, "Slice", expand)


def swish(model):
    """Swish, and SwiGLU (Swish of the gate times the value): x * Sigmoid(alpha * x), alpha in x's type."""
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, y = node.input[0], node.output[0]
        alpha = add_init(f"{name}/alpha", np.array(a.get("alpha", 1.0), _np_type(types, x)))
        gated = node.op_type == "SwiGLU"
        return [helper.make_node("Mul", [x, alpha], [f"{name}/ax"]),
                helper.make_node("Sigmoid", [f"{name}/ax"], [f"{name}/s"]),
                helper.make_node("Mul", [x, f"{name}/s"], [f"{name}/sw" if gated else y], name=None if gated else name)
                ] + ([helper.make_node("Mul", [f"{name}/sw", node.input[1]], [y], name=name)] if gated else [])
    rewrite(model, "Swish", expand)
    rewrite(model, "SwiGLU", expand)


def space_to_depth_crd(model):
    """SpaceToDepth's CRD order (opset 28): [b, c, h/s, s, w/s, s] -> [b, c, s, s, h/s, w/s] -> [b, c*s*s, h/s, w/s]."""
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, s = node.input[0], int(a["blocksize"])
        if a.get("mode", b"DCR") in (b"DCR", "DCR") or x not in shapes:
            return [node]
        b, c, h, w = shapes[x]
        split = add_init(f"{name}/split", np.array([b, c, h // s, s, w // s, s], np.int64))
        joined = add_init(f"{name}/joined", np.array([b, c * s * s, h // s, w // s], np.int64))
        return [helper.make_node("Reshape", [x, split], [f"{name}/t0"]),
                helper.make_node("Transpose", [f"{name}/t0"], [f"{name}/t1"], perm=[0, 1, 3, 5, 2, 4]),
                helper.make_node("Reshape", [f"{name}/t1", joined], [node.output[0]], name=name)]
    rewrite(model, "SpaceToDepth", expand)


def separable_max_pool(model):
    def expand(node, name, a, add_init):
        k, pads = list(a.get("kernel_shape", [])), list(a.get("pads", [0, 0, 0, 0]))
        if (len(k) != 2 or k[0] * k[1] < 9 or min(k) < 2 or any(s != 1 for s in a.get("strides", [1, 1]))
                or any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
                or len([o for o in node.output if o]) != 1):
            return [node]
        return [helper.make_node("MaxPool", [node.input[0]], [f"{name}/columns"], name=f"{name}/columns",
                                 kernel_shape=[k[0], 1], pads=[pads[0], 0, pads[2], 0]),
                helper.make_node("MaxPool", [f"{name}/columns"], [node.output[0]], name=name,
                                 kernel_shape=[1, k[1]], pads=[0, pads[1], 0, pads[3]])]
    rewrite(model, "MaxPool", expand)


def lp_normalization(model):
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        p = a.get("p", 2)
        if p not in (1, 2):
            return [node]  # check_static names it
        axes = add_init(f"{name}/axes", np.array([a.get("axis", -1)], np.int64))
        norm = helper.make_node(f"ReduceL{p}", [node.input[0], axes], [f"{name}/norm"], keepdims=1)
        if opset_of(model) < 18:
            norm = helper.make_node(f"ReduceL{p}", [node.input[0]], [f"{name}/norm"], keepdims=1,
                                    axes=[a.get("axis", -1)])
        dtype = _np_type(types, node.input[0])
        tiny = add_init(f"{name}/tiny", np.array(np.finfo(dtype).tiny if dtype.kind == "f" else 1, dtype))
        return [norm, helper.make_node("Max", [f"{name}/norm", tiny], [f"{name}/safe"]),  # 0 / 0 gives 0
                helper.make_node("Div", [node.input[0], f"{name}/safe"], [node.output[0]], name=name)]
    rewrite(model, "LpNormalization", expand)


def eye_like(model):
    types, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x = node.input[0]
        if x not in shapes or len(shapes[x]) != 2:
            return [node]
        dtype = helper.tensor_dtype_to_np_dtype(a.get("dtype", types.get(x, TensorProto.FLOAT)))
        eye = add_init(f"{name}/eye", np.eye(*shapes[x], k=a.get("k", 0), dtype=dtype))
        return [helper.make_node("Identity", [eye], [node.output[0]], name=name)]
    rewrite(model, "EyeLike", expand)


def layer_norm_statistics(model):
    types, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, outs = node.input[0], list(node.output) + ["", ""]
        if not any(outs[1:3]) or x not in shapes:
            return [node]
        rank, dtype = len(shapes[x]), types.get(x, TensorProto.FLOAT)
        axes = np.arange(a.get("axis", -1) % rank, rank, dtype=np.int64)

        def mean(src, dst):  # ReduceMean's axes: an input from opset 18, an attribute before
            if opset_of(model) >= 18:
                return helper.make_node("ReduceMean", [src, add_init(f"{dst}/axes", axes)], [dst], keepdims=1)
            return helper.make_node("ReduceMean", [src], [dst], keepdims=1, axes=axes.tolist())
        work = TensorProto.FLOAT if a.get("stash_type", 1) == TensorProto.FLOAT else dtype
        eps = add_init(f"{name}/eps", np.array(a.get("epsilon", 1e-5), helper.tensor_dtype_to_np_dtype(work)))
        t = [f"{name}/t{k}" for k in range(8)]
        out = [helper.make_node("Cast", [x], [t[0]], to=work),
               mean(t[0], t[1]),
               helper.make_node("Sub", [t[0], t[1]], [t[2]]),
               helper.make_node("Mul", [t[2], t[2]], [t[3]]),
               mean(t[3], t[4]),
               helper.make_node("Add", [t[4], eps], [t[5]]),
               helper.make_node("Sqrt", [t[5]], [t[6]]),
               helper.make_node("Reciprocal", [t[6]], [outs[2] or t[7]]),
               helper.make_node("Mul", [t[2], outs[2] or t[7]], [f"{name}/normed"]),
               helper.make_node("Cast", [f"{name}/normed"], [f"{name}/normed_x"], to=dtype),
               helper.make_node("Mul", [f"{name}/normed_x", node.input[1]], [f"{name}/scaled" if len(node.input) > 2
                                                                             and node.input[2] else outs[0]])]
        if len(node.input) > 2 and node.input[2]:
            out.append(helper.make_node("Add", [f"{name}/scaled", node.input[2]], [outs[0]], name=name))
        if outs[1]:
            out.append(helper.make_node("Identity", [t[1]], [outs[1]]))
        return out
    rewrite(model, "LayerNormalization", expand)


def float_mod(model):
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, y = node.input
        if a.get("fmod", 0) or types.get(x) not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
            return [node]
        zero = add_init(f"{name}/zero", np.array(0, _np_type(types, x)))
        t = [f"{name}/t{k}" for k in range(6)]
        return [helper.make_node("Mod", [x, y], [t[0]], fmod=1),
                helper.make_node("Mul", [t[0], y], [t[1]]),
                helper.make_node("Less", [t[1], zero], [t[2]]),  # non-zero, of the other sign than y
                helper.make_node("Add", [t[0], y], [t[3]]),
                helper.make_node("Where", [t[2], t[3], t[0]], [node.output[0]], name=name)]
    rewrite(model, "Mod", expand)


def bool_extrema(model):
    types, _ = types_and_shapes(model)
    for op in ("ReduceMax", "ReduceMin"):
        def expand(node, name, a, add_init):
            if types.get(node.input[0]) != TensorProto.BOOL:
                return [node]
            wide = helper.make_node("Cast", [node.input[0]], [f"{name}/u8"], to=TensorProto.UINT8)
            red = helper.make_node(op, [f"{name}/u8"] + list(node.input[1:]), [f"{name}/r"], name=name,
                                   **{k: v for k, v in a.items()})
            return [wide, red, helper.make_node("Cast", [f"{name}/r"], [node.output[0]], to=TensorProto.BOOL)]
        rewrite(model, op, expand)


def conv_transpose_output_shape(model):
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, w = node.input[0], node.input[1]
        if "output_shape" not in a or x not in shapes or w not in shapes:
            return [node]
        spatial = len(shapes[x]) - 2
        want = list(a["output_shape"])[-spatial:]
        strides, dil = a.get("strides", [1] * spatial), a.get("dilations", [1] * spatial)
        extra, kernel = a.get("output_padding", [0] * spatial), shapes[w][2:]
        total = [s * (i - 1) + e + (k - 1) * d + 1 - o
                 for s, i, e, k, d, o in zip(strides, shapes[x][2:], extra, kernel, dil, want)]
        upper = a.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER")
        begin = [t // 2 if upper else t - t // 2 for t in total]
        attrs = {k: v for k, v in a.items() if k not in ("output_shape", "auto_pad")}
        attrs["pads"] = begin + [t - b for t, b in zip(total, begin)]
        return [helper.make_node("ConvTranspose", list(node.input), list(node.output), name=name, **attrs)]
    rewrite(model, "ConvTranspose", expand)


def _resize_plan(node, a, consts, shape):
    """[(axis, in_len, out_len, scale)] for the resized axes, or None where
    an input is not constant or the mode is tf_crop_and_resize."""
    ins = list(node.input) + ["", "", ""]
    mode = a.get("coordinate_transformation_mode", b"half_pixel")
    if mode in (b"tf_crop_and_resize", "tf_crop_and_resize") or any(i and i not in consts for i in ins[1:4]):
        return None
    rank = len(shape)
    axes = [x % rank for x in a.get("axes", range(rank))]
    scales = consts[ins[2]].astype(np.float64).tolist() if ins[2] and consts[ins[2]].size else None
    sizes = consts[ins[3]].astype(np.int64).tolist() if ins[3] and consts[ins[3]].size else None
    if sizes is not None:
        ratios = [o / shape[x] for o, x in zip(sizes, axes)]
        policy = a.get("keep_aspect_ratio_policy", b"stretch")
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy != "stretch":
            common = (min if policy == "not_larger" else max)(ratios)
            ratios = [common] * len(axes)
            sizes = [int(np.floor(common * shape[x] + 0.5)) for x in axes]
        scales = ratios
    elif scales is not None:
        sizes = [int(np.floor(shape[x] * sc)) for x, sc in zip(axes, scales)]
    else:
        return None
    return [(x, shape[x], m, sc) for x, m, sc in zip(axes, sizes, scales) if m != shape[x] or sc != 1]


def _resize_matrix(node, a, n, m, scale, opset):
    """[m, n]: the reference's 1-D resize of the identity by `scale`."""
    from onnx.reference import ReferenceEvaluator

    keep = {k: v for k, v in a.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "s"], ["y"], **keep)], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([1.0, scale], np.float32), "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", max(opset, 13))])
    y = ReferenceEvaluator(model).run(None, {"x": np.eye(n, dtype=np.float32)})[0]
    return y.T if y.shape == (n, m) else None


def resize_by_matrices(model):
    from .ops import resize_needs_fallback

    protos = {t.name: t for t in model.graph.initializer}
    consts = {k: numpy_helper.to_array(t) for k, t in protos.items()}
    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x = node.input[0]
        if x not in shapes or not resize_needs_fallback(node, protos, shapes):
            return [node]
        plan = _resize_plan(node, a, consts, shapes[x])
        mats = [_resize_matrix(node, a, n, m, sc, opset_of(model)) for _, n, m, sc in plan or []]
        if plan is None or any(mt is None for mt in mats):
            return [node]  # check_static names the mode
        rank, out = len(shapes[x]), []
        for (axis, n, m, _), mt in zip(plan, mats):
            y = f"{name}/axis{axis}"
            if np.all((mt == 0) | (mt == 1)) and np.all(mt.sum(axis=1) == 1):  # each output row one input row
                out.append(helper.make_node("Gather", [x, add_init(f"{y}/rows", mt.argmax(axis=1))], [y], axis=axis))
            else:
                perm = list(range(rank))
                perm[axis], perm[-1] = perm[-1], perm[axis]
                t = [f"{y}/t{k}" for k in range(2)]
                out += [helper.make_node("Transpose", [x], [t[0]], perm=perm),
                        helper.make_node("MatMul", [t[0], add_init(f"{y}/m", np.ascontiguousarray(mt.T))], [t[1]]),
                        helper.make_node("Transpose", [t[1]], [y], perm=perm)]
            x = y
        return out + [helper.make_node("Identity", [x], [node.output[0]], name=name)]
    rewrite(model, "Resize", expand)


def pow_types(model):
    types, _ = types_and_shapes(model)

    def expand(node, name, a, add_init):
        x, y, out = node.input[0], node.input[1], node.output[0]
        if not types.get(x) or not types.get(y):
            return [node]  # a type inference does not know
        base, expo = types[x], types[y]
        if base in _FLOATS and expo != base:
            return [helper.make_node("Cast", [y], [f"{name}/y"], to=base),
                    helper.make_node("Pow", [x, f"{name}/y"], [out], name=name)]
        if base in _FLOATS:
            return [node]
        d = TensorProto.DOUBLE
        return [helper.make_node("Cast", [x], [f"{name}/x64"], to=d), helper.make_node("Cast", [y], [f"{name}/y64"], to=d),
                helper.make_node("Pow", [f"{name}/x64", f"{name}/y64"], [f"{name}/p64"]),
                helper.make_node("Cast", [f"{name}/p64"], [out], to=base, name=name)]
    rewrite(model, "Pow", expand)


_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}

# (the operators each rewrites, the rewrite): one runs only where its
# operators are in the graph (most infer the graph's shapes first)
DECOMPOSITIONS = [  # the fused operators first (their bodies' operators are rewritten below); convolutions
    # next: 1-D as 2-D, a ConvTranspose's pads, then its sub-pixel form, whose crop may be an old Slice
    (attention.FUSED, attention.expand),
    (("Conv", "ConvTranspose"), conv1d_as_2d), (("Conv",), conv_column_as_row),
    (("ConvTranspose",), conv_transpose_output_shape),
    (("ConvTranspose",), subpixel.apply),
    (("Slice",), slice_attributes), (("LRN",), lrn), (("IsInf",), isinf), (("RMSNormalization",), rms_norm),
    (("OneHot", "TopK"), small_forms), (("Upsample", "Resize"), upsample), (("ReverseSequence",), reverse_sequence),
    (_ACCUMULATING, wide_accumulation), (("DynamicQuantizeLinear",), dynamic_quantize_linear),
    (("ConvInteger",), conv_integer),
    (("MatMulInteger",), matmul_integer), (("Cast",), exact_casts), (("Celu",), celu), (("Swish", "SwiGLU"), swish),
    (("SpaceToDepth",), space_to_depth_crd),
    (("LpNormalization",), lp_normalization), (("EyeLike",), eye_like), (("MaxPool",), separable_max_pool),
    (("LayerNormalization",), layer_norm_statistics), (("Mod",), float_mod), (("ReduceMax", "ReduceMin"), bool_extrema),
    (("Resize",), resize_by_matrices), (("Pow",), pow_types)]


def apply(model):
    for ops, decompose in DECOMPOSITIONS:
        if any(n.op_type in ops for n in model.graph.node):
            decompose(model)
