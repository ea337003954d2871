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
