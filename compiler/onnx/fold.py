"""Fold everything computable at compile time (the pass fold_constants,
and the fused operators' inlined bodies: onnx/attention.py).

With fixed input shapes, the shape arithmetic that framework exporters write
into graphs (Shape -> Gather/Slice -> Concat -> Reshape, Expand, Range,
ConstantOfShape, Cast, ...) is constant. This pass replaces `Shape`/`Size` of
statically shaped tensors by constants and evaluates every node whose inputs
are all constants with ONNX's reference implementation, until nothing
changes. Constant nodes become initializers; dead nodes are removed.

A `Loop` whose trip count is known once its inputs are folded (a constant M
and a condition computed from constants and the iteration number) is
unrolled, one copy of its body per iteration (onnx/loops.py).

An `If` whose condition folds to a constant is replaced by the branch it
takes (its nodes inlined, its outputs renamed to the If's): a model's mode
switches (a sample rate, a batch-size check) fold away once the inputs that
decide them are bound (`--bind`); an If whose condition depends on a model
input stays, and legalize_onnx names it.

Folding can materialize a broadcast (Expand, ConstantOfShape, `x * zeros`)
into a full-size constant that an elementwise op then broadcasts against an
activation. Such a constant is stored at its smallest broadcast shape: an
axis along which every value is the same shrinks to 1 wherever the other
operand already gives the output that extent, so the bundle does not carry
(and every run does not read) the repeated values.
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

from ..errors import CompileError
from .loops import trip_count, unroll
from .recurrent import contrib_output_types
from .ops import branches, inline_branch, opset_of, outer_names

_NON_DETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
_CONTROL_FLOW = {"If", "Loop", "Scan"}  # their bodies may read values of the graph around them


def _static_shapes(model, partial=None):
    """{value: static shape}; the outputs of onnxruntime's contrib recurrent
    cells (which ONNX's inference does not know) recorded as value_info
    as soon as their input's shape is known, so the shapes after them
    are known too."""
    while True:
        shapes = _inferred_shapes(model, partial)
        known = {v.name for v in model.graph.value_info}
        hints = [h for n in model.graph.node if n.domain == "com.microsoft"
                 for h in contrib_output_types(n, shapes) if h.name not in known]
        if not hints:
            return shapes
        model.graph.value_info.extend(hints)


def _inferred_shapes(model, partial=None):
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:
        raise CompileError(f"ONNX shape inference failed: {e}") from None
    shapes = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if partial is not None:
                partial[vi.name] = dims
            if all(d is not None for d in dims):
                shapes[vi.name] = dims
    for t in g.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def _evaluate(node, consts, opset_imports):
    inputs = [n for n in node.input if n]
    graph = helper.make_graph(
        [node], "fold", [],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o],
        [numpy_helper.from_array(consts[n], n) for n in inputs])
    model = helper.make_model(graph, opset_imports=opset_imports)
    return ReferenceEvaluator(model).run(None, {})


def _try_evaluate(node, consts, opset_imports):
    """_evaluate, or None (the node stays, computed at run time) where ONNX's
    reference implementation has no kernel for it at this opset (it lacks
    DequantizeLinear-18, for one) or for these types; a CompileError naming
    the node where the constants themselves do not fit it."""
    try:
        return _evaluate(node, consts, opset_imports)
    except (NotImplementedError, TypeError):  # TypeError: the reference's own kernel fails on the types (OneHot)
        return None
    except RuntimeError as e:
        if str(e).startswith("No implementation for operator"):
            return None
        raise _unfoldable(node, e) from None
    except (ValueError, IndexError) as e:  # shapes or values that do not fit: the model's own
        raise _unfoldable(node, e) from None


def _unfoldable(node, e):
    """A node of constants that ONNX's own reference cannot compute either:
    the model is wrong there (a Reshape to a size its input lacks, ...)."""
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CompileError(f"{node.op_type} node '{node.name or node.output[0]}' computes from constants only, "
                        f"and ONNX's reference implementation fails on them: {reason}; check the model's "
                        "constants there (or the values given with --bind)")


def _shape_value(node, shapes):
    src = shapes.get(node.input[0])
    if src is None:
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(src)), dtype=np.int64)
    rank = len(src)
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    end = next((a.i for a in node.attribute if a.name == "end"), rank)
    start, end = max(0, start + rank if start < 0 else start), min(rank, end + rank if end < 0 else end)
    return np.array(src[start:end], dtype=np.int64 if None not in src else object)


def _fixed_sizes(sizes, index):
    """[the sizes a Gather takes of a Shape] where each is fixed, else None
    (the rest of that shape is set at run time)."""
    try:
        got = np.take(np.array(sizes, dtype=object), np.asarray(index, np.int64))
    except IndexError:
        return None
    return None if any(v is None for v in np.asarray(got).reshape(-1)) else [np.asarray(got, np.int64)]


def apply(model, qdq_scales=None):
    """`qdq_scales`: a list to which the scales of the int8 weights that
    DequantizeLinear nodes widen (symmetric: zero point 0) are added, so the
    bundle can store them int8 again (plan_weights)."""
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    nodes = list(g.node)
    seen = set()
    changed = True
    while changed:
        changed = False
        partial = {}  # {value: its shape, None for a size set at run time}
        shapes = _static_shapes(model, partial)
        sizes_of = {n.output[0]: _shape_value(n, partial) for n in nodes if n.op_type == "Shape"
                    and partial.get(n.input[0]) is not None}  # some of those sizes fixed
        kept = []
        for node in nodes:
            value = None
            if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input[0] in consts:
                kept.extend(_taken_branch(node, consts))
                changed = True
                continue
            if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
                count = trip_count(node, consts, model.opset_import)
                if count is not None:
                    kept.extend(_unrolled(node, count, consts, model))
                    changed = True
                    continue
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = [_evaluate(node, consts, model.opset_import)[0]]
            elif node.op_type in ("Shape", "Size") and shapes.get(node.input[0]) is not None:
                value = [_shape_value(node, shapes)]
            elif node.op_type == "Gather" and node.input[0] in sizes_of and node.input[1] in consts:
                value = _fixed_sizes(sizes_of[node.input[0]], consts[node.input[1]])
            elif (node.op_type not in _NON_DETERMINISTIC and node.op_type not in _CONTROL_FLOW
                  and all(i in consts for i in node.input if i) and any(node.input)):
                if qdq_scales is not None and node.op_type == "DequantizeLinear" and node.output[0] not in seen:
                    seen.add(node.output[0])  # folded here, or by the Relax folding if the reference lacks it
                    _record_scale(node, consts, qdq_scales)
                value = _try_evaluate(node, consts, model.opset_import)
                if value is None and node.op_type == "DequantizeLinear":
                    value = _dequantize(node, consts)
            if value is None:
                kept.append(node)
                continue
            for name, v in zip([o for o in node.output if o], value):
                consts[name] = np.asarray(v)
            changed = True
        nodes = kept
        _rewrite(model, nodes, consts, graph_outputs)
    # the last round changed nothing, so its shapes are the folded model's
    if _compact_broadcasts(list(model.graph.node), consts, shapes):
        _rewrite(model, list(model.graph.node), consts, graph_outputs)
    return model


def _dequantize(node, consts):
    """DequantizeLinear of constants where the reference implementation lacks
    it at the model's opset: (x - zero point) * scale, per tensor or along
    `axis` (blocked quantization stays for check_static to name)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, scale = consts[node.input[0]], consts[node.input[1]]
    zero = consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), x.dtype)
    if attrs.get("block_size", 0) or scale.ndim > 1 or x.dtype.kind not in "iu":
        return None
    shape = [1] * x.ndim
    if scale.size > 1:
        shape[attrs.get("axis", 1) % x.ndim] = -1
    s, z = scale.astype(np.float32).reshape(shape), zero.astype(np.float32).reshape(shape if zero.size > 1 else [])
    return [((x.astype(np.float32) - z) * s).astype(scale.dtype)]


