"""compiler/gpu/conv.py: the shape-generic GPU convolution variants. Output
shapes and push-constant words of a convolution, which variants apply and
which one a convolution gets (a choice where it applies, else GEMM, else
direct), grids that cover every output, Winograd's weight transform
computing the same convolution, and shaders that glslang compiles and
whose push-constant block and workgroup size match what the compiler
records."""
import math
import re
import struct

import numpy as np
import pytest
from gpu_models import glsl_to_spirv, needs_tools, SPIRV_MAGIC

from coldbrew.compiler.gpu import conv as gc
from coldbrew.compiler.kernels import ConvSpec


def conv(c=16, k=16, h=8, w=8, kh=3, kw=3, stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1, n=1):
    return ConvSpec(n, c, h, w, k, kh, kw, stride, pad, dilation, groups)


@pytest.mark.parametrize("cv, out", [
    (conv(), (8, 8)),                                                      # 3x3 "same"
    (conv(h=9, w=7, stride=(2, 2)), (5, 4)),                               # stride 2, odd sizes
    (conv(h=17, w=12, kh=5, kw=5, pad=(4, 4, 4, 4), dilation=(2, 2)), (17, 12)),  # dilated 5x5
    (conv(h=9, w=9, kh=2, kw=3, pad=(0, 1, 1, 2)), (9, 10)),               # asymmetric padding
    (conv(h=7, w=9, kh=1, kw=1, pad=(0, 0, 0, 0)), (7, 9)),                # pointwise
])
def test_output_shape_follows_onnx_conv(cv, out):
    assert (cv.out_h, cv.out_w) == out


def test_push_words_are_the_shapes_then_the_clamp_bits():
    cv = conv(c=3, k=70, h=13, w=11, stride=(2, 1), pad=(1, 2, 1, 2), dilation=(1, 2), n=2)
    words = gc.push(cv, gc.Epilogue(residual=True, lo=0.0, hi=6.0))
    assert len(words) == len(gc.PUSH_FIELDS) + 2 <= 32  # the runtime refuses more than 32 push words
    ints = dict(zip(gc.PUSH_FIELDS, words))
    assert ints == dict(n=2, c=3, h=13, w=11, k=70, oh=cv.out_h, ow=cv.out_w, kh=3, kw=3, sh=2, sw=1, ph=1, pw=2,
                        dh=1, dw=2, groups=1, residual=1)
    assert struct.unpack("<2f", struct.pack("<2I", *words[-2:])) == (0.0, 6.0)
    # no clamp: -inf / +inf as float32 bits, no residual: 0
    plain = gc.push(conv())
    assert plain[-2:] == [0xFF800000, 0x7F800000] and plain[gc.PUSH_FIELDS.index("residual")] == 0


def test_push_block_in_the_shaders_matches_push_fields():
    """The GLSL push-constant block declares the words in PUSH_FIELDS' order, then lo and hi."""
    block = re.search(r"uniform Push \{(.*?)\} p;", gc._PRELUDE, re.S).group(1)
    ints = re.search(r"int ([^;]*);", block).group(1)
    floats = re.search(r"float ([^;]*);", block).group(1)
    assert [s.strip() for s in ints.split(",")] == list(gc.PUSH_FIELDS)
    assert [s.strip() for s in floats.split(",")] == ["lo", "hi"]
    assert block.index("int ") < block.index("float ")


