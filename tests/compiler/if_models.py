"""Small ONNX models with an If, for the passes that fold or convert it."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def if_model(cond_from="flag", shapes_differ=False):
    """y = If(cond) then relu(x * w) else x - 1, w an initializer read only
    by the then-branch; cond is the bool input `flag`, or (cond_from="x")
    sum(x) > 0 computed from the activation. `shapes_differ`: the
    then-branch gives sum(x) ([1, 1]) instead."""
    w = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "w")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    then_nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"])]
    if shapes_differ:
        then_nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=1)]
    then_b = helper.make_graph(then_nodes, "then", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 1] if shapes_differ else [1, 4])])
    else_b = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["r"])], "else", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="gate", then_branch=then_b, else_branch=else_b)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])]
    if cond_from == "flag":
        nodes.insert(0, helper.make_node("Identity", ["flag"], ["cond"]))
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, [1]))
    else:
        zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
        nodes[:0] = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                     helper.make_node("Greater", ["s", "zero"], ["cond"])]
    g = helper.make_graph(nodes, "if_model", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"] if shapes_differ else [1, 4])],
                          [w, one] + ([zero] if cond_from == "x" else []))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
