"""compiler/kernels/random.py: ONNX's random operators give the numpy
reference's values (the same hash), normal and uniform by their moments,
the seed changing them and nothing else; a model that scales the noise by
0 computes what onnxruntime computes."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from onnx import TensorProto as P
from onnx import helper as h

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.kernels.random import random_reference


def model(node, inputs=(), shape=(64, 128), out=P.FLOAT):
    m = h.make_model(h.make_graph([node], "r", list(inputs), [h.make_tensor_value_info("y", out, list(shape))]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("op,attrs,normal,a,b", [("RandomNormal", {"mean": 1.0, "scale": 2.0}, True, 1.0, 2.0),
                                                 ("RandomUniform", {"low": -3.0, "high": 5.0}, False, -3.0, 5.0)])
def test_values_are_the_reference_s_and_have_its_moments(op, attrs, normal, a, b):
    node = h.make_node(op, [], ["y"], shape=[64, 128], seed=7.0, **attrs)
    y = coldbrew.load(compile_model(model(node))).run(None, {})[0]
    np.testing.assert_allclose(y, random_reference((64, 128), normal, a, b, 7), rtol=1e-5, atol=1e-5)
    if normal:
        assert abs(y.mean() - a) < 0.05 and abs(y.std() - b) < 0.05
    else:
        assert a <= y.min() and y.max() <= b and abs(y.mean() - (a + b) / 2) < 0.1


def test_like_follows_its_input_s_shape_and_the_seed_changes_the_values():
    x = h.make_tensor_value_info("x", P.FLOAT, [3, 5])
    ys = [coldbrew.load(compile_model(model(h.make_node("RandomNormalLike", ["x"], ["y"], seed=s), [x], (3, 5))))
          .run(None, {"x": np.zeros((3, 5), np.float32)})[0] for s in (1.0, 1.0, 2.0)]
    assert ys[0].shape == (3, 5) and np.array_equal(ys[0], ys[1]) and not np.allclose(ys[0], ys[2])


def test_noise_scaled_by_zero_matches_onnxruntime():
    nodes = [h.make_node("RandomNormalLike", ["x"], ["n"]), h.make_node("Mul", ["n", "s"], ["ns"]),
             h.make_node("Add", ["x", "ns"], ["y"])]
    m = h.make_model(h.make_graph(nodes, "r", [h.make_tensor_value_info("x", P.FLOAT, [4, 6]),
                                                h.make_tensor_value_info("s", P.FLOAT, [])],
                                  [h.make_tensor_value_info("y", P.FLOAT, [4, 6])]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(4, 6), "s": np.array(0, np.float32)}
    np.testing.assert_array_equal(coldbrew.load(compile_model(m)).run(None, feeds)[0], ort_run(m, feeds)[0])
