"""compiler/onnx/fold.py, the engine of the pass fold_constants (whose
graph-level tests are tests/compiler/passes/test_fold_constants.py): one
node's evaluation by ONNX's reference, and what it declines."""
import numpy as np
from onnx import helper

from coldbrew.compiler.onnx import fold


def test_a_node_the_reference_cannot_evaluate_is_left_for_the_kernels():
    dq = helper.make_node("DequantizeLinear", ["q", "sc"], ["d"], name="dq")
    assert fold._try_evaluate(dq, {"q": np.ones(2, np.int8), "sc": np.array(0.5, np.float32)},
                              [helper.make_opsetid("", 18)]) is None


def test_a_node_of_constants_is_evaluated():
    add = helper.make_node("Add", ["a", "b"], ["c"], name="add")
    out = fold._try_evaluate(add, {"a": np.array([1, 2]), "b": np.array([3, 4])}, [helper.make_opsetid("", 17)])
    np.testing.assert_array_equal(out[0] if isinstance(out, (list, tuple)) else out, [4, 6])
