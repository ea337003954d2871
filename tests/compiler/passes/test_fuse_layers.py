"""compiler/passes/fuse_layers.py: Relax operators lowered to TIR and fused into
layers (a convolution with its bias and activation: one PrimFunc); sigmoid
lowered vectorizably for CPUs only; a lowering failure is a CompileError."""
import pytest
from onnx import TensorProto, helper

from coldbrew.compiler import CompileError, front_end
from coldbrew.compiler.passes import fuse_layers


def _prim_funcs(mod):
    from tvm import tirx

    return sorted(gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc))


def test_conv_bias_and_relu_become_one_layer(small_model):
    names = _prim_funcs(fuse_layers.apply(front_end(small_model).mod))
    fused = [n for n in names if "conv2d" in n]
    assert len(fused) == 1 and "relu" in fused[0], names


def _sigmoid_model():
    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"], name="s")], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_sigmoid_gets_the_vectorizable_lowering_on_cpus_only():
    mod = front_end(_sigmoid_model()).mod
    assert "cb_sigmoid" in fuse_layers.apply(mod, cpu=True).script()
    assert "cb_sigmoid" not in fuse_layers.apply(mod, cpu=False).script()


def test_a_lowering_failure_is_a_compile_error(small_model, monkeypatch):
    import tvm

    def fail(self, mod):
        raise RuntimeError("InternalError: Check failed\n  (IR)\nValueError: cannot legalize op")

    mod = front_end(small_model).mod
    monkeypatch.setattr(tvm.transform.Sequential, "__call__", fail)
    with pytest.raises(CompileError, match="^lowering to TIR failed: ValueError: cannot legalize op$"):
        fuse_layers.apply(mod)


@pytest.mark.parametrize("op,shape,ranged", [("Softmax", (1, 40, 6625), None), ("LogSoftmax", (3, 100), None),
                                             ("Softmax", (2, 5, 37), None), ("Softmax", (8, 96), None),
                                             ("Softmax", (1, 40, 6625), "1x[4:80:4]x6625")])
def test_a_softmax_over_rows_of_whole_vectors_and_a_few_values_more_reduces_them_apart(op, shape, ranged):
    """6,625 classes: the row's whole vectors reduced per lane, the few
    values more apart (a row of whole vectors keeps topi's form), also
    where the number of rows is set at run time (a text line's
    characters); what onnxruntime computes."""
    import numpy as np
    from conftest import ort_run

    import coldbrew
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.options import Options

    dims = [d if ranged is None or k != 1 else "n" for k, d in enumerate(shape)]
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=-1)], "sm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    shapes = {"x": ranged} if ranged else None
    ragged = shape[-1] % fuse_layers.VECTOR_ROW != 0
    assert ("cb_max_vectors" in fuse_layers.apply(front_end(m, Options(input_shapes=shapes)).mod).script()) == ragged
    x = {"x": (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)}
    np.testing.assert_allclose(coldbrew.load(compile_model(m, input_shapes=shapes)).run(None, x)[0], ort_run(m, x)[0],
                               rtol=1e-5, atol=1e-5)


def _resize_model():
    """x [1, 8, h, w] -> nearest Resize x2 -> Relu."""
    sc = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Relu", ["u"], ["r"])]
    g = helper.make_graph(nodes, "ra", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 8, "h2", "w2"])], [sc])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_a_resize_over_sizes_set_at_run_time_fuses_with_what_follows():
    """TVM takes a load index that reads a size (not a loop) as opaque: the
    resize was a layer of its own at sizes set at run time, fused at fixed
    ones. Read at constant sizes, its pattern lets it fuse: one layer."""
    from coldbrew.compiler.options import Options

    for shape in ("1x8x[H=2:20]x[W=2:20]", [1, 8, 5, 6]):
        names = _prim_funcs(fuse_layers.apply(front_end(_resize_model(), Options(input_shapes={"x": shape})).mod))
        assert names == ["fused_resize2d_relu"], (shape, names)


def test_the_pattern_read_at_constant_sizes():
    from tvm import te, tirx

    h = tirx.Var("h", "int64")
    a = te.placeholder((1, 8, h), "float32", name="a")
    up = te.create_prim_func([a, te.compute((1, 8, h * 4), lambda n, c, y: a[n, c, y * h // (h * 4)], name="b")])
    assert fuse_layers._pattern_at_constants(up) == 2  # injective (TVM: opaque, 8)


def _flow_model(c):
    """A normalizing flow's coupling step, as VITS voices export it: half
    the channels through a convolution, the other half shifted, the halves
    joined, reversed (Slice, step -1) and split again."""
    import numpy as np
    from onnx import numpy_helper

    w = np.random.default_rng(0).standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3
    consts = {"w": w, "half": np.array([c, c], np.int64), "st": np.array([-1], np.int64),
              "en": np.array([-(2 ** 62)], np.int64), "ax": np.array([1], np.int64), "sp": np.array([-1], np.int64)}
    nodes = [helper.make_node("Split", ["x", "half"], ["a", "b"], axis=1),
             helper.make_node("Conv", ["a", "w"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("Sub", ["b", "h"], ["d"]), helper.make_node("Concat", ["a", "d"], ["cat"], axis=1),
             helper.make_node("Slice", ["cat", "st", "en", "ax", "sp"], ["f"]),
             helper.make_node("Split", ["f", "half"], ["p", "q"], axis=1)]
    g = helper.make_graph(nodes, "flow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2 * c, 1, "T"])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, 1, "T"]) for n in "pq"],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("shape", ["1x32x1x40", "1x32x1x[8:64]"])
def test_a_reversed_axis_is_a_layer_of_its_own_and_reads_the_right_channels(shape, tmp_path):
    """Fused with the blocked convolution's unblocking, a flip's index
    `K - c` reaches `c // 8` and `c % 8`, which TVM's buffer flattening
    rewrites wrongly (every channel of the first half wrong, at fixed sizes
    and at sizes set at run time): the flip is a layer of its own."""
    import numpy as np
    import onnxruntime as ort

    import coldbrew
    from coldbrew.compiler import compile_model

    model, path = _flow_model(16), str(tmp_path / "flow.brew")
    compile_model(model, path, input_shapes={"x": shape}, dump_ir=str(tmp_path / "ir"))
    with open(tmp_path / "ir" / "11_elide_copies.txt") as f:
        layers = [ln for ln in f if "strided_slice" in ln and "[generic" in ln]
    assert [ln.split(": ")[1].split(" ")[0] for ln in layers] == ["strided_slice"], layers
    x = np.random.default_rng(1).standard_normal((1, 32, 1, 40)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, want in zip(coldbrew.load(path).run(None, {"x": x}), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
