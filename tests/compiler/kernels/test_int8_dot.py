"""dense.int8_dot: a quantized model's layer as integer dot products
(AVX-512 VNNI vpdpbusd) against the exact integer product, and the
instruction in its code; dense.int8_dot_k (few outputs) and
dense.int8_tiles (AMX tiles) the same."""
import dataclasses
import subprocess

import numpy as np
import pytest
import tvm

from coldbrew.compiler.kernels import DenseSpec, get
from coldbrew.compiler.kernels import build as kb
from coldbrew.compiler.kernels.dense import int8_dot_factors, reference
from coldbrew.targets import resolve
from conftest import amx_target, vnni_target
from standalone import execute_func

HOST = resolve("host")
SPECS = [DenseSpec(8, 96, 80, in_scale=0.02, in_shift=128), DenseSpec(7, 33, 50, in_scale=0.5, in_shift=3),
         DenseSpec(1, 64, 16, in_scale=0.1, in_shift=0, lead=1)]


def _case(spec, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.integers(-spec.in_shift, 256 - spec.in_shift, (spec.m, spec.k))
    x = (q * np.float32(spec.in_scale)).astype(np.float32).reshape(spec.input_shape)
    w = rng.integers(-128, 128, (spec.k, spec.n)).astype(np.int8)
    w_scale = (rng.random(spec.n) * 0.01 + 1e-3).astype(np.float32)
    exact = (q.astype(np.float64) @ w.astype(np.float64)) * spec.in_scale * w_scale
    return x, w, w_scale, exact.reshape(spec.output_shape)


def _integer_case(spec, x_dtype):
    """_case's x as the model's 8-bit integers (x_dtype uint8: q + shift; int8: that - 128), or its floats (None)."""
    x, w, w_scale, exact = _case(spec)
    if x_dtype:
        u8 = np.rint(x.reshape(spec.m, spec.k) / spec.in_scale).astype(np.int64) + spec.in_shift
        x = (u8 if x_dtype == "uint8" else u8 - 128).astype(x_dtype).reshape(spec.input_shape)
    return x, w, w_scale, exact


def _funcs(spec, params, x_dtype=None):
    v = get("dense.int8_dot", vnni_target().vector if not HOST.vector.int8_dot else HOST.vector)
    return v, {"exe": kb.schedule(execute_func(v, spec, None, params, x_dtype=x_dtype), v, spec, params),
               "tr": kb.transform_func(v, spec, params)}


def _check(v, spec, params, funcs, x, w, w_scale, exact):
    """Build `funcs` (the weights' transform "tr", the kernel "exe") for the
    host, run them on x and int8 w, compare with the exact product."""
    lib, dev = kb.build(funcs, HOST), tvm.cpu()
    packed = tvm.runtime.tensor(np.zeros(v.transformed_shape(spec, params), np.float32), dev)
    lib["tr"](tvm.runtime.tensor(w.astype(np.float32), dev), packed)
    out = tvm.runtime.tensor(np.zeros(spec.output_shape, np.float32), dev)
    lib["exe"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(packed.numpy().astype(np.int8), dev),
               tvm.runtime.tensor(int8_dot_factors(spec, w, w_scale), dev), out)
    np.testing.assert_allclose(out.numpy(), exact, rtol=1e-5, atol=1e-6 * np.abs(exact).max(), err_msg=str(params))


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_the_reference_is_the_exact_integer_product(spec):
    x, w, w_scale, exact = _case(spec)
    got = reference(spec, x, w, int8_dot_factors(spec, w, w_scale))
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_int8_dot_matches_the_exact_product_on_the_host(spec):
    """Every schedule of the space, where the host has VNNI; elsewhere the
    variant does not apply (its instruction would fault)."""
    v = get("dense.int8_dot", HOST.vector)
    if not HOST.vector.int8_dot:
        assert not v.applies(spec)
        return
    x, w, w_scale, exact = _case(spec)
    for params in v.space(spec):
        _, funcs = _funcs(spec, params)
        _check(v, spec, params, funcs, x, w, w_scale, exact)


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("x_dtype", ["uint8", "int8"])
def test_int8_dot_reads_the_models_integers(spec, x_dtype):
    """Given the 8-bit integers under the grid (a cast's or a
    DequantizeLinear's input: q - zero + shift = q for uint8, q + 128 for
    int8) instead of their floats: the same exact product; uint8 rows whose
    K is a multiple of 4 are read in place (no row pass)."""
    v = get("dense.int8_dot", HOST.vector)
    if not HOST.vector.int8_dot:
        assert not v.applies(spec)
        return
    _, w, w_scale, exact = _case(spec)
    rng = np.random.default_rng(0)
    u8 = rng.integers(-spec.in_shift, 256 - spec.in_shift, (spec.m, spec.k)) + spec.in_shift  # _case's q + shift
    x = (u8 if x_dtype == "uint8" else u8 - 128).astype(x_dtype).reshape(spec.input_shape)
    for params in v.space(spec)[:2]:
        _, funcs = _funcs(spec, params, x_dtype)
        in_place = x_dtype == "uint8" and spec.k % 4 == 0
        assert ("cb_quant" in funcs["exe"].script()) != in_place
        _check(v, spec, params, funcs, x, w, w_scale, exact)


def test_int8_dot_code_is_vpdpbusd(tmp_path):
    """The variant's finish turns each 16 x 4 update into one vpdpbusd
    (TVM selects none from the loops: without the rewrite there is none)."""
    spec = SPECS[0]
    v, funcs = _funcs(spec, {"mb": 4, "nb": 32})
    so = tmp_path / "k.so"
    kb.build(funcs, vnni_target()).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    # 4 rows x 2 vectors per step of k, unrolled
    assert asm.count("vpdpbusd") >= 8


def test_int8_dot_applies_only_on_a_grid_with_vnni():
    v = get("dense.int8_dot", vnni_target().vector)
    assert v.applies(SPECS[0]) and not v.applies(dataclasses.replace(SPECS[0], in_scale=0.0))
    assert not get("dense.int8_dot", resolve("x86_64-avx512").vector).applies(SPECS[0])


K_SPECS = [DenseSpec(64, 512, 1, in_scale=1.0, in_shift=0, batch=(8, 8)), DenseSpec(7, 33, 5, in_scale=0.5, in_shift=3),
           DenseSpec(6, 130, 15, in_scale=0.1, in_shift=128)]


@pytest.mark.parametrize("spec", K_SPECS, ids=str)
@pytest.mark.parametrize("x_dtype", [None, "uint8", "int8"])
def test_int8_dot_k_matches_the_exact_product(spec, x_dtype):
    """Layers of fewer outputs than a vpdpbusd's 16 lanes (an attention
    score over many rows): products along K, 64 bytes of a row against 64
    of an output's weights per instruction, the 16 partial sums added at
    the end; from floats on the grid or from the model's integers."""
    v = get("dense.int8_dot_k", HOST.vector)
    assert not get("dense.int8_dot", HOST.vector).applies(spec)
    if not HOST.vector.int8_dot:
        assert not v.applies(spec)
        return
    x, w, w_scale, exact = _integer_case(spec, x_dtype)
    funcs = {"exe": kb.schedule(execute_func(v, spec, None, {}, x_dtype=x_dtype), v, spec, {}),
             "tr": kb.transform_func(v, spec, {})}
    _check(v, spec, {}, funcs, x, w, w_scale, exact)


def test_int8_dot_k_code_is_vpdpbusd_on_whole_rows(tmp_path):
    """Each 16 x 4 update is one vpdpbusd (TVM selects none from the loops)."""
    spec = K_SPECS[0]
    v = get("dense.int8_dot_k", vnni_target().vector)
    func = kb.schedule(execute_func(v, spec, None, {}, x_dtype="uint8"), v, spec, {})
    so = tmp_path / "k.so"
    kb.build({"exe": func}, vnni_target()).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert asm.count("vpdpbusd") >= 1


TILE_SPECS = [DenseSpec(100, 200, 50, in_scale=0.02, in_shift=128), DenseSpec(64, 128, 64, in_scale=0.5, in_shift=3),
              DenseSpec(96, 64, 40, in_scale=0.1, in_shift=0, batch=(2, 48))]


def _tiles(spec, x_dtype=None):
    target = HOST if HOST.vector.int8_tiles else amx_target()
    v = get("dense.int8_tiles", target.vector)
    return v, {"exe": kb.schedule(execute_func(v, spec, None, {}, x_dtype=x_dtype), v, spec, {}),
               "tr": kb.transform_func(v, spec, {})}


@pytest.mark.parametrize("spec", TILE_SPECS, ids=str)
@pytest.mark.parametrize("x_dtype", [None, "uint8", "int8"])
def test_int8_tiles_match_the_exact_product_on_the_host(spec, x_dtype):
    """Rows, outputs and K that are not whole tiles (100 rows, 50 outputs,
    K 200), whole ones (the model's uint8 then read in place), a batch of
    rows; from floats on the grid or the model's integers. Where the host
    has no AMX the variant does not apply (its instructions would fault)."""
    v = get("dense.int8_tiles", HOST.vector)
    if not HOST.vector.int8_tiles:
        assert not v.applies(spec)
        return
    x, w, w_scale, exact = _integer_case(spec, x_dtype)
    v, funcs = _tiles(spec, x_dtype)
    assert ("cb_quant" in funcs["exe"].script()) != (x_dtype == "uint8" and spec.m % 32 == 0 and spec.k % 64 == 0)
    _check(v, spec, {}, funcs, x, w, w_scale, exact)


def test_int8_tiles_code_is_amx(tmp_path):
    """finish() writes each output tile as AMX code: the tile
    configuration, per 64 values of K two row tiles and two weight tiles
    loaded and four tdpbusd, the sums stored, the tiles released (TVM
    selects none of these from the loops: without the rewrite there are none)."""
    v, funcs = _tiles(TILE_SPECS[0])
    so = tmp_path / "k.so"
    kb.build(funcs, amx_target()).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    dots = asm.count("tdpbusd")  # 4 per step of K (LLVM may unroll the 4 steps of K = 200)
    assert dots >= 4 and dots % 4 == 0 and asm.count("tileloadd") == dots and asm.count("tilestored") == 4
    assert "ldtilecfg" in asm and "tilerelease" in asm


def test_int8_tiles_apply_only_with_amx_on_enough_rows():
    spec = TILE_SPECS[0]
    v = get("dense.int8_tiles", amx_target().vector)
    assert v.applies(spec) and not v.applies(dataclasses.replace(spec, in_scale=0.0))
    assert not v.applies(DenseSpec(16, 200, 50, in_scale=0.02, in_shift=128))  # one row tile, mostly padding
    assert not get("dense.int8_tiles", vnni_target().vector).applies(spec)


AVX2 = resolve("x86_64-avx2")


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("x_dtype", [None, "uint8", "int8"])
def test_pair_dot_matches_the_exact_product(spec, x_dtype):
    """dense.pair_dot (AVX2, which every x86 host here runs): the integers
    widened to int16, two products per int32 lane; every schedule of its
    space gives the exact product, from floats on the grid or the model's
    own 8-bit integers."""
    v = get("dense.pair_dot", AVX2.vector)
    assert v.applies(spec) and not v.applies(dataclasses.replace(spec, in_scale=0.0))
    assert not get("dense.pair_dot", resolve("aarch64").vector).applies(spec)
    x, w, w_scale, exact = _integer_case(spec, x_dtype)
    for params in v.space(spec):
        funcs = {"exe": kb.schedule(execute_func(v, spec, None, params, x_dtype=x_dtype), v, spec, params),
                 "tr": kb.transform_func(v, spec, params)}
        _check(v, spec, params, funcs, x, w, w_scale, exact)


def test_pair_dot_code_is_vpmaddwd(tmp_path):
    """The variant's finish turns each 8 x 2 update into one vpmaddwd."""
    spec = SPECS[0]
    v, params = get("dense.pair_dot", AVX2.vector), {"mb": 4, "nb": 16}
    so = tmp_path / "k.so"
    kb.build({"exe": kb.schedule(execute_func(v, spec, None, params), v, spec, params)}, AVX2).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert asm.count("vpmaddwd") >= 8  # 4 rows x 2 vectors per step of k, unrolled
