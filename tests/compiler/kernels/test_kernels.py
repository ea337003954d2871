"""Every kernel variant against a plain numpy reference, over a sweep of
shapes, strides, pads, groups, dilations and channel counts that are not
multiples of the blocks; with and without a fused epilogue; through every
schedule of its parameter space on one shape; and its weight transform."""
import numpy as np
import pytest
import tvm
from tvm import te, topi

import dataclasses
import zlib

from coldbrew.compiler.passes.block_layout import conv_blocks, from_blocked
from standalone import execute_func, to_blocked, workspace_sizes
from coldbrew.compiler.kernels import ConvSpec, DenseSpec, applicable, get, variants
from coldbrew.compiler.kernels import build as kb
from coldbrew.compiler.ir.narrow import narrow_weights
from coldbrew.compiler.passes.plan_weights import scheduled_transform
from coldbrew.targets import resolve
from conftest import cpu_targets

# every kernel is built and run for the host's vector unit and, on x86, for
# AVX2 as well (AVX2 code runs on every AVX-512 CPU), wherever the tests run
TARGETS = [resolve(t) for t in cpu_targets()]


def te_variants(isa):
    """The variants written as TE computations and schedules of float
    weights (the cells' prescheduled kernels: tests/compiler/kernels/test_cells.py;
    the integer variant: tests/compiler/kernels/test_int8_dot.py)."""
    return [v for v in variants(isa) if not v.prescheduled and not v.integer]


def ref_conv(x, w, spec):
    """Direct definition of a grouped, strided, dilated, padded conv2d (float64)."""
    pt, pl, pb, pr = spec.pad
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    oh, ow = spec.out_h, spec.out_w
    k, cpg = w.shape[:2]
    kpg = k // spec.groups
    out = np.zeros((spec.n, k, oh, ow))
    for g in range(spec.groups):
        for r in range(spec.r):
            for s in range(spec.s):
                patch = xp[:, g * cpg:(g + 1) * cpg, r * dh:r * dh + sh * (oh - 1) + 1:sh, s * dw:s * dw + sw * (ow - 1) + 1:sw]
                out[:, g * kpg:(g + 1) * kpg] += np.einsum("ncyz,kc->nkyz", patch, w[g * kpg:(g + 1) * kpg, :, r, s])
    return out


