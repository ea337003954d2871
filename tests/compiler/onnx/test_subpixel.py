"""compiler/onnx/subpixel.py: a 2-D ConvTranspose becomes one Conv of its
output phases' sub-kernels and a pixel shuffle (the convolution variants
compute it), computing what onnxruntime computes for strides, kernels that
are and are not multiples of the stride, pads, output_padding, groups, no
bias and an old opset; what it does not rewrite stays a ConvTranspose."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.onnx import subpixel
from coldbrew.compiler.pipeline import front_end


def deconv(c=6, co=4, h=7, w=5, k=(3, 3), s=(2, 2), pads=(1, 1, 0, 1), op=(0, 0), group=1, bias=True, opset=17,
           dilations=(1, 1)):
    rng = np.random.default_rng(sum(k) + c)
    inits = [numpy_helper.from_array(rng.standard_normal((c, co // group, *k)).astype(np.float32), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "B"))
    node = helper.make_node("ConvTranspose", ["x", "W"] + (["B"] if bias else []), ["y"], name="up", strides=list(s),
                            pads=list(pads), output_padding=list(op), group=group, dilations=list(dilations))
    g = helper.make_graph([node], "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


CASES = [{}, {"k": (2, 2), "pads": (0, 0, 0, 0)}, {"s": (1, 1), "pads": (1, 1, 1, 1)},
         {"k": (4, 4), "pads": (1, 1, 1, 1)}, {"pads": (1, 1, 1, 1), "op": (1, 1)}, {"group": 2, "co": 6},
         {"k": (5, 3), "s": (3, 2), "pads": (2, 0, 1, 1), "op": (2, 1), "bias": False},
         {"c": 4, "co": 4, "group": 4, "k": (4, 4), "pads": (1, 1, 1, 1)}, {"opset": 9, "pads": (0, 0, 0, 0)}]


@pytest.mark.parametrize("attrs", CASES, ids=str)
def test_a_deconvolution_is_a_convolution_variant_computing_what_onnxruntime_computes(attrs):
    model = deconv(**attrs)
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    data = compile_model(model)
    steps = read_bytes(data)[0].plan.steps
    assert any((s.variant or b"").startswith(b"conv2d.") for s in steps)  # fails if left to conv2d_transpose
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_phase_weights_hold_every_tap_once():
    w = np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) + 1
    p = subpixel.phase_weights(w, (2, 2), 1)
    assert p.shape == (2 * 2 * 3, 2, 2, 2)
    assert sorted(p[p != 0].tolist()) == sorted(w.ravel().tolist())  # the padded taps are the zeros


def test_what_it_does_not_rewrite_stays_a_deconvolution():
    model = deconv(dilations=(2, 2))
    legalized = front_end(model).proto
    assert [n.op_type for n in legalized.graph.node] == ["ConvTranspose"]


@pytest.mark.parametrize("attrs", [{"k": (2, 2), "pads": (0, 0, 0, 0)}, {"k": (2, 2), "s": (3, 2), "bias": False,
                                                                       "pads": (0, 0, 0, 0)},
                                   {"k": (2, 2), "pads": (1, 0, 0, 1)}, {"k": (2, 2), "pads": (0, 0, 0, 0), "opset": 9}],
                         ids=str)
def test_a_depthwise_deconvolution_that_fits_its_stride_is_elementwise(attrs):
    """A learned upsampling (depthwise, kernel within the stride): each
    input value times one weight per tap into its own block, no Conv (whose
    phases would be a grouped 1x1 convolution); what onnxruntime computes."""
    model = deconv(c=8, co=8, group=8, h=6, w=9, **attrs)
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 9)).astype(np.float32)
    expanded = subpixel.apply(model)
    assert "Conv" not in [n.op_type for n in expanded.graph.node] and "Mul" in [n.op_type for n in expanded.graph.node]
    model = deconv(c=8, co=8, group=8, h=6, w=9, **attrs)
    np.testing.assert_allclose(coldbrew.load(compile_model(model)).run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
