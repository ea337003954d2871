"""compiler/kernels/recurrent.py: the recurrent cell kernels (LSTM, GRU in
both reset orders, RNN of each activation; one direction either way and
both; batches of one and two; hidden sizes that are and are not multiples
of the block) against the numpy reference, for the host and AVX2, through
every schedule of their spaces; the packing transform; and models whose
cells compile to one cell layer (not unrolled) computing what onnxruntime
computes, with cached and raw weights and either variant."""
import dataclasses
import zlib

import numpy as np
import pytest
import tvm
from cell_models import cell_model
from conftest import cpu_targets, ort_run
from onnx import numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.kernels import RecurrentSpec, get
from coldbrew.compiler.kernels import build as kb
from coldbrew.compiler.kernels.recurrent import reference
from coldbrew.targets import resolve

TARGETS = [resolve(t) for t in cpu_targets()]
VARIANTS = ("recurrent.packed", "recurrent.rows")
KINDS = [("lstm", 0, "Tanh"), ("gru", 1, "Tanh"), ("gru", 0, "Tanh"), ("rnn", 0, "Relu"), ("rnn", 0, "Sigmoid")]


def run_kernel(spec, variant, params, target):
    """(Y, Y_h, Y_c) of the variant's kernel (its transform first) and the reference's."""
    funcs = {"cell": variant.kernel(spec, params)}
    transform = kb.transform_func(variant, spec, params)
    if transform is not None:
        funcs["pack"] = transform
    lib = kb.build(funcs, target)
    rng = np.random.default_rng(zlib.crc32(repr(spec).encode()))  # hash() of a str varies per process
    xw = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = (rng.standard_normal(spec.weight_shape) * 0.3).astype(np.float32)
    state = (spec.dirs, spec.batch, spec.hidden)
    h0, c0 = (rng.standard_normal(state).astype(np.float32) for _ in range(2))
    wt = tvm.runtime.tensor(w)
    if transform is not None:
        wt = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec, params), np.float32))
        lib["pack"](tvm.runtime.tensor(w), wt)
    scratch = (spec.dirs, spec.batch, spec.hidden + 2)  # h_q, its scale and zero point
    outs = [tvm.runtime.tensor(np.zeros(s, np.float32))
            for s in (spec.output_shape, state, state) + (scratch,) * spec.quantize_h]
    scale = (rng.uniform(0.5, 2, (spec.dirs, spec.gates * spec.hidden)).astype(np.float32) if spec.quantize_h
             else None)  # a quantized cell's weights' scales
    ins = [tvm.runtime.tensor(a) for a in (xw, h0, c0) + ((scale,) if spec.quantize_h else ())]
    lib["cell"](ins[0], wt, *ins[1:], *outs)
    return [o.numpy() for o in outs[:3]], reference(spec, xw, w, h0, c0, scale)


def check(got, want, spec):
    for g, w in zip(got[:3 if spec.kind == "lstm" else 2], want):  # Y_c is scratch for GRU and RNN
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.vector.isa)
@pytest.mark.parametrize("kind,lbr,act", KINDS)
@pytest.mark.parametrize("dirs,reverse,hidden,batch", [(1, False, 32, 1), (1, True, 20, 2), (2, False, 20, 1)])
@pytest.mark.parametrize("name", VARIANTS)
def test_cell_kernel_matches_the_reference(target, kind, lbr, act, dirs, reverse, hidden, batch, name):
    spec = RecurrentSpec(kind, 4, batch, hidden, dirs, reverse, lbr, act)
    variant = get(name, target.vector)
    check(*run_kernel(spec, variant, variant.space(spec)[0], target), spec)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_schedule_of_the_space_is_right(name):
    target = TARGETS[0]
    spec = RecurrentSpec("lstm", 3, 1, 40, 2)
    variant = get(name, target.vector)
    assert len(variant.space(spec)) >= 2
    for params in variant.space(spec):
        check(*run_kernel(spec, variant, params, target), spec)


