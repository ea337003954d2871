"""The operators coldbrew supports: the one list every other part consults;
and what the ONNX passes share about a model's graph."""

# ONNX default-domain operator types accepted by the compiler. Each one is
# covered by the ONNX backend node tests (tests/compiler/test_onnx_node.py).
SUPPORTED_OPS = frozenset("""
Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast Ceil Clip Concat
Constant ConstantOfShape Conv ConvTranspose Cos Div Dropout Elu Equal Erf Exp
Expand Flatten Floor Gather Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
GreaterOrEqual HardSigmoid HardSwish Identity InstanceNormalization
LayerNormalization LeakyRelu Less LessOrEqual Log MatMul Max MaxPool Mean Min
Mul Neg Not Or Pad Pow PRelu Range Reciprocal ReduceMax ReduceMean ReduceMin
ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Shape Sigmoid Sign Sin
Size Slice Softmax Softplus Split Sqrt Squeeze Sub Sum Tanh Tile Transpose
Unsqueeze Where If LogSoftmax Mod Xor GatherElements GatherND IsNaN QuantizeLinear
DequantizeLinear DynamicQuantizeLinear MatMulInteger LSTM GRU LRN
Selu Celu Mish Softsign ThresholdedRelu Shrink Round IsInf Trilu Hardmax
ScatterND ScatterElements GroupNormalization RMSNormalization GridSample RoiAlign
DepthToSpace SpaceToDepth OneHot Einsum CumSum ReduceL1 ReduceL2 ReduceLogSumExp
ReduceLogSum Upsample TopK Loop ReverseSequence RNN ConvInteger Scan
Acos Acosh Asin Asinh Atan Atanh Cosh Sinh Tan BitwiseAnd BitwiseOr BitwiseXor
BitwiseNot LpPool EyeLike LpNormalization Swish SwiGLU HannWindow HammingWindow
BlackmanWindow MelWeightMatrix Attention RotaryEmbedding LinearAttention
CausalConvWithState com.microsoft.DynamicQuantizeLSTM NonZero Compress NonMaxSuppression Unique
RandomNormal RandomNormalLike RandomUniform RandomUniformLike
""".split())  # If: where its condition folds to a constant (onnx/fold.py inlines the branch);
# LSTM, GRU, RNN: unrolled over their fixed sequence (passes/legalize_onnx.py, onnx/recurrent.py);
# Loop: unrolled where its trip count is known at compile time (onnx/fold.py, onnx/loops.py), else to
# the most iterations it may run, each copy run while its condition holds (legalize_onnx, loops.unroll_while);
# Scan: unrolled over its scan inputs (onnx/loops.py); Attention, RotaryEmbedding, LinearAttention,
# CausalConvWithState: their ONNX function bodies (onnx/attention.py); others rewritten in
# onnx/decompose.py or lowered by coldbrew's own kernels (passes/lower_resize.py, passes/lower_sequential.py);
# the window functions and MelWeightMatrix: constants, folded (their inputs must be); the random
# operators: a counter-based generator's values, the same every run (kernels/random.py)

# Operators whose output's size depends on the input values (not only on
# the input shapes): each output is planned at a bound (the most the input
# allows, or --bound) and sized by the count its kernel finds (kernels/counted.py).
COUNTED_OPS = {
    "NonZero": "how many entries are non-zero",
    "Range": "its limits, where the data sets them",
    "NonMaxSuppression": "how many boxes survive",
    "Unique": "how many distinct values there are",
    "Compress": "how many entries the condition keeps",
}

MIN_OPSET = 1
MAX_OPSET = 28

# Operator inputs that decide shapes or modes and so must be compile-time
# constants (after constant folding): {op_type: input positions}.
STATIC_INPUTS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 2, 3},
    "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1}, "Resize": {1, 2, 3},
    "ConstantOfShape": {0}, "Dropout": {1, 2}, "ReduceMax": {1},
    "ReduceMean": {1}, "ReduceMin": {1}, "ReduceProd": {1}, "ReduceSum": {1},
    "ReduceSumSquare": {1}, "ReduceL1": {1}, "ReduceL2": {1}, "ReduceLogSum": {1}, "ReduceLogSumExp": {1},
    "If": {0}, "LSTM": {1, 2, 3, 4, 7}, "GRU": {1, 2, 3, 4}, "RNN": {1, 2, 3, 4}, "CumSum": {1},
    "OneHot": {1, 2}, "Upsample": {1},
    "TopK": {1}, "ReverseSequence": {1},
    "HannWindow": {0}, "HammingWindow": {0}, "BlackmanWindow": {0}, "MelWeightMatrix": {0, 1, 2, 3, 4},
}


