"""compiler/kernels/generic.py's generic schedule for layers without a
variant: a MatMul of two activations is register-blocked (a local tile,
vectors along its output's contiguous axis), a reduction over the
contiguous last axis is vectorized per lane (rfactor), a reduction read
across its output axis is not vectorized along it (it would gather); each
computes what numpy computes, for the host and AVX2. And the float32
exp, softmax, erf and tanh are lowered to vectorizable polynomials."""
import numpy as np
import pytest
import tvm
from tvm import s_tir, te, topi

from coldbrew.compiler.kernels import build as kb
from coldbrew.compiler.kernels.generic import MIN_PARALLEL_WORK, generic
from coldbrew.targets import resolve
from conftest import cpu_targets
from standalone import workspace_sizes

TARGETS = [resolve(t) for t in cpu_targets()]


def scheduled(func, target):
    sch = s_tir.Schedule(func)
    generic(sch, target.vector.lanes, target.vector.registers)
    return sch.mod["main"]


def run(func, target, shapes):
    lib = kb.build({"f": func}, target)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["f"](*tensors)
    return args, tensors[-1].numpy()


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
@pytest.mark.parametrize("b,m,k,n", [(4, 24, 40, 64), (1, 5, 7, 48), (2, 64, 100, 100), (1, 5, 7, 20), (8, 40, 40, 15)])
def test_a_product_of_two_activations_is_register_blocked(target, b, m, k, n):
    """Rows of whole vectors; a row of whole vectors and a few values more
    (100 keys), or of most of one (15), is padded to whole vectors
    (pad_einsum) and blocked too."""
    x, y = te.placeholder((1, b, m, k), name="x"), te.placeholder((1, b, k, n), name="y")
    r = te.reduce_axis((0, k), "r")
    out = te.compute((1, b, m, n), lambda a, h, i, j: te.sum(x[a, h, i, r] * y[a, h, r, j], axis=r), name="mm")
    func = scheduled(te.create_prim_func([x, y, out]), target)
    text = func.script()
    assert "_global = T.sblock_alloc_buffer" in text and "T.vectorized" in text  # the tile (TILE_SCOPE)
    assert ("T.parallel" in text) == (b * m * k * n >= MIN_PARALLEL_WORK)
    (a, c, _), got = run(func, target, [(1, b, m, k), (1, b, k, n), (1, b, m, n)])
    np.testing.assert_allclose(got, a @ c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
def test_a_reduction_over_the_contiguous_axis_is_vectorized_per_lane(target):
    x = te.placeholder((6, 3, 96), name="x")
    func = scheduled(te.create_prim_func([x, topi.sum(x, axis=2)]), target)
    text = func.script()
    assert "_rf" in text and "T.vectorized" in text
    (a, _), got = run(func, target, [(6, 3, 96), (6, 3)])
    np.testing.assert_allclose(got, a.sum(axis=2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
@pytest.mark.parametrize("reduce,keep", [(topi.max, True), (topi.min, False)])
def test_a_whole_tensor_reduction_runs_in_parallel_chunks_of_vectors(target, reduce, keep):
    """A quantizer's max and min over a whole tensor: chunks in parallel,
    each accumulated per lane (two rfactors), not one serial scalar loop."""
    x = te.placeholder((1, 32, 16, 64), name="x")
    func = scheduled(te.create_prim_func([x, reduce(x, keepdims=keep)]), target)
    text = func.script()
    assert "_rf_rf" in text and "T.parallel" in text and "T.vectorized" in text  # chunks, then lanes
    (a, _), got = run(func, target, [(1, 32, 16, 64), (1, 1, 1, 1) if keep else ()])
    np.testing.assert_array_equal(got.reshape(()), (np.max if reduce is topi.max else np.min)(a))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
def test_a_reduction_over_several_contiguous_axes_is_vectorized_per_lane(target):
    """A global pooling (a mean over H and W) as one reduced axis, per lane."""
    x = te.placeholder((2, 24, 16, 64), name="x")
    func = scheduled(te.create_prim_func([x, topi.sum(x, axis=(2, 3))]), target)
    text = func.script()
    assert "_rf" in text and "T.vectorized" in text and "T.parallel" in text
    (a, _), got = run(func, target, [(2, 24, 16, 64), (2, 24)])
    np.testing.assert_allclose(got, a.sum(axis=(2, 3)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["relu", "softmax", "sum"])
def test_a_layer_of_little_work_runs_on_one_thread_and_a_large_one_in_parallel(op):
    """A pool launch and the data's move between cores cost more than a
    small layer's work: below MIN_PARALLEL_WORK iterations no loop is
    parallel; the same layer 16 times larger has one."""
    target = TARGETS[0]
    texts = {}
    for rows in (8, 128):
        x = te.placeholder((rows, 256), name="x")
        y = {"relu": lambda: topi.nn.relu(x), "softmax": lambda: topi.nn.softmax(x),
             "sum": lambda: topi.sum(x, axis=1)}[op]()
        func = scheduled(te.create_prim_func([x, y]), target)
        texts[rows] = func.script()
        (a, _), got = run(func, target, [(rows, 256), tuple(int(d) for d in y.shape)])
        want = {"relu": lambda: np.maximum(a, 0), "softmax": lambda: np.exp(a) / np.exp(a).sum(1, keepdims=True),
                "sum": lambda: a.sum(1)}[op]()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert 8 * 256 < MIN_PARALLEL_WORK <= 128 * 256
    assert "T.parallel" not in texts[8] and "T.parallel" in texts[128]


def test_a_product_read_across_its_output_axis_is_not_vectorized_along_it():
    """x @ y^T reads y along the reduced axis: vectors along the output's
    columns would gather, so the reduction is vectorized per lane instead."""
    target = TARGETS[0]
    x, y = te.placeholder((32, 64), name="x"), te.placeholder((48, 64), name="y")
    r = te.reduce_axis((0, 64), "r")
    out = te.compute((32, 48), lambda i, j: te.sum(x[i, r] * y[j, r], axis=r), name="mm")
    func = scheduled(te.create_prim_func([x, y, out]), target)
    assert "_rf" in func.script()
    (a, c, _), got = run(func, target, [(32, 64), (48, 64), (32, 48)])
    np.testing.assert_allclose(got, a @ c.T, rtol=1e-5, atol=1e-5)


def _loops(func):
    """The scheduled function's loops, outermost first, as (variable, kind)."""
    found = []

    def visit(stmt):
        if isinstance(stmt, tvm.tirx.For):
            found.append((stmt.loop_var.name, tvm.tirx.ForKind(int(stmt.kind)).name))
            visit(stmt.body)
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif hasattr(stmt, "block"):  # a block realize
            visit(stmt.block.body)
        elif hasattr(stmt, "body"):
            visit(stmt.body)
    visit(func.body)
    return found


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
@pytest.mark.parametrize("case", ["transpose", "to_blocked", "pixel_shuffle_from_blocked"])
def test_a_gathering_copy_is_tiled_inside_its_contiguous_axis_and_unrolled(target, case):
    """A copy that reads its input at a stride along its output's last axis
    (a transpose, NCHW to the blocked layout, a pixel shuffle out of the
    blocked layout) is not vectorized (each lane would be a load of its
    own) but runs a tile of a vector's lanes of that axis, unrolled, inside
    the nearest axis along which the input is read contiguously: each
    cache line read serves a whole tile."""
    lanes = target.vector.lanes
    if case == "transpose":
        shape, out_shape = (96, 64), (64, 96)
        x = te.placeholder(shape, name="x")
        out = te.compute(out_shape, lambda i, j: x[j, i], name="t")
        want = lambda a: a.T  # noqa: E731
        partner = "i"
    elif case == "to_blocked":
        shape, out_shape = (1, 2 * lanes, 6, 2 * lanes), (1, 2, 6, 2 * lanes, lanes)
        x = te.placeholder(shape, name="x")
        out = te.compute(out_shape, lambda n, cb, y, z, c: x[n, cb * lanes + c, y, z], name="t")
        want = lambda a: a.reshape(1, 2, lanes, 6, 2 * lanes).transpose(0, 1, 3, 4, 2)  # noqa: E731
        partner = "z"
    else:  # 3 * lanes / 2 channels per phase (24 on AVX-512), 2 x 2 phases, blocked [1, 6, h, w, lanes]
        c, h, w = 3 * lanes // 2, 5, lanes
        shape, out_shape = (1, 4 * c // lanes, h, w, lanes), (1, c, 2 * h, 2 * w)

        def value(n, k, y, z):
            ch = ((y % 2) * 2 + z % 2) * c + k
            return x[n, ch // lanes, y // 2, z // 2, ch % lanes]
        x = te.placeholder(shape, name="x")
        out = te.compute(out_shape, value, name="t")

        def want(a):
            phases = a.transpose(0, 1, 4, 2, 3).reshape(1, 2, 2, c, h, w)
            return phases.transpose(0, 3, 4, 1, 5, 2).reshape(out_shape)
        partner = "k"
    func = scheduled(te.create_prim_func([x, out]), target)
    loops = _loops(func)
    assert "VECTORIZED" not in {k for _, k in loops}
    (_, kind), (outside, _) = loops[-1], loops[-2]
    assert kind == "UNROLLED" and outside.split("_")[0] == partner, loops
    (a, _), got = run(func, target, [shape, out_shape])
    np.testing.assert_array_equal(got, want(a))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
def test_a_copy_read_contiguously_stays_vectorized(target):
    x = te.placeholder((8, 4, 64), name="x")
    out = te.compute((4, 8, 64), lambda i, j, k: x[j, i, k] * 2.0, name="t")
    func = scheduled(te.create_prim_func([x, out]), target)
    assert "T.vectorized" in func.script()
    (a, _), got = run(func, target, [(8, 4, 64), (4, 8, 64)])
    np.testing.assert_array_equal(got, a.transpose(1, 0, 2) * 2)


@pytest.mark.parametrize("op", ["Exp", "Softmax", "Erf", "Tanh"])
def test_transcendentals_are_polynomials_on_the_cpu(op):
    """No libm call per lane: the lowered layer holds no exp/erf/tanh call."""
    from onnx import TensorProto, helper

    import coldbrew
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.passes import fuse_layers
    from coldbrew.compiler.pipeline import front_end

    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mod = fuse_layers.apply(front_end(model).mod)
    text = "".join(f.script() for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    assert op in ("Erf", "Tanh") or "T.reinterpret" in text  # fast_exp builds 2^n from exponent bits
    assert f"T.{op.lower()}(" not in text and "T.exp(" not in text
    x = np.linspace(-6, 6, 128, dtype=np.float32).reshape(4, 32)
    import onnxruntime as ort

    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(coldbrew.load(compile_model(model)).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_a_per_row_value_read_beside_the_reduced_rows_does_not_make_it_a_product():
    """A variance reads its row's mean (indexed by the row): still a
    reduction over the contiguous axis, vectorized per lane."""
    target = TARGETS[0]
    x, mean = te.placeholder((64, 96), name="x"), te.placeholder((64,), name="mean")
    r = te.reduce_axis((0, 96), "r")
    var = te.compute((64,), lambda i: te.sum((x[i, r] - mean[i]) * (x[i, r] - mean[i]), axis=r), name="var")
    func = scheduled(te.create_prim_func([x, mean, var]), target)
    assert "_rf" in func.script()
    (a, m, _), got = run(func, target, [(64, 96), (64,), (64,)])
    np.testing.assert_allclose(got, ((a - m[:, None]) ** 2).sum(axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
def test_a_read_with_a_shorter_period_than_the_vector_is_vectorized_at_that_period(target):
    """A rotary embedding's halves: out[r, i] reads x[r, i % 8] and a
    [4, 8] table at (i // 8, i % 8), a period of 8 along 32 outputs. On
    16 lanes one vector would span two periods (a gather whose LLVM code
    was seen to return the other half's values on AVX-512); the schedule
    takes vectors of 8 there, of the full width where the period allows
    it (8 lanes), and computes what numpy computes."""
    x, t = te.placeholder((6, 8), name="x"), te.placeholder((4, 8), name="t")
    out = te.compute((6, 32), lambda r, i: te.if_then_else(i % 8 < 4, x[r, i % 8] * t[i // 8, i % 8],
                                                          x[r, i % 8] - t[i // 8, i % 8]), name="rot")
    func = scheduled(te.create_prim_func([x, t, out]), target)
    assert "T.vectorized(8)" in func.script()
    (a, b, _), got = run(func, target, [(6, 8), (4, 8), (6, 32)])
    i = np.arange(32)
    want = np.where(i % 8 < 4, a[:, i % 8] * b[i // 8, i % 8], a[:, i % 8] - b[i // 8, i % 8])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
def test_register_tiles_live_on_the_stack_not_in_the_runtime_workspace(target):
    """A max pool on the blocked layout (a tile of one vector per output
    column), a product of two activations (a register tile) and a
    reduction along the contiguous axis (a vector per lane) keep their
    tiles in stack slots LLVM turns into registers: no workspace block is
    asked for (a "local" tile was one allocator call per tile, 385 against
    66 us for the pool on AVX2), and each still computes numpy's result.
    The pool's tile takes a row of 11 columns (any count up to 16 that
    divides the row and fits the registers: 66 -> 32 us for 55 columns)."""
    lanes = target.vector.lanes
    x = te.placeholder((1, 2, 23, 23, lanes), name="x")
    pool = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), "max", layout=f"NCHW{lanes}c")
    a, b = te.placeholder((2, 12, 40), name="a"), te.placeholder((2, 40, 32), name="b")
    r = te.reduce_axis((0, 40), "r")
    product = te.compute((2, 12, 32), lambda h, i, j: te.sum(a[h, i, r] * b[h, r, j], axis=r), name="mm")
    rows = te.placeholder((64, 48), name="rows")
    pooled = lambda x: np.max([x[:, :, i:i + 21:2, j:j + 21:2] for i in range(3) for j in range(3)], axis=0)
    cases = [(te.create_prim_func([x, pool]), [(1, 2, 23, 23, lanes), (1, 2, 11, 11, lanes)], pooled),
             (te.create_prim_func([a, b, product]), [(2, 12, 40), (2, 40, 32), (2, 12, 32)], np.matmul),
             (te.create_prim_func([rows, topi.sum(rows, axis=1)]), [(64, 48), (64,)], lambda r: r.sum(axis=1))]
    for k, (func, shapes, ref) in enumerate(cases):
        func = scheduled(func, target)
        if k == 0:  # the pool's 11 output columns in one tile: any count of rows that divides them
            assert "T.unroll(11)" in func.script()
        assert workspace_sizes(kb.build({"f": func}, target)) == []
        args, out = run(func, target, shapes)
        np.testing.assert_allclose(out, ref(*args[:-1]), rtol=1e-5, atol=1e-5)
