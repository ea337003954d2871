"""bundle/ (runtime/src/bundle): opening a bundle from a file or memory and
what it says of itself (open.c); the file's layout in the order of need and
its reading, weights checked as they arrive (stream.c); the header's
verification (model.cc); the target check (target.c); signed bundles
(signature.c: `coldbrew keygen`, `coldbrew compile --sign KEY`,
`coldbrew.load(path, public_key=...)`). Hostile bundles get a clean error
(a BundleError with the right status), never a crash. With a key the
runtime refuses an unsigned bundle, one signed by another key, and one
altered in any byte (every byte of a signed bundle is tried), before it
parses the header or loads code; without a key, signed and unsigned bundles
open alike."""
import platform
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run
from hostile import expect, open_bytes, read, repack, sources

import coldbrew
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.measure.protocol import evict
from coldbrew.compiler.tools.cli import main
from coldbrew.schemas.generated import bundle_generated as fb


def test_open_from_memory_unaligned(small_bundle):
    data = open(small_bundle, "rb").read()
    x = np.ones((1, 3, 16, 16), np.float32)
    ref = coldbrew.load(small_bundle).run(None, {"x": x})[0]
    # bytes objects are rarely 64-byte aligned; the runtime copies when needed
    for pad in range(3):
        buf = memoryview(bytes(pad) + data)[pad:]
        np.testing.assert_array_equal(coldbrew.load(buf).run(None, {"x": x})[0], ref)


def test_metadata(small_bundle):
    sess = coldbrew.load(small_bundle)
    (i,), (o,) = sess.get_inputs(), sess.get_outputs()
    assert (i.name, i.dtype, i.shape, i.type) == ("x", np.float32, [1, 3, 16, 16], "tensor(float32)")
    assert (o.name, o.shape) == ("y", [1, 5])


def test_input_specs_from_the_header_alone(small_bundle, tmp_path):
    """Tools read a bundle's inputs from its header without its weights (the
    cold sampler makes the inputs before the clock starts): they match the
    session's, and a file that is not a bundle is named."""
    from coldbrew.compiler.bundle.reader import InspectError, input_specs

    sess = coldbrew.load(small_bundle)
    assert input_specs(small_bundle) == [(i.name, i.shape, np.dtype(i.dtype).name) for i in sess.get_inputs()]
    (tmp_path / "x.bin").write_bytes(b"\0" * 100)
    with pytest.raises(InspectError, match="not a coldbrew bundle"):
        input_specs(tmp_path / "x.bin")
    (tmp_path / "cut.cb").write_bytes(open(small_bundle, "rb").read()[:200])
    with pytest.raises(InspectError, match="truncated"):
        input_specs(tmp_path / "cut.cb")


