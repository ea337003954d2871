"""compiler/onnx/shapes.py: shape arithmetic on sizes set at run time,
written back as constants in each operator's relative terms (a Reshape's
0 and -1, an Expand to ones as a product, a Slice's end from the end, a
Tile's repeats from a fixed axis), its dead chains dropped; each rewritten
model still gives onnxruntime's result at every size."""
import numpy as np
import onnx
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

from coldbrew.compiler.onnx import shapes


def _model(nodes, inits, x_dims, y_dims=None):
    m = helper.make_model(helper.make_graph(
        nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)],
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in inits.items()]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _consts(m):
    return {t.name: numpy_helper.to_array(t).tolist() for t in m.graph.initializer}


def test_a_reshape_target_from_the_input_shape_becomes_copies_and_one_inferred_size():
    """x [1, n, 12] -> [1, n, 3, 4] by Shape/Gather/Concat: the target
    written [1, 0, 3, 4] (0: the size it keeps), the Shape chain gone."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Concat", ["one", "n", "three", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = _model(nodes, {"i1": [1], "one": [1], "three": [3], "four": [4]}, [1, "n", 12])
    before = onnx.ModelProto()
    before.CopyFrom(m)
    shapes.apply(m)
    reshape = next(n for n in m.graph.node if n.op_type == "Reshape")
    assert _consts(m)[reshape.input[1]] == [1, 0, 3, 4]
    assert [n.op_type for n in m.graph.node] == ["Reshape"]  # the chain folded away
    for n in (1, 5):
        f = {"x": np.random.default_rng(n).standard_normal((1, n, 12)).astype(np.float32)}
        np.testing.assert_array_equal(ort_run(m, f)[0], ort_run(before, f)[0])


def test_two_sizes_set_at_run_time_in_one_target_leave_the_reshape_to_the_importer():
    """[n, m] -> [m, n] (a transpose written as a reshape of the data): no constant holds at every size."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["m"], axis=0),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Concat", ["m", "n"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = _model(nodes, {"i0": [0], "i1": [1]}, ["n", "m"])
    shapes.apply(m)
    reshape = next(n for n in m.graph.node if n.op_type == "Reshape")
    assert reshape.input[1] == "target"


def test_an_expand_to_the_input_shape_is_a_product_with_ones():
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    m = _model(nodes, {"shape": [1, 4, 1]}, [1, 1, "n"])
    shapes.apply(m)
    (node,) = m.graph.node
    assert node.op_type == "Mul" and np.array(_consts(m)[node.input[1]]).shape == (1, 4, 1)


def test_a_slice_ending_a_constant_before_a_size_set_at_run_time_counts_from_the_end():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["end"], axis=0),
             helper.make_node("Sub", ["end", "two"], ["cut"]),
             helper.make_node("Slice", ["x", "start", "cut", "axes"], ["y"])]
    m = _model(nodes, {"i1": [1], "two": [2], "start": [1], "axes": [1]}, [1, "n"])
    shapes.apply(m)
    sl = next(n for n in m.graph.node if n.op_type == "Slice")
    assert _consts(m)[sl.input[2]] == [-2]  # n - 2: two from the end


def test_a_slice_to_a_size_set_at_run_time_slices_to_the_largest_int64():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["end"], axis=0),
             helper.make_node("Slice", ["x", "start", "end", "axes"], ["y"])]
    m = _model(nodes, {"i1": [1], "start": [1], "axes": [1]}, [1, "n"])
    shapes.apply(m)
    sl = next(n for n in m.graph.node if n.op_type == "Slice")
    assert _consts(m)[sl.input[2]] == [shapes.BIG]