def opset_of(model, default=1):
    """The model's default-domain opset (`default` where it names none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default)


def drop_unread(model, names=None):
    """Nodes none of whose outputs anything reads any more (a graph output,
    a node, a subgraph's node at any depth): all of them, or with `names`,
    those that computed these names and, in turn, what only they read."""
    g = model.graph
    names = None if names is None else set(names)
    while names is None or names:
        used = {o.name for o in g.output} | _reads(g)
        dead = {k for k, n in enumerate(g.node) if not any(o in used for o in n.output if o)
                and (names is None or set(n.output) & names)}
        if not dead:
            return
        if names is not None:
            names = {i for k in dead for i in g.node[k].input if i}
        live = [n for k, n in enumerate(g.node) if k not in dead]
        del g.node[:]
        g.node.extend(live)


def _reads(graph):
    """Every name a graph's nodes read, its subgraphs' at any depth too."""
    return {i for n in graph.node for i in n.input} | {
        i for n in graph.node for a in n.attribute if a.type == a.GRAPH for i in _reads(a.g)}


def check_supported(model):
    """UnsupportedOperatorError naming every node (of the graph itself, not
    of its subgraphs) whose operator coldbrew does not support."""
    from ..errors import UnsupportedOperatorError

    unsupported = {}
    for i, node in enumerate(model.graph.node):
        if node.domain == "ai.coldbrew":  # coldbrew's own (a recurrent cell's layer: onnx/recurrent.py)
            continue
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if key not in SUPPORTED_OPS:
            unsupported.setdefault(key, []).append(node.name or f"#{i}")
    if unsupported:
        raise UnsupportedOperatorError(unsupported, {})


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


_SHAPE_OPS = ("Shape", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze")  # what TVM's importer keeps a shape
_SIZE_ARITH = ("Cast", "Identity", "Add", "Sub", "Mul", "Div")  # and the sizes' arithmetic it keeps so


def of_shapes(name, producer, consts, depth=0):
    """Whether value `name` is computed from Shape values (and constants)
    through what TVM's importer keeps as a shape or a size: sizes, not data."""
    src = producer.get(name)
    if src is None or depth > 16:
        return False
    if src.op_type == "Shape":
        return True
    whole = src.op_type in ("Concat", "Add", "Sub", "Mul", "Div")  # every input a value, else the first
    data = [i for i in (src.input if whole else src.input[:1]) if i and i not in consts]
    return src.op_type in _SHAPE_OPS + _SIZE_ARITH and bool(data) and \
        all(of_shapes(i, producer, consts, depth + 1) for i in data)


def shape_of_sizes(sizes, name, opset):
    """(nodes, initializers) making `name`, a shape: each of `sizes` an int
    or (value, axis), that axis of a value, read by Shape, Gather of a
    scalar axis and Unsqueeze (the importer keeps that a shape; a
    one-element index would read it as data, its sizes unknown ones)."""
    import numpy as np
    from onnx import helper, numpy_helper

    nodes, inits, parts = [], [], [f"{name}/{k}" for k in range(len(sizes))]
    for part, e in zip(parts, sizes):
        if not isinstance(e, tuple):
            inits.append(numpy_helper.from_array(np.array([int(e)], np.int64), part))
            continue
        inits.append(numpy_helper.from_array(np.array(e[1], np.int64), f"{part}/axis"))
        nodes += [helper.make_node("Shape", [e[0]], [f"{part}/shape"]),
                  helper.make_node("Gather", [f"{part}/shape", f"{part}/axis"], [f"{part}/size"], axis=0)]
        if opset >= 13:
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{part}/at"))
            nodes.append(helper.make_node("Unsqueeze", [f"{part}/size", f"{part}/at"], [part]))
        else:
            nodes.append(helper.make_node("Unsqueeze", [f"{part}/size"], [part], axes=[0]))
    return nodes + [helper.make_node("Concat", parts, [name], axis=0)], inits


def data_slice(node, consts):
    """Whether `node` is a Slice along one axis whose start or end the data
    sets, its axes and steps constants: its output is sized by the data
    (import_relax counts it: compiler/kernels/counted.py slice_te)."""
    import numpy as np
    from onnx import numpy_helper

    if node.op_type != "Slice" or len(node.input) < 3 or all(i in consts for i in node.input[1:3]):
        return False
    extra = [i for i in node.input[3:5] if i]
    if any(i not in consts for i in extra):
        return False
    values = [np.asarray(numpy_helper.to_array(consts[i]) if hasattr(consts[i], "dims") else consts[i]).reshape(-1)
              for i in extra]
    steps = values[1] if len(values) > 1 else np.ones(1)
    return all(v.size == 1 for v in values) and float(steps[0]) > 0


def check_static(model, sized=False):
    """Raise CompileError for every node whose shape/mode inputs are not
    constants, and for operator modes coldbrew does not implement. `sized`:
    input dimensions are sized at run time, and a shape input computed from
    input shapes only (through Shape or Size) is left to the importer."""
    from ..errors import CompileError

    from onnx import TensorProto

    g = model.graph
    consts = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    problems = []
    types, shapes = types_and_shapes(model)

    def roots(name, seen=None):
        """The model inputs whose values `name` depends on (`sized`: a Shape
        or Size reads its input's shape only)."""
        seen = seen if seen is not None else set()
        if name in seen or name in consts:
            return set()
        seen.add(name)
        node = producer.get(name)
        if node is None:
            return {name}
        if sized and node.op_type in ("Shape", "Size"):
            return set()
        return set().union(*[roots(i, seen) for i in node.input if i]) if node.input else set()

    for i, node in enumerate(g.node):
        label = f"{node.op_type} node '{node.name or '#%d' % i}'"
        counted = {1, 2} if data_slice(node, consts) else set()
        for pos in sorted(STATIC_INPUTS.get(node.op_type, set()) - counted):
            if pos < len(node.input) and node.input[pos] and node.input[pos] not in consts:
                src = ", ".join(sorted(roots(node.input[pos])))
                if not src:  # computed from input shapes sized at run time only
                    continue
                problems.append(f"{label}: input {pos} ('{node.input[pos]}') must be a compile-time constant "
                                f"but depends on model input(s) {src}; bind them with --bind NAME=FILE.npy")
        if node.op_type == "BatchNormalization" and _attr(node, "training_mode", 0):
            problems.append(f"{label}: training_mode=1 is not supported (inference only)")
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2] in consts:
            from onnx import numpy_helper

            if bool(numpy_helper.to_array(consts[node.input[2]])):
                problems.append(f"{label}: training_mode=true is not supported (inference only)")
        extra = [o for o in node.output[1:] if o]
        if node.op_type in ("MaxPool", "LayerNormalization", "BatchNormalization") and extra:
            problems.append(f"{label}: optional outputs {extra} are not supported")
        if node.op_type == "ConvTranspose" and _attr(node, "output_shape") is not None:
            problems.append(f"{label}: the output_shape attribute is not supported; give pads instead")
        if node.op_type in ("ReduceMax", "ReduceMin") and types.get(node.input[0]) == TensorProto.BOOL:
            problems.append(f"{label}: bool inputs are not supported")
        if node.op_type == "Resize":
            problems.extend(_resize_problems(node, label, consts, shapes))
        if (node.op_type == "Mod" and not _attr(node, "fmod", 0)
                and types.get(node.input[0]) in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16)):
            problems.append(f"{label}: Mod of floating-point values with fmod=0 is not supported yet "
                            "(integer Mod and fmod=1 are)")
        if node.op_type == "LpNormalization" and _attr(node, "p", 2) not in (1, 2):
            problems.append(f"{label}: p={_attr(node, 'p')} is not supported (p=1 and p=2 are)")
        if node.op_type == "RoiAlign" and _attr(node, "mode", b"avg") in (b"max", "max"):
            problems.append(f"{label}: RoiAlign mode=max is not supported (mode=avg is)")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and _attr(node, "block_size", 0):
            problems.append(f"{label}: blocked quantization (block_size) is not supported yet")
        for o in node.output:  # (an empty part of a shape, x.shape[4:] of a rank 4, is a shape: the importer's)
            if o in shapes and 0 in shapes[o] and not (sized and of_shapes(o, producer, consts)):
                problems.append(f"{label}: zero-size tensors are not supported ('{o}' has shape {shapes[o]})")
    if problems:
        raise CompileError("the model cannot be compiled statically:\n  " + "\n  ".join(problems))


