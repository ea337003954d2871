"""conv2d.pair_blocked: a quantized convolution's integers (|q|, |w| <= 255)
as int16 pairs, two products per int32 lane (vpmaddwd, AVX2: every x86
host here runs it), against the exact integer convolution; the
instruction in its code; the order of its rows and channel panels."""
import dataclasses
import subprocess

import numpy as np
import pytest
import tvm

from coldbrew.compiler.kernels import ConvSpec, get
from coldbrew.compiler.kernels import build as kb
from coldbrew.compiler.kernels.conv_blocked import PAIR_BOUND, rows_outer
from coldbrew.targets import resolve
from standalone import execute_func, to_blocked

AVX2 = resolve("x86_64-avx2")
B = AVX2.vector.lanes
SPECS = [ConvSpec(1, 16, 12, 13, 32, 3, 3, (1, 1), (1, 1, 1, 1), in_block=B, out_block=B, in_scale=0.5),
         ConvSpec(1, 3, 15, 17, 16, 3, 3, (2, 2), (1, 1, 1, 1), in_block=0, out_block=B, in_scale=1.0),  # a first layer
         ConvSpec(1, 24, 9, 9, 40, 1, 1, in_block=B, out_block=B, in_scale=0.25),
         ConvSpec(1, 8, 10, 10, 24, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), in_block=B, out_block=B, in_scale=1.0)]


def _exact(spec, q, w, factor, lanes=B):
    """The integer convolution in float64, times each channel's factor, blocked."""
    pt, pl, pb, pr = spec.pad
    qp = np.pad(q, ((0, 0), (0, 0), (pt, pb), (pl, pr))).astype(np.float64)
    (sh, sw), (dh, dw), oh, ow = spec.stride, spec.dilation, spec.out_h, spec.out_w
    out = np.zeros((spec.n, spec.k, oh, ow))
    for r in range(spec.r):
        for s in range(spec.s):
            patch = qp[:, :, r * dh: r * dh + (oh - 1) * sh + 1: sh, s * dw: s * dw + (ow - 1) * sw + 1: sw]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, r, s].astype(np.float64))
    return to_blocked((out * factor[None, :, None, None]).astype(np.float32), lanes)


