"""compiler/passes/import_relax.py: a folded ONNX model becomes a Relax module; the
importer's failure becomes a CompileError naming the node, not a traceback
with TVM's IR, and nothing the importer prints reaches the terminal."""
import pytest

from coldbrew.compiler import CompileError
from coldbrew.compiler.passes import import_relax, load_onnx


def test_the_model_becomes_a_relax_module_with_its_inputs(small_model):
    proto = load_onnx.apply(small_model, None, None)
    mod = import_relax.apply(proto)
    main = mod["main"]
    assert [p.name for p in main.params] == ["x"]
    assert [int(d) for d in main.params[0].ty.shape.values] == [1, 3, 16, 16]


def test_an_importer_failure_is_a_compile_error(small_model, monkeypatch):
    import tvm.relax.frontend.onnx as frontend

    def fail(*a, **k):
        raise RuntimeError("Traceback (most recent call last):\n  IR dump ...\nError converting operator Slice")

    monkeypatch.setattr(frontend, "from_onnx", fail)
    with pytest.raises(CompileError, match="^importing the ONNX graph failed: Error converting operator Slice$"):
        import_relax.apply(load_onnx.apply(small_model, None, None))


def test_the_node_the_importer_fails_on_is_named_and_its_printout_kept_off_the_terminal(small_model, monkeypatch,
                                                                                        capfd):
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    real = ONNXGraphImporter._convert_operator

    def convert(self, op_name, inputs, attrs, opset):
        if op_name == "Relu":
            print(f"Error converting operator {op_name}, with inputs: [R.Tensor((1, 8, 16, 16)) ...]")
            import warnings

            warnings.warn("Field 'shape' of 'type' is required but missing.")
            raise ValueError("Traceback (most recent call last):\n  ...\nrelu cannot take a 4-D input here")
        return real(self, op_name, inputs, attrs, opset)

    monkeypatch.setattr(ONNXGraphImporter, "_convert_operator", convert)
    with pytest.raises(CompileError) as e:
        import_relax.apply(load_onnx.apply(small_model, None, None))
    assert str(e.value).startswith("Relu node 'relu': the ONNX importer cannot convert it (relu cannot take a 4-D "
                                   "input here). If an input of it depends on a model input")
    import gc

    gc.collect()
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no print, no warning, no C++ log line (BlockBuilder destroyed ...)
    assert ONNXGraphImporter._convert_operator is convert  # the watch is undone


def test_min_and_max_of_several_inputs_broadcast_pairwise_not_as_full_size_constants():
    """Min / Max take one broadcasting op per further input: a bound of a
    written-out quantization (a scalar 255) is not made a constant of the
    whole tensor's size in the bundle; three inputs of different shapes
    give onnxruntime's result."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import coldbrew
    from coldbrew.compiler import compile_model
    from conftest import assert_close, ort_run

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 1024])
    row = helper.make_tensor_value_info("row", TensorProto.FLOAT, [1, 1, 1024])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 1024])
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 255.0))]
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Max", ["sq", "lo"], ["pos"]),
             helper.make_node("Min", ["pos", "hi", "row"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "m", [x, row], [out], consts),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    data = compile_model(m)
    assert len(data) < 256 * 1024 * 4 // 4  # no 1 MB constant of 255s (or of 0s)
    rng = np.random.default_rng(0)
    feeds = {"x": (rng.standard_normal((1, 256, 1024)) * 20).astype(np.float32),
             "row": (rng.standard_normal((1, 1, 1024)) * 200).astype(np.float32)}
    assert_close(coldbrew.load(data).run(None, feeds), ort_run(m, feeds))