def _record_scale(node, consts, qdq_scales):
    q = consts[node.input[0]]
    zero = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if q.dtype == np.int8 and (zero is None or not np.any(zero)):
        qdq_scales.append(np.asarray(consts[node.input[1]], np.float32))


def _unrolled(node, count, consts, model):
    opset = opset_of(model)
    nodes, inits = unroll(node, count, f"Loop node '{node.name or node.output[0]}'", opset)
    for t in inits:
        consts[t.name] = numpy_helper.to_array(t)
    return nodes


def _taken_branch(node, consts):
    """The nodes that replace an If with a constant condition: the taken
    branch's nodes (their names prefixed with the If's), its initializers
    as constants, and an Identity per output."""
    then_branch, else_branch = branches(node)
    taken = then_branch if bool(np.asarray(consts[node.input[0]]).reshape(-1)[0]) else else_branch
    prefix = f"{node.name or node.output[0]}/"
    nodes, inits, outs = inline_branch(taken, prefix)
    for t in inits:
        consts[t.name] = numpy_helper.to_array(t)
    return nodes + [helper.make_node("Identity", [inner], [outer], name=f"{prefix}out{k}")
                    for k, (inner, outer) in enumerate(zip(outs, node.output)) if outer]


_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Equal", "Less", "Greater", "Where"}