def test_packing_puts_each_gate_of_a_block_in_one_vector():
    target = TARGETS[0]
    spec = RecurrentSpec("gru", 2, 1, 12, 2)
    variant = get("recurrent.packed", target.vector)
    params = {"nb": 8}
    w = np.random.default_rng(0).standard_normal(spec.weight_shape).astype(np.float32)
    lib = kb.build({"pack": kb.transform_func(variant, spec, params)}, target)
    out = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec, params), np.float32))
    lib["pack"](tvm.runtime.tensor(w), out)
    want = np.zeros((2, 2, 13, 3, 8), np.float32)  # [dirs, H / nb, H + 1, gates, nb], units past H zero
    for d in range(2):
        for g in range(3):
            for i in range(12):
                want[d, i // 8, :, g, i % 8] = w[d, g * 12 + i]
    np.testing.assert_array_equal(out.numpy(), want)


# ---- models ----

def feeds_of(model):
    rng = np.random.default_rng(8)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def variants_of(data):
    return [(s.variant or b"").decode() for s in read_bytes(data)[0].plan.steps]


@pytest.mark.parametrize("op,direction,attrs", [
    ("LSTM", "bidirectional", {"states": True}), ("LSTM", "reverse", {"batch": 2}),
    ("GRU", "forward", {"linear_before_reset": 1}), ("GRU", "bidirectional", {"linear_before_reset": 0}),
    ("RNN", "forward", {"activations": ["Relu"], "states": True})])
@pytest.mark.parametrize("variant,weights", [(None, "cached"), (None, "raw"), ("recurrent.rows", "cached")])
def test_a_cell_is_one_layer_computing_what_onnxruntime_computes(op, direction, attrs, variant, weights):
    model = cell_model(op, direction=direction, **attrs)
    feeds = feeds_of(model)
    data = compile_model(model, variants={"recurrent": variant} if variant else None, weights=weights)
    assert variants_of(data).count(variant or "recurrent.packed") == 1
    for g, w in zip(coldbrew.load(data).run(None, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_layers_do_not_grow_with_the_sequence():
    """Unrolled, every step would add layers; as a cell, a longer sequence
    is the same layers (the input projection, the cell)."""
    short, long = (variants_of(compile_model(cell_model("GRU", seq=s, linear_before_reset=1))) for s in (2, 12))
    assert short == long and "recurrent.packed" in short and len(short) <= 4


def test_the_packed_weights_are_the_cold_plans_choice():
    """The packing is a transform the plan weighs: raw weights in the bundle
    and the packing run at open, or the packed weights cached."""
    model = cell_model("LSTM")
    raw, cached = (read_bytes(compile_model(model, weights=w))[0] for w in ("raw", "cached"))
    (r,) = [s for s in raw.plan.steps if s.variant == b"recurrent.packed"]
    (c,) = [s for s in cached.plan.steps if s.variant == b"recurrent.packed"]
    assert r.transform and not c.transform


def test_a_peephole_lstm_is_unrolled_and_right():
    rng = np.random.default_rng(9)
    model = cell_model("LSTM")
    model.graph.initializer.append(numpy_helper.from_array((rng.standard_normal((1, 72)) * 0.3).astype(np.float32), "P"))
    model.graph.node[0].input.extend(["", "", "", "P"])
    feeds = feeds_of(model)
    data = compile_model(model)
    assert not any(v.startswith("recurrent.") for v in variants_of(data))
    for g, w in zip(coldbrew.load(data).run(None, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_weights_that_disagree_with_hidden_size_are_named():
    from coldbrew.compiler import CompileError

    model = cell_model("GRU")
    r = next(t for t in model.graph.initializer if t.name == "R")
    r.CopyFrom(numpy_helper.from_array(np.zeros((1, 72, 20), np.float32), "R"))
    with pytest.raises(CompileError, match=r"GRU node 'cell': R has shape \[1, 72, 20\], not \[1, 72, 24\]"):
        compile_model(model)


def test_the_tests_cover_every_cell_variant():
    from coldbrew.compiler.kernels import variants

    # the integer cell: test_an_integer_cell_matches_the_reference_where_the_host_has_vnni
    # and recurrent.pair_dot: test_an_integer_cell_without_vnni_is_exact_in_int16_pairs
    assert {v.name for v in variants(TARGETS[0].vector, "recurrent")} == set(VARIANTS) | {"recurrent.int8_dot",
                                                                                         "recurrent.pair_dot"}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("name", VARIANTS)
def test_narrow_weights_are_widened_then_transformed(name, precision):
    """Weights stored narrow (fp16, or int8 with a scale per gate row) are
    widened by the transform, then packed (or read in place)."""
    from coldbrew.compiler.ir.narrow import narrow_weights

    target = TARGETS[0]
    spec = RecurrentSpec("lstm", 3, 1, 20, 2)
    variant = get(name, target.vector)
    params = variant.space(spec)[0]
    w = (np.random.default_rng(1).standard_normal(spec.weight_shape) * 0.3).astype(np.float32)
    stored, wide = narrow_weights(w, precision, kb.output_axis(spec))
    lib = kb.build({"cell": variant.kernel(spec, params),
                    "widen": kb.transform_func(variant, spec, params, precision)}, target)
    wt = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec, params) if name.endswith("packed")
                                     else spec.weight_shape, np.float32))
    lib["widen"](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in stored), wt)
    rng = np.random.default_rng(2)
    xw = rng.standard_normal(spec.input_shape).astype(np.float32)
    state = (2, 1, 20)
    zeros = np.zeros(state, np.float32)
    outs = [tvm.runtime.tensor(np.zeros(s, np.float32)) for s in (spec.output_shape, state, state)]
    lib["cell"](tvm.runtime.tensor(xw), wt, tvm.runtime.tensor(zeros), tvm.runtime.tensor(zeros), *outs)
    check([o.numpy() for o in outs], reference(spec, xw, wide.astype(np.float32), zeros, zeros), spec)


@pytest.mark.parametrize("name", VARIANTS)
def test_a_quantized_lstm_kernel_quantizes_h_per_row(name):
    """onnxruntime's DynamicQuantizeLSTM multiplies h quantized to uint8 per
    row each step: the kernel does the same (its weights dequantized)."""
    target = TARGETS[0]
    spec = RecurrentSpec("lstm", 4, 2, 24, 2, quantize_h=True)
    variant = get(name, target.vector)
    check(*run_kernel(spec, variant, variant.space(spec)[0], target), spec)


def _integer_cell(spec, variant, params, target):
    """(outputs, reference) of recurrent.int8_dot on int8 weights."""
    rng = np.random.default_rng(7)
    h, state = spec.hidden, (spec.dirs, spec.batch, spec.hidden)
    w = rng.integers(-127, 128, spec.weight_shape).astype(np.float32)
    w[..., -1] = 0  # R's bias joined the projection's
    scale = rng.uniform(0.5, 2, (spec.dirs, spec.gates * h)).astype(np.float32) * 0.003
    xw = rng.standard_normal(spec.input_shape).astype(np.float32)
    h0, c0 = (rng.standard_normal(state).astype(np.float32) for _ in range(2))
    lib = kb.build({"cell": variant.kernel(spec, params, "int8"), "pack": kb.transform_func(variant, spec, params)},
                   target)
    packed = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec, params), np.float32))
    lib["pack"](tvm.runtime.tensor(w), packed)
    factors = np.stack([scale, w[:, :, :h].sum(axis=2)], axis=1).astype(np.float32)
    outs = [tvm.runtime.tensor(np.zeros(s, np.float32))
            for s in (spec.output_shape, state, state, (spec.dirs, spec.batch, h + 2))]
    lib["cell"](*[tvm.runtime.tensor(a) for a in (xw,)], tvm.runtime.tensor(packed.numpy().astype(np.int8)),
                *[tvm.runtime.tensor(a) for a in (h0, c0, factors)], *outs)
    return [o.numpy() for o in outs[:3]], reference(spec, xw, w, h0, c0, scale)


