"""compiler/passes/fold_batchnorm.py: an inference BatchNormalization after a Conv
is folded into the Conv's weights and bias, with the same outputs; one it
cannot fold is left as it is."""
import numpy as np
import onnx
from conftest import assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

from coldbrew.compiler.passes import fold_batchnorm


def conv_bn(extra_consumer=False, bias=True):
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "var")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"] if bias else ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3,
                              name="bn")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])]
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 8, 8]))
    g = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _ops(model):
    return [n.op_type for n in model.graph.node]


def test_batchnorm_is_folded_into_the_conv_with_the_same_output():
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    for bias in (True, False):
        model = conv_bn(bias=bias)
        before = ort_run(model, {"x": x})
        folded = fold_batchnorm.apply(onnx.ModelProto.FromString(model.SerializeToString()))
        assert _ops(folded) == ["Conv"]
        assert {t.name for t in folded.graph.initializer} == {"c_bnW", "c_bnB"}  # the BN's constants are gone
        assert_close(ort_run(folded, {"x": x})[0], before[0], rel=1e-5)


def test_a_conv_whose_output_is_also_used_elsewhere_keeps_its_batchnorm():
    model = conv_bn(extra_consumer=True)
    assert _ops(fold_batchnorm.apply(model)) == ["Conv", "BatchNormalization", "Relu"]
