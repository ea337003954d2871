"""compiler/passes/legalize_onnx.py: Pow forms the importer lacks rewritten to
equivalent ones (same outputs), and shape-deciding inputs required constant."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.passes import legalize_onnx


def pow_model(base, expo, base_values=None):
    inits = [numpy_helper.from_array(np.array(2, dtype=helper.tensor_dtype_to_np_dtype(expo)), "e")]
    g = helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")], "pow",
                          [helper.make_tensor_value_info("x", base, [4])],
                          [helper.make_tensor_value_info("y", base, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("base, expo, casts", [(TensorProto.FLOAT, TensorProto.INT64, 1),
                                               (TensorProto.INT32, TensorProto.INT32, 3),
                                               (TensorProto.FLOAT, TensorProto.FLOAT, 0)])
def test_pow_is_rewritten_with_the_same_result(base, expo, casts):
    model = pow_model(base, expo)
    x = np.array([1, 2, 3, -4], dtype=helper.tensor_dtype_to_np_dtype(base))
    out = legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString()))
    assert [n.op_type for n in out.graph.node].count("Cast") == casts
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_a_shape_deciding_input_that_is_not_constant_is_refused():
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="shape"):
        legalize_onnx.apply(m)


def test_an_if_on_a_computed_condition_is_computed_both_ways_and_selected():
    import os
    import sys

    from conftest import ROOT

    sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
    from if_models import if_model

    import coldbrew
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.passes import fold_constants, load_onnx

    model = if_model(cond_from="x")
    legal = legalize_onnx.apply(fold_constants.apply(load_onnx.apply(if_model(cond_from="x"))))
    ops = [n.op_type for n in legal.graph.node]
    assert "If" not in ops and ops.count("Where") == 1
    sess = coldbrew.load(compile_model(model))
    for x in (np.array([[1.0, 2.0, -0.5, 0.25]], np.float32), np.array([[-1.0, 0.5, -2.0, 0.25]], np.float32)):
        (want,) = ort_run(model, {"x": x})
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)


def test_an_if_whose_branches_differ_in_shape_is_named_with_what_to_bind():
    import os
    import sys

    from conftest import ROOT

    sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
    from if_models import if_model

    from coldbrew.compiler import compile_model

    with pytest.raises(CompileError, match=r"If node 'gate': input 0 \('cond'\) must be a compile-time constant but "
                                           r"depends on model input\(s\) flag; bind them with --bind"):
        compile_model(if_model(shapes_differ=True))


def test_an_empty_scales_beside_sizes_is_an_absent_input():
    import coldbrew
    from coldbrew.compiler import compile_model

    inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
             numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
             numpy_helper.from_array(np.array([1, 2, 8, 8], np.int64), "sizes")]
    g = helper.make_graph([helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], mode="nearest")], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    legal = legalize_onnx.apply(onnx.load_model_from_string(model.SerializeToString()))
    assert list(legal.graph.node[0].input) == ["x", "", "", "sizes"]
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    (want,) = ort_run(model, {"x": x})
    np.testing.assert_array_equal(coldbrew.load(compile_model(model)).run(None, {"x": x})[0], want)


def test_a_clip_with_bounds_computed_at_run_time_becomes_max_then_min():
    import coldbrew
    from coldbrew.compiler import compile_model

    nodes = [helper.make_node("ReduceMin", ["x"], ["lo"], keepdims=0), helper.make_node("ReduceMean", ["x"], ["hi"],
                                                                                           keepdims=0),
             helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")]
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    legal = legalize_onnx.apply(onnx.load_model_from_string(model.SerializeToString()))
    assert [n.op_type for n in legal.graph.node][2:] == ["Max", "Min", "Identity"]
    x = np.random.default_rng(2).standard_normal((2, 6)).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    np.testing.assert_allclose(coldbrew.load(compile_model(model)).run(None, {"x": x})[0], want, rtol=1e-6)

