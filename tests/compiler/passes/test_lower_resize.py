"""compiler/passes/lower_resize.py: nearest Resize lowered with exact integer
source indices (ONNX's rules for every coordinate mode and rounding), equal
to ONNX's reference where TVM's float lowering rounded ties wrongly."""
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import coldbrew
from coldbrew.compiler import compile_model


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("mode,nearest,hw_in,hw_out", [
    ("half_pixel", "round_prefer_floor", (2, 3), (7, 5)),  # exact ties: topi's FMA rounded them up
    ("pytorch_half_pixel", "round_prefer_ceil", (4, 7), (3, 1)),
    ("align_corners", "ceil", (6, 3), (1, 8)),  # out size 1: topi divides by zero
    ("asymmetric", "floor", (5, 4), (2, 10)),
])
def test_resize_nearest_matches_onnx_reference(mode, nearest, hw_in, hw_out):
    from onnx.reference import ReferenceEvaluator

    shape_in, shape_out = [1, 2, *hw_in], [1, 2, *hw_out]
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode=mode, nearest_mode=nearest)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)],
               [helper.make_tensor("sizes", TensorProto.INT64, [4], shape_out)], opset=19)
    x = np.arange(np.prod(shape_in), dtype=np.float32).reshape(shape_in)
    got = coldbrew.load(compile_model(m)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(m).run(None, {"x": x})[0])


@pytest.mark.parametrize("mode", ["half_pixel", "asymmetric", "tf_half_pixel_for_nearest"])
@pytest.mark.parametrize("up", [True, False])
def test_a_size_set_at_run_time_times_a_whole_factor_divides_by_a_constant(mode, up):
    """out = 4 * in (or in = 4 * out) at every size: the source index is
    the ratio's, a division by a constant rather than by a size (one per
    pixel), and equal to the index from the sizes at every size."""
    from tvm import tirx
    from tvm.sym import Analyzer

    from coldbrew.compiler.passes.lower_resize import _src_index

    h, y = tirx.Var("h", "int64"), tirx.Var("y", "int64")
    n_in, n_out = (h, h * 4) if up else (h * 4, h)
    idx = _src_index(y, n_in, n_out, mode, "")
    assert not re.search(r"//\s*\(?h", str(idx)), idx
    for hv in (1, 3, 10):
        for yv in range(int(4 * hv if up else hv)):
            ana = Analyzer()
            ana.bind(h, tirx.IntImm("int64", hv))
            ana.bind(y, tirx.IntImm("int64", yv))
            sized = _src_index(tirx.IntImm("int64", yv), int(ana.simplify(n_in)), int(ana.simplify(n_out)), mode, "")
            assert int(ana.simplify(idx)) == int(sized), (hv, yv)