@pytest.mark.parametrize("dirs,batch,hidden", [(1, 1, 64), (2, 2, 40), (1, 3, 17)])
def test_an_integer_cell_matches_the_reference_where_the_host_has_vnni(dirs, batch, hidden):
    """recurrent.int8_dot: the state's uint8 levels times the int8 weights
    in int32 lanes, the zero point's share taken out with the rows' sums;
    every schedule of its space. Without VNNI it does not apply."""
    spec = RecurrentSpec("lstm", 4, batch, hidden, dirs, quantize_h=True, int8_weights=True)
    target = TARGETS[0]
    variant = get("recurrent.int8_dot", target.vector)
    if not target.vector.int8_dot:
        assert not variant.applies(spec)
        return
    assert not variant.applies(dataclasses.replace(spec, int8_weights=False))
    _every_schedule_exact(spec, variant, target)


def _every_schedule_exact(spec, variant, target):
    for params in variant.space(spec):
        got, want = _integer_cell(spec, variant, params, target)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6, err_msg=str(params))


def test_an_integer_cell_is_vpdpbusd(tmp_path):
    """Four products per int32 lane: the cell's code has the instruction."""
    import subprocess

    from conftest import vnni_target

    spec = RecurrentSpec("lstm", 2, 1, 32, 1, quantize_h=True, int8_weights=True)
    variant = get("recurrent.int8_dot", vnni_target().vector)
    so = tmp_path / "cell.so"
    kb.build({"cell": variant.kernel(spec, {"nb": 32}, "int8")}, vnni_target()).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert asm.count("vpdpbusd") >= 8  # 4 gates x 2 vectors of 16 units