def test_weights_follow_the_code_in_the_order_of_need():
    """The file holds the header, the code, then the weights in the order
    the plan's steps first use them, each tensor with its own checksum."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.checksum import checksum64
    from coldbrew.compiler.bundle.reader import read_bytes
    from coldbrew.schemas.generated import bundle_generated as fb

    data = compile_model(small_cnn(), variants={"conv2d": "winograd_f2"}, weights={"*": "cached", "c0": "raw"})
    b = read_bytes(data)[0]
    kinds = [s.kind for s in sorted(b.segments, key=lambda s: s.offset)]
    assert kinds[0] == fb.SegmentKind.cpu_code_lz4 and fb.SegmentKind.weights_raw in kinds
    assert fb.SegmentKind.weights_cached in kinds
    placed = []
    for s in b.plan.steps:
        layer = b.layers[s.layer]
        for i in [int(v) for v in s.transformArgs] + [int(v) for v in layer.args]:
            t = b.tensors[i]
            if t.kind == fb.TensorKind.weight and i not in placed:
                placed.append(i)
    offsets = [b.segments[b.tensors[i].segment].offset + b.tensors[i].segmentOffset for i in placed]
    assert offsets == sorted(offsets)
    for i in placed:
        t = b.tensors[i]
        start = b.segments[t.segment].offset + t.segmentOffset
        assert checksum64(data[start:start + t.nbytes]) == t.checksum


def test_valid_bundle_opens(small_bundle):
    sess = coldbrew.load(small_bundle)
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert open_bytes(read(small_bundle)).get_outputs()[0].shape == [1, 5]


def test_empty_and_garbage(tmp_path):
    expect(b"", "BAD_MAGIC", tmp_path)
    expect(b"\x7fELF" + bytes(100), "BAD_MAGIC", tmp_path)


def test_wrong_magic(small_bundle, tmp_path):
    data = read(small_bundle)
    data[0:8] = b"COLDBRUE"
    expect(data, "BAD_MAGIC", tmp_path, "magic")


def test_wrong_schema_version(small_bundle, tmp_path):
    for version in (3, 99):  # a bundle of the schema before the step kinds, one of a schema to come
        data = read(small_bundle)
        struct.pack_into("<I", data, 8, version)
        expect(data, "VERSION", tmp_path, f"schema version {version}")
    # a header whose own version field disagrees is refused too, even with a version the runtime reads
    expect(repack(read(small_bundle), lambda b: setattr(b, "schemaVersion", 1)), "VERSION", tmp_path)
    expect(repack(read(small_bundle), lambda b: setattr(b, "schemaVersion", 3)), "VERSION", tmp_path)


def test_a_step_is_of_its_bundles_kind(small_bundle, tmp_path):
    """A CPU bundle's steps are CpuSteps: a step without a kind, of a kind
    this runtime does not know, with its kind's table missing, or a GpuStep
    is refused, naming the step."""
    def kind(type_, table):
        def mutate(b):
            b.plan.steps[1].kindType, b.plan.steps[1].kind = type_, table
        return mutate
    for mutate in (kind(fb.StepKind.NONE, None), kind(7, fb.CpuStepT()), kind(fb.StepKind.CpuStep, None),
                   kind(fb.StepKind.GpuStep, fb.GpuStepT())):
        expect(repack(read(small_bundle), mutate), "CORRUPT", tmp_path, "plan step 1 is not a CPU step")


def test_kernel_calls_are_checked_at_open(small_bundle, tmp_path):
    """Kernels do not check their own arguments: every call of the
    plan is checked against the kernel's recorded dtypes and byte sizes
    before the code runs, and a CPU bundle without that list is refused."""
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(read(small_bundle)[64:]), 0))
    assert [k.symbol for k in b.kernels] == sorted(k.symbol for k in b.kernels)
    called = {s.kind.kernel for s in b.plan.steps} | {s.transform for s in b.plan.steps if s.transform}
    assert called <= {k.symbol for k in b.kernels}
    for s in b.plan.steps:
        k = next(k for k in b.kernels if k.symbol == s.kind.kernel)
        args = [b.tensors[a] for a in b.layers[s.layer].args]
        assert list(k.argDtypes) == [t.dtype for t in args] and list(k.argNbytes) == [t.nbytes for t in args]

    def swap_argument(b):  # the first layer's output for its input: another size
        args = [int(a) for a in b.layers[0].args]
        args[0] = args[-1]
        b.layers[0].args = args
    expect(repack(read(small_bundle), swap_argument), "CORRUPT", tmp_path, "compiled for another dtype or size")

    def drop_argument(b):
        b.layers[0].args = [int(a) for a in b.layers[0].args[:-1]]
    expect(repack(read(small_bundle), drop_argument), "CORRUPT", tmp_path, "arguments; it takes")

    def no_arguments(b):  # a kernel listed with no arguments, called with none
        k = next(k for k in b.kernels if k.symbol == b.plan.steps[0].kind.kernel)
        k.argDtypes = k.argNbytes = b.layers[0].args = []
    expect(repack(read(small_bundle), no_arguments), "CORRUPT", tmp_path, "with no arguments")

    def wrong_size(b):
        k = next(k for k in b.kernels if k.symbol == b.plan.steps[0].kind.kernel)
        k.argNbytes = [int(n) + 64 for n in k.argNbytes]
    expect(repack(read(small_bundle), wrong_size), "CORRUPT", tmp_path, "compiled for another dtype or size")

    def unlisted(b):
        b.kernels = [k for k in b.kernels if k.symbol != b.plan.steps[0].kind.kernel]
    expect(repack(read(small_bundle), unlisted), "CORRUPT", tmp_path, "kernel list lacks")

    def no_list(b):
        b.kernels = None
    expect(repack(read(small_bundle), no_list), "CORRUPT", tmp_path, "lacks its kernel list")


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_truncated(small_bundle, tmp_path, keep):
    data = read(small_bundle)
    expect(data[: int(len(data) * keep)], "CORRUPT" if keep > 0.01 else "BAD_MAGIC", tmp_path, "truncated")


def test_flipped_header_bytes(small_bundle, tmp_path):
    data = read(small_bundle)
    hdr_off, hdr_size = struct.unpack_from("<IQ", data, 12)
    rng = np.random.default_rng(0)
    for pos in rng.choice(np.arange(hdr_off, hdr_off + hdr_size), 25, replace=False):
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(8))
        expect(bad, "CORRUPT", tmp_path, "checksum")


def test_flipped_preamble_sizes(small_bundle, tmp_path):
    data = read(small_bundle)
    bad = bytearray(data)
    struct.pack_into("<Q", bad, 16, 2**63)  # header size
    expect(bad, "CORRUPT", tmp_path)
    bad = bytearray(data)
    struct.pack_into("<I", bad, 12, 2**31)  # header offset
    expect(bad, "CORRUPT", tmp_path)


def test_flipped_code_and_weight_bytes(small_bundle, tmp_path):
    """Code is checked at open; each weight tensor by the run that first
    reads it (opening does not wait for weight bytes), never used unchecked."""
    data = read(small_bundle)
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[64:]), 0))
    assert b.weightChecksums
    x = np.zeros((1, 3, 16, 16), np.float32)
    weights = [t for t in b.tensors if t.kind == fb.TensorKind.weight]
    assert weights
    for seg in b.segments:
        bad = bytearray(data)
        bad[seg.offset + seg.size // 2] ^= 0x10
        if seg.kind in (fb.SegmentKind.cpu_code, fb.SegmentKind.cpu_code_lz4):
            expect(bad, "CORRUPT", tmp_path, "checksum")
            continue
        p = tmp_path / "bad.brew"
        p.write_bytes(bytes(bad))
        for source in sources(p, bad):
            sess = coldbrew.load(source)
            for _ in range(2):  # a failed first run leaves the session cold: it fails again
                with pytest.raises(coldbrew.BundleError) as e:
                    sess.run(None, {"x": x})
                assert e.value.status == "CORRUPT" and "fails its checksum" in str(e.value), str(e.value)
            # checked eagerly on request
            with pytest.raises(coldbrew.BundleError, match="fails its checksum"):
                coldbrew.load(source).verify_weights()
            # opened without weight checks, the same bytes run (the caller's choice)
            coldbrew.load(source, verify_weights=False).run(None, {"x": x})


def wide_dense(n_out=256):
    """x[1, 600] -> Gemm with a 600 KB weight (past the size the execution
    threads check together; 2.4 MB per 1024 outputs) -> y[1, n_out]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((n_out, 600)) * 0.05).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(n_out).astype(np.float32), "B")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1, name="fc")], "wide_dense",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 600])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], [w, bias])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("n_out", [256, 3072])
