"""Shapes set at run time (schema 5; runtime/src/bundle/program.c,
runtime/src/exec/shapes.c): a bundle compiled with an input range runs at
every shape of it and matches onnxruntime; inputs that share a dim follow
each other; refused shapes name the input, the axis and the range and
change nothing; the C API under ASan + UBSan (tests/runtime/c/shapes.c).
A bundle's dims and shape programs are verified at open: malformed
programs and ranges, a program whose largest value is not its tensor's
shape, dims in a GPU or schema-4 bundle are CORRUPT, naming the tensor
(each made by editing the header of a compiled bundle)."""
import os
import struct
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.tools.cli import main
from coldbrew.schemas.generated import bundle_generated as fb

END, ADD, SUB, MUL, FLOORDIV, FLOORMOD, MIN, MAX, DIM, NEG = range(-1, -11, -1)
X, Z, B, N, Y = range(5)  # the bundle's tensors: inputs x and z, weight b, dim n, output y


def shared_dim_model():
    """y = (relu(x) + z) * b, x and z of shape [1, n, 3]."""
    b = numpy_helper.from_array(np.array([0.5, 2, -1], np.float32), "b")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["y"])]
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, "n", 3]) for v in "xzy"]
    m = helper.make_model(helper.make_graph(nodes, "shared_dim", io[:2], io[2:], [b]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def model():
    return shared_dim_model()


@pytest.fixture(scope="module")
def bundle(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("shapes") / "shared.brew"
    compile_model(model, str(path), input_shapes={"x": "1x[n=2:40:2]x3", "z": "1xnx3"},
                  typical_shapes={"x": [1, 10, 3]})
    return str(path)


def feeds(n, seed=0):
    rng = np.random.default_rng(seed + n)
    return {k: rng.standard_normal((1, n, 3)).astype(np.float32) for k in "xz"}


def test_the_bundle_is_the_one_these_tests_edit(bundle):
    b = header(open(bundle, "rb").read())
    assert b.schemaVersion == 5
    assert [(t.name, t.kind) for t in b.tensors] == [(b"x", fb.TensorKind.input), (b"z", fb.TensorKind.input),
                                                      (b"w2", fb.TensorKind.weight), (b"n", fb.TensorKind.dim),
                                                      (b"y", fb.TensorKind.output)]
    r = b.tensors[N].bounds
    assert (r.min, r.max, r.step, r.typical, r.input, r.axis) == (2, 40, 2, 10, 0, 1)
    assert list(b.tensors[Y].shapeProgram) == [1, END, 2, DIM, N, MUL, END, 3, END]


def test_every_shape_in_range_runs_and_matches_onnxruntime(model, bundle):
    sess = coldbrew.load(bundle)
    (x, z), (y,) = sess.get_inputs(), sess.get_outputs()
    assert (x.shape, z.shape, y.shape) == ([1, 40, 3], [1, 40, 3], [1, 40, 3])  # the largest: memory's plan
    assert x.ranges == z.ranges == [(1, 1, 1), (2, 40, 2), (3, 3, 1)]
    for n in (10, 2, 40, 18, 18, 4):
        f = feeds(n)
        (out,) = sess.run(None, f)
        assert out.shape == (1, n, 3)
        np.testing.assert_array_equal(out, ort_run(model, f)[0])


def test_refused_shapes_name_the_input_axis_and_range_and_change_nothing(model, bundle):
    sess = coldbrew.load(bundle)
    sess.run(None, feeds(6))
    for shapes, message in [(((1, 42, 3), (1, 42, 3)), "input 'x' axis 1 is 42: the bundle takes 2..40 in steps of 2"),
                            (((1, 7, 3), (1, 7, 3)), "input 'x' axis 1 is 7: the bundle takes 2..40 in steps of 2"),
                            (((1, 8, 3), (1, 6, 3)), "input 'z' axis 1 is 6: the bundle takes 8 there"),
                            (((2, 8, 3), (2, 8, 3)), "input 'x' axis 0 is 2: the bundle takes 1 there"),
                            (((1, 8), (1, 8)), "input 'x' has 3 axes, not 2")]:
        with pytest.raises(coldbrew.BundleError, match=message) as e:
            sess.run(None, {k: np.zeros(s, np.float32) for k, s in zip("xz", shapes)})
        assert e.value.status == "INVALID_ARGUMENT"
    f = feeds(8)  # x's shape was set before z's was refused: the run sets both again
    np.testing.assert_array_equal(sess.run(None, f)[0], ort_run(model, f)[0])


def test_the_c_api_under_sanitizers(bundle, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "runtime"))
    import build

    flags = build.SANITIZERS["asan"]
    build.build(str(tmp_path), "clang", "clang++", flags=flags)
    program = build.build_program(os.path.join(ROOT, "tests", "runtime", "c", "shapes.c"), str(tmp_path), "clang",
                                  flags)
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1"}
    r = subprocess.run([program, bundle], capture_output=True, text=True, timeout=300, env=env)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr[-4000:]


def test_coldbrew_run_takes_inputs_of_any_shape_in_range(bundle, tmp_path):
    for k, v in feeds(12).items():
        np.save(tmp_path / f"{k}.npy", v)
    args = ["run", bundle, "--warm", "--repeat", "1", "--input", f"x={tmp_path / 'x.npy'}",
            "--input", f"z={tmp_path / 'z.npy'}"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "output y float32[1, 12, 3]" in r.output, r.output
    np.save(tmp_path / "x.npy", np.zeros((1, 44, 3), np.float32))
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "input 'x' axis 1 is 44: the bundle takes 2..40 in steps of 2" in r.output


# --- the header's dims and programs verified: edited bundles ---

def header(data):
    off, size = struct.unpack_from("<IQ", data, 12)
    return fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[off:off + size]), 0))


