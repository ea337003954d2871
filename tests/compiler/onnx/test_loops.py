"""compiler/onnx/loops.py: a Loop whose trip count is known at compile time is
unrolled and computes what onnxruntime computes (carried values and scan
outputs, a condition that stops it before M); one whose condition depends
on the data runs its copies while the condition holds, up to its trip count
or the user's bound (a run that would need more fails naming --bound), its
scan outputs as long as the iterations it ran; one with no bound, or that
runs too long, is refused by name."""
import numpy as np
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.onnx import loops

F = TensorProto.FLOAT


def while_model(m, n, data_cond=False):
    """An exporter's `while i < n and k < M`: carried i (a counter) and h
    (h = tanh(h @ W + x[i])), each step's h a scan output."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    limit = numpy_helper.from_array(np.array(n, np.int64), "n")
    w = numpy_helper.from_array((np.random.default_rng(1).standard_normal((4, 4)) * 0.5).astype(np.float32), "W")
    body_nodes = [
        helper.make_node("Add", ["i_in", "one"], ["i_out"]),
        helper.make_node("Gather", ["x", "i_in"], ["x_i"], axis=0),
        helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
        helper.make_node("Add", ["hw", "x_i"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["h_out"], ["h_scan"]),
    ]
    if data_cond:  # go on while the state's sum is below a threshold: data-dependent
        body_nodes += [helper.make_node("ReduceSum", ["h_out"], ["s"], keepdims=0),
                       helper.make_node("Less", ["s", "thr"], ["cond_out"])]
    else:
        body_nodes.append(helper.make_node("Less", ["i_out", "n"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("it", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i_in", TensorProto.INT64, []),
         helper.make_tensor_value_info("h_in", F, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("h_out", F, [1, 4]),
         helper.make_tensor_value_info("h_scan", F, [1, 4])])
    inits = [one, limit, w, numpy_helper.from_array(np.array(m, np.int64), "M"),
             numpy_helper.from_array(np.array(True), "c0"), numpy_helper.from_array(np.array(0, np.int64), "i0"),
             numpy_helper.from_array(np.array(1e9, np.float32), "thr")]
    loop = helper.make_node("Loop", ["M", "c0", "i0", "h0"], ["i_end", "h_end", "hs"], name="loop", body=body)
    g = helper.make_graph([loop], "while",
                          [helper.make_tensor_value_info("x", F, [8, 1, 4]),
                           helper.make_tensor_value_info("h0", F, [1, 4])],
                          [helper.make_tensor_value_info("h_end", F, [1, 4]),
                           helper.make_tensor_value_info("hs", F, [None, 1, 4])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("m, n", [(5, 8), (8, 3), (8, 8)])
def test_unrolled_loop_matches_onnxruntime(m, n):
    model = while_model(m, n)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 1, 4)).astype(np.float32),
             "h0": rng.standard_normal((1, 4)).astype(np.float32)}
    ref = ort_run(model, feeds)
    got = coldbrew.load(compile_model(model)).run(None, feeds)
    assert got[1].shape == (min(m, n), 1, 4)  # stopped by whichever comes first: M or the condition
    assert_close(got, ref)


def test_trip_count_runs_the_static_part_only():
    model = while_model(8, 3)
    node = model.graph.node[0]
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert loops.trip_count(node, consts, model.opset_import) == 3
    assert loops.trip_count(while_model(8, 3, data_cond=True).graph.node[0], consts, model.opset_import) is None
    del consts["M"]  # M computed at run time
    assert loops.trip_count(node, consts, model.opset_import) is None


def data_loop(m, given=()):
    """while_model's loop stopped by the data (the state's sum reaching the
    input `thr`), with `given` of M and c0 graph inputs instead of constants."""
    model = while_model(m, 8, data_cond=True)
    g = model.graph
    keep = [t for t in g.initializer if t.name not in ("thr", *given)]
    g.ClearField("initializer")
    g.initializer.extend(keep)
    g.input.append(helper.make_tensor_value_info("thr", F, []))
    types = {"M": TensorProto.INT64, "c0": TensorProto.BOOL}
    g.input.extend(helper.make_tensor_value_info(k, types[k], []) for k in given)
    return model


def loop_feeds(thr, **more):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((8, 1, 4)).astype(np.float32), "h0": np.full((1, 4), 0.5, np.float32),
            "thr": np.array(thr, np.float32), **{k: np.array(v) for k, v in more.items()}}


def stops(model, sess, cases):
    """Each case's run matches onnxruntime; the scan output's lengths."""
    lengths = []
    for feeds in cases:
        got = sess.run(None, feeds)
        assert_close(got, ort_run(model, feeds))
        lengths.append(got[1].shape[0])
    return lengths


def test_a_loop_the_data_stops_matches_onnxruntime_at_every_length():
    model = data_loop(8)
    sess = coldbrew.load(compile_model(model))
    assert sess.get_outputs()[1].ranges[0] == (0, 8, 1)
    lengths = stops(model, sess, [loop_feeds(t) for t in (-10, 0.5, 1.5, 2.0, 10)])
    assert lengths[0] == 1 and lengths[-1] == 8 and len(set(lengths)) >= 3, lengths


def test_the_body_runs_once_per_iteration():
    """The runtime's loop: one copy of the body in the bundle, its steps
    executed again per iteration, no more after the condition stops it."""
    bundle = compile_model(data_loop(8))
    sess = coldbrew.load(bundle)
    loop = read_bytes(bundle)[0].plan.loops[0]
    body = set(range(loop.start + 1, loop.end))
    ran = {}
    for t in (-10, 1.5, 10):  # 1, 2 and 8 iterations
        steps = [step for step, _, _ in sess.run_layers(loop_feeds(t))]
        ran[sess.run(None, loop_feeds(t))[1].shape[0]] = sum(step in body for step in steps)
    assert sorted(ran) == [1, 2, 8] and ran[2] == 2 * ran[1] and ran[8] == 8 * ran[1], ran


def test_m_and_the_first_condition_computed_at_run_time():
    model = data_loop(8, given=("M", "c0"))
    with pytest.raises(CompileError, match=r"Loop node 'loop': its condition depends on the data and it may run any "
                                           r"number of iterations.*--bound hs=N"):
        compile_model(model)
    sess = coldbrew.load(compile_model(model, bounds={"loop": 6}))
    cases = [loop_feeds(10, M=np.int64(m), c0=c) for m, c in ((3, True), (6, True), (0, True), (5, False))]
    assert stops(model, sess, cases[:2]) == [3, 6]
    for feeds in cases[2:]:  # no iteration: the state as given, no scan output
        got = sess.run(None, feeds)
        assert got[1].shape == (0, 1, 4) and np.array_equal(got[0], feeds["h0"])
    with pytest.raises(coldbrew.BundleError, match="found 7 entries for 'hs', more than the 6 the bundle holds"):
        sess.run(None, loop_feeds(10, M=np.int64(8), c0=True))


def test_a_bound_below_the_trip_count_fails_only_the_runs_that_need_more():
    model = data_loop(10**9)
    sess = coldbrew.load(compile_model(model, bounds={"hs": 5}))
    assert stops(model, sess, [loop_feeds(t) for t in (-10, 1.5)]) == [1, 2]
    with pytest.raises(coldbrew.BundleError, match=r"more than the 5 the bundle holds \(compile with --bound hs=N"):
        sess.run(None, loop_feeds(10))


def test_too_many_iterations_are_refused():
    with pytest.raises(CompileError, match=f"more than {loops.MAX_ITERATIONS}"):
        compile_model(while_model(loops.MAX_ITERATIONS + 5, 10**6))


@pytest.mark.parametrize("in_axis, in_rev, out_axis, out_rev", [(0, 0, 0, 0), (1, 1, 1, 0), (1, 0, -1, 1)])
def test_scan_is_unrolled_over_its_axes_and_directions(in_axis, in_rev, out_axis, out_rev):
    """A running sum over a scan input (state) and each step's scaled slice
    (a scan output), read along either axis in either direction."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["x_t", "two"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", F, [3]), helper.make_tensor_value_info("x_t", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("y_t", F, [3])],
        [numpy_helper.from_array(np.array(2, np.float32), "two")])
    x_shape = [5, 3] if in_axis == 0 else [3, 5]
    scan = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], name="scan", body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_rev],
                            scan_output_axes=[out_axis], scan_output_directions=[out_rev])
    g = helper.make_graph([scan], "scan", [helper.make_tensor_value_info("s0", F, [3]),
                                           helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("s", F, [3]),
                           helper.make_tensor_value_info("ys", F, [5, 3] if out_axis == 0 else [3, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    rng = np.random.default_rng(2)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32), "x": rng.standard_normal(x_shape).astype(np.float32)}
    ref = ort_run(model, feeds)
    got = coldbrew.load(compile_model(model)).run(None, feeds)
    assert_close(got, ref)


def test_onnx_loop_case_with_its_first_condition_from_the_data():
    """ONNX's test_loop11 (a scan output sliced by the iteration number) with
    only M bound: its condition stays an input, each run's value taken."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        case = next(c for c in collect_testcases(None) if c.name == "test_loop11")
    trip, _, y = case.data_sets[0][0]
    sess = coldbrew.load(compile_model(case.model, constants={"trip_count": np.asarray(trip)}))
    for cond in (True, False):
        feeds = {"trip_count": np.asarray(trip), "cond": np.array(cond), "y": y}
        got = sess.run(None, {"cond": np.array(cond), "y": y})
        assert_close(got, ort_run(case.model, feeds))
        assert got[1].shape[0] == (int(trip) if cond else 0)


def decoder_model(rows=6, span=1):
    """An exporter's greedy decoder, as a table-structure model writes it:
    the state h adds |its step's row of the input| (a Slice from the step to
    step + `span`), each step's output written into row `step` of a buffer
    (ScatterElements) that starts as a scalar the body never reads, a
    counter carried; the loop stops where the row's sum passes `thr` or at
    `rows`; the output is the buffer's first `count` rows (a Slice whose end
    the data sets)."""
    i64, B = TensorProto.INT64, TensorProto.BOOL

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))

    body_nodes = [
        const("one", np.array([1], np.int64)), const("ax1", np.array([1], np.int64)),
        const("span", np.array([span], np.int64)), const("rows", np.array(rows, np.int64)),
        helper.make_node("Reshape", ["step_in", "one"], ["s1"]),
        helper.make_node("Add", ["s1", "span"], ["s2"]),
        helper.make_node("Slice", ["x", "s1", "s2", "ax1"], ["row"]),          # [1, span, 4]
        helper.make_node("ReduceSum", ["row", "ax1"], ["rsum"], keepdims=0),    # [1, 4]
        helper.make_node("Abs", ["rsum"], ["h_pre"]),
        helper.make_node("Add", ["h_in", "h_pre"], ["h_out"]),  # growing: a threshold stops it anywhere
        helper.make_node("Unsqueeze", ["h_out", "ax1"], ["h_row"]),            # [1, 1, 4]
        helper.make_node("Reshape", ["s1", "one"], ["s_idx"]),
        helper.make_node("Reshape", ["s_idx", "idx_shape"], ["s_b"]),
        helper.make_node("Expand", ["s_b", "row_shape"], ["where"]),
        helper.make_node("ScatterElements", ["buf_zero", "where", "h_row"], ["buf_out"], axis=1),
        helper.make_node("Add", ["step_in", "one_s"], ["step_out"]),
        helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
        helper.make_node("Less", ["tot", "thr"], ["go"]),
        helper.make_node("Less", ["step_out", "rows"], ["room"]),
        helper.make_node("And", ["go", "room"], ["cond_out"]),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("it", i64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("step_in", i64, []), helper.make_tensor_value_info("h_in", F, [1, 4]),
         helper.make_tensor_value_info("buf_in", F, None)],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("step_out", i64, []),
         helper.make_tensor_value_info("h_out", F, [1, 4]), helper.make_tensor_value_info("buf_out", F, None)],
        [numpy_helper.from_array(np.array(1, np.int64), "one_s"),
         numpy_helper.from_array(np.array([1, 1, 1], np.int64), "idx_shape"),
         numpy_helper.from_array(np.array([1, 1, 4], np.int64), "row_shape")])
    inits = [numpy_helper.from_array(np.array(100, np.int64), "M"), numpy_helper.from_array(np.array(True), "c0"),
             numpy_helper.from_array(np.array(0, np.int64), "step0"), numpy_helper.from_array(np.array(0, np.float32),
                                                                                              "buf0"),
             numpy_helper.from_array(np.zeros((1, rows, 4), np.float32), "buf_zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64),
                                                                                               "axis1"),
             numpy_helper.from_array(np.array([1], np.int64), "one1")]
    nodes = [helper.make_node("Loop", ["M", "c0", "step0", "h0", "buf0"], ["steps", "h_end", "buf"], name="dec",
                              body=body),
             helper.make_node("Reshape", ["steps", "one1"], ["end"]),
             helper.make_node("Slice", ["buf", "zero", "end", "axis1"], ["out"])]
    g = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", F, [1, rows + span, 4]),
                                             helper.make_tensor_value_info("h0", F, [1, 4]),
                                             helper.make_tensor_value_info("thr", F, [])],
                          [helper.make_tensor_value_info("out", F, [1, None, 4]),
                           helper.make_tensor_value_info("h_end", F, [1, 4])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def decoder_feeds(thr, rows=6, span=1):
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((1, rows + span, 4)).astype(np.float32),
            "h0": np.zeros((1, 4), np.float32), "thr": np.array(thr, np.float32)}


def test_a_decoder_runs_as_one_body_and_matches_onnxruntime_at_every_length():
    """Its buffer starts as a scalar and becomes [1, rows, 4] (the START
    gives it that shape, zeros), its step's row is a Slice at the step (one
    row long, checked), its output a Slice to the step count (counted)."""
    model = decoder_model()
    bundle = compile_model(model)
    assert len(read_bytes(bundle)[0].plan.loops) == 1 and read_bytes(bundle)[0].plan.loops[0].atLeastOnce
    sess = coldbrew.load(bundle)
    lengths = []
    for thr in (0.0, 6.0, 14.0, 100.0):
        feeds = decoder_feeds(thr)
        got, ref = sess.run(None, feeds), ort_run(model, feeds)
        assert_close(got, ref)
        lengths.append(got[0].shape[1])
    assert lengths == [1, 2, 4, 6], lengths


def test_a_step_slice_of_another_length_fails_the_run():
    """A Slice at the step keeps the length its first iteration has: one
    that the axis's end cuts short fails the run rather than reading past it."""
    model = decoder_model(rows=6, span=2)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 6  # the last step's 2 rows cut to 1
    sess = coldbrew.load(compile_model(model))
    feeds = {**decoder_feeds(0.0), "x": decoder_feeds(0.0)["x"][:, :6]}
    assert_close(sess.run(None, feeds), ort_run(model, feeds))  # one step: its 2 rows are there
    with pytest.raises(coldbrew.BundleError, match="found 1 entries for .*, fewer than the 2 the bundle was compiled"):
        sess.run(None, {**feeds, "thr": np.array(100.0, np.float32)})


def test_a_loop_whose_first_shapes_change_must_run_once():
    model = decoder_model()
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "c0"))
    model.graph.input.append(helper.make_tensor_value_info("c0", TensorProto.BOOL, []))
    sess = coldbrew.load(compile_model(model))
    feeds = decoder_feeds(100.0)
    assert_close(sess.run(None, {**feeds, "c0": np.array(True)}), ort_run(model, {**feeds, "c0": np.array(True)}))
    with pytest.raises(coldbrew.BundleError, match="took no iteration: a value it carries has another shape"):
        sess.run(None, {**feeds, "c0": np.array(False)})