def test_large_weight_checked_by_the_execution_threads(tmp_path, n_out):
    """A large tensor is checked in stripes ending on the stream's 2 MB
    chunks, which the execution threads take in turn (each sums its
    stripes, the parts are added): the sum holds for the intact bundle, and
    a flipped byte anywhere (first word, either side of each stripe
    boundary, middle, last byte) is still that tensor's checksum failure,
    from a cached file, an evicted one (streamed) and memory."""
    from conftest import assert_close, ort_run

    from coldbrew.compiler import compile_model

    model = wide_dense(n_out)
    data = bytearray(compile_model(model))
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[64:]), 0))
    big = max((t for t in b.tensors if t.kind == fb.TensorKind.weight), key=lambda t: t.nbytes)
    assert big.nbytes >= 512 << 10
    x = np.random.default_rng(0).standard_normal((1, 600)).astype(np.float32)
    for threads in (1, 2):
        assert_close(coldbrew.load(bytes(data), threads=threads).run(None, {"x": x})[0],
                     ort_run(model, {"x": x})[0])
    start = b.segments[big.segment].offset + big.segmentOffset
    chunk = 2 << 20
    edges = [e - start for e in range((start // chunk + 1) * chunk, start + big.nbytes, chunk)]
    assert len(edges) == (0 if n_out == 256 else 3), edges
    for at in [5, big.nbytes // 2 + 3, big.nbytes - 1] + [e + d for e in edges for d in (-1, 0)]:
        bad = bytearray(data)
        bad[start + at] ^= 0x04
        p = tmp_path / "bad.brew"
        p.write_bytes(bytes(bad))
        for source in sources(p, bad):
            for threads in (1, 2):
                with pytest.raises(coldbrew.BundleError) as e:
                    coldbrew.load(source, threads=threads).run(None, {"x": x})
                assert e.value.status == "CORRUPT" and big.name.decode() in str(e.value), (at, str(e.value))


def test_bundle_streamed_in_2mb_chunks_from_a_cold_file(tmp_path):
    """A bundle of several 2 MB chunks, opened from a file just evicted from
    the page cache: its readers wait for the streamer's chunks (they do not
    fault the file in beside it) and the run matches onnxruntime at 1 and 2
    threads; a flipped byte in the last weight, read last, is still named."""
    from onnx import TensorProto, helper, numpy_helper

    from conftest import assert_close, ort_run

    from coldbrew.compiler import compile_model

    rng = np.random.default_rng(5)
    w1 = numpy_helper.from_array((rng.standard_normal((1024, 1024)) * 0.03).astype(np.float32), "W1")
    w2 = numpy_helper.from_array((rng.standard_normal((1024, 1024)) * 0.03).astype(np.float32), "W2")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
                           helper.make_node("Relu", ["h"], ["r"], name="relu"),
                           helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2")], "two_dense",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], [w1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    data = compile_model(model)
    assert len(data) > 8 << 20
    path = tmp_path / "two_dense.brew"
    path.write_bytes(data)
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    ref = ort_run(model, {"x": x})[0]

    for threads in (1, 2):
        evict(path)
        assert_close(coldbrew.load(str(path), threads=threads).run(None, {"x": x})[0], ref)
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(data[64:], 0))
    last = max((t for t in b.tensors if t.kind == fb.TensorKind.weight),
               key=lambda t: b.segments[t.segment].offset + t.segmentOffset)
    bad = bytearray(data)
    bad[b.segments[last.segment].offset + last.segmentOffset + last.nbytes - 1] ^= 0x10
    path.write_bytes(bytes(bad))
    evict(path)
    with pytest.raises(coldbrew.BundleError) as e:
        coldbrew.load(str(path), threads=2).run(None, {"x": x})
    assert e.value.status == "CORRUPT" and last.name.decode() in str(e.value)


def test_code_past_the_first_read_is_checked(small_model, tmp_path):
    """The open reads a bundle's first 128 KiB; a code segment that runs past
    them (here behind a header made long by a long model name) is read once
    the header is parsed, with the first weights, and its last byte is still
    checked before the code loads."""
    import onnx

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_header

    first_request = 128 << 10  # runtime/src/bundle/bundle.h: CB_STREAM_FIRST
    path = tmp_path / "front.brew"

    def code():
        return next(s for s in read_header(str(path)).segments if s.kind == fb.SegmentKind.cpu_code_lz4)

    model = onnx.ModelProto()
    model.CopyFrom(small_model)
    compile_model(model, str(path))
    model.graph.name = "m" * (first_request - code().offset - code().size // 2)
    compile_model(model, str(path))
    c = code()
    assert c.offset < first_request < c.offset + c.size
    evict(path)
    x = np.zeros((1, 3, 16, 16), np.float32)
    assert coldbrew.load(str(path)).run(None, {"x": x})[0].shape == (1, 5)
    data = read(path)
    data[c.offset + c.size - 1] ^= 0x01
    expect(data, "CORRUPT", tmp_path, "checksum")


def test_segment_past_end(small_bundle, tmp_path):
    def far(b):
        b.segments[0].offset = 2**64 - 4096
    expect(repack(read(small_bundle), far), "CORRUPT", tmp_path, "outside")

    def long(b):
        b.segments[1].size = 2**63
    expect(repack(read(small_bundle), long), "CORRUPT", tmp_path, "outside")


def test_tensor_shape_overflow_and_bad_indices(small_bundle, tmp_path):
    def huge(b):
        t = next(t for t in b.tensors if t.kind == fb.TensorKind.weight)
        t.shape = [2**40, 2**40, 2**40]
    expect(repack(read(small_bundle), huge), "CORRUPT", tmp_path, "invalid shape")

    def weight_outside(b):
        t = next(t for t in b.tensors if t.kind == fb.TensorKind.weight)
        t.segmentOffset = 2**62
    expect(repack(read(small_bundle), weight_outside), "CORRUPT", tmp_path, "outside its segment")

    def bad_arg(b):
        b.layers[0].args = [10_000] + [int(a) for a in b.layers[0].args[1:]]
    expect(repack(read(small_bundle), bad_arg), "CORRUPT", tmp_path, "names tensor")

    def bad_layer(b):
        b.plan.steps[0].layer = 999
    expect(repack(read(small_bundle), bad_layer), "CORRUPT", tmp_path, "names layer")

    def arena_outside(b):
        b.plan.arenaSize = 64
    expect(repack(read(small_bundle), arena_outside), "CORRUPT", tmp_path, "outside the arena")


def test_bundle_for_another_cpu(small_bundle, tmp_path):
    def aarch64(b):
        b.target.triple = "aarch64-linux-gnu"
        b.target.cpu = "cortex-a76"
    expect(repack(read(small_bundle), aarch64), "TARGET", tmp_path, "aarch64")

    def needs_unknown_feature(b):
        # in place of the host's list: the header must still fit before the
        # first segment, whose padding depends on the host's cpu name and features
        b.target.features = ["sme2"]
    expect(repack(read(small_bundle), needs_unknown_feature), "TARGET", tmp_path, "sme2")


# the runtime's x86 feature names and the kernel's names for them in /proc/cpuinfo
CPUINFO_FLAGS = {"sse4.2": "sse4_2", "fma": "fma", "avx": "avx", "f16c": "f16c", "avx2": "avx2", "bmi": "bmi1",
                 "bmi2": "bmi2", "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512cd": "avx512cd",
                 "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
                 "avx512fp16": "avx512_fp16", "avx512bf16": "avx512_bf16"}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 CPU features")
def test_each_cpu_feature_is_found_as_the_kernel_reports_it(small_bundle, tmp_path):
    """A bundle that needs one feature opens where /proc/cpuinfo lists it and
    is refused, naming it, where it does not: every feature the runtime
    checks, so both answers are exercised on any x86 machine (AVX-512 ones
    missing on an AVX2 host; avx512fp16 on a Zen 4)."""
    with open("/proc/cpuinfo") as f:
        flags = set(next(ln for ln in f if ln.startswith("flags")).split(":", 1)[1].split())
    data = read(small_bundle)
    for feature, flag in CPUINFO_FLAGS.items():
        def needs(b, feature=feature):
            b.target.features = [feature]
        one = repack(data, needs)
        if flag in flags:
            open_bytes(one).close()
        else:
            expect(one, "TARGET", tmp_path, f"needs '{feature}', which this CPU lacks")


def test_missing_file():
    with pytest.raises(coldbrew.BundleError) as e:
        coldbrew.load("/nonexistent/model.brew")
    assert e.value.status == "IO"


def test_inspect_verify_checks_every_weight(small_bundle, tmp_path):
    from click.testing import CliRunner

    from coldbrew.compiler.tools.cli import main

    ok = CliRunner().invoke(main, ["inspect", small_bundle, "--verify"])
    assert ok.exit_code == 0 and "every weight checksum" in ok.output, ok.output
    data = read(small_bundle)
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[64:]), 0))
    t = next(t for t in b.tensors if t.kind == fb.TensorKind.weight)
    data[b.segments[t.segment].offset + t.segmentOffset] ^= 0x04
    p = tmp_path / "bad.brew"
    p.write_bytes(bytes(data))
    bad = CliRunner().invoke(main, ["inspect", str(p), "--verify"])
    assert bad.exit_code != 0 and "fails its checksum" in bad.output, bad.output


# statuses a refused open may give: the preamble's own checks come first
# (magic, version, declared size, the signature block's place), then the signature
REFUSED = ("SIGNATURE", "BAD_MAGIC", "VERSION", "CORRUPT")


@pytest.fixture(scope="module")
def signed(tmp_path_factory, small_model):
    import onnx

    d = tmp_path_factory.mktemp("signed")
    onnx.save(small_model, str(d / "small.onnx"))
    runner = CliRunner()
    for key in ("key", "other"):
        r = runner.invoke(main, ["keygen", str(d / key)])
        assert r.exit_code == 0, r.output
    for name, extra in (("signed", ["--sign", str(d / "key")]), ("unsigned", [])):
        r = runner.invoke(main, ["compile", str(d / "small.onnx"), "-o", str(d / f"{name}.brew"), "--no-tune", *extra])
        assert r.exit_code == 0, r.output
    return d


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def test_a_signed_bundle_runs_with_its_key_and_without_one(signed, small_model, feeds):
    ref = ort_run(small_model, feeds)
    for key in (str(signed / "key.pub"), open(signed / "key.pub").read().strip(), None):
        sess = coldbrew.load(str(signed / "signed.brew"), public_key=key)
        assert_close(sess.run(None, feeds)[0], ref[0])
        sess.close()
    data = (signed / "signed.brew").read_bytes()
    sess = coldbrew.load(data, public_key=bytes.fromhex(open(signed / "key.pub").read()))  # from memory too
    assert_close(sess.run(None, feeds)[0], ref[0])


def test_unsigned_and_other_keys_are_refused(signed):
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle is not signed"):
        coldbrew.load(str(signed / "unsigned.brew"), public_key=str(signed / "key.pub"))
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle is signed by another key"):
        coldbrew.load(str(signed / "signed.brew"), public_key=str(signed / "other.pub"))
    coldbrew.load(str(signed / "unsigned.brew")).close()  # no key required: unsigned bundles open
    with pytest.raises(ValueError, match="public_key must be"):
        coldbrew.load(str(signed / "signed.brew"), public_key="not a key")


def test_altering_any_byte_is_refused(signed):
    data = bytearray((signed / "signed.brew").read_bytes())
    key = open(signed / "key.pub").read().strip()
    statuses = {}
    for i in range(len(data)):
        data[i] ^= 1 << (i % 8)
        try:
            coldbrew.load(bytes(data), public_key=key).close()
            opened = True
        except coldbrew.BundleError as e:
            opened = False
            statuses[e.status] = statuses.get(e.status, 0) + 1
        data[i] ^= 1 << (i % 8)
        assert not opened, f"byte {i} altered, yet the bundle opened"
    assert set(statuses) <= set(REFUSED), statuses
    assert statuses["SIGNATURE"] >= len(data) - 64, statuses  # all but the preamble's own fields


def _refresh_checksums(data):
    """Every checksum made right again, as a careful attacker would."""
    hdr_off, hdr_size = struct.unpack_from("<IQ", data, 12)
    b = fb.Bundle.GetRootAs(bytes(data[hdr_off:hdr_off + hdr_size]), 0)
    for k in range(b.SegmentsLength()):
        s = b.Segments(k)
        slot = s._tab.Offset(12)  # Segment.checksum
        c = checksum64(bytes(data[s.Offset():s.Offset() + s.Size()]))
        struct.pack_into("<Q", data, hdr_off + s._tab.Pos + slot, c)
    struct.pack_into("<Q", data, 24, checksum64(bytes(data[hdr_off:hdr_off + hdr_size])))
    return data


def test_altered_code_with_checksums_made_right_is_refused_before_it_loads(signed):
    data = bytearray((signed / "signed.brew").read_bytes())
    b, _, _ = read_bytes(bytes(data))
    code = next(s for s in b.segments if s.kind in (fb.SegmentKind.cpu_code, fb.SegmentKind.cpu_code_lz4))
    data[code.offset + code.size // 2] ^= 0xFF
    data = _refresh_checksums(data)
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle signature does not verify"):
        coldbrew.load(bytes(data), public_key=str(signed / "key.pub"))


def test_inspect_names_the_signer(signed):
    runner = CliRunner()
    pub = open(signed / "key.pub").read().strip()
    r = runner.invoke(main, ["inspect", str(signed / "signed.brew"), "--verify", "--public-key", str(signed / "key.pub")])
    assert r.exit_code == 0, r.output
    assert f"signature  Ed25519 by {pub}: valid for every byte" in r.output
    r = runner.invoke(main, ["inspect", str(signed / "unsigned.brew"), "--verify", "--public-key", pub])
    assert r.exit_code != 0 and "bundle is not signed" in r.output
    r = runner.invoke(main, ["compile", str(signed / "small.onnx"), "-o", str(signed / "x.brew"), "--no-tune",
                             "--sign", str(signed / "missing")])
    assert r.exit_code != 0 and "coldbrew keygen" in r.output


def test_a_bundles_structure_is_checked_without_opening_it(small_bundle, small_model):
    """coldbrew.check_bundle: the open's structural checks, none of this
    machine's; a bundle for another CPU passes, altered bytes do not."""
    from coldbrew.compiler import compile_model

    coldbrew.check_bundle(compile_model(small_model, target="aarch64"))
    data = open(small_bundle, "rb").read()
    coldbrew.check_bundle(data)
    with pytest.raises(coldbrew.BundleError, match="CORRUPT|BAD_MAGIC"):
        coldbrew.check_bundle(data[:200])


def test_a_weight_stored_relaid_out_is_a_gpu_bundles_and_its_relayout_is_checked(small_bundle, tmp_path):
    """Tensor.relayout whose stored shape is not the tensor's own (schema 8:
    a GPU section reading a CPU section's bytes) is refused in a CPU bundle,
    and in a GPU bundle where an axis lies outside the raw shape."""
    def relaid(axis, gpu=False):
        def mutate(b):
            t = next(t for t in b.tensors if t.kind == fb.TensorKind.weight and t.nbytes >= 8)
            n = t.nbytes // 4
            t.relayout = fb.RelayoutT(raw=list(t.shape), stored=[n // 2, 2], axes=[axis, axis], mults=[2, 1])
            if gpu:
                b.target.gpuClass = "vulkan"
        return mutate
    expect(repack(read(small_bundle), relaid(0)), "CORRUPT", tmp_path, "a weight stored relaid out is a GPU bundle's")
    expect(repack(read(small_bundle), relaid(7, gpu=True)), "CORRUPT", tmp_path, "has an invalid relayout")
