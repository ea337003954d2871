"""compiler/ir/narrow.py: what fp16 and int8 store for fp32 weights, what
they widen back to, and the error between."""
import numpy as np

from coldbrew.compiler.ir.narrow import FP16_MAX, choice, direct_layers, fits_fp16, narrow_weights, weight_error


def test_fp16_stores_the_values_rounded_to_half_precision():
    w = np.array([[1.0, 1 / 3], [-2.5, 1e-4]], np.float32)
    (stored,), wide = narrow_weights(w, "fp16", 0)
    assert stored.dtype == np.float16 and np.array_equal(wide, w.astype(np.float16).astype(np.float32))


def test_int8_scales_each_entry_of_the_axis_by_its_own_peak():
    w = np.array([[1.0, -0.5, 0.25], [100.0, 50.0, -25.0], [0, 0, 0]], np.float32)
    (q, scale), wide = narrow_weights(w, "int8", 0)
    assert q.dtype == np.int8 and q.shape == w.shape
    assert np.allclose(scale, [1 / 127, 100 / 127, 1.0])  # an all-zero row keeps scale 1
    assert q[0, 0] == 127 and q[1, 0] == 127 and q[1, 2] == np.int8(np.rint(-25 / (100 / 127)))
    assert np.allclose(wide, q.astype(np.float32) * scale[:, None])
    assert weight_error(w, wide) < 0.5 / 127 + 1e-6


def test_int8_along_another_axis():
    w = np.array([[1.0, 100.0], [-1.0, 50.0]], np.float32)
    (_, scale), _ = narrow_weights(w, "int8", 1)
    assert np.allclose(scale, [1 / 127, 100 / 127])


def test_weight_error_is_relative_to_the_peak():
    raw = np.array([2.0, -4.0], np.float32)
    assert abs(weight_error(raw, raw + np.float32(0.4)) - 0.1) < 1e-6
    assert weight_error(np.zeros(3, np.float32), np.ones(3, np.float32)) == 0.0


def test_fits_fp16():
    assert fits_fp16(np.array([FP16_MAX, -1], np.float32)) and fits_fp16(np.zeros(0, np.float32))
    assert not fits_fp16(np.array([1e5], np.float32))


def test_choice_takes_the_layer_then_star_then_default():
    assert choice({"c1": "raw", "*": "cached"}, "c1", "x") == "raw"
    assert choice({"c1": "raw", "*": "cached"}, "c2", "x") == "cached"
    assert choice({}, "c2", "x") == "x"


def test_direct_layers_are_those_asked_direct_at_a_narrow_precision():
    direct = direct_layers({"*": "cached", "c1": "direct", "c2": "direct"}, {"*": "fp32", "c1": "int8"})
    assert [direct(a) for a in ("c0", "c1", "c2")] == [None, "int8", None]  # c2 is fp32: nothing to read narrow
    assert direct_layers("direct", "fp16")("c9") == "fp16"
