"""compiler/measure/error.py: narrow weights' effect on the outputs,
measured on sample inputs, and the fewest layers kept fp32 under a bound."""
from types import SimpleNamespace

import numpy as np
import pytest

from coldbrew.compiler import CompileError
from coldbrew.compiler.measure import error
from coldbrew.compiler.pipeline import front_end

INFOS = [SimpleNamespace(name="x", dtype=np.dtype("float32"), shape=[1, 3]),
         SimpleNamespace(name="n", dtype=np.dtype("int64"), shape=[1])]


def test_generated_inputs_are_seeded_normal_floats_and_zero_integers():
    feeds, described = error.sample_inputs(INFOS, samples=4, seed=7)
    again, _ = error.sample_inputs(INFOS, samples=4, seed=7)
    assert len(feeds) == 4 and described == "generated (4 samples, normal, seed 7)"
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(feeds, again))
    assert feeds[0]["x"].dtype == np.float32 and not np.array_equal(feeds[0]["x"], feeds[1]["x"])
    assert all(f["n"].dtype == np.int64 and not f["n"].any() for f in feeds)


def test_calibration_arrays_one_sample_or_many():
    one, _ = error.sample_inputs(INFOS, {"x": np.ones((1, 3)), "n": np.zeros(1)})
    many, described = error.sample_inputs(INFOS, {"x": np.ones((5, 1, 3)), "n": np.zeros((5, 1))})
    assert len(one) == 1 and len(many) == 5 and described == "calibration arrays (5 samples)"
    assert one[0]["x"].dtype == np.float32 and many[0]["x"].shape == (1, 3)


@pytest.mark.parametrize("data,message", [
    ({"x": np.ones((1, 3))}, r"lacks input\(s\) \['n'\]"),
    ({"x": np.ones((2, 4)), "n": np.zeros(1)}, "input 'x' has shape"),
    ({"x": np.ones((2, 1, 3)), "n": np.zeros((3, 1))}, "different sample counts"),
])
def test_unusable_calibration_data_is_refused(data, message):
    with pytest.raises(CompileError, match=message):
        error.sample_inputs(INFOS, data)


def test_output_error_is_relative_to_the_reference_peak_and_counts_top1():
    ref = [[np.array([1.0, 4.0])], [np.array([3.0, 1.0])]]
    got = [[np.array([1.2, 4.0])], [np.array([1.0, 3.5])]]
    err, agree = error.output_error(ref, got)
    assert err == pytest.approx(2.5 / 3) and agree == 0.5
    assert error.output_error(ref, [[np.array([np.nan, 4.0])], ref[1]])[0] == float("inf")


def test_choose_narrows_and_a_bound_keeps_layers_fp32(small_model):
    front = front_end(small_model)
    chosen, solo, acc = error.choose(front, "int8")
    assert set(chosen) == set(solo) and all(p == "int8" for p in chosen.values()) and chosen
    assert acc["output_error"] > 0 and acc["samples"] == error.SAMPLES
    kept, _, bounded = error.choose(front, "int8", max_error=acc["output_error"] / 1e6)
    assert len(kept) < len(chosen) and bounded["output_error"] <= acc["output_error"] / 1e6
    assert bounded["max_error"] == acc["output_error"] / 1e6