def rewrite(data, mutate, version=None):
    """The bundle with its header changed by `mutate` (and the schema version
    in it and the preamble, if given); its segments move by whole pages
    where the header grew."""
    import flatbuffers

    b = header(data)
    mutate(b)
    if version:
        b.schemaVersion = version

    def pack():
        builder = flatbuffers.Builder(4096)
        builder.ForceDefaults(True)  # every scalar written: the size does not depend on the offsets
        builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
        return bytes(builder.Output())

    first = min(s.offset for s in b.segments)
    shift = -(-max(0, 64 + len(pack()) - first) // 4096) * 4096
    for s in b.segments:
        s.offset += shift
    hdr = pack()
    out = bytearray(data[:64]) + hdr + bytes(first + shift - 64 - len(hdr)) + data[first:]
    struct.pack_into("<QQQ", out, 16, len(hdr), checksum64(hdr), len(out))
    if version:
        struct.pack_into("<I", out, 8, version)
    return bytes(out)


def refused(data, message):
    """CORRUPT from the structural check and from an open, with `message`."""
    for check in (coldbrew.check_bundle, coldbrew.load):
        with pytest.raises(coldbrew.BundleError) as e:
            check(data)
        assert e.value.status == "CORRUPT" and message in str(e.value), str(e.value)


def program(t, words):
    def mutate(b):
        b.tensors[t].shapeProgram = words
    return mutate


def bounds(**fields):
    def mutate(b):
        for k, v in fields.items():
            setattr(b.tensors[N].bounds, k, v)
    return mutate


def test_a_rewritten_bundle_runs(model, bundle):
    """The edits' control: a header grown by more than a page (a long
    tools-only string) moves the segments, and the bundle runs as before."""
    data = rewrite(open(bundle, "rb").read(), lambda b: setattr(b.tensors[X], "source", "x" * 5000))
    assert len(data) >= len(open(bundle, "rb").read()) + 4096
    f = feeds(14)
    np.testing.assert_array_equal(coldbrew.load(data).run(None, f)[0], ort_run(model, f)[0])


def test_programs_evaluate_in_floor_arithmetic(model, bundle):
    """Programs any straight-line arithmetic of the dims: FLOORDIV and
    FLOORMOD round down (C's / and % truncate: -7 // 2 is -4, -7 % 5 is 3),
    a stack of 16 values is allowed; each accepted bundle runs."""
    data = open(bundle, "rb").read()
    sixteen = [1] + [0] * 15 + [ADD] * 15 + [END]
    for axis2 in ([0, 7, SUB, 5, FLOORMOD, END], [0, 7, SUB, 2, FLOORDIV, NEG, 1, SUB, END],
                  [DIM, N, 3, MIN, 1, 2, MAX, MUL, 3, SUB, END]):
        edited = rewrite(data, program(Y, sixteen + [2, DIM, N, MUL, END] + axis2))
        f = feeds(16)
        np.testing.assert_array_equal(coldbrew.load(edited).run(None, f)[0], ort_run(model, f)[0])


@pytest.mark.parametrize("words, why", [
    ([1, END, DIM, N, MUL, END, 3, END], "takes a value from an empty stack"),
    ([1, END, 2, DIM, N, MUL, END, 3], "does not end each axis with one value"),
    ([1, END, 2, DIM, N, MUL, END, 3, END, 1, END], "does not end each axis with one value"),
    ([1, 1, END, 2, DIM, N, MUL, END, 3, END], "does not end each axis with one value"),
    ([1] + [0] * 16 + [ADD] * 16 + [END, 2, DIM, N, MUL, END, 3, END], "is deeper than 16 values"),
    ([1, END, 2, DIM, X, MUL, END, 3, END], "names a tensor that is not a dim"),
    ([1, END, 2, DIM, 99, MUL, END, 3, END], "names a tensor that is not a dim"),
    ([1, END, 2, DIM], "names a tensor that is not a dim"),
    ([1, END, 2, DIM, N, -11, END, 3, END], "has an unknown word"),
    ([1, END, 2, DIM, N, MUL, END, 3, 0, FLOORDIV, END], "overflows or divides by zero"),
    ([1, END, 2, DIM, N, MUL, END, 3, 0, FLOORMOD, END], "overflows or divides by zero"),
    ([1, END, 2, DIM, N, MUL, END, 1 << 62, 4, MUL, END], "overflows or divides by zero"),
    ([1, END, 2, DIM, N, MUL, END, 0, 3, SUB, END], "gives a negative size"),
    ([1, END, 2, DIM, N, MUL, END, 4, END], "gives a larger shape than its own at the dims' largest values"),
    ([1, END, 4, DIM, N, MUL, END, 3, END], "gives a larger shape than its own at the dims' largest values"),
])
def test_malformed_programs_are_refused_naming_the_tensor(bundle, words, why):
    refused(rewrite(open(bundle, "rb").read(), program(Y, words)), f"tensor 4 ('y'): its shape program {why}")


def test_a_program_on_a_weight_is_refused(bundle):
    refused(rewrite(open(bundle, "rb").read(), program(B, [3, END])),
            "tensor 2 ('w2') has a shape program, which only inputs, outputs and intermediates have")


@pytest.mark.parametrize("fields", [dict(min=0, typical=2), dict(min=12), dict(step=0), dict(max=41),
                                    dict(max=38, min=3), dict(typical=42), dict(typical=11), dict(step=-2)])
def test_bad_ranges_are_refused_naming_the_dim(bundle, fields):
    refused(rewrite(open(bundle, "rb").read(), bounds(**fields)), "dim tensor 3 ('n') has an invalid range")


@pytest.mark.parametrize("fields", [dict(input=2), dict(input=0, axis=2), dict(axis=5), dict(step=1, min=1, max=39),
                                    dict(step=4, min=4, max=40, typical=12)])
def test_a_dim_carried_by_no_input_axis_is_refused(bundle, fields):
    refused(rewrite(open(bundle, "rb").read(), bounds(**fields)), "dim tensor 3 ('n') names input")


def test_a_dim_is_an_int64_of_no_bytes_and_only_dims_have_ranges(bundle):
    data = open(bundle, "rb").read()
    for field, value in [("shape", [1]), ("dtype", fb.DType.f32), ("nbytes", 8)]:
        refused(rewrite(data, lambda b: setattr(b.tensors[N], field, value)),
                "dim tensor 3 ('n') is not an int64 of shape [] and no bytes")
    refused(rewrite(data, lambda b: setattr(b.tensors[N], "bounds", None)), "tensor 3 ('n'): a dim tensor has a range")
    refused(rewrite(data, lambda b: setattr(b.tensors[X], "bounds", fb.RangeT())),
            "tensor 0 ('x'): a dim tensor has a range, no other tensor has one")


def test_dims_in_a_gpu_or_schema_4_bundle_are_refused(bundle):
    data = open(bundle, "rb").read()
    refused(rewrite(data, lambda b: setattr(b.target, "gpuClass", "vulkan")),
            "tensor 0 ('x') has a shape set at run time: GPU bundles have fixed shapes")
    refused(rewrite(data, lambda b: None, version=4), "tensor 0 ('x') has a shape set at run time: schema 4 has none")


def test_a_shape_larger_than_the_plan_at_a_smaller_dim_is_refused_when_set(model, bundle):
    """A program may give more bytes below the dims' max than at it (23 - n/2
    grows as n shrinks): the runtime refuses such a shape when it is set
    (or when the session starts at it), before any kernel runs."""
    data = open(bundle, "rb").read()
    grows = [1, END, 2, DIM, N, MUL, END, 23, DIM, N, SUB, END]  # 3 at n = 40; 480 bytes at most
    with pytest.raises(coldbrew.BundleError, match="tensor 'y' would need more than the 480 bytes"):
        coldbrew.load(rewrite(data, program(Y, grows)))  # n = 10 at the start: 20 x 18 x 4 bytes
    sess = coldbrew.load(rewrite(data, lambda b: (program(Y, grows)(b), bounds(typical=40)(b))))
    sess.run(None, feeds(40))
    with pytest.raises(coldbrew.BundleError, match="tensor 'y' would need more than the 480 bytes"):
        sess.run(None, feeds(20))
    f = feeds(40)
    np.testing.assert_array_equal(sess.run(None, f)[0], ort_run(model, f)[0])


def test_a_program_within_its_bound_at_the_largest_dims_is_accepted(bundle):
    """`shape` is the bound over every size, not the value at the dims' largest (a size that falls as a dim grows)."""
    coldbrew.check_bundle(rewrite(open(bundle, "rb").read(), program(Y, [1, END, DIM, N, END, 3, END])))
