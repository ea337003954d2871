"""compiler/passes/select_variants.py: a kernel variant per conv and dense
layer with constant weights (ids c0.., d0.. in binding order), forced
choices honoured or refused in one sentence, the weights as the chosen
variant's kernel reads them."""
import numpy as np
import pytest

from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.ir.anchors import ANCHOR_RE
from coldbrew.compiler.kernels import get
from coldbrew.compiler.passes import block_layout, select_variants
from coldbrew.compiler.pipeline import front_end
from coldbrew.targets import resolve

ISA = resolve("host").vector
# the integer dense variant of the host: VNNI's, else AVX2's vpmaddwd (x86), else none
INTEGER = "dense.int8_dot" if ISA.int8_dot else "dense.pair_dot" if ISA.isa in ("avx2", "avx512") else None


@pytest.fixture(scope="module")
def blocked(small_model):
    return block_layout.apply(front_end(small_model).mod, ISA)


def test_each_layer_gets_an_id_a_variant_and_its_alternatives(blocked):
    mod, anchors = select_variants.apply(blocked, ISA)
    assert [(a.id, a.index, a.variant.op) for a in anchors] == [("c0", 0, "conv2d"), ("d0", 1, "dense")]
    for a in anchors:
        assert a.variant.name in a.alternatives and a.variant.name == select_variants.auto_variant(a.spec, ISA)
        assert a.raw.shape == a.spec.weight_shape
    names = [gv.name_hint for gv in mod.functions if ANCHOR_RE.search(gv.name_hint)]
    assert sorted(int(ANCHOR_RE.search(n).group(1)) for n in names) == [0, 1]


def test_a_forced_variant_is_taken_per_layer_per_op_or_for_all(blocked):
    _, anchors = select_variants.apply(blocked, ISA)
    other = next(v for v in anchors[0].alternatives if v != anchors[0].variant.name)
    for choice in ({"c0": other}, {"conv2d": other.split(".")[1]}, {"*": other}):
        _, forced = select_variants.apply(blocked, ISA, choice)
        assert forced[0].variant.name == other and forced[1].variant.name == anchors[1].variant.name


def test_a_forced_layer_variant_that_does_not_apply_is_a_compile_error(blocked, small_model):
    with pytest.raises(CompileError, match="variant 'no_such' does not apply to c0"):
        select_variants.apply(blocked, ISA, {"c0": "no_such"})
    with pytest.raises(CompileError, match="does not apply to c0"):  # the same through compile_model
        compile_model(small_model, variants={"c0": "no_such"})


def test_transformed_weights_are_the_variants_transform_of_the_raw_ones(blocked):
    _, anchors = select_variants.apply(blocked, ISA)
    for a in anchors:
        assert a.transformed.shape == tuple(a.variant.transformed_shape(a.spec, a.params))
        if a.variant.transform_rearranges:  # the same values in another order (and zero padding)
            got = np.sort(a.transformed[a.transformed != 0])
            assert np.array_equal(got, np.sort(a.raw[a.raw != 0]))
    assert any(a.transform_func is not None for a in anchors)


def test_the_direct_form_stores_the_weights_narrow(blocked):
    _, anchors = select_variants.apply(blocked, ISA, direct=lambda aid: "fp16" if aid == "c0" else None)
    conv = anchors[0]
    if not conv.variant.transform_rearranges:
        pytest.skip(f"{conv.variant.name} does not only rearrange its weights")
    assert conv.direct == "fp16" and conv.const.value.numpy().dtype == np.float16
    assert 0 < conv.direct_error < 1e-3 and anchors[1].direct == ""


