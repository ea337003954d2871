"""The runtime's Python API and the C API used from a plain C program."""
import os
import subprocess
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, assert_close, ort_run


def test_matches_onnxruntime(small_model, small_bundle):
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    sess = coldbrew.load(small_bundle)
    assert_close(sess.run(None, {"x": x})[0], ort_run(small_model, {"x": x})[0])
    # repeated runs give identical results (the arena is reused)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])


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


def test_import_runtime_loads_no_tvm():
    code = ("import sys, coldbrew.runtime, coldbrew\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'onnx'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_c_program(small_model, small_bundle, tmp_path):
    lib_dir = os.path.dirname(coldbrew.runtime.__file__)
    exe = tmp_path / "run_bundle"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", os.path.join(ROOT, "examples", "c", "run_bundle.c"),
                    "-I", os.path.join(ROOT, "runtime", "include"), "-L", lib_dir, "-lcoldbrew",
                    f"-Wl,-rpath,{lib_dir}", "-o", str(exe)], check=True)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    out = subprocess.run([str(exe), small_bundle, str(tmp_path / "out"), str(tmp_path / "x.bin")],
                         check=True, capture_output=True, text=True).stdout
    assert "output 0 y: 20 bytes" in out
    y = np.fromfile(tmp_path / "out0.bin", dtype=np.float32).reshape(1, 5)
    assert_close(y, ort_run(small_model, {"x": x})[0])
    bad = subprocess.run([str(exe), str(tmp_path / "x.bin")], capture_output=True, text=True)
    assert bad.returncode == 1 and "BAD_MAGIC" in bad.stderr


def test_raw_and_cached_weights_agree_across_thread_counts(tmp_path):
    """A bundle whose layers carry raw weights + transform kernels and one
    that carries the transformed weights give the same results, at any
    thread count; the raw one runs each transform once."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes

    model = small_cnn()
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    outs = []
    for form in ("raw", "cached"):
        data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights=form)
        b = read_bytes(data)[0]
        steps = {s.variant.decode(): s for s in b.plan.steps}
        conv = steps["conv2d.winograd_f2"]
        assert bool(conv.transform) == (form == "raw") and (b.plan.preparedSize > 0) == (form == "raw")
        transforms = sum(1 for s in b.plan.steps if s.transform)
        for threads in (1, 2, 3):
            sess = coldbrew.load(data, threads=threads, trace=True)
            for run in range(2):
                outs.append(sess.run(None, {"x": x})[0])
                phases = [e["phase"] for e in sess.trace()]
                assert phases.count("transform") == (transforms if run == 0 else 0)
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-6, atol=1e-6)
    assert_close(outs[0], ort_run(model, {"x": x})[0])


def test_preparation_workers_prepare_ahead_of_execution(tmp_path):
    """Steps placed on preparation queue 1 are read, checked and transformed
    by a worker on another core while the executing thread runs; results
    equal the inline plan's at any thread count, and only the first run
    prepares."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes

    model = small_cnn()
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    inline = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")
    ahead = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw", queues={"*": 1, "c0": 0})
    steps = read_bytes(ahead)[0].plan.steps
    assert {s.prepQueue for s in steps} == {0, 1}
    ref = coldbrew.load(inline).run(None, {"x": x})[0]
    for threads in (1, 2, 3):
        sess = coldbrew.load(ahead, threads=threads, trace=True)
        for run in range(3):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref)
            events = sess.trace()
            prep = [e for e in events if e["phase"] in ("read", "transform")]
            if run == 0:
                assert {e["step"] for e in prep} == set(range(len(steps)))
                assert any(e["phase"] == "transform" for e in prep)
                # every step executes after its preparation ended
                done = {}
                for e in prep:
                    done[e["step"]] = max(done.get(e["step"], 0), e["end_ns"])
                for e in events:
                    if e["phase"] == "execute":
                        assert e["start_ns"] >= done[e["step"]]
            else:
                assert not prep


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


def test_outputs_correct_under_a_cpu_hog():
    """A busy process pinned to a preparation worker's core: whoever claims a
    step first prepares it (the executing thread steals what the worker has
    not started), and the outputs do not change."""
    import os
    import subprocess
    import sys

    from conftest import small_cnn

    from coldbrew.compiler import compile_model

    cores = sorted(os.sched_getaffinity(0))
    model = small_cnn()
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)
    data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw", queues={"*": 1, "c0": 0})
    ref = coldbrew.load(compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")).run(None, {"x": x})[0]
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cores[-1]}}})\nwhile True: pass"])
    try:
        for threads in (1, 2):
            for _ in range(10):
                sess = coldbrew.load(data, threads=threads, trace=True)
                np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref)
                prepared = [e["step"] for e in sess.trace() if e["phase"] == "read"]
                assert sorted(prepared) == sorted(set(prepared))  # every step prepared exactly once
    finally:
        hog.kill()
        hog.wait()
