"""Pass `legalize_onnx`: rewrite ONNX forms the Relax importer does not take
into equivalent ones it does, then check that every shape-deciding input
is constant (ops.check_static).

- Pow with an exponent of another dtype: cast the exponent to the base's type.
- Pow on integers: compute in float64 and cast back (exact for the integer
  range where the result fits).
"""
import onnx
from onnx import TensorProto, helper

from ..ir.ops import check_static

NAME = "legalize_onnx"
_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def _types(model):
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def apply(model):
    g = model.graph
    if any(n.op_type == "Pow" for n in g.node):
        types = _types(model)
        nodes = []
        for node in g.node:
            if node.op_type != "Pow" or node.input[0] not in types or node.input[1] not in types:
                nodes.append(node)
                continue
            base, expo = types[node.input[0]], types[node.input[1]]
            x, y, out = node.input[0], node.input[1], node.output[0]
            if base in _FLOATS and expo != base:
                nodes.append(helper.make_node("Cast", [y], [y + "_as_base"], to=base, name=node.name + "_cast"))
                nodes.append(helper.make_node("Pow", [x, y + "_as_base"], [out], name=node.name))
            elif base not in _FLOATS:
                d = TensorProto.DOUBLE
                nodes.append(helper.make_node("Cast", [x], [out + "_x64"], to=d, name=node.name + "_castx"))
                nodes.append(helper.make_node("Cast", [y], [out + "_y64"], to=d, name=node.name + "_casty"))
                nodes.append(helper.make_node("Pow", [out + "_x64", out + "_y64"], [out + "_p64"], name=node.name))
                nodes.append(helper.make_node("Cast", [out + "_p64"], [out], to=base, name=node.name + "_castback"))
            else:
                nodes.append(node)
        g.ClearField("node")
        g.node.extend(nodes)
    check_static(model)
    return model


def run(c):
    c.proto = apply(c.proto)
    return c
