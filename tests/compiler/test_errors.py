"""compiler/errors.py: one error type, messages that name what is wrong."""
import pytest

from coldbrew.compiler.errors import CompileError, UnsupportedOperatorError


def test_unsupported_operators_are_all_named_sorted_with_their_nodes():
    e = UnsupportedOperatorError({"TopK": ["head/topk"], "If": ["vad/if0", "vad/if1"]})
    assert isinstance(e, CompileError)
    assert str(e) == "unsupported operators: If (nodes 'vad/if0', 'vad/if1'); TopK (nodes 'head/topk')"
    assert list(e.unsupported) == ["If", "TopK"]


def test_many_nodes_of_one_operator_are_counted_not_listed():
    e = UnsupportedOperatorError({"Loop": [f"n{k}" for k in range(8)]})
    assert str(e) == "unsupported operators: Loop (nodes 'n0', 'n1', 'n2', 'n3', 'n4' and 3 more)"


def test_a_compile_error_is_raised_with_its_message():
    with pytest.raises(CompileError, match="^input 'x' has no fixed shape$"):
        raise CompileError("input 'x' has no fixed shape")


def test_an_internal_error_is_one_sentence_that_asks_for_a_report():
    from coldbrew.compiler.errors import InternalError

    cause = RuntimeError("Check failed: x != nullptr\n# from tvm.script import ir as I\n@I.ir_module\nclass Module:")
    e = InternalError("pass fuse_layers", cause)
    assert isinstance(e, CompileError) and "\n" not in str(e)
    assert str(e).startswith("internal error in pass fuse_layers: RuntimeError: Check failed: x != nullptr. "
                             "This is a coldbrew bug: please report it")
    assert len(str(InternalError("x", ValueError("y" * 5000)))) < 500


def test_a_pass_that_fails_unexpectedly_is_named_and_nothing_else_reaches_the_user(small_model, monkeypatch,
                                                                                  tmp_path):
    from click.testing import CliRunner
    import onnx

    from coldbrew.compiler import InternalError, compile_model
    from coldbrew.compiler.passes import fuse_layers
    from coldbrew.compiler.tools.cli import main

    def broken(c):
        raise IndexError("list index out of range\nIR follows:\n  %0 = ...")

    monkeypatch.setattr(fuse_layers, "run", broken)
    with pytest.raises(InternalError, match=r"^internal error in pass fuse_layers: IndexError: list index out of range\.") \
            as e:
        compile_model(small_model)
    assert isinstance(e.value.__cause__, IndexError)
    path = tmp_path / "m.onnx"
    onnx.save(small_model, str(path))
    r = CliRunner().invoke(main, ["compile", str(path), "-o", str(path.with_suffix(".brew"))])
    assert r.exit_code == 1 and "internal error in pass fuse_layers" in r.output
    assert "Traceback" not in r.output and "IR follows" not in r.output


def test_an_unexpected_failure_around_the_pipeline_is_wrapped_too(small_model, monkeypatch):
    from coldbrew.compiler import InternalError, compile_model, driver

    monkeypatch.setattr(driver, "back_end", lambda *a, **k: 1 / 0)
    with pytest.raises(InternalError, match="^internal error in compile: ZeroDivisionError"):
        compile_model(small_model)


def test_unsupported_operators_are_all_named_in_one_error():
    from onnx import helper

    from coldbrew.compiler.onnx.ops import check_supported

    nodes = [helper.make_node(op, ["x"], [f"y{k}"], name=f"n{k}")
             for k, op in enumerate(["NonZero", "StringNormalizer", "Relu", "Bernoulli", "StringNormalizer"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [3])], [])
    with pytest.raises(UnsupportedOperatorError, match=r"^unsupported operators: Bernoulli \(nodes 'n3'\); "
                                                       r"StringNormalizer \(nodes 'n1', 'n4'\)$"):
        check_supported(helper.make_model(g))
