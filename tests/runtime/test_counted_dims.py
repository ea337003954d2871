"""Sizes the data sets (schema 5 Range.count; runtime/src/bundle/program.c
cb_counts_check, runtime/src/exec/shapes.c cb_shapes_count): a counted
dim's tensor must be one int64, fixed, written by exactly one step, and
its range 0 <= min <= typical <= max in steps of 1, else the bundle is
CORRUPT naming the dim (each made by editing the header of a compiled
bundle); a run sizes what follows the counting step by its count; an
output's ranges say which axes the data sets."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from test_shapes import header, refused, rewrite

import coldbrew
from coldbrew.compiler import compile_model

X, BUF, COUNT, K, NZ, R = range(6)  # input x, the kernel's bounded output and count, the dim, outputs nz and r


@pytest.fixture(scope="module")
def data():
    """nz = NonZero(x), r = Relu(x), x of 6 values."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Relu", ["x"], ["r"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                                            [helper.make_tensor_value_info("nz", TensorProto.INT64, [1, "k"]),
                                             helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    return compile_model(m)


def test_the_bundle_is_the_one_these_tests_edit(data):
    b = header(data)
    assert [(t.name, t.kind) for t in b.tensors][K:] == [(b"nz", 5), (b"nz", 1), (b"r", 1)]
    r = b.tensors[K].bounds
    assert (r.min, r.max, r.step, r.typical, r.count) == (0, 6, 1, 6, COUNT)
    assert list(b.layers[0].args) == [X, BUF, COUNT]


def test_each_run_takes_its_own_count(data):
    sess = coldbrew.load(data)
    assert [o.ranges for o in sess.get_outputs()] == [[(1, 1, 1), (0, 6, 1)], [(6, 6, 1)]]
    for x in ([0, 1, 0, 2, 0, 3], [0] * 6, [1] * 6, [0, 0, 0, 0, 0, -1]):
        nz, r = sess.run(None, {"x": np.array(x, np.float32)})
        assert nz.tolist() == [list(np.nonzero(x)[0])] and r.shape == (6,)


def count(value):
    def mutate(b):
        b.tensors[K].bounds.count = value
    return mutate


@pytest.mark.parametrize("value,why", [(X, "an input"), (K, "the dim itself"), (NZ, "48 bytes, shaped by it"),
                                       (R, "a float"), (6, "no tensor"), (BUF, "48 bytes")])
def test_a_count_that_is_not_one_int64_one_step_writes_is_refused(data, value, why):
    refused(rewrite(data, count(value)), f"counted dim tensor {K} ('nz') names tensor {value}, which is not one int64 "
                                         f"that one step writes")


def test_a_count_no_step_writes_is_refused(data):
    def unwritten(b):  # the count is the take layer's input instead of the kernel's output
        b.layers[0].args = [X, BUF, R]
    refused(rewrite(data, unwritten), f"counted dim tensor {K} ('nz') names tensor {COUNT}")


@pytest.mark.parametrize("fields", [dict(min=-1), dict(step=2), dict(typical=7), dict(min=3, typical=2),
                                    dict(step=0)])
def test_bad_counted_ranges_are_refused(data, fields):
    def mutate(b):
        for k, v in fields.items():
            setattr(b.tensors[K].bounds, k, v)
    refused(rewrite(data, mutate), f"counted dim tensor {K} ('nz') has an invalid range")


def test_a_count_over_a_smaller_range_fails_the_run_and_the_next_runs(data):
    def smaller(b):
        b.tensors[K].bounds.max = 2
        b.tensors[K].bounds.typical = 2
    sess = coldbrew.load(rewrite(data, smaller))
    assert sess.run(None, {"x": np.array([0, 0, 4, 0, 5, 0], np.float32)})[0].tolist() == [[2, 4]]
    with pytest.raises(coldbrew.BundleError, match="found 3 entries for 'nz', more than the 2 the bundle holds"):
        sess.run(None, {"x": np.array([1, 0, 4, 0, 5, 0], np.float32)})
    assert sess.run(None, {"x": np.array([0, 0, 0, 0, 5, 0], np.float32)})[0].tolist() == [[4]]
