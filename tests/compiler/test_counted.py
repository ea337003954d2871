"""Outputs sized by the data (compiler/kernels/counted.py): NonZero,
Compress, NonMaxSuppression and Unique compile with a bound (derived, or
--bound), run to the size the data gives and match onnxruntime and the
numpy references, with the layers after them sized by the count; a count
over the bound fails the run naming the option; what cannot be compiled
is refused in one sentence."""
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ort_run
from onnx import TensorProto as P
from onnx import helper as h
from onnx import numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.kernels import counted
from coldbrew.compiler.tools.cli import main


def model(nodes, inputs, outputs, inits=(), opset=17):
    m = h.make_model(h.make_graph(nodes, "counted", inputs, outputs, list(inits)),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == np.asarray(w).shape and g.dtype == np.asarray(w).dtype, (g.shape, np.asarray(w).shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def nonzero_chain():
    """The non-zero entries of x (3x4x5), their coordinates and values
    (NonZero -> Transpose -> GatherND), the values' sum, and how many."""
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Transpose", ["nz"], ["at"]),
             h.make_node("GatherND", ["x", "at"], ["v"]), h.make_node("ReduceSum", ["v"], ["s"], keepdims=0),
             h.make_node("Shape", ["v"], ["n"])]
    m = model(nodes, [vi("x", P.FLOAT, [3, 4, 5])],
              [vi("at", P.INT64, ["k", 3]), vi("v", P.FLOAT, ["k"]), vi("s", P.FLOAT, []), vi("n", P.INT64, [1])])
    return m, coldbrew.load(compile_model(m))


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 1.0])
def test_nonzero_and_the_layers_after_it_follow_the_count(nonzero_chain, keep):
    m, sess = nonzero_chain
    rng = np.random.default_rng(int(keep * 10))
    x = (rng.random((3, 4, 5)) < keep) * rng.standard_normal((3, 4, 5)).astype(np.float32)
    x = x.astype(np.float32)
    got = sess.run(None, {"x": x})
    same(got, ort_run(m, {"x": x}))
    assert got[0].shape == (np.count_nonzero(x), 3) and got[3].tolist() == [np.count_nonzero(x)]


def test_one_session_runs_many_counts_in_turn(nonzero_chain):
    m, sess = nonzero_chain
    rng = np.random.default_rng(7)
    for k in (60, 0, 17, 60, 3):
        x = np.zeros(60, np.float32)
        x[rng.permutation(60)[:k]] = rng.standard_normal(k) + 3
        got = sess.run(None, {"x": x.reshape(3, 4, 5)})
        assert got[1].shape == (k,)
        same(got, ort_run(m, {"x": x.reshape(3, 4, 5)}))


def test_the_output_ranges_say_what_the_data_sizes(nonzero_chain):
    _, sess = nonzero_chain
    at, v, s, n = sess.get_outputs()
    assert at.ranges == [(0, 60, 1), (3, 3, 1)] and v.ranges == [(0, 60, 1)] and s.ranges == []
    assert at.shape == [60, 3]  # the bound: what the memory is planned for


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float32])
def test_nonzero_of_each_dtype_matches_numpy(dtype):
    m = model([h.make_node("NonZero", ["x"], ["y"])], [vi("x", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                          [2, 3, 4])], [vi("y", P.INT64, [3, "k"])])
    sess = coldbrew.load(compile_model(m))
    x = (np.random.default_rng(1).random((2, 3, 4)) > 0.6).astype(dtype)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], counted.nonzero_reference(x))


@pytest.mark.parametrize("axis,length", [(None, 24), (0, 2), (1, 3), (2, 4), (1, 2), (-1, 3)])
def test_compress_keeps_what_the_condition_keeps(axis, length):
    attrs = {} if axis is None else {"axis": axis}
    m = model([h.make_node("Compress", ["x", "c"], ["y"], **attrs)], [vi("x", P.FLOAT, [2, 3, 4]),
              vi("c", P.BOOL, [length])], [vi("y", P.FLOAT, ["k"] if axis is None else
                                                            ["k" if a == axis % 3 else d for a, d in enumerate([2, 3, 4])])])
    sess = coldbrew.load(compile_model(m))
    rng = np.random.default_rng(length)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for c in (rng.random(length) > 0.5, np.zeros(length, bool), np.ones(length, bool)):
        got = sess.run(None, {"x": x, "c": c})
        same(got, ort_run(m, {"x": x, "c": c}))
        np.testing.assert_array_equal(got[0], counted.compress_reference(x, c[:x.size if axis is None else
                                                                            x.shape[axis]], axis))