def test_slice_axes_kept_whole_at_every_declared_size_are_dropped():
    """Axis 0 sliced [0:1000000000] with n at most 64 is kept whole (dropped
    from the Slice), axis 1's [1:3] stays; without an axes input the kept
    axis is named. With n up to 2e9 the end may cut: the Slice stays."""
    for axes in (["axes"], []):
        nodes = [helper.make_node("Slice", ["x", "starts", "ends"] + axes, ["y"])]
        m = _model(nodes, {"starts": [0, 1], "ends": [1000000000, 3], "axes": [0, 1]}, ["n", 6])
        before = onnx.ModelProto()
        before.CopyFrom(m)
        shapes.apply(m, {"n": (1, 64)})
        sl = m.graph.node[0]
        assert [_consts(m)[i] for i in sl.input[1:4]] == [[1], [3], [1]]
        for n in (1, 9):
            f = {"x": np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)}
            np.testing.assert_array_equal(ort_run(m, f)[0], ort_run(before, f)[0])
        m.CopyFrom(before)
        shapes.apply(m, {"n": (1, 2000000000)})
        assert len(m.graph.node[0].input) == len(before.graph.node[0].input)
        assert _consts(m)[m.graph.node[0].input[2]] == [1000000000, 3]


def test_a_slice_keeping_every_axis_whole_is_an_identity():
    nodes = [helper.make_node("Slice", ["x", "zero", "big", "zero"], ["y"])]
    m = _model(nodes, {"zero": [0], "big": [shapes.BIG]}, ["n", 6])
    shapes.apply(m)  # past any size: no range needed
    assert [n.op_type for n in m.graph.node] == ["Identity"]


def test_a_range_over_a_size_and_the_exporters_test_for_minus_one_fold():
    """The exporters' broadcast of a constant to a computed shape:
    Expand(c, Where(Equal(Shape(r), -1), ones, Shape(r))), r a Range over
    x's length reshaped to [n, 1]: the Range's length named, the test for
    -1 decided (a size is never negative), the Expand's shape read from
    shapes (r's, or x's axis); the result onnxruntime's at every length."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Reshape", ["r", "col"], ["rc"]), helper.make_node("Shape", ["rc"], ["rs"]),
             helper.make_node("Equal", ["rs", "minus"], ["eq"]), helper.make_node("Where", ["eq", "ones", "rs"], ["t"]),
             helper.make_node("Expand", ["c", "t"], ["e"]), helper.make_node("Cast", ["rc"], ["rf"], to=1),
             helper.make_node("Mul", ["rf", "e"], ["m"]), helper.make_node("Transpose", ["m"], ["mt"]),
             helper.make_node("Add", ["x", "mt"], ["y"])]
    m = _model(nodes, {"i1": 1, "zero": 0, "one": 1, "col": [-1, 1], "minus": [-1], "ones": [1, 1]}, [1, "n"])
    m.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "c"))
    before = onnx.ModelProto()
    before.CopyFrom(m)
    shapes.apply(m)
    ops = [n.op_type for n in m.graph.node]
    assert "Equal" not in ops and "Where" not in ops, ops
    expand = next(n for n in m.graph.node if n.op_type == "Expand")
    assert next(n for n in m.graph.node if expand.input[1] in n.output).op_type in ("Shape", "Concat")  # of Shapes
    for n in (1, 5, 9):
        x = np.arange(n, dtype=np.float32).reshape(1, n)
        np.testing.assert_array_equal(ort_run(m, {"x": x})[0], ort_run(before, {"x": x})[0])


def test_an_expand_to_sizes_of_several_tensors_reads_each_from_its_own():
    """A voice model's broadcast of x's mean row to [1, n, 1] by
    Where(Equal(Reshape(Concat(-1, n, -1)), -1), ones, ...): the test for -1
    decided, the shape made of the constants and x's axis 1 (a Shape and a
    Gather, which the importer takes); onnxruntime's result at every n."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["minus", "n1", "minus"], ["cat"], axis=0),
             helper.make_node("Reshape", ["cat", "minus"], ["t"]),
             helper.make_node("Equal", ["t", "minus3"], ["eq"]), helper.make_node("Where", ["eq", "ones", "t"], ["w"]),
             helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1, 2], keepdims=1),
             helper.make_node("Expand", ["mean", "w"], ["e"]), helper.make_node("Sub", ["x", "e"], ["y"])]
    m = _model(nodes, {"i1": 1, "zero1": [0], "minus": [-1], "minus3": [-1, -1, -1], "ones": [1, 1, 1]},
               [1, "n", 4], [1, "n", 4])
    m.opset_import[0].version = 13
    before = onnx.ModelProto()
    before.CopyFrom(m)
    shapes.apply(m)
    ops = [n.op_type for n in m.graph.node]
    assert "Equal" not in ops and "Where" not in ops, ops
    for n in (1, 6, 11):
        x = np.random.default_rng(n).standard_normal((1, n, 4)).astype(np.float32)
        np.testing.assert_allclose(ort_run(m, {"x": x})[0], ort_run(before, {"x": x})[0], rtol=1e-6)


