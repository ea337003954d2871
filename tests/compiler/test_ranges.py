"""Input dimensions declared as ranges, compiler side: the options' text
(compiler/options.py Dim, input_dims; `--input-shape`, `--typical-shape`),
one bundle compiled for every size of its ranges (a conv model through
blocked convs, pooling, a ConvTranspose as its phases' conv, a Resize and a
global average) against onnxruntime at the extremes and odd sizes, the
variants and row tiles chosen for rows sized at run time, the generic
schedule's proofs (kernels/generic.py), the schema version
(the shape programs themselves: tests/compiler/ir/test_dims.py), and
how `coldbrew inspect`, Graph.dump and examples/c/run_bundle.c show and run
such a bundle. The runtime's side: tests/runtime/test_shapes.py."""
import dataclasses
import glob
import json
import os
import re
import subprocess
import types
import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model, driver
from coldbrew.compiler.errors import ScheduleFallbackWarning
from coldbrew.compiler.bundle.reader import dim_values, read, shape_now, text
from coldbrew.compiler.ir import dims
from coldbrew.compiler.kernels.generic import multiple, proved, size, typical_sizes
from coldbrew.compiler.options import Dim, Options
from coldbrew.compiler.tools.cli import main
from coldbrew.compiler.tools.inspect import describe, infix
from coldbrew.targets import resolve
from coldbrew.schemas.generated import bundle_generated as fb

SHAPES = {"x": "1x3x[9:33]x[W=8:40:4]"}  # H any size from 9 to 33, W a multiple of 4 from 8 to 40
TYPICAL = {"x": [1, 3, 17, 24]}
SIZES = [(9, 8), (33, 40), (17, 20), (24, 12), (13, 36)]  # (H, W): the extremes, odd rows, the typical's neighbours


# --- the options' text ---

def _scheduled(model, path, tmp_path, shape, typical):
    """Compile `model` with input x ranged as `shape` to `path`; the kernels' TIR after schedule_kernels."""
    compile_model(model, path, input_shapes={"x": shape}, typical_shapes={"x": typical}, dump_ir=str(tmp_path / "ir"))
    with open(glob.glob(str(tmp_path / "ir" / "*_schedule_kernels.txt"))[0]) as f:
        return f.read()


def test_ranges_steps_shared_names_and_typical_sizes():
    o = Options(input_shapes={"x": "1x3x[32:256]x[W=32:256:4]", "z": "1xWx[8:16]"},
                typical_shapes={"x": [1, 3, 128, 64]})
    x, z = o.input_shapes["x"], o.input_shapes["z"]
    assert x == (1, 3, Dim("x.2", 32, 256, 1, 128), Dim("W", 32, 256, 4, 64))
    assert z == (1, x[3], Dim("z.2", 8, 16, 1, 16))  # W is x's; z.2's typical size is its max
    assert sorted(o.dims) == ["W", "x.2", "z.2"]
    assert (str(x[2]), str(x[3])) == ("[32:256]", "[32:256:4]")
    assert [x[3].holds(n) for n in (32, 36, 34, 28, 260, 256)] == [True, True, False, False, False, True]
    given = Options(input_shapes={"x": [1, 3, Dim("H", 8, 64, 8), "H"]}, typical_shapes={"x": "1x3x16x16"})
    assert given.input_shapes["x"] == (1, 3, Dim("H", 8, 64, 8, 16), Dim("H", 8, 64, 8, 16))
    assert Options(input_shapes={"x": "1x3x224x224"}).input_shapes["x"] == (1, 3, 224, 224) and not Options().dims


@pytest.mark.parametrize("shapes, typical, message", [
    ({"x": "1x3x[32-256]x4"}, None, r"input 'x' dimension 2: '\[32-256\]' is not a size, a range like"),
    ({"x": "1x[64:32]"}, None, r"dimension x.1: \[64:32:1\] is not a range"),
    ({"x": "1x[0:32]"}, None, r"dimension x.1: \[0:32:1\] is not a range"),
    ({"x": "1x[30:256:4]"}, None, r"\[30:256:4\] is not a range \(1 <= min <= max, both multiples of the step\)"),
    ({"x": "1x[32:250:4]"}, None, r"\[32:250:4\] is not a range"),
    ({"x": "1x[N=2:8]", "z": "1x[N=2:16]"}, None, r"dimension N is declared twice, as \[2:8\] and \[2:16\]"),
    ({"x": "1xmx3"}, None, r"input 'x': dimension 'm' is not declared \(write \[m=MIN:MAX\] once\)"),
    ({"x": "1x[32:256]"}, {"x": [1, 300]}, r"dimension x.1: typical size 300 is not in \[32:256\]"),
    ({"x": "1x[32:256:4]"}, {"x": [1, 34]}, r"typical size 34 is not in \[32:256:4\]"),
    ({"x": "1x[32:256]"}, {"x": [2, 64]}, r"--typical-shape x: size 2 where the input's size is fixed to 1"),
    ({"x": "1x[32:256]"}, {"x": [64]}, r"--typical-shape x: expected 2 sizes for input 'x'"),
    ({"x": "1x[32:256]"}, {"q": [1, 64]}, r"--typical-shape q: expected 0 sizes for input 'q'"),
])
def test_every_malformed_range_is_a_compile_error(shapes, typical, message):
    with pytest.raises(CompileError, match=message):
        Options(input_shapes=shapes, typical_shapes=typical)


def test_ranges_on_a_gpu_target_are_a_compile_error():
    with pytest.raises(CompileError, match="ranges are not available for GPU targets"):
        Options(target="vulkan", input_shapes=SHAPES)
    assert Options(target="vulkan", input_shapes={"x": "1x3x16x16"}).input_shapes["x"] == (1, 3, 16, 16)