@pytest.mark.parametrize("rows,direct", [(4, True), (64, False)])
def test_a_streaming_dense_layer_reads_the_models_own_int8_in_place(rows, direct):
    """A MatMulInteger of few rows (its time is its weights' bytes) reads
    the model's int8 weights in place (direct int8, scale 1: exact, a
    quarter of the bytes); one of many rows keeps fp32 weights (each is
    reused enough that a widening per load would cost), unless the CPU
    multiplies the integers (VNNI: dense.int8_dot, AVX2: dense.pair_dot,
    whatever the rows)."""
    import coldbrew
    from onnx import TensorProto, helper, numpy_helper

    from coldbrew.compiler.bundle.reader import WEIGHT_FORMS, read_bytes

    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (rows, 128), dtype=np.uint8)
    b = rng.integers(-127, 128, (128, 64), dtype=np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mi",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [rows, 64])],
                          [numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = compile_model(m)
    bundle = read_bytes(data)[0]
    step = next(st for st in bundle.plan.steps if (st.variant or b"").startswith(b"dense."))
    # with VNNI or AVX2 the integer variant multiplies a's 8-bit values (always int8 weights,
    # direct); with AMX tiles too, those of 64 rows in tiles
    integer = INTEGER is not None
    tiles = ISA.int8_tiles and rows >= 64
    assert step.variant.decode() == ("dense.int8_tiles" if tiles else INTEGER if integer
                                     else "dense.packed_gemm")
    assert (WEIGHT_FORMS[step.weightForm] == "direct") == (direct or integer)
    np.testing.assert_array_equal(coldbrew.load(data).run(None, {"a": a})[0], a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("kind,zero", [("uint8", 131), ("int8", -3)])
def test_a_quantized_layer_multiplies_the_models_integers(kind, zero):
    """A MatMul of a DequantizeLinear's output and the model's int8 weights
    (a QDQ model) gets the integer variant where the CPU has VNNI or AVX2:
    its input is on the quantizer's grid (in_scale, in_shift), the weights
    stored int8 with the two factors per output; outputs as onnxruntime's.
    Elsewhere (NEON) the layer stays on dense.packed_gemm, same outputs. The
    weights use 7 bits: onnxruntime's own int8 kernel on AVX2 without VNNI
    saturates on full-range ones (int16 pair sums)."""
    import coldbrew
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.integers(-64, 64, (96, 40), dtype=np.int8)
    ty = TensorProto.UINT8 if kind == "uint8" else TensorProto.INT8
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "s"),
             helper.make_tensor("z", ty, [], [zero]), numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array(0.002, np.float32), "ws")]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 96])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 40])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((6, 96)).astype(np.float32) * 3
    front = front_end(m)
    _, anchors = select_variants.apply(front.mod, resolve("host").vector, own_scales=front.qdq_scales)
    (a,) = anchors
    assert a.spec.in_scale == pytest.approx(0.03) and a.spec.in_shift == zero + (128 if kind == "int8" else 0)
    if INTEGER:
        assert a.variant.name == INTEGER and a.direct == "int8"
        assert a.scale.value.numpy().shape == (2, 40)
    else:
        assert a.variant.name == "dense.packed_gemm"
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = coldbrew.load(compile_model(m)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape", [(32, 1, 48), (4, 6, 48), (2, 3, 4, 48)])
def test_a_batch_of_sequences_times_weights_is_a_dense_layer_over_its_rows(shape):
    """x [*batch, K] @ w [K, N] whose leading axes are not all units (a
    batch of sequences) gets a dense variant over its prod(batch) rows,
    taken flat as they lie in memory, not the generic schedule."""
    import coldbrew
    from onnx import TensorProto, helper, numpy_helper

    from coldbrew.compiler.bundle.reader import read_bytes

    rng = np.random.default_rng(2)
    w = rng.standard_normal((48, 40)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "bm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape[:-1] + (40,))],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = compile_model(m)
    variants = [(st.variant or b"").decode() for st in read_bytes(data)[0].plan.steps]
    assert any(v.startswith("dense.") for v in variants), variants
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], x @ w, rtol=1e-4, atol=1e-4)


def test_a_row_tile_over_sizes_set_at_run_time_divides_every_row_only_where_that_does_more_per_load():
    """A blocked convolution over rows of 8 * W columns (W set at run time)
    on AVX2: the chosen 3 columns x 3 vectors divides no such row; the
    blocks that do and fit 16 registers (2 x 3, 8 x 1 ...) do less work
    per load than 3 x 3 over the rows padded to whole tiles (128 columns
    at the typical size), so it is kept; a chosen 3 x 1 does less than
    2 x 3, which is taken."""
    import types

    from tvm import tirx

    from coldbrew.compiler.passes.select_variants import _whole_tiles

    variant = get("conv2d.blocked", resolve("x86_64-avx2").vector)
    exact = types.SimpleNamespace(out_w=tirx.Var("W", "int64") * 8)
    spec = types.SimpleNamespace(k=24, out_w=128, in_block=8)  # 3 vectors of output channels, rows of 128 at the typical size
    assert _whole_tiles(variant, spec, exact, {"zt": 3, "kvb": 3}) == {"zt": 3, "kvb": 3}
    assert _whole_tiles(variant, spec, exact, {"zt": 3, "kvb": 1}) == {"zt": 2, "kvb": 3}


def test_a_whole_row_tile_is_one_of_the_variants_own_register_blocks():
    """The blocks _whole_tiles weighs are the variant's: kvb need not
    divide the channel blocks (5 blocks of 8: 4 x 2, its last panel padded,
    rather than 4 x 1), and conv2d.pair_blocked's product takes a register
    of its own (6 x 2 fills AVX2's 16 with conv2d.blocked's count, one too
    many for the pair kernel, which keeps its 5 x 2 over the padded row)."""
    import types

    from tvm import tirx

    from coldbrew.compiler.passes.select_variants import _whole_tiles

    isa = resolve("x86_64-avx2").vector
    blocked, pair = get("conv2d.blocked", isa), get("conv2d.pair_blocked", isa)
    w = tirx.Var("W", "int64")
    rows_of_4 = types.SimpleNamespace(out_w=w * 4)
    assert _whole_tiles(blocked, types.SimpleNamespace(k=40, out_w=100, in_block=8), rows_of_4,
                        {"zt": 3, "kvb": 1}) == {"zt": 4, "kvb": 2}
    rows_of_6, spec = types.SimpleNamespace(out_w=w * 6), types.SimpleNamespace(k=16, out_w=100, in_block=8)
    assert _whole_tiles(blocked, spec, rows_of_6, {"zt": 5, "kvb": 2}) == {"zt": 6, "kvb": 2}
    assert _whole_tiles(pair, spec, rows_of_6, {"zt": 5, "kvb": 2}) == {"zt": 5, "kvb": 2}
    assert (6, 2) in blocked.register_blocks(spec, [6]) and (6, 2) not in pair.register_blocks(spec, [6])