CONV_SPECS = [
    ConvSpec(1, 3, 17, 19, 10, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvSpec(1, 16, 14, 14, 24, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvSpec(1, 13, 15, 11, 9, 3, 3, (2, 2), (1, 1, 1, 1)),
    ConvSpec(1, 8, 12, 12, 20, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    ConvSpec(1, 12, 9, 9, 12, 3, 3, (1, 1), (0, 0, 0, 0), groups=3),
    ConvSpec(1, 20, 10, 10, 20, 3, 3, (1, 1), (1, 1, 1, 1), groups=20),
    ConvSpec(1, 20, 11, 11, 20, 3, 3, (2, 2), (1, 1, 1, 1), groups=20),
    ConvSpec(1, 24, 9, 13, 24, 5, 5, (1, 1), (2, 2, 2, 2), groups=24),
    ConvSpec(1, 17, 9, 9, 33, 1, 1),
    ConvSpec(1, 32, 8, 8, 16, 1, 1, (2, 2)),
    ConvSpec(2, 5, 13, 13, 7, 5, 5, (1, 1), (2, 1, 0, 2)),
    ConvSpec(1, 3, 31, 31, 16, 7, 7, (2, 2), (3, 3, 3, 3)),
    ConvSpec(1, 6, 7, 7, 6, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvSpec(1, 64, 8, 8, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
]
DENSE_SPECS = [DenseSpec(1, 37, 29), DenseSpec(3, 64, 16), DenseSpec(5, 128, 50), DenseSpec(16, 9, 3),
               DenseSpec(7, 48, 40, lead=1)]  # a batch-1 sequence: x [1, 7, 48]
# shapes whose channels are multiples of every target's lanes (4, 8, 16):
# the blocked layout's convolutions (compiler/passes/block_layout.py)
BLOCKED_SHAPES = [
    ConvSpec(1, 3, 23, 21, 32, 3, 3, (2, 2), (1, 1, 1, 1)),
    ConvSpec(1, 32, 13, 13, 48, 1, 1),
    ConvSpec(1, 16, 9, 11, 32, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvSpec(1, 16, 12, 12, 16, 3, 3, (2, 2), (1, 0, 2, 1), (2, 2)),
    ConvSpec(2, 32, 7, 7, 64, 1, 1, (2, 2)),
    ConvSpec(1, 48, 14, 14, 48, 3, 3, (1, 1), (1, 1, 1, 1), groups=48),
    ConvSpec(1, 32, 15, 15, 32, 3, 3, (2, 2), (1, 1, 1, 1), groups=32),
    ConvSpec(1, 16, 9, 13, 16, 5, 5, (1, 1), (2, 2, 2, 2), groups=16),
    ConvSpec(1, 16, 13, 12, 32, 3, 3, (1, 1), (1, 1, 1, 1)),  # winograd F(6x6) on blocks: two tiles per side
]


def blocked_specs(lanes):
    """BLOCKED_SHAPES (and any sweep shape that qualifies) in the layout block_layout gives them."""
    out = []
    for spec in BLOCKED_SHAPES + CONV_SPECS:
        ib, ob = conv_blocks(spec.c, spec.k, spec.groups, lanes)
        if ob:
            out.append(dataclasses.replace(spec, in_block=ib, out_block=ob))
    return out


def _cases():
    for t in TARGETS:
        for spec in CONV_SPECS + blocked_specs(t.vector.lanes):
            for v in applicable(spec, "conv2d", t.vector):
                yield pytest.param(t, v, spec, id=f"{t.name}-{v.name}-{spec.c}x{spec.h}x{spec.w}-k{spec.k}r{spec.r}"
                                                  f"s{spec.stride[0]}g{spec.groups}d{spec.dilation[0]}"
                                                  f"b{spec.in_block}.{spec.out_block}")
        for spec in DENSE_SPECS:
            for v in applicable(spec, "dense", t.vector):
                yield pytest.param(t, v, spec, id=f"{t.name}-{v.name}-{spec.m}x{spec.k}x{spec.n}l{spec.lead}")


def _run(target, variant, spec, params=None, epilogue=False, precision="fp32", direct=False):
    """`direct`: the execute kernel reads its transformed weights in
    `precision` (fp16, int8) and widens them itself (the direct weight
    form; int8 scaled per output channel in the epilogue)."""
    rng = np.random.default_rng(zlib.crc32(repr((variant.name, spec)).encode()))  # hash() of a str varies per process
    dev = tvm.cpu()
    blocked = isinstance(spec, ConvSpec) and spec.out_block
    x = rng.standard_normal(dataclasses.replace(spec, in_block=0).input_shape if blocked
                            else spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    stored = [w]
    if precision != "fp32":  # the reference uses what the narrow weights stand for
        stored, w = narrow_weights(w, precision, kb.output_axis(spec))
    if isinstance(spec, ConvSpec):
        ref = ref_conv(x, w, spec)
    else:
        ref = x.astype(np.float64) @ w
    axis = -1 if isinstance(spec, DenseSpec) else 1  # output channels
    bias = rng.standard_normal(ref.shape[axis]).astype(np.float32)
    along = [1] * ref.ndim
    along[axis] = -1  # the bias broadcast along the channel axis

    def bias_relu(out):
        b = te.placeholder((ref.shape[axis],), "float32", name="bias")
        shape = [ref.shape[axis] if d == -1 else 1 for d in along]
        if blocked:  # channel c of the blocked output: [c // b, ..., c % b]
            shape = [1, ref.shape[1] // spec.out_block, 1, 1, spec.out_block]
        return topi.nn.relu(topi.add(out, topi.reshape(b, shape))), [b]

    funcs = {"exe": kb.schedule(execute_func(variant, spec, bias_relu if epilogue else None, params,
                                                precision if direct else "fp32"), variant, spec, params)}
    params = params if params is not None else variant.space(spec)[0]
    scales = []
    if direct:  # the compiler transforms the narrow values (int8: unscaled), then stores them narrow
        if precision == "int8":
            scales = [tvm.runtime.tensor(stored[1].reshape(kb.scale_shape(spec)), dev)]
        stored = [(w if precision == "fp16" else stored[0]).astype(np.float32)]
    tf = kb.transform_func(variant, spec, params, "fp32" if direct else precision)
    if tf is not None:  # scheduled as the compiler schedules it
        funcs["tr"] = scheduled_transform(variant, tf) if precision != "fp32" and not direct else tf
    lib = kb.build(funcs, target)
    wt = tvm.runtime.tensor(stored[0] if direct else w, dev)
    if tf is not None:
        out_w = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec, params), np.float32), dev)
        lib["tr"](*[tvm.runtime.tensor(a, dev) for a in stored], out_w)
        wt = out_w
    if direct:
        wt = tvm.runtime.tensor(wt.numpy().astype(np.float16 if precision == "fp16" else np.int8), dev)
    out = tvm.runtime.tensor(np.zeros(spec.output_shape if blocked else ref.shape, np.float32), dev)
    xin = to_blocked(x, spec.in_block) if blocked and spec.in_block else x
    args = [tvm.runtime.tensor(xin, dev), wt, *scales] + ([tvm.runtime.tensor(bias, dev)] if epilogue else []) + [out]
    lib["exe"](*args)
    result = from_blocked(out.numpy()) if blocked else out.numpy()
    if epilogue:
        ref = np.maximum(ref + bias.reshape(along), 0)
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(result - ref).max())
    # winograd F(6x6) is the least accurate in fp32; everything else is near exact
    tol = 5e-3 if "winograd_f6" in variant.name else 1e-4
    assert err <= tol * scale, f"{variant.name} {spec}: max err {err} (scale {scale})"


def _sweep(target):
    return CONV_SPECS + blocked_specs(target.vector.lanes) + DENSE_SPECS


def _runs(variant, spec):
    return variant.applies(spec) and variant.blocked == bool(getattr(spec, "out_block", 0))


@pytest.mark.parametrize("target,variant,spec", list(_cases()))
def test_variant_matches_reference(target, variant, spec):
    _run(target, variant, spec)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("target,variant", [(t, v) for t in TARGETS for v in te_variants(t.vector)],
                         ids=lambda p: getattr(p, "name", ""))
def test_variant_with_narrow_weights_matches_reference(target, variant, precision):
    # the narrow weights widened by the variant's transform (or by the
    # widening pass alone, for a variant without one) give the kernel
    # exactly what the narrow weights stand for
    spec = next(s for s in _sweep(target) if variant.op == ("conv2d" if isinstance(s, ConvSpec) else "dense")
                and _runs(variant, s))
    _run(target, variant, spec, precision=precision)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("target,variant", [(t, v) for t in TARGETS for v in te_variants(t.vector)
                                            if v.transform_rearranges], ids=lambda p: getattr(p, "name", ""))
def test_variant_reading_narrow_weights_directly_matches_reference(target, variant, precision):
    # the direct form: the execute kernel loads fp16 or int8 weights in its
    # own layout and widens them in registers (int8 scaled per output
    # channel after the sum); every spec the variant applies to, the first
    # also with a fused epilogue
    specs = [s for s in _sweep(target) if variant.op == ("conv2d" if isinstance(s, ConvSpec) else "dense")
             and _runs(variant, s)]
    assert specs
    for k, spec in enumerate(specs):
        _run(target, variant, spec, precision=precision, direct=True, epilogue=k == 0)


def test_narrow_weights_round_trip():
    w = np.random.default_rng(0).standard_normal((6, 3, 3, 3)).astype(np.float32) * np.arange(1, 7).reshape(6, 1, 1, 1)
    (h,), wide = narrow_weights(w, "fp16", 0)
    assert h.dtype == np.float16 and np.array_equal(wide, h.astype(np.float32))
    (q, scale), wide = narrow_weights(w, "int8", 0)
    assert q.dtype == np.int8 and scale.shape == (6,) and np.abs(q).max() == 127
    assert np.allclose(scale, np.abs(w).reshape(6, -1).max(axis=1) / 127)  # per output channel
    assert np.abs(wide - w).max() <= scale.max() / 2 + 1e-7  # rounding to the nearest step
    (q, scale), _ = narrow_weights(np.zeros((4, 5), np.float32), "int8", 1)  # dense [K, N]: per column
    assert scale.shape == (5,) and not q.any() and np.all(scale == 1)


@pytest.mark.parametrize("target,variant", [(t, v) for t in TARGETS for v in te_variants(t.vector)],
                         ids=lambda p: getattr(p, "name", ""))
def test_variant_with_fused_epilogue_and_every_schedule(target, variant):
    # the first sweep shape it applies to, and the last (the deepest
    # reduction: GEMMs block it there, and pick the other loop order)
    specs = [s for s in _sweep(target) if variant.op == ("conv2d" if isinstance(s, ConvSpec) else "dense")
             and _runs(variant, s)]
    assert specs, f"no sweep shape exercises {variant.name}"
    for spec in dict.fromkeys((specs[0], specs[-1])):
        for params in variant.space(spec):
            _run(target, variant, spec, params, epilogue=True)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_gemm_spaces_hold_both_loop_orders_and_a_reduction_block(target):
    from coldbrew.compiler.kernels import get

    isa = target.vector
    half_l1 = isa.l1d_kb * 1024 // 2
    deep = ConvSpec(1, 64, 8, 8, 64, 3, 3, (1, 1), (1, 1, 1, 1))
    space = get("conv2d.im2col_gemm", isa).space(deep)
    assert {p["order"] for p in space} == {"rows", "channels"}
    for p in space:
        # the operand a tile rereads: the 576 x zt column tile ("rows", it
        # overflows half of L1 on every target) or the 576 x kb weight panel
        panel = 576 * 4 * (p["zt"] if p["order"] == "rows" else p["kb"])
        assert bool(p["qb"]) == (panel > half_l1), p
        assert not p["qb"] or (576 % p["qb"] == 0 and p["qb"] * panel // 576 <= half_l1), p
    # output channels in the lanes: a 1024-deep weight panel of one channel
    # vector overflows half of L1 everywhere, so the channels order blocks it
    wide = ConvSpec(1, 1024, 14, 14, 256, 1, 1)
    kvec = get("conv2d.gemm_1x1_kvec", isa).space(wide)
    assert any(p["order"] == "channels" and p["qb"] for p in kvec)
    assert all(p["qb"] == 0 for p in kvec if p["order"] == "rows")


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_an_odd_count_of_channel_blocks_gets_wide_register_blocks_on_padded_panels(target):
    """Five output channel blocks divide by no kvb > 1: the blocked
    variants' first-ranked register block still holds several weight
    vectors (the last panel padded with zero weights, its extra channels
    cropped), and every block of the space, padded or not, gives the
    reference's output."""
    from coldbrew.compiler.kernels import get

    lanes = target.vector.lanes
    # rows of 12: whole tiles of 2, 3, 4 or 6 (a tile past an unpadded row would copy the input first)
    point = ConvSpec(1, 2 * lanes, 7, 12, 5 * lanes, 1, 1, in_block=lanes, out_block=lanes)
    wide = dataclasses.replace(point, r=3, s=3, pad=(1, 1, 1, 1))
    for name, spec in (("conv2d.blocked", point), ("conv2d.gemm_1x1_blocked", point),
                       ("conv2d.blocked", wide), ("conv2d.im2col_blocked", wide)):
        variant = get(name, target.vector)
        space = variant.space(spec)
        assert space[0]["kvb"] > 1 and 5 % space[0]["kvb"], (name, space)
        padded = [p for p in space if 5 % p["kvb"]]
        assert variant.transformed_shape(spec, padded[0])[0] * (1 if name == "conv2d.blocked" else padded[0]["kvb"]) \
            == -(-5 // padded[0]["kvb"]) * padded[0]["kvb"]
        for params in space:
            _run(target, variant, spec, params, epilogue=True)


@pytest.mark.parametrize("isa_name", ["x86_64-avx2", "x86_64-avx512"])
def test_a_first_layers_register_block_keeps_the_reused_broadcasts_in_registers(isa_name):
    """A first layer on an NCHW input (3 channels, 7x7 or 3x3 at stride 2):
    a filter row's taps are the innermost reduction and adjacent columns'
    windows overlap, so the compiler keeps each column's broadcast for the
    taps that read it again (Blocked.register_blocks counts them). The
    first-ranked block runs without reloading a vector from the stack
    (code built for AVX2 and AVX-512, not run); counted as one broadcast,
    the first-ranked 6 x 2 (AVX2) or 6 x 4 (AVX-512) spills. Blocked
    inputs, and strides that clear the window, count one."""
    import re

    from coldbrew.compiler.kernels import get

    target = resolve(isa_name)
    lanes = target.vector.lanes
    reload = re.compile(r"\(%rsp\), %" + ("zmm" if lanes == 16 else "ymm"))
    variant = get("conv2d.blocked", target.vector)
    first = [ConvSpec(1, 3, 96, 96, 4 * lanes, 7, 7, (2, 2), (3, 3, 3, 3), in_block=0, out_block=lanes),
             ConvSpec(1, 3, 96, 96, 2 * lanes, 3, 3, (2, 2), (1, 1, 1, 1), in_block=0, out_block=lanes)]
    for spec in first:
        assert variant.taps_innermost(spec)
        params = variant.space(spec)[0]
        asm = kb.build({"exe": kb.schedule(execute_func(variant, spec, None, params), variant, spec, params)},
                       target).inspect_source("asm")
        assert not reload.findall(asm), (spec, params)
    assert not variant.taps_innermost(dataclasses.replace(first[0], in_block=lanes, c=lanes))
    assert not variant.taps_innermost(dataclasses.replace(first[1], stride=(3, 3)))


def test_layers_whose_weights_outgrow_l1_rank_blocks_of_more_columns(monkeypatch):
    """A tile sweeps its panel's weights whole at every step; where the
    layer's weights outgrow L1 they come from L2, and a weight vector
    counts as schedule.L2_STREAMED loads: 256 -> 256 3x3 at 14 x 14 on
    AVX2 ranks 5 x 2 first (1.71 ms measured against the 3 x 3 an even
    count ranks first, 1.88); a layer whose weights fit L1 counts evenly."""
    from coldbrew.compiler.kernels import schedule

    isa = resolve("x86_64-avx2").vector
    variant = get("conv2d.blocked", isa)
    deep = ConvSpec(1, 256, 14, 14, 256, 3, 3, pad=(1, 1, 1, 1), in_block=8, out_block=8)
    small = dataclasses.replace(deep, c=8, k=16)
    assert schedule.streamed_cost(isa, 256 * 256 * 9 * 4) == schedule.L2_STREAMED > 1
    assert schedule.streamed_cost(isa, 8 * 16 * 9 * 4) == 1
    first = lambda spec: (variant.space(spec)[0]["zt"], variant.space(spec)[0]["kvb"])  # noqa: E731
    assert first(deep) == (5, 2)
    even = first(small)
    monkeypatch.setattr(schedule, "L2_STREAMED", 1)
    assert first(deep) == (3, 3)  # the even count's pick
    assert first(small) == even


def test_a_one_vector_block_stops_at_the_rows_that_spill():
    """A block of one weight vector feeds one product per broadcast, and
    the compiler loads the broadcasts ahead: on AVX2 (16 registers) its
    rows stop at 9 (registers // 2 + 1). The largest such block of
    register_blocks reloads nothing from the stack (a 1x1 convolution of
    512 channels, code built, not run), one row more does (the bound is
    the spill's); on AVX-512 (32 registers) every row count is kept."""
    import re

    from coldbrew.compiler.kernels.schedule import register_blocks

    target = resolve("x86_64-avx2")
    rows = [r for r, v in register_blocks(target.vector, range(1, 15), 4) if v == 1]
    assert max(rows) == 9
    assert max(r for r, v in register_blocks(resolve("x86_64-avx512").vector, range(1, 15), 4) if v == 1) == 14
    variant = get("conv2d.blocked", target.vector)
    spec = ConvSpec(1, 512, 13, 13, 64, 1, 1, in_block=8, out_block=8)
    reloads = []
    for zt in (max(rows), max(rows) + 1):
        params = {"kvb": 1, "zt": zt}
        asm = kb.build({"exe": kb.schedule(execute_func(variant, spec, None, params), variant, spec, params)},
                       target).inspect_source("asm")
        reloads.append(len(re.findall(r"\(%rsp\), %ymm", asm)))
    assert reloads[0] == 0 < reloads[1], reloads


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_unpadded_layers_prefer_width_tiles_that_divide_their_rows(target):
    """A width tile that does not divide an unpadded layer's 160-wide rows
    makes the kernel copy its input first: the first-ranked tile of each
    width-vectorized variant divides the rows (a 16 -> 4 1 x 1 conv, a
    transposed conv's phases); with pads the input is copied anyway and
    the widths rank as before."""
    from coldbrew.compiler.kernels import get
    from coldbrew.compiler.kernels.conv import COPY_PENALTY, _copies_input

    assert COPY_PENALTY < 1
    isa = target.vector
    bare = ConvSpec(1, 16, 160, 160, 4, 1, 1)
    padded = dataclasses.replace(ConvSpec(1, 16, 160, 160, 4, 3, 3), pad=(1, 1, 1, 1))
    for name, key in (("conv2d.direct", "zb"), ("conv2d.packed_direct", "zb"), ("conv2d.gemm_1x1", "zt")):
        space = get(name, isa).space(bare)
        assert 160 % space[0][key] == 0, (name, space[:3])
    assert _copies_input(bare, 48) and not _copies_input(bare, 32) and not _copies_input(padded, 48)


@pytest.mark.parametrize("isa_name", ["x86_64-avx2", "x86_64-avx512"])
def test_unpadded_blocked_layers_weigh_the_input_copy_a_width_tile_makes(isa_name):
    """On the blocked layout too, a row tile that reads past an unpadded
    layer's row copies its input first (copy_share: that pass's bytes
    beside the layer's products): a 128 -> 128 1 x 1 conv at 56 x 56, whose
    copy is as long as half its products on AVX2, and a stride-2 1 x 1
    take tiles that divide their rows; 1024 -> 1024 at 7 x 7, whose copy is
    small, keeps a wider tile over a padded row on AVX2; with pads nothing
    counts."""
    from coldbrew.compiler.kernels import get
    from coldbrew.compiler.kernels.conv_blocked import copy_share

    isa = resolve(isa_name).vector
    b = isa.lanes
    big = ConvSpec(1, 128, 56, 56, 128, 1, 1, in_block=b, out_block=b)
    down = ConvSpec(1, 64, 56, 56, 128, 1, 1, (2, 2), in_block=b, out_block=b)
    deep = ConvSpec(1, 1024, 7, 7, 1024, 1, 1, in_block=b, out_block=b)
    for name in ("conv2d.blocked", "conv2d.gemm_1x1_blocked"):
        variant = get(name, isa)
        for spec in (big,) + ((down,) if variant.applies(down) else ()):
            zt = variant.space(spec)[0]["zt"]
            assert copy_share(spec, zt, b) == 0, (name, spec, variant.space(spec)[:2])
        if b == 8:  # (AVX-512's 7 x 3 block divides the row)
            assert copy_share(deep, variant.space(deep)[0]["zt"], b) > 0
    assert copy_share(big, 6, b) > 0 and copy_share(dataclasses.replace(big, r=3, s=3, pad=(1, 1, 1, 1)), 6, b) == 0
    assert get("conv2d.pair_blocked", isa).copy_share(big, 6) == 0  # its int16 input is a copy whatever the tile


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_variant_is_exercised_by_the_sweep(target):
    isa = target.vector
    covered = {v.name for s in CONV_SPECS + blocked_specs(isa.lanes) for v in applicable(s, "conv2d", isa)}
    covered |= {v.name for s in DENSE_SPECS for v in applicable(s, "dense", isa)}
    assert covered == {v.name for v in te_variants(isa)}


@pytest.mark.parametrize("isa_name", ["x86_64-avx2", "x86_64-avx512"])
def test_a_convolutions_register_block_lives_on_the_stack(isa_name):
    """The blocked convolution's accumulators (the anchor's tile, written
    back through a fused bias + Relu) are a stack slot LLVM keeps in
    registers, not a runtime workspace block asked for at every output row;
    what the code still asks the workspace for is the padded input (tens
    of KB), never a tile: 2 x 4 vectors, 256 bytes on AVX2, 512 on AVX-512
    (TVM gives a stack slot to buffers under 1 KB; AVX-512's larger blocks
    stay workspace blocks, one per output row)."""
    target = resolve(isa_name)
    lanes = target.vector.lanes
    spec = ConvSpec(1, 4 * lanes, 14, 14, 4 * lanes, 3, 3, (1, 1), (1, 1, 1, 1), in_block=lanes, out_block=lanes)
    variant = get("conv2d.blocked", target.vector)

    def bias_relu(out):
        bias = te.placeholder((spec.k // lanes, lanes), "float32", name="bias")
        return te.compute(out.shape, lambda n, k, y, z, c: te.max(out[n, k, y, z, c] + bias[k, c], 0.0)), [bias]

    params = {"kvb": 2, "zt": 4, "rows_outer": False}
    func = kb.schedule(execute_func(variant, spec, bias_relu, params), variant, spec, params)
    sizes = workspace_sizes(kb.build({"exe": func}, target))
    assert sizes and all(s >= 1024 for s in sizes), sizes


@pytest.mark.parametrize("name", ["conv2d.blocked", "conv2d.pair_blocked"])
def test_border_rows_skip_the_products_with_the_padding(name):
    """On a layer padded at the top or bottom the filter-row loop runs, at
    each output row, over the rows that land on the input (its bounds
    follow the row); an unpadded layer keeps the whole loop. What the
    layers compute with it is test_variant_matches_reference's (strides,
    dilations and uneven pads included)."""
    target = resolve("x86_64-avx2")
    lanes, variant = target.vector.lanes, get(name, target.vector)
    padded = ConvSpec(1, 2 * lanes, 4, 16, 2 * lanes, 3, 3, (1, 1), (1, 1, 1, 1), in_block=lanes, out_block=lanes,
                      in_scale=1.0 if variant.integer else None)
    bare = dataclasses.replace(padded, pad=(0, 1, 0, 1))
    for spec, bounded in ((padded, True), (bare, False)):
        params = variant.space(spec)[0]
        text = kb.schedule(execute_func(variant, spec, None, params), variant, spec, params).script()
        assert ("T.max(" in _rr_loop(text)) == bounded


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_a_row_its_tile_does_not_divide_runs_its_last_columns_apart(target):
    """conv2d.blocked over a row its tile does not divide (14 columns in
    tiles of 6, 7 in tiles of 4) computes the row exact: its whole tiles,
    then the last columns as a narrower tile of their own (the tile loop
    partitioned: docs/kernels.md, "The row's last tile"), the padded input
    only as wide as the pads make it, the epilogue after the panel's row;
    it matches the reference with and without an epilogue. Rows are padded
    to whole tiles as before (one tile loop, a padded input as wide as
    they read) past row_tail's bound (a panel's row over half of L1) and
    under TAIL_REDUCTION products per output (one channel block x 3 taps)."""
    b = target.vector.lanes
    variant = get("conv2d.blocked", target.vector)
    for width, zt, c, r in ((14, 6, 2 * b, 3), (7, 4, 2 * b, 3), (1000, 6, 2 * b, 3), (14, 6, b, 1)):
        spec = ConvSpec(1, c, 3, width, 2 * b, r, 3, (1, 1), (r // 2, 1, r // 2, 1), in_block=b, out_block=b)
        params = {"kvb": 2, "zt": zt}
        text = kb.schedule(execute_func(variant, spec, None, params), variant, spec, params).script()
        apart = width < 1000 and r == 3
        whole, columns = width // zt, width + 2 if apart else -(-width // zt) * zt + 2
        assert (f"in range({whole}, {whole + 1}):" in text) == apart, text
        assert f"cb_pad = T.sblock_alloc_buffer((1, {c // b}, {3 + r - 1}, {columns}, {b}))" in text, text
        if width < 1000:
            _run(target, variant, spec, params, epilogue=True)
            _run(target, variant, spec, params)


def _rr_loop(text):
    """The header of the filter-row loop: "for rr in ..." or "for co, rr, rs, ci in T.grid(...)"."""
    return next(line for line in text.splitlines()
                if line.strip().startswith("for ") and "rr" in line.split(" in ")[0].replace(",", " ").split())


def test_a_models_padded_convolution_skips_its_border_rows_products():
    """The same through the compiler (the model's int64 indices, the
    anchor's reads as the pipeline makes them): the variant's own schedule
    runs (no fallback to the generic one) with the bounded loop, and the
    bundle matches onnxruntime."""
    import coldbrew
    from onnx import TensorProto, helper, numpy_helper
    from coldbrew.compiler import compile_graph
    from conftest import assert_close, ort_run

    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 4, 24])], [w]),
        opset_imports=[helper.make_opsetid("", 13)])
    data, graph = compile_graph(model, variants={"conv2d": "blocked"})
    assert not [n for n in graph.notes if "schedule failed" in n], graph.notes
    conv = next(f for name, f in graph.kernels.items() if "blocked" in name)
    assert "T.max(" in _rr_loop(conv.script())
    x = {"x": rng.standard_normal((1, 16, 4, 24)).astype(np.float32)}
    assert_close(coldbrew.load(data).run(None, x), ort_run(model, x))
