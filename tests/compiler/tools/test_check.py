"""compiler/tools/check.py, the output check of the corpus, the benchmarks and
the tests' assert_close: each fault it guards against is planted and seen
to fail (a NaN, an infinity, a reference that is not finite, a missing or
extra output, a shape, an integer, rows swapped, a score off beside large
boxes, an output that ignores the input), and inputs mean something to the
model (ids from its vocabulary, masks with padding)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import check

RNG = np.random.default_rng(1)
REF = [RNG.standard_normal((2, 8)).astype(np.float32), np.array([3, 1, 2], np.int64)]


def planted(k, fault):
    got = [a.copy() for a in REF]
    fault(got[k])
    return got


def test_a_faithful_copy_passes():
    v = check.compare(REF, [a.copy() for a in REF])
    assert v.ok and v.error == 0.0


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_fails(value):
    v = check.compare(REF, planted(0, lambda a: a.__setitem__((1, 3), value)))
    assert not v.ok and "NaN or infinite values where the reference has none" in v.message()


def test_an_all_nan_output_fails():
    assert not check.compare(REF, [np.full_like(REF[0], np.nan), REF[1]]).ok


def test_a_reference_that_is_not_finite_fails():
    ref = [REF[0].copy(), REF[1]]
    ref[0][0, 0] = np.nan
    v = check.compare(ref, [ref[0].copy(), ref[1]])  # even where ours has the same NaN
    assert not v.ok and "the reference itself has 1 NaN" in v.message()


def test_a_missing_or_extra_output_fails():
    assert "1 outputs where the reference has 2" in check.compare(REF, REF[:1]).message()
    assert not check.compare(REF, REF + [REF[1]]).ok


def test_a_shape_or_an_integer_that_differs_fails():
    assert "shape [2, 7]" in check.compare(REF, [REF[0][:, :7], REF[1]]).message()
    assert "1 of 3 integer values differ" in check.compare(REF, planted(1, lambda a: a.__setitem__(0, 4))).message()


def test_swapped_rows_fail():
    assert not check.compare(REF, [REF[0][::-1].copy(), REF[1]]).ok


def test_scores_beside_large_boxes_have_their_own_scale():
    """Rows of (x1, y1, x2, y2, score): a score 0.3 off beside 300-pixel
    boxes fails, an error of 1e-4 of a box's scale does not."""
    boxes = np.array([[10, 20, 300, 310, 0.9], [40, 50, 200, 280, 0.6], [5, 5, 30, 40, 0.2]], np.float32)
    off = boxes.copy()
    off[1, 4] += 0.3
    v = check.compare([boxes], [off])
    assert not v.ok and v.error == pytest.approx(0.3, rel=1e-3)
    near = boxes.copy()
    near[:, :4] += 0.03
    assert check.compare([boxes], [near]).ok


def test_ranked_rows_in_another_order_fail_unless_their_scores_tie():
    ref = np.array([[10, 10, 50, 50, 0.9, 0], [0, 0, 5, 5, 0.6, 1], [1, 1, 6, 6, 0.00011, 1],
                    [2, 2, 7, 7, 0.00010, 1]], np.float32)
    ranked = {"output": 0, "score": 4}
    assert check.compare([ref], [ref[[0, 1, 3, 2]]], ranked=ranked).ok  # a near-tie in either order
    v = check.compare([ref], [ref[[1, 0, 2, 3]]], ranked=ranked)
    assert not v.ok and "rows out of order" in v.message()
    moved = ref.copy()
    moved[0, 0] += 5
    assert not check.compare([ref], [moved], ranked=ranked).ok


def test_an_output_that_ignores_the_input_is_seen():
    a = [np.arange(4.0), np.ones(3)]
    assert check.unchanged_outputs(a, [np.arange(4.0) + 1, np.ones(3)]) == [1]
    assert check.unchanged_outputs(a, [x.copy() for x in a]) == [0, 1]


def embedding_model(quantized=False):
    """ids -> Cast -> Gather over a 50-row table (quantized: int8 rows times
    a scale, as a dynamic-quantized text model keeps it) and a mask."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 4)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32)]
    inits = []
    if quantized:
        inits += [numpy_helper.from_array((table * 40).astype(np.int8), "tq"),
                  numpy_helper.from_array(np.array(1 / 40, np.float32), "ts")]
        nodes += [helper.make_node("Cast", ["tq"], ["tf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["tf", "ts"], ["table"])]
    else:
        inits.append(numpy_helper.from_array(table, "table"))
    nodes += [helper.make_node("Gather", ["table", "ids32"], ["e"]),
              helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["m", "ax"], ["mu"]),
              helper.make_node("Mul", ["e", "mu"], ["y"])]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "ax"))
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "n"]),
                                         helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, "n"]),
                                         helper.make_tensor_value_info("len", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("quantized", [False, True])
def test_ids_come_from_the_models_vocabulary(quantized):
    m = embedding_model(quantized)
    assert check.vocabularies(m) == {"ids": 50}
    x = check.inputs(m, {"ids": {"shape": [1, 16]}, "mask": {"shape": [1, 16]}, "len": {"range": [1, 17]}})
    assert x["ids"].dtype == np.int64 and x["ids"].min() >= 0 and x["ids"].max() < 50 and len(set(x["ids"][0])) > 4
    assert x["mask"].dtype == np.bool_ and x["mask"][0, :12].all() and not x["mask"][0, 12:].any()
    assert 1 <= x["len"][0] < 17
    other = check.inputs(m, {"ids": {"shape": [1, 16]}, "len": {"range": [1, 17]}}, seed=1)
    assert not np.array_equal(x["ids"], other["ids"])


def test_an_integer_input_of_unknown_meaning_is_refused_until_its_range_is_given():
    with pytest.raises(ValueError, match="integer input 'len' indexes no embedding: give its range"):
        check.inputs(embedding_model(), {})


def test_ids_are_never_all_zero():
    """A seed whose draw of one id from the 50-row vocabulary is 0 still
    gives a non-zero id."""
    seed = next(s for s in range(5000) if not np.random.default_rng(s).integers(0, 50, size=[1, 1]).any())
    x = check.inputs(embedding_model(), {"ids": {"shape": [1, 1]}, "len": {"range": [0, 1]}}, seed=seed)
    assert x["ids"].any()


def test_assert_close_uses_the_check():
    from conftest import assert_close

    with pytest.raises(AssertionError, match="NaN"):
        assert_close(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    with pytest.raises(AssertionError, match="1 outputs where the reference has 2"):
        assert_close(REF[:1], REF)


def test_a_text_line_is_dark_strokes_on_a_light_page():
    """"draw": "strokes" (a recognizer that reads noise as blank): values 0
    and 1, mostly light, different per seed."""
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 64, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 64, 256])])
    m = helper.make_model(g)
    a, b = (check.inputs(m, {"x": {"draw": "strokes"}}, seed)["x"] for seed in (0, 1))
    assert set(np.unique(a)) == {0.0, 1.0} and 0.5 < a.mean() < 1.0 and not np.array_equal(a, b)
