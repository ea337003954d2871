"""ONNX's fused transformer operators (Attention, RotaryEmbedding,
LinearAttention, CausalConvWithState) replaced by the function bodies ONNX
defines them by: each schema's context-dependent function, built for the
node's attributes and input types (the reference's own semantics: causal
and window masks, KV caches, GQA, softcap, softmax precision, the zero rows
of fully-masked queries), converted to the model's opset and inlined. Then:

- float16 inputs: the body computes in float32 and its outputs are cast
  back (as decompose.py's float16 products are), within a float16 step of
  the reference;
- CastLike: a Cast to the type inferred for its target;
- the shape arithmetic folded (the shapes are static) and the Scans
  (LinearAttention's recurrence) unrolled;
- a row's test for being all -inf, Equal(ReduceMax(row), -inf):
  ReduceMin(Equal(row, -inf)), as coldbrew's max reduction starts from the
  lowest finite value, not -inf;
- zero-size pieces (RotaryEmbedding's unrotated part when it rotates every
  channel) left out of the Concats that join them.

The Relax importer takes any `Attention` for onnxruntime's contrib one,
whatever its domain, so none may reach it.
"""
import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from ..errors import CompileError
from .ops import opset_of, rewrite, types_and_shapes

FUSED = ("Attention", "RotaryEmbedding", "LinearAttention", "CausalConvWithState")
_DOMAIN = "ai.coldbrew.fused"  # each node's own function while it is inlined


def _body(node, label, schema, types, name):
    """The FunctionProto computing `node` (schema defaults filled in)."""
    given = {a.name for a in node.attribute}
    node.attribute.extend(a.default_value for k, a in schema.attributes.items()
                          if k not in given and a.default_value.name)
    unknown = [i for i in node.input if i and not (i in types and types[i].tensor_type.elem_type)]
    fn = onnx.FunctionProto()
    if not unknown:
        fn.ParseFromString(schema.get_context_dependent_function(node.SerializeToString(), [
            (types[i] if i else onnx.TypeProto()).SerializeToString() for i in node.input]))
    if not fn.node:
        raise CompileError(f"{node.op_type} node '{label}': ONNX builds no function body for its attributes and "
                           f"input types (types not known: {unknown or 'none'})")
    fn.name, fn.domain = name, _DOMAIN
    node.op_type, node.domain = name, _DOMAIN
    return fn


def _typed(model):
    """{value: TypeProto} of every value of the graph."""
    g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {v.name: v.type for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update((t.name, helper.make_tensor_type_proto(t.data_type, t.dims)) for t in g.initializer)
    return types


def _inline(model):
    """Every fused node replaced by its function body (float16 values in float32)."""
    types, opset, bodies = _typed(model), opset_of(model), []

    def expand(node, name, a, add_init):
        if node.domain not in ("", "ai.onnx"):
            return [node]
        half = {v for v in list(node.input) + list(node.output)
                if v in types and types[v].tensor_type.elem_type == TensorProto.FLOAT16}
        out = [helper.make_node("Cast", [v], [f"{name}/{v}/f32"], to=TensorProto.FLOAT)
               for v in node.input if v in half]
        for k, v in enumerate(node.input):
            if v in half:
                node.input[k], wide = f"{name}/{v}/f32", onnx.TypeProto()
                wide.CopyFrom(types[v])
                wide.tensor_type.elem_type = TensorProto.FLOAT
                types[node.input[k]] = wide
        after = [helper.make_node("Cast", [f"{v}/f32"], [v], to=TensorProto.FLOAT16) for v in node.output if v in half]
        node.output[:] = [f"{v}/f32" if v in half else v for v in node.output]
        bodies.append(_body(node, name, onnx.defs.get_schema(node.op_type, opset), types, f"f{len(bodies)}"))
        return out + [node] + after
    for op in FUSED:
        rewrite(model, op, expand)
    model.functions.extend(bodies)
    typed = {v.name for v in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)}
    model.graph.value_info.extend(helper.make_value_info(v, t) for v, t in types.items() if v not in typed)  # the
    # version conversion of a body written for an older opset reads them
    model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    model.CopyFrom(onnx.inliner.inline_local_functions(model, convert_version=True))
    del model.opset_import[[o.domain for o in model.opset_import].index(_DOMAIN)]


def expand(model):
    from .fold import apply as fold

    _inline(model)
    fold(model)
    _unroll_scans(model)
    _cast_likes(model)
    fold(model)
    _masked_rows(model)
    _drop_empty(model)


def _unroll_scans(model):
    from .loops import unroll_scan

    _, shapes = types_and_shapes(model)

    def expand(node, name, a, add_init):
        nodes, inits = unroll_scan(node, f"Scan node '{name}'", shapes, opset_of(model))
        model.graph.initializer.extend(inits)
        return nodes
    rewrite(model, "Scan", expand)


def _cast_likes(model):
    types, _ = types_and_shapes(model)
    for node in model.graph.node:
        if node.op_type == "CastLike":
            node.op_type, like = "Cast", node.input.pop(1)
            node.attribute.append(helper.make_attribute("to", types[like]))


def _masked_rows(model):
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}

    def expand(node, name, a, add_init):
        top, low = producer.get(node.input[0]), consts.get(node.input[1])
        if top is None or top.op_type != "ReduceMax" or low is None or not np.all(np.isneginf(low)):
            return [node]
        out, node.input[0], node.output[0] = node.output[0], top.input[0], f"{name}/each"
        keep = {k: v for k, v in ((x.name, helper.get_attribute_value(x)) for x in top.attribute)}
        return [node, helper.make_node("ReduceMin", [f"{name}/each"] + list(top.input[1:]), [out], **keep)]
    rewrite(model, "Equal", expand)


def _drop_empty(model):
    """Zero-size pieces left out of Concats; a Split of one non-empty piece an Identity."""
    _, shapes = types_and_shapes(model)
    empty = {v for v, s in shapes.items() if 0 in s}
    for node in model.graph.node:
        kept = [i for i in node.input if i not in empty]
        if node.op_type == "Concat" and kept and len(kept) < len(node.input):
            del node.input[:]
            node.input.extend(kept)
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        full = [o for o in node.output if o not in empty]
        if node.op_type == "Split" and len(full) == 1 and not used & (set(node.output) - set(full)):
            node.op_type, node.output[:] = "Identity", full
            del node.input[1:], node.attribute[:]