def test_the_command_line_and_compile_model_build_the_same_options(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(driver, "compile", lambda model, options, *a, **k: seen.append(options) or b"")
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.brew")]
    r = CliRunner().invoke(main, [*args, "--input-shape", "x=1x3x[9:33]x[n=8:40:4]", "--input-shape", "z=1xn",
                                  "--typical-shape", "x=1x3x17x24", "--weights", "cached"])
    assert r.exit_code == 0, r.output
    compile_model(None, None, input_shapes={"x": "1x3x[9:33]x[n=8:40:4]", "z": [1, "n"]}, typical_shapes=TYPICAL,
                  weights={"*": "cached"}, queues={"*": 0})
    assert len(seen) == 2 and seen[0].input_shapes == seen[1].input_shapes  # the typical sizes in their Dims
    assert seen[0] == dataclasses.replace(seen[1], typical_shapes=seen[0].typical_shapes)
    assert seen[0].input_shapes["z"] == (1, Dim("n", 8, 40, 4, 24))
    r = CliRunner().invoke(main, [*args, "--input-shape", "[W=8:40]"])
    assert r.exit_code != 0 and "expected NAME=1x3x224x224" in r.output
    r = CliRunner().invoke(main, [*args, "--input-shape", "x=1x[8:40:3]"])
    assert r.exit_code != 0 and "[8:40:3] is not a range" in r.output


# --- one bundle for every size ---

def ranged_model():
    """x [1, 3, H, W] -> conv 3x3 + relu -> max pool 2 -> conv 3x3 + relu ->
    ConvTranspose 2x2 stride 2, plus the pool's output resized x2 (nearest)
    -> y: conv 1x1 to 4 channels; g: the sum's global average."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]

    def w(*shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), f"w{len(inits)}"))
        return inits[-1].name

    nodes = [
        helper.make_node("Conv", ["x", w(16, 3, 3, 3), w(16)], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", w(16, 16, 3, 3), w(16)], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("ConvTranspose", ["r2", w(16, 16, 2, 2), w(16)], ["t"], strides=[2, 2]),
        helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest"),
        helper.make_node("Add", ["t", "u"], ["s"]),
        helper.make_node("Conv", ["s", w(4, 16, 1, 1)], ["y"]),
        helper.make_node("GlobalAveragePool", ["s"], ["g"]),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, h, wd])
          for n, c, h, wd in (("x", 3, "h", "w"), ("y", 4, None, None), ("g", 16, 1, 1))]
    m = helper.make_model(helper.make_graph(nodes, "ranged", io[:1], io[1:], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def ranged(tmp_path_factory):
    """The model and its one ranged bundle (its IR dumped after each pass)."""
    d = tmp_path_factory.mktemp("ranged")
    model = ranged_model()
    compile_model(model, str(d / "r.brew"), input_shapes=SHAPES, typical_shapes=TYPICAL, dump_ir=str(d / "ir"))
    return types.SimpleNamespace(model=model, path=str(d / "r.brew"), ir=str(d / "ir"), header=read(str(d / "r.brew")))


def feed(h, w):
    return {"x": np.random.default_rng(h * 100 + w).standard_normal((1, 3, h, w)).astype(np.float32)}


def test_one_bundle_runs_every_size_and_matches_onnxruntime(ranged):
    b, _, version = ranged.header
    assert version == b.schemaVersion == 5
    sess = coldbrew.load(ranged.path)
    assert sess.get_inputs()[0].shape == [1, 3, 33, 40]  # the largest: what memory is planned for
    for h, w in SIZES:
        f = feed(h, w)
        ours, ref = sess.run(None, f), ort_run(ranged.model, f)
        assert [o.shape for o in ours] == [(1, 4, h // 2 * 2, w), (1, 16, 1, 1)]
        assert_close(ours, ref)


@pytest.mark.parametrize("shape, message", [
    ((1, 3, 34, 40), "input 'x' axis 2 is 34: the bundle takes 9..33"),
    ((1, 3, 8, 40), "input 'x' axis 2 is 8: the bundle takes 9..33"),
    ((1, 3, 16, 44), "input 'x' axis 3 is 44: the bundle takes 8..40 in steps of 4"),
    ((1, 3, 16, 18), "input 'x' axis 3 is 18: the bundle takes 8..40 in steps of 4"),
])
def test_sizes_out_of_range_or_off_the_step_are_refused_naming_the_range(ranged, shape, message):
    with pytest.raises(coldbrew.BundleError, match=message):
        coldbrew.load(ranged.path).run(None, {"x": np.zeros(shape, np.float32)})


def test_ranged_convs_take_blocked_variants_whose_row_tile_divides_every_row_where_one_does_as_much(ranged):
    """Every conv (the ConvTranspose as its phases' conv among them, the
    1x1 conv to 4 channels padded to a block) runs a blocked variant, and
    its row tile divides its output row at every size where a register
    block whose tile does does as much work per load as the chosen one
    over the padded row (select_variants._whole_tiles): at the typical
    sizes a wider tile would be chosen. Where none does, the row is padded
    to whole tiles."""
    from coldbrew.compiler.kernels.schedule import intensity, padding_efficiency, register_blocks

    b, isa = ranged.header[0], resolve("host").vector
    steps = [(s, b.layers[s.layer]) for s in b.plan.steps if "conv" in text(b.layers[s.layer].op)
             or text(b.layers[s.layer].name).startswith("c")]
    assert [text(s.variant) for s, _ in steps] == ["conv2d.blocked"] * 4
    assert text(b.tensors[steps[2][1].args[-1]].name).startswith("t/phases")
    tiles = []
    for s, layer in steps:
        out, params = b.tensors[layer.args[-1]], json.loads(text(s.kind.params))  # out: [1, C/b, H, W, b]
        rows = {shape_now(out, dim_values(b, [[1, 3, h, w]]))[3] for h in (9, 33) for w in range(8, 41, 4)}
        zt, kvb, kblocks = params["zt"], params["kvb"], shape_now(out, dim_values(b, [[1, 3, 9, 8]]))[1]
        if any(r % zt for r in rows):  # every block whose tile divides every row does much less per load
            whole = [z for z in range(1, 15) if all(r % z == 0 for r in rows)]
            # every block of the register file's count (a superset of an NCHW first layer's: the stronger check)
            best = max(intensity(z, v) * padding_efficiency((kblocks, v))
                       for z, v in register_blocks(isa, whole, 4) if v <= kblocks)
            typical = shape_now(out, dim_values(b, [[1, 3, 17, 24]]))[3]
            assert best < intensity(zt, kvb) * padding_efficiency((typical, zt), (kblocks, kvb)), (
                text(layer.name), params, sorted(rows))
        tiles.append(zt)
    assert max(tiles) > 1


def test_shapes_and_dims_in_the_bundle(ranged):
    b = ranged.header[0]
    dim = {text(t.name): t.bounds for t in b.tensors if t.kind == fb.TensorKind.dim}
    assert {k: (r.min, r.max, r.step, r.typical, r.input, r.axis) for k, r in dim.items()} == {
        "x.2": (9, 33, 1, 17, 0, 2), "W": (8, 40, 4, 24, 0, 3)}
    y, g = (b.tensors[i] for i in b.outputs)
    assert ([int(d) for d in y.shape], [int(d) for d in g.shape]) == ([1, 4, 32, 40], [1, 16, 1, 1])
    assert g.shapeProgram is None or not len(g.shapeProgram)
    for h, w in SIZES:
        assert shape_now(y, dim_values(b, [[1, 3, h, w]])) == [1, 4, h // 2 * 2, w]


def test_fixed_shape_bundles_keep_schema_version_4(small_bundle):
    b, _, version = read(small_bundle)
    assert version == b.schemaVersion == 4
    assert not any(t.bounds or (t.shapeProgram is not None and len(t.shapeProgram)) for t in b.tensors)


# --- the generic schedule's proofs and the shape programs ---

def test_multiple_proves_divisibility_for_every_size_or_refuses():
    from tvm import tirx

    v = tirx.Var("v", "int64")
    assert multiple(v * 32, 16) and multiple(v * 4 + 8, 4) and multiple(tirx.floordiv(v * 8, 2), 4)
    assert not multiple(v * 2, 16) and not multiple(v * 4 + 2, 4) and not multiple(v, 2)
    assert multiple(48, 16) and not multiple(tirx.IntImm("int64", 20), 16)
    assert proved(tirx.floormod(v * 6, 3) == 0) and not proved(tirx.floormod(v * 6, 4) == 0) and proved(True)
    with typical_sizes({"v": 5}):
        assert (size(v * 4 + 1), size(7)) == (21, 7)
    with pytest.raises(ValueError, match="no typical size for 'v'"):
        size(v * 4)


def test_parallel_loops_fuse_with_the_size_set_at_run_time_outermost():
    """The fused parallel loop is taken apart by constants only: the generic
    schedule fuses the constant loops before a symbolic one
    (generic._fusable), a variant's fuse_parallel puts the symbolic loop
    outermost (kernels/schedule.py)."""
    import re

    from tvm import s_tir, te, tirx

    from coldbrew.compiler.kernels.generic import _fusable
    from coldbrew.compiler.kernels.schedule import fuse_parallel

    h = tirx.Var("h", "int64")
    a = te.placeholder((2, 4, h, 8), "float32", name="a")
    b = te.compute(a.shape, lambda n, c, y, x: a[n, c, y, x] * 2, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    n, c, y, x = sch.get_loops(sch.get_sblock("b"))
    assert [len(_fusable(sch, lps)) for lps in ([n, c, y], [n, c], [y, x])] == [2, 2, 1]
    par = fuse_parallel(sch, n, c, y)
    assert (sch.get(par).loop_var.name, sch.get(par).kind) == ("y_n_c_fused", tirx.ForKind.PARALLEL)
    assert not re.search(r"(//|%) \(?h", sch.mod.script()), sch.mod.script()
    # leading axes of one (a batch of one image, one channel): the symbolic row loop is the parallel one,
    # not a parallel loop of one iteration
    a1 = te.placeholder((1, 1, h, 8), "float32", name="a")
    sch = s_tir.Schedule(te.create_prim_func([a1, te.compute(a1.shape, lambda *i: a1[i] * 2, name="b")]))
    n, c, y, x = sch.get_loops(sch.get_sblock("b"))
    assert _fusable(sch, [n, c, y]) == [y]


# --- how the bundle is shown and run ---

def test_inspect_shows_ranges_typical_sizes_dims_and_shape_programs(ranged):
    lines = describe(ranged.path)
    for want in ["input      x float32[1, 3, 9..33, 8..40/4] typical [1, 3, 17, 24]",
                 "output     y float32[1, 4, 2*(x.2 // 2), W] largest [1, 4, 32, 40]",
                 "output     g float32[1, 16, 1, 1]",
                 "dim        x.2 9..33 typical 17: input x axis 2",
                 "dim        W 8..40/4 typical 24: input x axis 3"]:
        assert want in lines, "\n".join(lines)
    lanes = resolve("host").vector.lanes  # p's 16 channels in blocks of the host's vector
    sized = [x for x in lines if x.startswith("  %") and f" p@NCHW{lanes}c float32" in x]
    assert sized == [f"  %{sized[0].split()[0][1:]} p@NCHW{lanes}c float32[1, {16 // lanes}, x.2 // 2, W/2, {lanes}] "
                     f"largest [1, {16 // lanes}, 16, 20, {lanes}]"], lines


def test_inspect_writes_every_program_word():
    d = {7: types.SimpleNamespace(name=b"n", bounds=types.SimpleNamespace(step=2))}
    e = dims
    words = [3, e.DIM, 7, e.MUL, 1, e.ADD, 2, e.FLOORDIV, e.END,  # (3*n/2 + 1) // 2
             e.DIM, 7, 4, e.FLOORMOD, 5, e.DIM, 7, e.MIN, e.SUB, e.END,  # n/2 % 4 - min(5, n/2)
             2, e.DIM, 7, e.MUL, e.DIM, 7, e.MUL, 5, e.NEG, e.MAX, e.END,  # max(n * (n/2), -5)
             6, 4, e.SUB, 3, e.MUL, e.END]
    assert infix(words, d) == ["(3*n/2 + 1) // 2", "n/2 % 4 - min(5, n/2)", "max(n * (n/2), -5)", "6"]


def test_graph_dump_shows_extents_beside_the_largest_shape(ranged):
    with open(glob.glob(os.path.join(ranged.ir, "*_plan_memory.txt"))[0]) as f:
        dump = f.read().splitlines()
    assert "  input  %0 x float32[1, 3, 33, 40] = [1, 3, x_2, W * 4]" in dump, dump
    assert any(x.startswith("  output %") and x.endswith(" y float32[1, 4, 32, 40] = [1, 4, x_2 // 2 * 2, W * 4]")
               for x in dump), dump
    assert any(x.endswith(" g float32[1, 16, 1, 1]") for x in dump), dump
    assert [x.split(None, 2)[-1] for x in dump if x.startswith("  dim ")] == [
        "W [8:40:4] typical 24 (W = size / 4)", "x.2 [9:33] typical 17"], dump
    lanes, blocks = resolve("host").vector.lanes, 16 // resolve("host").vector.lanes
    assert any(x.startswith("  sized  %") and f" p@NCHW{lanes}c float32[1, {blocks}, 16, 20, {lanes}] = "
               f"[1, {blocks}, x_2 // 2, W * 2, {lanes}]" in x for x in dump), dump


def test_run_bundle_runs_a_ranged_bundle_at_its_largest_shape(ranged, tmp_path):
    """examples/c/run_bundle.c sets each input at the bundle's shape (the
    largest) before its data: the session starts at the typical shapes."""
    lib_dir = os.path.dirname(coldbrew.runtime.__file__)
    exe = tmp_path / "run_bundle"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", os.path.join(ROOT, "examples", "c", "run_bundle.c"),
                    "-I", os.path.join(ROOT, "runtime", "include"), "-L", lib_dir, "-lcoldbrew",
                    f"-Wl,-rpath,{lib_dir}", "-o", str(exe)], check=True)
    f = feed(33, 40)
    f["x"].tofile(tmp_path / "x.bin")
    out = subprocess.run([str(exe), ranged.path, str(tmp_path / "out"), str(tmp_path / "x.bin")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "output 0 y: 20480 bytes" in out.stdout, out.stdout
    ref = ort_run(ranged.model, f)
    assert_close([np.fromfile(tmp_path / f"out{k}.bin", np.float32).reshape(r.shape) for k, r in enumerate(ref)], ref)


def test_continuous_mode_with_ranges_is_refused_naming_what_to_do():
    with pytest.raises(CompileError, match="continuous mode is not available with input dimensions given as ranges"):
        Options(input_shapes={"x": "1x[1:8]"}, continuous=True)


def test_a_variant_forced_for_fixed_sizes_gives_way_to_one_that_computes_the_range(tmp_path):
    """A plan's (or the user's) NCHW choice for a conv sized at run time:
    the conv stays blocked and takes the default blocked variant
    (select_variants._anchor, block_layout), never a legalization failure."""
    path = str(tmp_path / "forced.brew")
    compile_model(ranged_model(), path, input_shapes=SHAPES, typical_shapes=TYPICAL, variants={"*": "im2col_gemm"})
    b = read(path)[0]
    assert {text(s.variant) for s in b.plan.steps if text(b.layers[s.layer].name).startswith("c")} == {"conv2d.blocked"}
    f = feed(13, 36)
    assert_close(coldbrew.load(path).run(None, f), ort_run(ranged_model(), f))


def _pool_model(pool_attrs, channels=16):
    """x [1, C, H, W] -> identity 1x1 conv (blocked) -> MaxPool(pool_attrs) -> y, and GlobalAveragePool -> g."""
    eye = numpy_helper.from_array(np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1), "eye")
    nodes = [helper.make_node("Conv", ["x", "eye"], ["c"]),
             helper.make_node("MaxPool", ["c"], ["y"], **pool_attrs),
             helper.make_node("GlobalAveragePool", ["c"], ["g"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, channels, h, w])
          for n, h, w in (("x", "h", "w"), ("y", None, None), ("g", 1, 1))]
    m = helper.make_model(helper.make_graph(nodes, "pool", io[:1], io[1:], [eye]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_same_padding_over_sizes_set_at_run_time_is_explicit_where_it_holds_for_every_size(tmp_path):
    """SAME pads that come out alike at every size (stride 1; stride 2 over an
    even-stepped size) compile and match onnxruntime; where they differ from
    size to size the refusal says which step makes them alike."""
    path = str(tmp_path / "same.brew")
    for attrs, shape in (({"kernel_shape": [2, 2], "strides": [1, 1]}, "1x16x[h=5:40]x[w=5:40]"),
                         ({"kernel_shape": [3, 3], "strides": [2, 2]}, "1x16x[h=6:40:2]x[w=6:40:2]")):
        model = _pool_model({**attrs, "auto_pad": "SAME_UPPER"})
        compile_model(model, path, input_shapes={"x": shape})
        sess = coldbrew.load(path)
        for h, w in ((6, 8), (12, 38)):
            f = {"x": np.random.default_rng(h).standard_normal((1, 16, h, w)).astype(np.float32)}
            assert_close(sess.run(None, f), ort_run(model, f))
    model = _pool_model({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"})
    model.graph.node[1].op_type = "AveragePool"
    with pytest.raises(CompileError, match=r"SAME padding over a size set at run time differs.*\[MIN:MAX:2\]"):
        compile_model(model, path, input_shapes={"x": "1x16x[h=5:40]x[w=5:40]"})


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_a_max_pool_whose_same_pads_change_with_the_size_pads_at_run_time(tmp_path, mode):
    """MTCNN's pyramid feeds any size: a stride-2 SAME max pooling pads odd
    sizes and not even ones (import_relax._same_max_pool); with fixed
    planes and a batch set at run time, the pads are explicit."""
    path = str(tmp_path / "same.brew")
    model = _pool_model({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": mode})
    compile_model(model, path, input_shapes={"x": "1x16x[h=5:40]x[w=5:40]"})
    sess = coldbrew.load(path)
    for h, w in ((5, 5), (6, 9), (17, 40), (40, 23)):
        f = {"x": np.random.default_rng(h * w).standard_normal((1, 16, h, w)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    for d, v in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], (9, 13)):
        d.dim_value = v
    for o in model.graph.output:
        o.type.tensor_type.shape.dim[0].dim_param = "n"
    compile_model(model, path, input_shapes={"x": "[n=1:8]x16x9x13"})
    f = {"x": np.random.default_rng(1).standard_normal((3, 16, 9, 13)).astype(np.float32)}
    assert_close(coldbrew.load(path).run(None, f), ort_run(model, f))


def test_a_global_mean_over_a_plane_sized_at_run_time_sums_row_by_row(tmp_path):
    """One running float32 sum over a 256 x 256 plane of one value near
    1000 drifts ~1e-3 off its mean (each add rounds the same way); each
    row's mean, then theirs, stays within 1e-5 (block_layout's global mean
    at sizes set at run time)."""
    model, path = _pool_model({"kernel_shape": [1, 1]}), str(tmp_path / "mean.brew")
    compile_model(model, path, input_shapes={"x": "1x16x[h=8:256]x[w=8:256]"})
    x = np.full((1, 16, 256, 256), 1000.1, np.float32)  # every add rounds the same way: the drift adds up
    g = coldbrew.load(path).run(None, {"x": x})[1]
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert np.abs(g - want).max() / 1000 < 1e-5


def test_a_mean_over_rows_sized_at_run_time_off_the_vector_sums_in_narrower_vectors(tmp_path):
    """A global mean over 6 x 2w (a recognizer's squeeze-and-excite over a
    line of any even width): 12w values a row, a multiple of 4 at every
    size but not of the 16-lane vector, are summed in 4 lanes
    (generic.row_reduction_block), not one scalar sum (7x slower); each
    width matches onnxruntime."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 6, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 1, 1])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "mean.brew")
    kernel = _scheduled(model, path, tmp_path, "1x32x6x[w=2:240:2]", [1, 32, 6, 80])
    assert re.search(r"_rf = T.sblock_alloc_buffer\(\(.*T.int64\(4\)\)\)", kernel) and "T.vectorized(T.int64(4))" in kernel, kernel
    sess = coldbrew.load(path)
    for w in (2, 34, 240):
        f = {"x": np.random.default_rng(w).standard_normal((1, 32, 6, w)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_dense_layers_over_rows_sized_at_run_time_take_the_packed_gemm(tmp_path):
    """A MatMul with constant weights over a sequence sized at run time runs
    dense.packed_gemm and matches at every length, one row included. The
    rows are whole blocks at every size (the last one cropped): a test of
    the row inside the reduction kept the accumulators out of registers
    (a 6,625-class classifier ran 2.5x slower than at a fixed size)."""
    import re

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((24, 40)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 40])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "dense.brew")
    kernel = _scheduled(model, path, tmp_path, "1x[n=1:50]x24", [1, 32, 24])
    b = read(path)[0]
    assert [text(s.variant) for s in b.plan.steps] == ["dense.packed_gemm"]
    padded = r"cb_anchor = T.sblock_alloc_buffer\(\(\(n - T.int64\(1\)\) // T.int64\((\d+)\) \* T.int64\(\1\) \+ T.int64\(\1\)"
    assert re.search(padded, kernel), kernel
    sess = coldbrew.load(path)
    for n in (1, 7, 32, 50):
        f = {"x": np.random.default_rng(n).standard_normal((1, n, 24)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_positions_from_a_range_over_a_length_set_at_run_time_meet_the_sequence(tmp_path):
    """Range(0, Shape(x)[1]) (an exporter's positions) added to x: the
    positions' length is the sequence's own size, at every length."""
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
         (("zero", 0), ("one", 1), ("axis1", [1]), ("first", [0]))}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["posf", "first"], ["pos2"]),
             helper.make_node("Add", ["x", "pos2"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])], list(c.values())),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "positions.brew")
    compile_model(model, path, input_shapes={"x": "1x[n=1:64]"})
    sess = coldbrew.load(path)
    for n in (1, 5, 64):
        f = {"x": np.random.default_rng(n).standard_normal((1, n)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


# --- recurrent cells over a sequence sized at run time ---

def cell_model(kind, direction, linear_before_reset=0, hidden=16, size=8):
    """x [1, n, 8] -> Transpose -> LSTM or GRU over the n steps -> (Y, Y_h)."""
    rng = np.random.default_rng(7)
    gates, dirs = {"LSTM": 4, "GRU": 3}[kind], 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name) for name, shape in
             (("W", (dirs, gates * hidden, size)), ("R", (dirs, gates * hidden, hidden)), ("B", (dirs, 2 * gates * hidden)))]
    extra = {"linear_before_reset": linear_before_reset} if kind == "GRU" else {}
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node(kind, ["xt", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden, direction=direction, **extra)]
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", size]),
          helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", dirs, 1, hidden]),
          helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [dirs, 1, hidden])]
    m = helper.make_model(helper.make_graph(nodes, "cell", io[:1], io[1:], inits), opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("kind, direction, linear_before_reset, shape, lengths", [
    ("LSTM", "bidirectional", 0, "1x[n=1:40]x8", (1, 7, 20, 40)),
    ("GRU", "reverse", 0, "1x[n=2:40:2]x8", (2, 14, 40)),  # a length 2 * n: the kernel takes n as an argument
])
def test_a_recurrent_cell_over_a_sequence_sized_at_run_time_matches_onnxruntime(tmp_path, kind, direction,
                                                                                linear_before_reset, shape, lengths):
    """One bundle for every length: the cell layer's kernel reads its time
    loop's extent from its input (onnx/recurrent.py as_cell, import_relax
    _Cell, select_variants._cell_of), its variant chosen at the typical length."""
    model, path = cell_model(kind, direction, linear_before_reset), str(tmp_path / "cell.brew")
    # 2n rows padded to blocks of 4: written ((2n - 1) // 4 + 1) * 4, which TVM proves covers them
    # (as (2n + 3) // 4 * 4 it did not, and the projection fell back to the generic schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleFallbackWarning)
        compile_model(model, path, input_shapes={"x": shape}, typical_shapes={"x": [1, 20, 8]})
    b = read(path)[0]
    assert [text(s.variant) for s in b.plan.steps if text(b.layers[s.layer].name).startswith("r")] == ["recurrent.packed"]
    sess = coldbrew.load(path)
    for n in lengths:
        f = {"x": np.random.default_rng(n).standard_normal((1, n, 8)).astype(np.float32)}
        ours, ref = sess.run(None, f), ort_run(model, f)
        assert ours[0].shape == ref[0].shape and ref[0].shape[0] == n
        assert_close(ours, ref)


def test_an_if_whose_branches_declare_no_shapes_over_a_size_set_at_run_time(tmp_path):
    """The branches' shapes are inferred (with the size's name), compared as
    such: the If becomes a select, never an internal error."""
    def branch(op, out):
        return helper.make_graph([helper.make_node(op, ["x"], [out])], op,
                                 [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu", "t"), else_branch=branch("Neg", "e"))]
    model = helper.make_model(helper.make_graph(
        nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")]), opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "if.brew")
    compile_model(model, path, input_shapes={"x": "1x[n=2:64]"})
    sess = coldbrew.load(path)
    for n, sign in ((5, 1), (40, -1)):
        f = {"x": (sign * np.abs(np.random.default_rng(n).standard_normal((1, n)))).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_a_clip_bound_from_a_size_set_at_run_time(tmp_path):
    """A Clip whose upper bound is the input's width (a recognizer's lengths
    clipped to its time steps): the size, written into a tensor, bounds it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["w"], axis=0),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Clip", ["x", "zero", "wf"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
        [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.float32),
                                                                                         "zero")]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "clip.brew")
    compile_model(model, path, input_shapes={"x": "1x[n=2:64]"})
    sess = coldbrew.load(path)
    for n in (3, 20, 64):
        f = {"x": (np.random.default_rng(n).standard_normal((1, n)) * 40).astype(np.float32)}
        got = sess.run(None, f)
        assert_close(got, ort_run(model, f))
        assert got[0].max() <= n and (got[0] == n).any(), n


def test_a_reduction_of_data_after_a_squeeze_is_not_taken_for_a_shape(tmp_path):
    """A ReduceSum reads a shape's values as data only where they come from a
    Shape; a Squeeze of data before it (a classifier's pooled features)
    stays float (it was cast to int64 once)."""
    nodes = [helper.make_node("GlobalMaxPool", ["x"], ["p"]),
             helper.make_node("Squeeze", ["p", "axes23"], ["q"]),
             helper.make_node("ReduceSum", ["q", "axes1"], ["y"], keepdims=0)]
    model = helper.make_model(helper.make_graph(
        nodes, "sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "axes23"),
         numpy_helper.from_array(np.array([1], np.int64), "axes1")]), opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "sum.brew")
    compile_model(model, path, input_shapes={"x": "[n=1:8]x4x3x3"})
    f = {"x": np.random.default_rng(0).standard_normal((3, 4, 3, 3)).astype(np.float32) * 3.3}
    got = coldbrew.load(path).run(None, f)
    assert got[0].dtype == np.float32
    assert_close(got, ort_run(model, f))


def test_a_row_of_any_width_runs_whole_register_tiles(tmp_path):
    """A convolution whose row is a size set at run time: its anchor's row
    is padded to whole tiles of the chosen width at each size (the columns
    past the row read its last one and are cropped), where the only tile
    dividing every row (one column) did a third of the work per load; it
    matches onnxruntime at widths the tile divides and at ones it does not."""
    import re

    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((64, 64, 1, 1)) * 0.2).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "row", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 6, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 6, "w"])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "row.brew")
    kernel = _scheduled(model, path, tmp_path, "1x64x6x[W=1:40]", [1, 64, 6, 15])
    # the tile in registers (its epilogue under the tile loop), the row padded to whole tiles (tiles x zt)
    tile = r'cb_anchor = T.sblock_alloc_buffer\(\(.*\(W - T.int64\(1\)\) // T.int64\((\d+)\) \+ T.int64\(1\), T.int64\(\1\)'
    assert re.search(tile, kernel), kernel
    sess = coldbrew.load(path)
    for width in (1, 4, 15, 16, 37, 40):
        f = {"x": rng.standard_normal((1, 64, 6, width)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_a_padded_row_sized_at_run_time_keeps_the_tile_schedule(tmp_path):
    """A dilated 1 x 3 convolution with pads and a bias over a row of 8 n
    columns (a vocoder's upsampled frames): the row padded to whole tiles
    is written tiles x zt, the form in which TVM proves that the tiles
    cover the row and that the pad stage is wide enough for them (written
    ceil(W / zt) * zt it proved neither: every such kernel fell back to the
    generic schedule, with a ScheduleFallbackWarning); it matches
    onnxruntime at widths the tile divides and at ones it does not."""
    rng = np.random.default_rng(6)
    w = numpy_helper.from_array((rng.standard_normal((128, 128, 1, 3)) * 0.05).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 3], dilations=[1, 2], pads=[0, 2, 0, 2])
    model = helper.make_model(helper.make_graph(
        [conv], "frames", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 1, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, 1, "w"])], [w, bias]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "frames.brew")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleFallbackWarning)
        compile_model(model, path, input_shapes={"x": "1x128x1x[n=8:400:8]"}, typical_shapes={"x": [1, 128, 1, 160]})
    b = read(path)[0]
    zt = [json.loads(text(s.kind.params))["zt"] for s in b.plan.steps if text(s.variant) == "conv2d.blocked"]
    assert len(zt) == 1 and 8 % zt[0], zt  # a tile that does not divide every row
    sess = coldbrew.load(path)
    for width in (8, 48, 160, 392, 400):
        f = {"x": rng.standard_normal((1, 128, 1, width)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_a_tensorflow_exporters_reverse_and_zero_state_over_a_batch_sized_at_run_time(tmp_path):
    """What a TensorFlow exporter writes around a bidirectional LSTM, over a
    batch set at run time: ReverseSequence whose lengths are the whole
    sequence expanded to the batch (Expand(Gather(Shape(x), time),
    Gather(Shape(x), batch))), one reversing Slice at every batch; and a
    zero state Expand(0, [batch, 4]) whose shape goes through int32
    (Cast, Slice, Concat, Cast back), read from x's own axis so the
    importer keeps it a shape. Matches onnxruntime at three batches."""
    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [i64("t_axis", [0]), i64("b_axis", [1]), i64("one", [1]), i64("two", [2]),
             numpy_helper.from_array(np.array([4], np.int32), "four"),
             numpy_helper.from_array(np.zeros([1], np.float32), "zero")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "t_axis"], ["steps"], axis=0),
             helper.make_node("Gather", ["s", "b_axis"], ["batch"], axis=0),
             helper.make_node("Expand", ["steps", "batch"], ["lens"]),
             helper.make_node("ReverseSequence", ["x", "lens"], ["r"], batch_axis=1, time_axis=0),
             helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
             helper.make_node("Slice", ["s32", "one", "two"], ["b32"]),
             helper.make_node("Concat", ["b32", "four"], ["shape32"], axis=0),
             helper.make_node("Cast", ["shape32"], ["shape"], to=TensorProto.INT64),
             helper.make_node("Expand", ["zero", "shape"], ["state"]),
             helper.make_node("Add", ["r", "state"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "tf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, "b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, "b", 4])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "tf.brew")
    compile_model(model, path, input_shapes={"x": "5x[b=1:12]x4"}, typical_shapes={"x": [5, 3, 4]})
    sess = coldbrew.load(path)
    for b in (1, 3, 12):
        f = {"x": np.random.default_rng(b).standard_normal((5, b, 4)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


@pytest.mark.parametrize("quantized", [False, True])
def test_a_batch_of_fixed_sequences_sized_at_run_time_runs_the_dense_variants(tmp_path, quantized):
    """x [b, 40, 64] with b set at run time through a MatMul: the rows taken
    flat (b outermost) on dense.packed_gemm, or on dense.int8_dot where x
    and the weights are 8-bit (a QDQ model's projections, an audio
    transformer's); every batch matches onnxruntime (a kernel that took
    the rows of one batch entry only left the others unwritten)."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    inits, nodes = [], [helper.make_node("MatMul", ["xq", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    if quantized:
        inits = [numpy_helper.from_array(np.round(w * 20).clip(-127, 127).astype(np.int8), "w8"),
                 numpy_helper.from_array(np.array(0.05, np.float32), "ws"),
                 numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
                 numpy_helper.from_array(np.array(128, np.uint8), "xz")]
        nodes = [helper.make_node("DequantizeLinear", ["w8", "ws"], ["w"]),
                 helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x8"]),
                 helper.make_node("DequantizeLinear", ["x8", "xs", "xz"], ["xq"])] + nodes
    else:
        inits = [numpy_helper.from_array(w, "w")]
        nodes = [helper.make_node("Identity", ["x"], ["xq"])] + nodes
    model = helper.make_model(helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 40, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 40, 48])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "rows.brew")
    compile_model(model, path, input_shapes={"x": "[1:6]x40x64"}, typical_shapes={"x": [1, 40, 64]})
    from coldbrew.targets import resolve

    vector = resolve("host").vector
    integer = "dense.int8_dot" if vector.int8_dot else "dense.pair_dot" if vector.isa in ("avx2", "avx512") else ""
    want = integer if quantized and integer else "dense.packed_gemm"
    assert want in [text(s.variant) for s in read(path)[0].plan.steps]
    sess = coldbrew.load(path)
    for b in (1, 2, 5):
        f = {"x": rng.standard_normal((b, 40, 64)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))



@pytest.mark.parametrize("one_d", [False, True])
def test_a_convolution_over_a_batch_sized_at_run_time_runs_blocked(tmp_path, one_d):
    """A Conv (2-D, or 1-D as the 2-D one over a height of 1) over a batch
    set at run time: blocked (conv2d.blocked, the batch a loop of its
    kernel), not the generic schedule (an audio transformer's stem ran 4x
    slower so); every batch matches onnxruntime."""
    rng = np.random.default_rng(9)
    x_dims = ["b", 16, 50] if one_d else ["b", 16, 12, 20]
    w = numpy_helper.from_array((rng.standard_normal((32, 16, 3) if one_d else (32, 16, 3, 3)) * 0.2)
                                .astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1] * (1 if one_d else 2)),
             helper.make_node("Relu", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 32] + x_dims[2:])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "batch.brew")
    compile_model(model, path, input_shapes={"x": "x".join(["[1:6]"] + [str(d) for d in x_dims[1:]])},
                  typical_shapes={"x": [1] + x_dims[1:]})
    assert "conv2d.blocked" in [text(s.variant) for s in read(path)[0].plan.steps]
    sess = coldbrew.load(path)
    for b in (1, 2, 5):
        f = {"x": rng.standard_normal([b] + x_dims[1:]).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_a_clip_between_convolutions_over_a_width_set_at_run_time_stays_blocked(tmp_path):
    """A hard swish (x * Clip(x + 3, 0, 6)) between two convolutions over a
    width set at run time: TVM legalizes each Clip half to a call of its
    maximum / minimum with the size's variable as an extra operand; it is
    still a Clip half (ir.relax.clip_half), so it runs on the blocked values,
    fused into the first convolution's layer as at a fixed width (it was a
    layer of its own that unblocked and re-blocked them); every width
    matches onnxruntime."""
    rng = np.random.default_rng(12)
    f32 = lambda n, v: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    inits = [f32("w0", rng.standard_normal((16, 8, 3, 3)) * 0.2), f32("w1", rng.standard_normal((16, 16, 1, 1)) * 0.2),
             f32("three", 3.0), f32("zero", 0.0), f32("six", 6.0)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["k"]),
             helper.make_node("Mul", ["c", "k"], ["h"]), helper.make_node("Conv", ["h", "w1"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "hardswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, "w"])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "hardswish.brew")
    compile_model(model, path, input_shapes={"x": "1x8x6x[8:64:8]"}, typical_shapes={"x": [1, 8, 6, 16]})
    names = [text(layer.op) for layer in read(path)[0].layers]
    assert [n for n in names if "maximum" in n] == [n for n in names if n.startswith("cb0_blocked")], names
    sess = coldbrew.load(path)
    for w in (8, 24, 64):
        f = {"x": rng.standard_normal((1, 8, 6, w)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


@pytest.mark.parametrize("op", ["conv", "depthwise", "strided"])
def test_a_row_of_a_multiple_of_a_size_padded_to_whole_tiles_keeps_the_epilogue_on_the_tiles(tmp_path, monkeypatch, op):
    """A blocked convolution (or depthwise, or one of stride 2) over rows
    of 4 * W (2 * W) columns (a width declared in steps of 4) whose
    register tile, 6 columns, divides no such row: the row is padded to
    whole tiles, as two axes, tiles x 6, which TVM proves cover the row,
    so the bias and ReLU are computed per tile from the tile in registers
    (as one axis of ceil(W * 4 / 6) * 6 columns, not proved to cover the
    row, they were a pass of their own over the whole output); the pad
    stage is made wide enough for the padded row, so no tap reads through
    a min (conv_blocked._padded); every width matches onnxruntime."""
    from coldbrew.compiler.passes import select_variants

    chosen = select_variants._whole_tiles
    monkeypatch.setattr(select_variants, "_whole_tiles", lambda variant, spec, exact, params: (
        {**params, "zt": 6, **({"kvb": 1} if "kvb" in params else {})} if exact is not None and "zt" in params
        else chosen(variant, spec, exact, params)))
    rng = np.random.default_rng(13)
    c, groups = 32, (32 if op == "depthwise" else 1)
    weights = [numpy_helper.from_array((rng.standard_normal((c, c // groups, 3, 3)) * 0.2).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=groups,
                              strides=[1, 2 if op == "strided" else 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "tiles", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 5, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 5, None])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "tiles.brew")
    tir = _scheduled(model, path, tmp_path, "1x%dx5x[8:64:4]" % c, [1, c, 5, 24])
    relu = tir[tir.index('sblock("compute")'):]
    assert "T.reads(cb_anchor[" in relu[:relu.index("T.writes")], relu[:800]
    taps = tir[tir.index('sblock("cb_anchor_update")'):]
    assert "T.min(" not in taps[:taps.index("T.writes")], taps[:800]
    sess = coldbrew.load(path)
    for w in (8, 28, 64):  # rows 8, 28, 64 wide (none a multiple of 6; 4, 14, 32 at stride 2)
        f = {"x": rng.standard_normal((1, c, 5, w)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_a_depth_to_space_over_sizes_set_at_run_time_is_one_pass_fused_with_what_follows(tmp_path, mode):
    """DepthToSpace (a transposed convolution's phases interleaved, a pixel
    shuffle) over rows and columns set at run time: one injective kernel
    (import_relax._depth_to_space) fused with the bias and ReLU after it,
    not the reshape, transpose and reshape the importer writes, which stay
    apart over such sizes (three passes over memory); every size matches
    onnxruntime."""
    rng = np.random.default_rng(14)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["c"], ["d"], blocksize=2, mode=mode),
             helper.make_node("Add", ["d", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    inits = [numpy_helper.from_array((rng.standard_normal((32, 8, 3, 3)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "b")]
    model = helper.make_model(helper.make_graph(
        nodes, "d2s", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, "h2", "w2"])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = str(tmp_path / "d2s.brew")
    compile_model(model, path, input_shapes={"x": "1x8x[4:32]x[4:32]"}, typical_shapes={"x": [1, 8, 16, 16]})
    names = [text(layer.op) for layer in read(path)[0].layers]
    assert not [n for n in names if "reshape" in n or "transpose" in n], names
    assert [n for n in names if "depth_to_space" in n and "relu" in n.replace("maximum", "relu")], names
    sess = coldbrew.load(path)
    for h, w in ((4, 4), (9, 17), (32, 30)):
        f = {"x": rng.standard_normal((1, 8, h, w)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


@pytest.mark.parametrize("stride, kernel, pads", [(8, 16, [4, 4]), (2, 4, [1, 1]), (3, 7, [2, 1])])
def test_a_vocoders_upsampling_over_a_length_set_at_run_time_runs_blocked(tmp_path, stride, kernel, pads):
    """A HiFi-GAN block over frames whose count is set at run time: a 1-D
    ConvTranspose (1 x s as 2-D) runs blocked, as its phases' conv and one
    kernel that interleaves the phases and crops the pads
    (import_relax._conv_transpose), not on the generic schedule (a Piper
    voice's decoder: 7.0 -> 4.1 s); the dilated 1-D Conv after it runs
    blocked too, as the 2-D one over a height of one (conv1d_as_2d);
    every length matches onnxruntime."""
    rng = np.random.default_rng(15)
    nodes = [helper.make_node("ConvTranspose", ["x", "wt", "bt"], ["u"], strides=[stride], pads=pads,
                              kernel_shape=[kernel]),
             helper.make_node("LeakyRelu", ["u"], ["r"], alpha=0.1),
             helper.make_node("Conv", ["r", "wd", "bd"], ["c"], dilations=[3], pads=[3, 3], kernel_shape=[3]),
             helper.make_node("Add", ["c", "u"], ["y"])]
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, kernel)) * 0.2).astype(np.float32), "wt"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bt"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 3)) * 0.2).astype(np.float32), "wd"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bd")]
    model = helper.make_model(helper.make_graph(
        nodes, "vocoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, "t2"])], inits),
        opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    path = str(tmp_path / "vocoder.brew")
    compile_model(model, path, input_shapes={"x": "1x32x[1:400]"}, typical_shapes={"x": [1, 32, 89]})
    b = read(path)[0]
    ops, variants = [text(layer.op) for layer in b.layers], [text(s.variant) for s in b.plan.steps]
    assert variants.count("conv2d.blocked") == 2 and not [op for op in ops if "transpose" in op], ops
    assert len([op for op in ops if "phase_shuffle" in op]) == 1, ops
    assert not [op for op in ops if op.startswith(("strided", "reshape", "transpose"))], ops  # no crop, no shuffle apart
    sess = coldbrew.load(path)
    for t in (1, 89, 400):
        f = {"x": rng.standard_normal((1, 32, t)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


@pytest.mark.parametrize("end", [1000000000, 2 ** 63 - 1])
def test_a_convolution_over_an_exporters_bounded_batch_runs_blocked(tmp_path, end):
    """A batch sliced [0:1000000000] (a JAX exporter's full slice) or
    [0:INT64_MAX] (PyTorch's): the slice keeps the whole batch at every
    declared size, so it is dropped (onnx/shapes.py _whole_axes; imported,
    the batch's extent was min(end, b), which kept the convolution off the
    blocked variants); every batch matches onnxruntime."""
    rng = np.random.default_rng(10)
    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [i64("zero", [0]), i64("big", [end]),
             numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32), "w")]
    nodes = [helper.make_node("Slice", ["x", "zero", "big", "zero"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = helper.make_model(helper.make_graph(
        nodes, "bounded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 32, 8, 8])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "bounded.brew")
    compile_model(model, path, input_shapes={"x": "[1:6]x16x8x8"}, typical_shapes={"x": [1, 16, 8, 8]})
    assert "conv2d.blocked" in [text(s.variant) for s in read(path)[0].plan.steps]
    sess = coldbrew.load(path)
    for b in (1, 4):
        f = {"x": rng.standard_normal((b, 16, 8, 8)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def test_ifs_that_a_size_decides_at_every_size_fold_to_their_branch(tmp_path):
    """A PyTorch RNN's tests of its input's rank (Size of a Shape) and of a
    fixed axis (Shape[-1] == 1), over a batch set at run time: each holds at
    every size, so its If is folded to the branch taken (legalize_onnx
    _fold_sizes), though the branches differ in rank (no select can join
    them); every batch matches onnxruntime."""
    def branch(node, out, rank):
        return helper.make_graph([node], out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [None] * rank)])

    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [i64("last", [-1]), i64("one", [1]), i64("three", 3), i64("axis", [2])]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["s"], ["rank"]),
             helper.make_node("Equal", ["rank", "three"], ["is3"]),
             helper.make_node("If", ["is3"], ["r"], then_branch=branch(helper.make_node("Relu", ["x"], ["t"]), "t", 3),
                              else_branch=branch(helper.make_node("Neg", ["x"], ["e"]), "e", 3)),
             helper.make_node("Shape", ["r"], ["s2"]), helper.make_node("Gather", ["s2", "last"], ["w"], axis=0),
             helper.make_node("Equal", ["w", "one"], ["unit"]),
             helper.make_node("If", ["unit"], ["y"], then_branch=branch(
                 helper.make_node("Squeeze", ["r", "axis"], ["q"]), "q", 2), else_branch=branch(
                 helper.make_node("Identity", ["r"], ["i"]), "i", 3))]
    model = helper.make_model(helper.make_graph(
        nodes, "ifs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "ifs.brew")
    compile_model(model, path, input_shapes={"x": "[b=1:16]x4x1"})
    sess = coldbrew.load(path)
    for b in (1, 3, 16):
        f = {"x": np.random.default_rng(b).standard_normal((b, 4, 1)).astype(np.float32)}
        got, want = sess.run(None, f), ort_run(model, f)
        assert got[0].shape == (b, 4)
        assert_close(got, want)


@pytest.mark.parametrize("initial", [True, False])
def test_an_lstm_over_a_batch_sized_at_run_time_is_unrolled_over_its_fixed_steps(tmp_path, initial):
    """A VAD's LSTM: one step (or a few) over a batch set at run time. The
    cell kernel takes a fixed batch, so the cell is unrolled (onnx/recurrent.py:
    zero initial states broadcast, outputs given their leading axes by
    Unsqueeze); every batch matches onnxruntime, Y, Y_h and Y_c."""
    rng = np.random.default_rng(12)
    seq, hidden, size = 2, 8, 6
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name) for name, shape in
             (("W", (1, 4 * hidden, size)), ("R", (1, 4 * hidden, hidden)), ("B", (1, 8 * hidden)))]
    states = ["h0", "c0"] if initial else ["", ""]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B", ""] + states, ["Y", "Y_h", "Y_c"], hidden_size=hidden)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, "b", size])] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "b", hidden]) for n in states if n]
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [seq, 1, "b", hidden])] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "b", hidden]) for n in ("Y_h", "Y_c")]
    model = helper.make_model(helper.make_graph(nodes, "lstm", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path = str(tmp_path / "lstm.brew")
    ranges = {"x": f"{seq}x[b=1:16]x{size}", **{n: f"1xbx{hidden}" for n in states if n}}
    compile_model(model, path, input_shapes=ranges)
    assert not any(text(s.variant).startswith("recurrent.") for s in read(path)[0].plan.steps)
    sess = coldbrew.load(path)
    for b in (1, 5, 16):
        f = {i.name: rng.standard_normal([b if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
        got, want = sess.run(None, f), ort_run(model, f)
        assert [g.shape for g in got] == [w.shape for w in want]
        assert_close(got, want)


def _reflected_conv1d(rng):
    """A 1-D convolution over a length set at run time after a reflection
    pad written as slices (x[1:4] reversed, then x): as exporters write it
    (silero VAD's front end)."""
    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [i64("one", [1]), i64("four", [4]), i64("two", [2]), i64("last", [-1]), i64("first", [-2 ** 63]),
             numpy_helper.from_array((rng.standard_normal((24, 16, 3)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b")]
    nodes = [helper.make_node("Slice", ["x", "one", "four", "two"], ["edge"]),
             helper.make_node("Slice", ["edge", "last", "first", "two", "last"], ["mirror"]),
             helper.make_node("Concat", ["mirror", "x"], ["padded"], axis=2),
             helper.make_node("Conv", ["padded", "w", "b"], ["c"], kernel_shape=[3], pads=[0, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "reflected", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, "t2"])], inits),
        opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("declared, lengths, blocked", [("1x16x[8:300]", (8, 37, 300), True),
                                                        ("1x16x[2:300]", (2, 3, 4, 37, 300), False)])
def test_a_slice_within_its_axis_at_every_declared_length_keeps_its_extent_exact(tmp_path, declared, lengths,
                                                                                   blocked):
    """A slice by constants of an axis set at run time whose bounds lie
    within the axis at every declared size has extent end - start
    (import_relax._slice_within), not min(4, t) - min(1, t), so the 1-D
    convolution after it runs blocked as the 2-D one over a height of one
    (conv1d_as_2d: silero VAD's front end, an STFT's convolutions: 2 ms ->
    0.3 ms). Where a declared length is shorter than the slice (t = 2 in
    [2:300]), the extent keeps its clamps and the convolution takes the
    generic schedule (select_variants: TVM's buffer compaction
    under-allocates blocked rows of such extents). Every length matches
    onnxruntime."""
    rng = np.random.default_rng(16)
    model = _reflected_conv1d(rng)
    path = str(tmp_path / "reflected.brew")
    compile_model(model, path, input_shapes={"x": declared}, typical_shapes={"x": [1, 16, 37]})
    b = read(path)[0]
    variants = [text(s.variant) for s in b.plan.steps]
    assert ("conv2d.blocked" in variants) == blocked, variants
    sess = coldbrew.load(path)
    for t in lengths:
        f = {"x": rng.standard_normal((1, 16, t)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def _relative_positions(rng):
    """A VITS encoder's relative positions over a length T set at run time:
    embeddings padded by T - 5 on each side (PyTorch's F.pad, its pads
    reshaped to [-1, 2], reversed, transposed and flattened; negative below
    T = 5, a crop), sliced to [0, 2T - 1) by a computed end, and scores
    sliced from T - 1 by a computed start; a reshape to a shape with an
    empty part (x.shape[3:] of a rank 3)."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal((1, 9, 4)).astype(np.float32), "emb"),
             i64("two", 2), i64("five", 5), i64("one", 1), i64("zero1", [0]), i64("ax0", [0]), i64("pairs", [-1, 2]),
             i64("last", [-1]), i64("first", [-2 ** 63 + 1]), i64("flat", [-1]), i64("big", [2 ** 63 - 1]),
             i64("ax1", [1]), i64("ax2", [2]), i64("three", [3]), i64("zero", [0])]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "two"], ["t"], axis=0),
        helper.make_node("Sub", ["t", "five"], ["t5"]), helper.make_node("Unsqueeze", ["t5", "ax0"], ["t5v"]),
        helper.make_node("Concat", ["zero1", "zero1", "t5v", "t5v", "zero1", "zero1"], ["p6"], axis=0),
        helper.make_node("Reshape", ["p6", "pairs"], ["p32"]),
        helper.make_node("Slice", ["p32", "last", "first", "ax0", "last"], ["p32r"]),
        helper.make_node("Transpose", ["p32r"], ["p23"], perm=[1, 0]),
        helper.make_node("Reshape", ["p23", "flat"], ["pads"]),
        helper.make_node("Pad", ["emb", "pads"], ["padded"], mode="constant"),
        helper.make_node("Mul", ["t", "two"], ["t2"]), helper.make_node("Sub", ["t2", "one"], ["t21"]),
        helper.make_node("Unsqueeze", ["t21", "ax0"], ["end"]),
        helper.make_node("Slice", ["padded", "zero", "end", "ax1"], ["rel"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["rel"], ["relt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["xt", "relt"], ["scores"]),
        helper.make_node("Sub", ["t", "one"], ["t1"]), helper.make_node("Unsqueeze", ["t1", "ax0"], ["start"]),
        helper.make_node("Slice", ["scores", "start", "big", "ax2"], ["z"]),
        helper.make_node("Shape", ["z"], ["zs"]), helper.make_node("Slice", ["zs", "zero", "three"], ["head"]),
        helper.make_node("Slice", ["zs", "three", "big"], ["tail"]),
        helper.make_node("Concat", ["head", "tail"], ["zshape"], axis=0),
        helper.make_node("Reshape", ["z", "zshape"], ["y"])]
    graph = helper.make_graph(nodes, "relative", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", "T"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_pads_and_slices_by_sizes_follow_the_length_set_at_run_time(tmp_path):
    """Relative positions over a length set at run time (a VITS voice over
    its phoneme count): a Pad whose widths are sizes (onnx/shapes.py
    _sizes_of_values, import_relax._pad_by_sizes; T - 5 is negative for
    T < 5, a crop), Slices whose bounds are sizes (not the data's:
    ops.of_shapes; proved within their axes, import_relax._slice_within)
    and a shape with an empty part. One bundle matches onnxruntime at
    every length, cropped and padded."""
    rng = np.random.default_rng(81)
    model = _relative_positions(rng)
    path = str(tmp_path / "relative.brew")
    compile_model(model, path, input_shapes={"x": "1x4x[3:40]"}, typical_shapes={"x": [1, 4, 12]})
    counted = [text(t.name) for t in read(path)[0].tensors if t.bounds is not None and t.bounds.count >= 0]
    assert not counted, counted  # sized by T, not by the data
    sess = coldbrew.load(path)
    for t in (3, 4, 5, 12, 40):
        f = {"x": rng.standard_normal((1, 4, t)).astype(np.float32)}
        out = sess.run(None, f)
        assert out[0].shape == (1, t, t)
        assert_close(out, ort_run(model, f))


def test_one_kernel_called_over_two_sizes_has_a_contract_for_each(tmp_path):
    """TVM merges kernels equal but for their size variables' names (the
    same epilogue over two inputs' lengths); each binding of the variables
    is a symbol of its own (extract_layers symbol_for), so the runtime's
    check of each call against its kernel's largest bytes holds for both."""
    nodes = [helper.make_node("Relu", [n], [f"{n}r"]) for n in ("a", "b")]
    nodes += [helper.make_node("Mul", [f"{n}r", "k"], [f"{n}y"]) for n in ("a", "b")]
    graph = helper.make_graph(nodes, "twice", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, "A"]),
                                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, "B"])],
                              [helper.make_tensor_value_info(f"{n}y", TensorProto.FLOAT, [1, 8, n.upper()]) for n in ("a", "b")],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "twice.brew")
    compile_model(model, path, input_shapes={"a": "1x8x[1:20]", "b": "1x8x[1:50]"})
    kernels = {text(s.kind.kernel) for s in read(path)[0].plan.steps}
    assert len(kernels) == 2, kernels
    sess, rng = coldbrew.load(path), np.random.default_rng(2)
    for ta, tb in ((20, 50), (3, 41)):
        f = {"a": rng.standard_normal((1, 8, ta)).astype(np.float32), "b": rng.standard_normal((1, 8, tb)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))


def _batched_decoder(rows=5, span=1):
    """A table-structure decoder over a batch N set at run time: its state
    zeros of [N, 4] (a ConstantOfShape of the batch of a feature resized to
    sizes and reshaped, read as a PaddlePaddle exporter does: Shape, Cast,
    Gather, Reshape to [1], which ONNX's inference does not follow; the
    body reads that feature too), each step's row a Slice
    at the step that keeps the batch axis whole, its end Min(the input's
    fixed length, step + span) (a Gather of a Shape whose batch is set at
    run time); each step's output written into row `step` of a buffer that
    starts as a scalar the body never reads and becomes [N, rows, 4], at
    places a Tile repeats over the batch; it stops where the state's sum
    passes `thr` or at `rows`; the output the buffer's first `count` rows."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    F, B = TensorProto.FLOAT, TensorProto.BOOL
    body_nodes = [
        helper.make_node("Reshape", ["step_in", "one"], ["s1"]), helper.make_node("Add", ["s1", "span"], ["s2"]),
        helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Gather", ["xs", "one"], ["xlen"], axis=0),
        helper.make_node("Min", ["xlen", "s2"], ["s_end"]),
        helper.make_node("Slice", ["x", "s1", "s_end", "one"], ["row"]),  # [N, span, 4]
        helper.make_node("ReduceSum", ["row", "one"], ["rsum"], keepdims=0),  # [N, 4]
        helper.make_node("ReduceMean", ["feat"], ["f_mean"], axes=[2], keepdims=0),  # [N, 12]
        helper.make_node("Slice", ["f_mean", "zero", "four", "one"], ["f4"]),
        helper.make_node("Add", ["rsum", "f4"], ["r_pre"]),
        helper.make_node("Abs", ["r_pre"], ["h_pre"]), helper.make_node("Add", ["h_in", "h_pre"], ["h_out"]),
        helper.make_node("Unsqueeze", ["h_out", "one"], ["h_row"]),  # [N, 1, 4]
        helper.make_node("Reshape", ["s1", "idx_shape"], ["s_b"]),  # [1, 1, 1]
        helper.make_node("Shape", ["h_row"], ["hs"]), helper.make_node("Slice", ["hs", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "one", "four"], ["reps"], axis=0),
        helper.make_node("Tile", ["s_b", "reps"], ["where"]),  # [N, 1, 4]
        helper.make_node("Shape", ["x"], ["xs2"]), helper.make_node("Slice", ["xs2", "zero", "one"], ["n2"]),
        helper.make_node("Concat", ["n2", "rows1", "four"], ["bshape"], axis=0),
        helper.make_node("ConstantOfShape", ["bshape"], ["buf_zero"], value=numpy_helper.from_array(
            np.zeros(1, np.float32))),
        helper.make_node("ScatterElements", ["buf_zero", "where", "h_row"], ["buf_out"], axis=1),
        helper.make_node("Add", ["step_in", "one_s"], ["step_out"]),
        helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
        helper.make_node("Less", ["tot", "thr"], ["go"]), helper.make_node("Less", ["step_out", "rows"], ["room"]),
        helper.make_node("And", ["go", "room"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("it", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("step_in", TensorProto.INT64, []), helper.make_tensor_value_info("h_in", F, None),
         helper.make_tensor_value_info("buf_in", F, None)],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("step_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("h_out", F, None), helper.make_tensor_value_info("buf_out", F, None)],
        [i64("one_s", 1), i64("one", [1]), i64("zero", [0]), i64("span", [span]), i64("rows", rows),
         i64("rows1", [rows]), i64("four", [4]), i64("idx_shape", [1, 1, 1])])
    nodes = [helper.make_node("Unsqueeze", ["x", "o_one"], ["xu"]),  # [N, 1, 6, 4] resized to [N, 1, 12, 8]
             helper.make_node("Shape", ["xu"], ["xu_shape"]),
             helper.make_node("Slice", ["xu_shape", "o_zero", "o_two"], ["nc2"]),
             helper.make_node("Reshape", ["nc2", "o_two"], ["nc"]),  # (which ONNX's inference does not follow)
             helper.make_node("Concat", ["nc", "o_plane"], ["sizes"], axis=0),
             helper.make_node("Resize", ["xu", "", "", "sizes"], ["xr"], mode="nearest"),
             helper.make_node("Reshape", ["xr", "o_rows"], ["feat"]),  # [N, 12, 8]
             helper.make_node("Shape", ["feat"], ["f_shape"]),  # a PaddlePaddle exporter's [N] of it:
             helper.make_node("Cast", ["f_shape"], ["f_shape64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["f_shape64", "o_at0"], ["batch0"], axis=0),
             helper.make_node("Reshape", ["batch0", "o_one"], ["batch"]),
             helper.make_node("Concat", ["batch", "o_four"], ["hshape"], axis=0),
             helper.make_node("ConstantOfShape", ["hshape"], ["h0"], value=numpy_helper.from_array(
                 np.zeros(1, np.float32))),
             helper.make_node("Loop", ["M", "c0", "step0", "h0", "buf0"], ["steps", "h_end", "buf"], name="dec",
                              body=body),
             helper.make_node("Reshape", ["steps", "o_one"], ["end"]),
             helper.make_node("Slice", ["buf", "o_zero", "end", "o_one"], ["out"])]
    inits = [i64("M", 100), numpy_helper.from_array(np.array(True), "c0"), i64("step0", 0),
             numpy_helper.from_array(np.array(0, np.float32), "buf0"), i64("o_zero", [0]), i64("o_one", [1]),
             i64("o_two", [2]), i64("o_four", [4]), i64("o_plane", [12, 8]), i64("o_rows", [0, 12, -1]), i64("o_at0", 0)]
    g = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", F, ["N", rows + span, 4]),
                                             helper.make_tensor_value_info("thr", F, [])],
                          [helper.make_tensor_value_info("out", F, ["N", None, 4]),
                           helper.make_tensor_value_info("h_end", F, ["N", 4]),
                           helper.make_tensor_value_info("feat", F, ["N", 12, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_decoder_the_data_stops_runs_as_one_body_over_a_batch_set_at_run_time(tmp_path):
    """The loop runs as the runtime's loop at every batch: its state's
    sizes named where ONNX's inference loses them (a ConstantOfShape of
    sizes: onnx/shapes.py _sized_by, _shape_from_dims), its buffer's first
    zeros of a shape set at run time (onnx/loops.py _zeros_of), its step's
    row a slice that keeps the batch axis whole (_sliced_at), its end
    folded from the input's fixed length (fold._fixed_sizes), a Tile over
    the batch an Expand (shapes._tile_by_sizes); the counted sizes are not
    taken for the input's (runtime exec/shapes.c)."""
    model = _batched_decoder()
    path = str(tmp_path / "decoder.brew")
    compile_model(model, path, input_shapes={"x": "[1:4]x6x4"}, typical_shapes={"x": [1, 6, 4]})
    assert len(read(path)[0].plan.loops) == 1
    sess, rng = coldbrew.load(path), np.random.default_rng(82)
    lengths = set()
    for n in (1, 2, 4):
        for thr in (0.0, 9.0 * n, 100.0 * n):
            f = {"x": rng.standard_normal((n, 6, 4)).astype(np.float32), "thr": np.array(thr, np.float32)}
            got = sess.run(None, f)
            assert_close(got, ort_run(model, f))
            lengths.add(got[0].shape[1])
    assert len(lengths) > 1, lengths


def test_a_resize_to_sizes_over_a_batch_set_at_run_time_resizes_by_their_scales(tmp_path):
    """Sizes [N, C, 8, 12] read from the input's shape: the batch and
    channels kept, the plane resized by the scales those sizes imply
    (onnx/shapes.py _resize_scales; the importer takes no shape beside
    constants)."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Slice", ["xs", "zero", "two"], ["nc"]),
             helper.make_node("Concat", ["nc", "plane"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
             helper.make_node("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 6])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3, 8, 12])],
                          [i64("zero", [0]), i64("two", [2]), i64("plane", [8, 12])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "resize.brew")
    compile_model(model, path, input_shapes={"x": "[1:5]x3x5x6"})
    sess, rng = coldbrew.load(path), np.random.default_rng(83)
    for n in (1, 3, 5):
        f = {"x": rng.standard_normal((n, 3, 5, 6)).astype(np.float32)}
        assert_close(sess.run(None, f), ort_run(model, f))