def nms_model(center, given):
    """NonMaxSuppression over boxes [2, 40, 4] and scores [2, 3, 40]; `given`:
    its limits as graph inputs (else constants)."""
    limits = {"m": np.array([5], np.int64), "iou": np.array([0.4], np.float32), "th": np.array([0.3], np.float32)}
    inputs = [vi("boxes", P.FLOAT, [2, 40, 4]), vi("scores", P.FLOAT, [2, 3, 40])]
    inits = []
    for k, v in limits.items():
        if given:
            inputs.append(vi(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), [1]))
        else:
            inits.append(numpy_helper.from_array(v, k))
    node = h.make_node("NonMaxSuppression", ["boxes", "scores", "m", "iou", "th"], ["sel"], center_point_box=center)
    return model([node], inputs, [vi("sel", P.INT64, ["k", 3])], inits), limits


def boxes(rng, center):
    xy = rng.random((2, 40, 2)) * 10
    wh = rng.random((2, 40, 2)) * 4 + 0.5
    b = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)[..., [1, 0, 3, 2]]
    return b.astype(np.float32)


@pytest.mark.parametrize("center,given", [(0, False), (1, False), (0, True)])
def test_non_max_suppression_matches_onnxruntime(center, given):
    m, limits = nms_model(center, given)
    sess = coldbrew.load(compile_model(m))
    # the bound: 5 boxes per class and batch; every box where the limit is an input
    assert sess.get_outputs()[0].shape == [2 * 3 * (40 if given else 5), 3]
    rng = np.random.default_rng(center + 2 * given)
    for trial in range(3):
        feeds = {"boxes": boxes(rng, center), "scores": rng.random((2, 3, 40)).astype(np.float32)}
        if given:
            feeds.update({k: v * (trial + 1) if k == "m" else v for k, v in limits.items()})
        got = sess.run(None, feeds)
        same(got, ort_run(m, feeds))
        want = counted.nms_reference(feeds["boxes"], feeds["scores"], int(feeds.get("m", limits["m"])[0]), 0.4, 0.3,
                                     center)
        np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("axis,is_sorted", [(None, 1), (None, 0), (0, 1), (1, 0), (-1, 1)])
def test_unique_gives_values_firsts_inverse_and_counts(axis, is_sorted):
    attrs = {"sorted": is_sorted, **({} if axis is None else {"axis": axis})}
    m = model([h.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs)],
              [vi("x", P.FLOAT, [4, 6])], [vi(n, P.FLOAT if n == "y" else P.INT64, [f"d{n}{k}" for k in range(
                  (1 if axis is None else 2) if n == "y" else 1)]) for n in ("y", "first", "inverse", "counts")])
    sess = coldbrew.load(compile_model(m))
    x = np.random.default_rng(3).integers(0, 3, (4, 6)).astype(np.float32)
    x[2] = x[0]  # a repeated row
    x[:, 4] = x[:, 1]  # a repeated column
    got = sess.run(None, {"x": x})
    same(got, ort_run(m, {"x": x}))
    same(got, counted.unique_reference(x, None if axis is None else axis % 2, bool(is_sorted)))


def test_a_count_over_the_bound_fails_the_run_naming_the_option(tmp_path):
    m = model([h.make_node("NonZero", ["x"], ["nz"])], [vi("x", P.FLOAT, [10])], [vi("nz", P.INT64, [1, "k"])])
    sess = coldbrew.load(compile_model(m, bounds={"nz": 4}))
    assert sess.get_outputs()[0].shape == [1, 4]
    x = np.array([0, 1, 0, 2, 3, 0, 0, 4, 0, 0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [[1, 3, 4, 7]])
    x[0] = 5
    with pytest.raises(coldbrew.BundleError, match=r"found 5 entries for 'nz', more than the 4 the bundle holds "
                                                   r"\(compile with --bound nz=N for more\)"):
        sess.run(None, {"x": x})
    x[0] = 0
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [[1, 3, 4, 7]])  # the session goes on
    onnx.save(m, tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.brew"), "--bound",
                                  "nz=2"])
    assert r.exit_code == 0, r.output
    assert coldbrew.load(str(tmp_path / "m.brew")).get_outputs()[0].shape == [1, 2]
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.brew"), "--bound",
                                  "nz"])
    assert r.exit_code != 0 and "expected TENSOR=N" in r.output