def _check(spec, params, seed=0, target=AVX2):
    v, b = get("conv2d.pair_blocked", target.vector), target.vector.lanes
    rng = np.random.default_rng(seed)
    q = rng.integers(-PAIR_BOUND, PAIR_BOUND + 1, (spec.n, spec.c, spec.h, spec.w))
    w = rng.integers(-PAIR_BOUND, PAIR_BOUND + 1, (spec.k, spec.c, spec.r, spec.s))
    factor = spec.in_scale * (rng.random(spec.k) * 0.01 + 1e-3)
    x = (q * np.float32(spec.in_scale)).astype(np.float32)
    funcs = {"exe": kb.schedule(execute_func(v, spec, None, params), v, spec, params),
             "tr": kb.transform_func(v, spec, params)}
    lib, dev = kb.build(funcs, target), tvm.cpu()
    packed = tvm.runtime.tensor(np.zeros(v.transformed_shape(spec, params), np.float32), dev)
    lib["tr"](tvm.runtime.tensor(w.astype(np.float32), dev), packed)
    out = tvm.runtime.tensor(np.zeros(spec.output_shape, np.float32), dev)
    lib["exe"](tvm.runtime.tensor(to_blocked(x, b) if spec.in_block else x, dev),
               tvm.runtime.tensor(packed.numpy().astype(np.int16), dev),
               tvm.runtime.tensor(factor.astype(np.float32).reshape(spec.k // b, b), dev), out)
    want = _exact(spec, q, w, factor, b)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6 * np.abs(want).max(), err_msg=str(params))


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_pair_blocked_matches_the_exact_convolution(spec):
    """Every schedule of its space, rows inside and outside the channel
    panels, full-range integers (255 x 255 products)."""
    v = get("conv2d.pair_blocked", AVX2.vector)
    assert v.applies(spec)
    for params in v.space(spec):
        for outer in (False, True):
            _check(spec, {**params, "rows_outer": outer})


def test_pair_blocked_code_is_vpmaddwd(tmp_path):
    """finish() turns each 8 x 2 update into one vpmaddwd (TVM selects none
    from the loops: without the rewrite there is none)."""
    spec, params = SPECS[0], {"kvb": 2, "zt": 4}
    v = get("conv2d.pair_blocked", AVX2.vector)
    so = tmp_path / "k.so"
    kb.build({"exe": kb.schedule(execute_func(v, spec, None, params), v, spec, params)}, AVX2).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert asm.count("vpmaddwd") >= 8  # 4 columns x 2 vectors per pair of channels and tap, unrolled


def test_pair_blocked_on_avx512_is_16_lane_vpmaddwd(tmp_path):
    """On AVX-512 (16 lanes, NCHW16c) each 16 x 2 update is one 512-bit
    vpmaddwd (AVX-512 BW); run against the exact convolution where this
    host has AVX-512."""
    target = resolve("x86_64-avx512")
    spec = ConvSpec(1, 32, 10, 11, 48, 3, 3, (1, 1), (1, 1, 1, 1), in_block=16, out_block=16, in_scale=0.5)
    v = get("conv2d.pair_blocked", target.vector)
    params = v.space(spec)[0]
    so = tmp_path / "k.so"
    kb.build({"exe": kb.schedule(execute_func(v, spec, None, params), v, spec, params)}, target).export_library(str(so))
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert sum("vpmaddwd" in line and "zmm" in line for line in asm.splitlines()) >= params["kvb"] * params["zt"]
    if "avx512bw" in open("/proc/cpuinfo").read():
        for params in v.space(spec):
            _check(spec, params, target=target)


def test_pair_blocked_applies_only_to_integers_it_sums_exactly():
    v, spec = get("conv2d.pair_blocked", AVX2.vector), SPECS[0]
    assert v.applies(spec) and not v.applies(dataclasses.replace(spec, in_scale=0.0))
    assert not get("conv2d.pair_blocked", resolve("aarch64").vector).applies(spec)
    # 255 x 255 x C x R x S must stay under 2^31: 4,096 channels of 3 x 3 taps do not
    assert not v.applies(dataclasses.replace(spec, c=4096, in_block=B))


def test_rows_go_outside_the_panels_where_that_streams_fewer_bytes():
    """A large map of few channels reads its input once per row band
    rather than once per channel panel; a small map of many channels reads
    its weights once per panel rather than once per row; a panel whose pass
    feeds many products per input byte, or an input that stays cached,
    keeps the rows inside, unless the input exceeds the target's
    last-level cache (the 52 MB input of 128 -> 64 at 320)."""
    large = ConvSpec(1, 80, 464, 464, 120, 3, 3, (2, 2), (1, 1, 1, 1), in_block=B, out_block=B)
    dense = ConvSpec(1, 128, 320, 320, 64, 3, 3, (1, 1), (1, 1, 1, 1), in_block=B, out_block=B)  # 36 products a byte
    small = ConvSpec(1, 480, 29, 29, 480, 3, 3, (1, 1), (1, 1, 1, 1), in_block=B, out_block=B)
    cached = ConvSpec(1, 256, 28, 28, 256, 1, 1, in_block=B, out_block=B)  # 0.8 MB: stays in the caches
    v = AVX2.vector
    assert rows_outer(large, 3, v, 4) and not rows_outer(small, 3, v, 4) and not rows_outer(dense, 2, v, 4)
    assert not rows_outer(cached, 2, v, 4)
    l3 = v._replace(l3_kb=32 * 1024)
    assert rows_outer(dense, 2, l3, 4) and not rows_outer(dataclasses.replace(dense, h=112, w=112), 2, l3, 4)
    assert not rows_outer(small, 3, l3, 4) and not rows_outer(cached, 2, l3, 4)
    assert get("conv2d.blocked", AVX2.vector).space(large)[0]["rows_outer"]
    assert not get("conv2d.pair_blocked", AVX2.vector).space(dataclasses.replace(small, in_scale=1.0))[0]["rows_outer"]