@pytest.mark.parametrize("cv, names", [
    (conv(), ["gpu.conv_winograd", "gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(c=8), ["gpu.conv_gemm", "gpu.conv_direct"]),                    # too few channels for Winograd
    (conv(k=8), ["gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(stride=(2, 2)), ["gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(dilation=(2, 2), pad=(2, 2, 2, 2)), ["gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(kh=5, kw=5, pad=(2, 2, 2, 2)), ["gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(kh=1, kw=1, pad=(0, 0, 0, 0)), ["gpu.conv_gemm", "gpu.conv_direct"]),
    (conv(groups=16), ["gpu.conv_direct"]),                               # depthwise
    (conv(c=32, k=32, groups=2), ["gpu.conv_direct"]),                    # grouped
])
def test_applicable_variants(cv, names):
    assert gc.applicable(cv) == names


def test_choose_defaults_to_gemm_then_direct():
    assert gc.choose(conv()).name == "gpu.conv_gemm"  # Winograd applies but is chosen, not default
    assert gc.choose(conv(groups=16)).name == "gpu.conv_direct"
    assert gc.choose(conv(), "auto").name == "gpu.conv_gemm"


@pytest.mark.parametrize("choice", ["winograd", "conv_winograd", "gpu.conv_winograd"])
def test_choose_takes_a_choice_that_applies_in_any_spelling(choice):
    assert gc.full_name(choice) == "gpu.conv_winograd"
    assert gc.choose(conv(), choice) is gc.get("gpu.conv_winograd")
    assert gc.choose(conv(), "direct").name == "gpu.conv_direct"


def test_choose_falls_back_where_the_choice_does_not_apply():
    assert gc.choose(conv(stride=(2, 2)), "winograd").name == "gpu.conv_gemm"
    assert gc.choose(conv(groups=16), "gemm").name == "gpu.conv_direct"
    assert gc.choose(conv(groups=16), "winograd").name == "gpu.conv_direct"


def test_get_finds_each_variant_and_nothing_else():
    for v in gc.VARIANTS:
        assert gc.get(v.name) is v
    with pytest.raises(StopIteration):
        gc.get("gpu.conv_fft")


@pytest.mark.parametrize("cv", [conv(), conv(c=67, k=130, h=7, w=9, kh=1, kw=1, pad=(0, 0, 0, 0)),
                                conv(n=2, c=3, k=65, h=23, w=20, kh=7, kw=7, stride=(2, 2), pad=(3, 3, 3, 3)),
                                conv(k=33, h=15, w=9)])
def test_grids_cover_every_output_and_no_more(cv):
    gemm = gc.get("gpu.conv_gemm").grid(cv)
    cols = cv.n * cv.out_h * cv.out_w
    assert gemm == [math.ceil(cols / gc.GEMM_TILE), math.ceil(cv.k / gc.GEMM_TILE), 1]
    direct = gc.get("gpu.conv_direct").grid(cv)
    total = cv.n * cv.k * cv.out_h * cv.out_w
    assert direct == [math.ceil(total / gc.DIRECT_GROUP), 1, 1]  # one invocation per output
    wino = gc.get("gpu.conv_winograd")
    if wino.applies(cv):
        tiles = cv.n * math.ceil(cv.out_h / 2) * math.ceil(cv.out_w / 2)
        assert wino.grid(cv) == [math.ceil(tiles / 8), math.ceil(cv.k / 32), 1]


def test_direct_grid_is_folded_within_the_vulkan_limit():
    cv = conv(c=1, k=64, h=1024, w=1024, groups=1)  # 64 Mi outputs: 262144 workgroups of 256
    x, y, z = gc.get("gpu.conv_direct").grid(cv)
    groups = math.ceil(cv.k * cv.out_h * cv.out_w / gc.DIRECT_GROUP)
    assert x <= gc.MAX_GRID and y <= gc.MAX_GRID and z == 1 and y > 1
    assert x * y >= groups and x * (y - 1) < groups


def _winograd_reference(u, d):
    """Y = A^T [sum_c U[c] .* (B^T d[c] B)] A for one 4x4 input tile per channel."""
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
    v = np.einsum("ij,cjk,lk->cil", bt, d, bt)  # [C, 4, 4]
    m = np.einsum("cek,ce->ke", u.astype(np.float64), v.reshape(d.shape[0], 16))  # [K, 16]
    return np.einsum("ij,kjl,ml->kim", at, m.reshape(-1, 4, 4), at)  # [K, 2, 2]


def test_winograd_weights_compute_the_convolution():
    rng = np.random.default_rng(3)
    k, c = 5, 4
    w = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    u = gc.winograd_weights(w)
    assert u.shape == gc.get("gpu.conv_winograd").transformed_shape(conv(c=c, k=k)) == (c, 16, k)
    assert u.dtype == np.float32 and u.flags.c_contiguous
    d = rng.standard_normal((c, 4, 4))
    direct = np.array([[[np.sum(d[:, i:i + 3, j:j + 3] * w[kk]) for j in range(2)] for i in range(2)]
                       for kk in range(k)])
    np.testing.assert_allclose(_winograd_reference(u, d), direct, rtol=1e-4, atol=1e-4)


def test_only_winograd_needs_a_runtime_weight_transform():
    assert {v.name: v.transform for v in gc.VARIANTS} == {
        "gpu.conv_winograd": "gpu.winograd_f23", "gpu.conv_gemm": "", "gpu.conv_direct": ""}


@needs_tools
@pytest.mark.parametrize("variant", gc.VARIANTS, ids=lambda v: v.name)
def test_variant_shader_compiles_with_its_recorded_workgroup_and_bindings(variant, tmp_path):
    src = variant.source()
    assert glsl_to_spirv(src, tmp_path)[:4] == SPIRV_MAGIC
    sizes = dict(re.findall(r"local_size_([xyz]) = (\d+)", src))
    assert tuple(int(sizes.get(a, 1)) for a in "xyz") == tuple(variant.local_size)
    assert sorted(int(b) for b in re.findall(r"binding = (\d+)", src)) == list(range(gc.BINDINGS))
    assert "store(" in variant.body  # every variant writes through the shared epilogue