def test_an_expand_to_a_shape_made_of_shapes_is_left_as_the_importer_takes_it():
    """A YOLO head's grid: Expand(row, Concat(Shape(a), Shape(b))) over sizes
    set at run time stays a shape made of Shape values (the importer takes
    it; read from other tensors' axes it was not, at run time)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=1),
             helper.make_node("Range", ["zf", "nf", "onef"], ["r"]),
             helper.make_node("Reshape", ["r", "row"], ["rr"]), helper.make_node("Reshape", ["r", "col"], ["rc"]),
             helper.make_node("Shape", ["rc"], ["s1"]), helper.make_node("Shape", ["rr"], ["s2"]),
             helper.make_node("Concat", ["s1", "s2"], ["t"], axis=0),
             helper.make_node("Expand", ["rr", "t"], ["y"])]
    m = _model(nodes, {"i1": 1, "row": [1, -1], "col": [-1, 1]}, [1, "n"], ["n", "n"])
    m.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), k)
                                for k, v in (("zf", 0.0), ("onef", 1.0))])
    before = onnx.ModelProto()
    before.CopyFrom(m)
    shapes.apply(m)
    expand = next(n for n in m.graph.node if n.op_type == "Expand")
    assert expand.input[1] == "t" and not any(n.output[0].endswith("/dims") for n in m.graph.node)
    for n in (2, 7):
        x = np.zeros((1, n), np.float32)
        np.testing.assert_array_equal(ort_run(m, {"x": x})[0], ort_run(before, {"x": x})[0])


def test_a_reshape_with_allowzero_keeps_its_sizes_when_its_target_folds():
    """A PyTorch exporter's Reshape(allowzero=1) to [batch, n, 3, 4] from
    Shape: the target folds to [0, 0, 3, 4] (0: the size it keeps), which
    allowzero=1 would read as sizes of zero; allowzero is cleared and the
    rewritten model gives onnxruntime's result at every size."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["bn"]),
             helper.make_node("Concat", ["bn", "three", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], allowzero=1)]
    m = _model(nodes, {"zero": [0], "two": [2], "three": [3], "four": [4]}, ["b", "n", 12])
    before = onnx.ModelProto()
    before.CopyFrom(m)
    shapes.apply(m)
    reshape = next(n for n in m.graph.node if n.op_type == "Reshape")
    assert _consts(m)[reshape.input[1]] == [0, 0, 3, 4]
    assert [a.i for a in reshape.attribute if a.name == "allowzero"] == [0]
    for b, n in ((1, 1), (2, 5)):
        f = {"x": np.random.default_rng(n).standard_normal((b, n, 12)).astype(np.float32)}
        np.testing.assert_array_equal(ort_run(m, f)[0], ort_run(before, f)[0])


def test_an_exporters_own_zero_in_a_reshape_target_still_folds():
    """Paddle's targets say 0 for a kept size themselves (allowzero off):
    [0, n, 3, 4] from Shape folds to [0, 0, 3, 4] (an allowzero=1 Reshape
    asking a size of zero is the only one left to the importer)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Concat", ["zero", "n", "three", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = _model(nodes, {"i1": [1], "zero": [0], "three": [3], "four": [4]}, [1, "n", 12])
    shapes.apply(m)
    reshape = next(n for n in m.graph.node if n.op_type == "Reshape")
    assert _consts(m)[reshape.input[1]] == [0, 0, 3, 4]
