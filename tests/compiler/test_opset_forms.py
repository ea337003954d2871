"""Every opset form of the operators whose ONNX signature moved between
opsets (attributes that became inputs, new modes, new optional inputs):
Slice, Pad, Split, Squeeze, Unsqueeze, the reductions, Clip, Resize and
Upsample, each written as an exporter of that opset writes it, compile and
compute what onnxruntime computes."""
import numpy as np
import onnx
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SHAPE = [2, 6, 4, 5]


def c(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


# (operator, opset, nodes, initializers): the node reads "x" [2, 6, 4, 5] and writes "y" (and "z")
FORMS = [
    ("Slice", 1, [node("Slice", ["x"], starts=[1, 0], ends=[5, 3], axes=[1, 2])], []),
    ("Slice", 10, [node("Slice", ["x", "s", "e", "a", "p"])],
     [c("s", [1, 0]), c("e", [5, 3]), c("a", [1, 2]), c("p", [2, 1])]),
    ("Slice", 13, [node("Slice", ["x", "s", "e", "a", "p"])],
     [c("s", [-1, 0]), c("e", [-6, 3]), c("a", [-3, 2]), c("p", [-2, 1])]),
    ("Pad", 2, [node("Pad", ["x"], pads=[0, 0, 1, 2, 0, 0, 1, 1], value=0.5)], []),
    ("Pad", 11, [node("Pad", ["x", "p", "v"], mode="constant")],
     [c("p", [0, 0, 1, 2, 0, 0, 1, 1]), c("v", 0.5, np.float32)]),
    ("Pad", 13, [node("Pad", ["x", "p"], mode="reflect")], [c("p", [0, 0, 1, 2, 0, 0, 1, 1])]),
    ("Pad", 18, [node("Pad", ["x", "p", "", "a"], mode="edge")], [c("p", [1, 2, 1, 1]), c("a", [2, 3])]),
    ("Pad", 19, [node("Pad", ["x", "p", "", "a"], mode="wrap")], [c("p", [1, 2, 1, 1]), c("a", [2, 3])]),
    ("Split", 2, [node("Split", ["x"], ["y", "z"], axis=1, split=[2, 4])], []),
    ("Split", 11, [node("Split", ["x"], ["y", "z"], axis=-3, split=[2, 4])], []),
    ("Split", 13, [node("Split", ["x", "s"], ["y", "z"], axis=1)], [c("s", [2, 4])]),
    ("Split", 18, [node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2)], []),
    ("Squeeze", 1, [node("Unsqueeze", ["x"], ["u"], axes=[0, 3]), node("Squeeze", ["u"], axes=[0, 3])], []),
    ("Squeeze", 11, [node("Unsqueeze", ["x"], ["u"], axes=[-1]), node("Squeeze", ["u"], axes=[-1])], []),
    ("Squeeze", 13, [node("Unsqueeze", ["x", "a"], ["u"]), node("Squeeze", ["u", "a"])], [c("a", [0, -1])]),
    ("Squeeze", 21, [node("Unsqueeze", ["x", "a"], ["u"]), node("Squeeze", ["u"])], [c("a", [0])]),
    ("ReduceSum", 1, [node("ReduceSum", ["x"], axes=[1, 3], keepdims=0)], []),
    ("ReduceSum", 13, [node("ReduceSum", ["x", "a"], keepdims=1)], [c("a", [-3, 3])]),
    ("ReduceSum", 13, [node("ReduceSum", ["x"], keepdims=0)], []),  # no axes: all of them
    ("ReduceMean", 11, [node("ReduceMean", ["x"], axes=[-1], keepdims=1)], []),
    ("ReduceMean", 18, [node("ReduceMean", ["x", "a"], keepdims=0)], [c("a", [1, 2])]),
    ("ReduceMax", 18, [node("ReduceMax", ["x", "a"], keepdims=1)], [c("a", [2])]),
    ("ReduceL2", 18, [node("ReduceL2", ["x", "a"], keepdims=1)], [c("a", [1])]),
    ("ReduceLogSumExp", 11, [node("ReduceLogSumExp", ["x"], axes=[3], keepdims=0)], []),
    ("Clip", 6, [node("Clip", ["x"], min=-0.5, max=0.7)], []),
    ("Clip", 11, [node("Clip", ["x", "lo", "hi"])], [c("lo", -0.5, np.float32), c("hi", 0.7, np.float32)]),
    ("Clip", 13, [node("Clip", ["x", "", "hi"])], [c("hi", 0.7, np.float32)]),
    ("Upsample", 7, [node("Upsample", ["x"], scales=[1.0, 1.0, 2.0, 2.0])], []),
    ("Upsample", 9, [node("Upsample", ["x", "s"], mode="linear")], [c("s", [1, 1, 2, 1.5], np.float32)]),
    ("Slice", 9, [node("Slice", ["x"], starts=[-3, 1], ends=[100, -1])], []),
    ("Resize", 10, [node("Resize", ["x", "s"], mode="nearest")], [c("s", [1, 1, 2, 3], np.float32)]),
    ("Resize", 10, [node("Resize", ["x", "s"], mode="linear")], [c("s", [1, 1, 2, 1.5], np.float32)]),
    ("Resize", 11, [node("Resize", ["x", "r", "s"], mode="linear", coordinate_transformation_mode="half_pixel")],
     [c("r", [], np.float32), c("s", [1, 1, 2, 2], np.float32)]),
    ("Resize", 13, [node("Resize", ["x", "", "", "z"], mode="nearest", nearest_mode="round_prefer_ceil",
                         coordinate_transformation_mode="asymmetric")], [c("z", [2, 6, 7, 9])]),
    ("Resize", 18, [node("Resize", ["x", "", "s"], mode="cubic", coordinate_transformation_mode="pytorch_half_pixel")],
     [c("s", [1, 1, 2, 2], np.float32)]),
    ("Resize", 19, [node("Resize", ["x", "", "", "z"], mode="linear", axes=None)], [c("z", [2, 6, 3, 10])]),
]


def model_of(opset, nodes, inits):
    outs = sorted({o for n in nodes for o in n.output} & {"y", "z"})
    g = helper.make_graph(nodes, "form", [helper.make_tensor_value_info("x", F, SHAPE)],
                          [helper.make_tensor_value_info(o, F, None) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7 if opset <= 15 else 8 if opset <= 18 else 9 if opset <= 20 else 10
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.output}
    for o in m.graph.output:  # the output's shape, as an exporter records it
        o.CopyFrom(inferred[o.name])
    return m


@pytest.mark.parametrize("op, opset, nodes, inits", FORMS, ids=[f"{f[0]}-{f[1]}-{k}" for k, f in enumerate(FORMS)])
def test_form_compiles_and_matches_onnxruntime(op, opset, nodes, inits):
    model = model_of(opset, nodes, inits)
    x = np.random.default_rng(opset).standard_normal(SHAPE).astype(np.float32)
    ref = ort_run(model, {"x": x})
    got = coldbrew.load(compile_model(model)).run(None, {"x": x})
    assert_close(got, ref)