def test_a_count_with_ranged_inputs_is_bounded_at_the_largest_input():
    m = model([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Transpose", ["nz"], ["y"])],
              [vi("x", P.FLOAT, [2, "w"])], [vi("y", P.INT64, ["k", 2])])
    sess = coldbrew.load(compile_model(m, input_shapes={"x": "2x[w=1:50]"}))
    assert sess.get_outputs()[0].shape == [100, 2]
    rng = np.random.default_rng(5)
    for w in (1, 13, 50):
        x = (rng.random((2, w)) > 0.5).astype(np.float32)
        same(sess.run(None, {"x": x}), ort_run(m, {"x": x}))


def test_the_inspector_names_the_counting_layer(tmp_path, nonzero_chain):
    m, _ = nonzero_chain
    compile_model(m, str(tmp_path / "c.brew"))
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "c.brew")])
    assert r.exit_code == 0, r.output
    assert "dim        nz 0..60 typical 60: counted by the data into %" in r.output
    assert "output     v float32[nz] largest [60]" in r.output


def test_compare_checks_every_layer_at_the_counted_sizes(tmp_path, nonzero_chain):
    from coldbrew.compiler.tools.compare import compare

    m, _ = nonzero_chain
    onnx.save(m, tmp_path / "c.onnx")
    compile_model(m, str(tmp_path / "c.brew"))
    x = np.where(np.arange(60).reshape(3, 4, 5) % 7 == 0, 1.5, 0).astype(np.float32)
    report = compare(str(tmp_path / "c.onnx"), str(tmp_path / "c.brew"), inputs={"x": x})
    assert report.first is None and report.matched >= 3, report.first


@pytest.mark.parametrize("what", ["gpu", "continuous"])
def test_counted_outputs_are_refused_where_not_available(what, nonzero_chain):
    m, _ = nonzero_chain
    options = {"target": "vulkan"} if what == "gpu" else {"continuous": True, "plan": "cold-greedy"}
    with pytest.raises(CompileError, match=r"outputs sized by the data \(nz\) are not available"):
        compile_model(m, **options)


def test_a_bound_must_be_a_whole_number():
    with pytest.raises(CompileError, match="bound of 'nz' must be a whole number of entries"):
        compile_model(model([h.make_node("NonZero", ["x"], ["nz"])], [vi("x", P.FLOAT, [3])],
                            [vi("nz", P.INT64, [1, "k"])]), bounds={"nz": -1})


def test_a_range_whose_limit_the_data_sets_needs_a_bound_and_follows_it():
    """Range(0, round(sum(x)), 1), as a TTS voice's frames from its
    durations: refused without a bound, naming the option; with one, the
    length each run's data gives."""
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Ceil", ["s"], ["c"]),
             h.make_node("Cast", ["c"], ["n"], to=P.INT64), h.make_node("Range", ["zero", "n", "one"], ["r"]),
             h.make_node("Cast", ["r"], ["rf"], to=P.FLOAT), h.make_node("Mul", ["rf", "half"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("zero", 0), ("one", 1))]
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    m = model(nodes, [vi("x", P.FLOAT, [4])], [vi("y", P.FLOAT, ["k"])], inits)
    with pytest.raises(CompileError, match=r"how many entries 'r' holds has no bound known at compile time: give "
                                           r"one with --bound r=N"):
        compile_model(m)
    sess = coldbrew.load(compile_model(m, bounds={"r": 40}))
    for x in ([0, 0, 0, 0], [0.5, 1, 2, 3.2], [10, 10, 10, 10]):
        feeds = {"x": np.array(x, np.float32)}
        got = sess.run(None, feeds)
        same(got, ort_run(m, feeds))
    with pytest.raises(coldbrew.BundleError, match="found 41 entries for 'r'"):
        sess.run(None, {"x": np.array([10, 10, 10, 11], np.float32)})


def test_a_topk_whose_k_is_the_fewer_of_a_count_and_a_limit():
    """A detector's tail (paddle2onnx's NMS exports): k = ReduceMin of
    [the count of found entries, 3], read off a Shape: the shape's values
    as data, a TopK whose k the data sets."""
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Shape", ["nz"], ["s"]),
             h.make_node("Slice", ["s", "one", "two"], ["n"]), h.make_node("Concat", ["n", "three"], ["c"], axis=0),
             h.make_node("ReduceMin", ["c"], ["k"], keepdims=1), h.make_node("TopK", ["x", "k"], ["v", "i"])]
    inits = [numpy_helper.from_array(np.array([v], np.int64), k) for k, v in (("one", 1), ("two", 2), ("three", 3))]
    m = model(nodes, [vi("x", P.FLOAT, [10])], [vi("v", P.FLOAT, ["k"]), vi("i", P.INT64, ["k"])], inits)
    sess = coldbrew.load(compile_model(m))
    for nonzero in (0, 2, 3, 7):
        x = np.zeros(10, np.float32)
        x[:nonzero] = np.arange(1, nonzero + 1, dtype=np.float32)[::-1] * 1.5
        got = sess.run(None, {"x": x})
        same(got, ort_run(m, {"x": x}))
        assert got[0].shape == (min(nonzero, 3),)
