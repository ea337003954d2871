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