def _compact(value, other_shape, out_shape):
    """`value` shrunk to 1 along every axis where it repeats one value and
    the other operand (right-aligned) already has the output's extent."""
    rank = len(out_shape)
    other = [1] * (rank - len(other_shape)) + list(other_shape)
    offset = rank - value.ndim
    for axis in range(value.ndim):
        if value.shape[axis] == 1 or other[axis + offset] != out_shape[axis + offset]:
            continue
        first = np.take(value, [0], axis=axis)
        if np.array_equal(value, np.broadcast_to(first, value.shape)):
            value = first
    return value


def _compact_broadcasts(nodes, consts, shapes):
    """Point each broadcasting node's constant operands at compacted copies; True if any changed."""
    changed = False
    for node in nodes:
        if node.op_type not in _BROADCASTING or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        out_shape = shapes.get(node.output[0])
        if out_shape is None:
            continue
        for k, name in enumerate(node.input):
            value = consts.get(name)
            others = [shapes.get(i) for j, i in enumerate(node.input) if j != k and i]
            if value is None or value.size <= 1 or value.ndim > len(out_shape) or any(o is None for o in others):
                continue
            other = np.broadcast_shapes(*[tuple(o) for o in others]) if others else ()
            small = _compact(value, other, out_shape)
            if small.size < value.size:
                compact = f"{name}.compact{'x'.join(map(str, small.shape))}"
                consts[compact] = np.ascontiguousarray(small)
                node.input[k] = compact
                changed = True
    return changed


def _rewrite(model, nodes, consts, graph_outputs):
    """Keep live nodes, and the initializers they (or graph outputs) use."""
    g = model.graph
    needed = set(graph_outputs)
    live = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
            needed.update(outer_names(node))  # what its subgraphs read
    live.reverse()
    inputs = {i.name for i in g.input}
    g.ClearField("node")
    g.node.extend(live)
    g.ClearField("initializer")
    g.initializer.extend(numpy_helper.from_array(consts[n], n) for n in sorted(needed) if n in consts)
    # Graph inputs that are constants now (initializers listed as inputs, as
    # IR 3 exporters list every one, or values a node computes under an
    # input's name) are inputs no more.
    kept_inputs = [i for i in g.input if i.name not in consts]
    if len(kept_inputs) != len(inputs):
        g.ClearField("input")
        g.input.extend(kept_inputs)