@pytest.mark.parametrize("dirs,batch,hidden", [(1, 1, 64), (2, 2, 40), (1, 3, 17)])
def test_an_integer_cell_without_vnni_is_exact_in_int16_pairs(dirs, batch, hidden):
    """recurrent.pair_dot (AVX2, which every x86 target here has): the
    state's levels and the int8 weights widened to int16, two products per
    int32 lane, the zero point's share taken out with the rows' sums; every
    schedule of its space matches the reference."""
    spec = RecurrentSpec("lstm", 4, batch, hidden, dirs, quantize_h=True, int8_weights=True)
    target = resolve("x86_64-avx2")
    variant = get("recurrent.pair_dot", target.vector)
    assert variant.applies(spec) and not variant.applies(dataclasses.replace(spec, int8_weights=False))
    assert not get("recurrent.pair_dot", resolve("aarch64").vector).applies(spec)
    _every_schedule_exact(spec, variant, target)


def test_an_integer_cell_without_vnni_is_vpmaddwd(tmp_path):
    """Two products per int32 lane: the cell's code has the instruction."""
    import subprocess

    spec = RecurrentSpec("lstm", 2, 1, 32, 1, quantize_h=True, int8_weights=True)
    target = resolve("x86_64-avx2")
    so = tmp_path / "cell.so"
    kb.build({"cell": get("recurrent.pair_dot", target.vector).kernel(spec, {"nb": 16}, "int8")},
             target).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert asm.count("vpmaddwd") >= 8  # 4 gates x 2 vectors of 8 units


def test_the_cells_activations_are_vector_arithmetic_within_2e7(tmp_path):
    """The cells' sigmoid and tanh go through recurrent.exp, arithmetic
    LLVM vectorizes: an LSTM cell's code calls no libm function (the exp
    intrinsic was one expf call per lane, 176 of them in one cell), and
    exp, sigmoid and tanh stay within 2e-7 (exp: relative) of float64's
    over [-100, 100], saturating without inf or NaN."""
    import subprocess

    from tvm import te

    from coldbrew.compiler.kernels.recurrent import exp, sigmoid, tanh

    target = resolve("x86_64-avx2")
    spec = RecurrentSpec("lstm", 2, 1, 32, 2)
    so = tmp_path / "cell.so"
    kb.build({"cell": get("recurrent.packed", target.vector).kernel(spec, {"nb": 16})}, target).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert not [line for line in asm.splitlines() if "call" in line and ("exp" in line or "tanh" in line)]

    x = np.concatenate([np.linspace(-100, 100, 20001), np.linspace(-1e-3, 1e-3, 201)]).astype(np.float32)
    arg = te.placeholder(x.shape, "float32", name="x")
    outs = [te.compute(x.shape, (lambda f: lambda i: f(arg[i]))(f), name=n)
            for n, f in (("e", exp), ("s", sigmoid), ("t", tanh))]
    lib = tvm.compile(te.create_prim_func([arg, *outs]), target="llvm")
    got = [tvm.runtime.tensor(np.zeros_like(x)) for _ in outs]
    lib(tvm.runtime.tensor(x), *got)
    e, s, t = (g.numpy() for g in got)
    x64 = x.astype(np.float64)
    inside = np.abs(x64) < 87
    assert np.max(np.abs(e[inside] / np.exp(x64[inside]) - 1)) < 2e-7
    assert np.max(np.abs(s - 1 / (1 + np.exp(-x64)))) < 2e-7
    assert np.max(np.abs(t - np.tanh(x64))) < 2e-7
    assert np.isfinite(e).all() and np.isfinite(s).all() and np.isfinite(t).all()