def types_and_shapes(model, symbolic=False, values=False):
    """({value: element type}, {value: shape}) as ONNX infers them: static
    shapes only, or with `symbolic` every known rank, a dimension sized at
    run time None; with `values`, shapes computed from constant values too
    (ONNX's data propagation)."""
    import onnx

    g = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=values).graph
    types, shapes = {}, {}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        tt = v.type.tensor_type
        types[v.name] = tt.elem_type
        if tt.HasField("shape") and (symbolic or all(d.HasField("dim_value") for d in tt.shape.dim)):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for t in g.initializer:
        types[t.name], shapes[t.name] = t.data_type, list(t.dims)
    return types, shapes


def resize_needs_fallback(node, consts, shapes):
    """Whether a Resize uses a mode the TIR lowering does not implement
    (onnx/decompose.py computes those with constant matrices)."""
    return bool(_resize_problems(node, "", consts, shapes))


def _resize_problems(node, label, consts, shapes):
    """Resize modes the TIR lowering does not implement exactly."""
    from onnx import numpy_helper

    out = []
    if _attr(node, "axes") is not None:
        out.append(f"{label}: the axes attribute is not supported")
    if _attr(node, "antialias", 0):
        out.append(f"{label}: antialias=1 is not supported")
    if _attr(node, "keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
        out.append(f"{label}: keep_aspect_ratio_policy other than stretch is not supported")
    if _attr(node, "coordinate_transformation_mode", b"") in (b"half_pixel_symmetric", "half_pixel_symmetric"):
        out.append(f"{label}: coordinate_transformation_mode half_pixel_symmetric is not supported")
    scales = node.input[2] if len(node.input) > 2 else ""
    sizes = node.input[3] if len(node.input) > 3 else ""
    if scales and not sizes and scales in consts and node.input[0] in shapes:
        sc = numpy_helper.to_array(consts[scales])
        dims = shapes[node.input[0]]
        if sc.size == len(dims) and any(abs(d * s - round(d * s)) > 1e-6 for d, s in zip(dims, sc)):
            out.append(f"{label}: scales that do not give whole output sizes are not supported; give sizes")
    return out


def graph_inputs(model):
    """The graph inputs that are real inputs (not initializers)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def inline_branch(branch, prefix):
    """A subgraph (an If's branch) made part of the graph around it: (nodes,
    initializers, output names), every name it defines prefixed with
    `prefix` so none can meet a name of the graph around it, its
    references to that graph kept (its own subgraphs' references to its
    names follow the renaming)."""
    from onnx import TensorProto

    defined = {o for n in branch.node for o in n.output if o} | {t.name for t in branch.initializer}
    rename = {d: f"{prefix}{d}" for d in defined}
    nodes = [_renamed(n, rename, f"{prefix}{n.name or f'{n.op_type}_{k}'}") for k, n in enumerate(branch.node)]
    inits = []
    for t in branch.initializer:
        copy = TensorProto()
        copy.CopyFrom(t)
        copy.name = rename[t.name]
        inits.append(copy)
    return nodes, inits, [rename.get(o.name, o.name) for o in branch.output]


def _renamed(node, rename, name=None):
    """A copy of `node` reading and writing the renamed names, inside its
    subgraphs too (names there are unique: SSA across the whole model)."""
    from onnx import AttributeProto, NodeProto

    copy = NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = [rename.get(i, i) for i in node.input]
    copy.output[:] = [rename.get(o, o) for o in node.output]
    if name is not None:
        copy.name = name
    for a in copy.attribute:
        for g in [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []:
            inner = [_renamed(n, rename) for n in g.node]
            g.ClearField("node")
            g.node.extend(inner)
            for o in g.output:
                o.name = rename.get(o.name, o.name)
    return copy


def branches(node):
    """(then_branch, else_branch) GraphProtos of an If node."""
    from onnx import helper

    got = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return got["then_branch"], got["else_branch"]


def outer_names(node):
    """The names a node's subgraphs (an If's branches, a Loop's body) read
    from the graph around them: what must stay defined while the node does."""
    from onnx import AttributeProto

    used = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            defined |= {o for n in g.node for o in n.output}
            for n in g.node:
                used |= {i for i in n.input if i and i not in defined}
                used |= outer_names(n) - defined
            used |= {o.name for o in g.output if o.name not in defined}
    return used


def rewrite(model, op_type, expand):
    """Every `op_type` node replaced by the nodes expand(node, name, attrs, add_init) returns."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    if not any(n.op_type == op_type for n in g.node):
        return
    nodes = []

    def add_init(name, value):
        g.initializer.append(numpy_helper.from_array(np.array(value), name))
        return name

    for node in g.node:
        if node.op_type != op_type:
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes += expand(node, node.name or node.output[0], attrs, add_init)
    g.ClearField("node")
    g.node.extend(nodes)
