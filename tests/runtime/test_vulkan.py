"""GPU (Vulkan) bundles, run for real on Mesa's CPU Vulkan driver (lavapipe,
installed by .ci/setup.sh): every zoo model against onnxruntime, the SPIR-V
segment, the pipeline cache file and its rejection rules, clear errors."""
import ctypes
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, assert_close, ort_run
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.inspect import describe
from coldbrew.runtime import testing_function as runtime_hook
from coldbrew.schemas.generated import bundle_generated as fb
from hostile import expect, repack

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402

CACHE_MAGIC = b"CBVKPC01"
CACHE_HEADER = struct.Struct("<8sIIII16sQQ")  # magic, vendor, device, driver, reserved, uuid, size, checksum


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test's own pipeline cache folder (the runtime reads the variable at open)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("COLDBREW_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def small_gpu_bundle(tmp_path_factory, small_model):
    path = tmp_path_factory.mktemp("gpu") / "small.brew"
    compile_model(small_model, str(path), target="vulkan")
    return str(path)


def run_once(path, feeds):
    """One launch's first run, its bundle then released: the pipelines it
    left being made are finished and the cache written (for the next launch)."""
    sess = coldbrew.load(path)
    out = sess.run(None, feeds)
    sess.close()
    return out


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_model_on_vulkan_matches_onnxruntime(name, tmp_path):
    model = zoo.build(name)
    path = str(tmp_path / f"{name}.brew")
    compile_model(model, path, target="vulkan")
    sess = coldbrew.load(path)
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(3).standard_normal(inp.shape).astype(np.float32)
    ours = sess.run(None, {inp.name: x})
    ref = ort_run(model, {inp.name: x})
    assert_close(ours, ref)


@pytest.mark.parametrize("first_run", ["plan", "whole"])
def test_first_ever_run_executes_layers_while_later_pipelines_are_made(first_run, tmp_path, monkeypatch):
    """A first-ever launch (empty pipeline cache) submits its first layers
    as soon as their pipelines exist (COLDBREW_GPU_FIRST_RUN=plan: each
    layer's own launches, no first-run ones): the trace's first GPU chunk
    goes to the GPU before the last pipeline is made, every chunk after the
    pipelines of its first step's dispatches, and the chunks complete in
    order. With the first run made whole (COLDBREW_GPU_FIRST_RUN=whole:
    every pipeline first, as before chunks) its one GPU event starts after
    the last pipeline. The outputs match onnxruntime either way, on the
    first run and the next."""
    monkeypatch.setenv("COLDBREW_GPU_FIRST_RUN", first_run)
    model = zoo.build("squeezenet")
    path = str(tmp_path / "squeezenet.brew")
    compile_model(model, path, target="vulkan")
    b = read_bytes(open(path, "rb").read())[0]
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort_run(model, {"input": x})
    early = False
    for attempt in range(5):  # a busy machine (tests in parallel) may make every pipeline before the first chunk
        monkeypatch.setenv("COLDBREW_CACHE_DIR", str(tmp_path / f"cache{attempt}"))  # a first-ever launch each
        sess = coldbrew.load(path, trace=True)
        first = sess.run(None, {"input": x})[0]  # right after the open, while its workers make pipelines
        assert_close(first, ref[0])
        ev = sess.trace()
        gpu = sorted((e for e in ev if e["phase"] == "gpu_execute"), key=lambda e: e["start_ns"])
        made = {int(e["layer"].split()[-1]): e["end_ns"] for e in ev if e["phase"] == "pipeline"}
        assert sorted(made) == list(range(len(b.shaders)))
        assert not any(e["first_run_layers"] for e in gpu)
        if first_run == "whole":
            assert len(gpu) == 1 and gpu[0]["start_ns"] >= max(made.values())
            early = True
        else:
            assert [e["end_ns"] for e in gpu] == sorted(e["end_ns"] for e in gpu)
            for e in gpu:
                shaders = [d.shader for d in b.plan.steps[e["step"]].kind.dispatches]
                assert e["start_ns"] >= max(made[k] for k in shaders), e
            early = len(gpu) >= 2 and gpu[0]["start_ns"] < max(made.values())  # on the GPU before the last pipeline
        assert_close(sess.run(None, {"input": x})[0], ref[0])  # the recorded command buffer
        assert len([e for e in sess.trace() if e["phase"] == "gpu_execute"]) == 1
        if early:
            break
    assert early


def test_layers_run_their_first_run_launches_until_their_own_pipelines_exist(tmp_path):
    """The GEMM convolution's pipeline is the slowest a driver makes (on an
    H200 77-150 ms against 20 ms for the direct convolution's), so each GEMM
    layer also carries conv_direct launches over the same tensors, their
    shader numbered before the GEMM's (made first). With the GEMM's pipeline
    held back, the first run does not wait for it: its chunks report every
    such layer run through its first-run launches, no GEMM pipeline was made
    by its end, and it matches onnxruntime. Once the GEMM exists a run
    records the plan's own launches (one submission, no first-run layers)
    and matches too."""
    hold = runtime_hook("cb_debug_gpu_hold_shader", None, ctypes.c_char_p, ctypes.c_uint32)
    model = zoo.build("squeezenet")
    path = str(tmp_path / "squeezenet.brew")
    compile_model(model, path, target="vulkan")
    b = read_bytes(open(path, "rb").read())[0]
    named = {k: sh.name.decode() for k, sh in enumerate(b.shaders)}
    first = [k for k, s in enumerate(b.plan.steps) if s.kind.firstRun]
    assert first == [k for k, s in enumerate(b.plan.steps) if s.variant == b"gpu.conv_gemm"] and first
    for k in first:
        (own,), (cold,) = b.plan.steps[k].kind.dispatches, b.plan.steps[k].kind.firstRun
        assert named[own.shader] == "gpu.conv_gemm" and named[cold.shader] == "gpu.conv_direct"
        assert list(cold.bindings) == list(own.bindings) and list(cold.push) == list(own.push)
        assert cold.shader < own.shader
    assert "first run: shader" in "\n".join(describe(path))
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort_run(model, {"input": x})[0]
    hold(b"gpu.conv_gemm", 30000)  # released below; at the latest after 30 s (a first run that waited fails)
    try:
        sess = coldbrew.load(path, trace=True)
        assert_close(sess.run(None, {"input": x})[0], ref)
        ev = sess.trace()
        made = {int(e["layer"].split()[-1]) for e in ev if e["phase"] == "pipeline"}
        assert "gpu.conv_gemm" not in {named[k] for k in made} and "gpu.conv_direct" in {named[k] for k in made}
        assert sum(e["first_run_layers"] for e in ev if e["phase"] == "gpu_execute") == len(first)
    finally:
        hold(None, 0)
    for _ in range(500):  # the GEMM's pipeline is made now: a later run records the plan's own launches
        out = sess.run(None, {"input": x})[0]
        gpu = [e for e in sess.trace() if e["phase"] == "gpu_execute"]
        if len(gpu) == 1 and gpu[0]["step"] == -1:
            break
        assert_close(out, ref)
        time.sleep(0.02)
    assert len(gpu) == 1 and gpu[0]["step"] == -1 and gpu[0]["first_run_layers"] == 0
    assert_close(out, ref)


def test_small_model_runs_repeatedly_and_in_two_sessions(small_gpu_bundle, small_model):
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort_run(small_model, {"x": x})[0]
    a, b = coldbrew.load(small_gpu_bundle), coldbrew.load(small_gpu_bundle)
    for _ in range(3):
        assert_close(a.run(None, {"x": x})[0], ref)
        assert_close(b.run(None, {"x": x * 2})[0], ort_run(small_model, {"x": x * 2})[0])


def test_bundle_holds_validated_spirv_and_no_cpu_code(tmp_path):
    data = compile_model(zoo.build("squeezenet"), target="vulkan")
    b = read_bytes(data)[0]
    kinds = [s.kind for s in b.segments]
    assert fb.SegmentKind.cpu_code not in kinds and kinds.count(fb.SegmentKind.spirv) == 1
    assert b.target.gpuClass == b"vulkan" and not b.target.features
    (seg,) = [s for s in b.segments if s.kind == fb.SegmentKind.spirv]
    dispatches = [d for s in b.plan.steps for d in s.kind.dispatches]
    first = [d for s in b.plan.steps for d in s.kind.firstRun or []]
    assert len(b.shaders) < len(dispatches)  # identical shaders are stored once
    assert {d.shader for d in dispatches + first} == set(range(len(b.shaders)))
    for k, sh in enumerate(b.shaders[:5]):
        spv = data[seg.offset + sh.offset:seg.offset + sh.offset + sh.size]
        assert spv[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little-endian
        (tmp_path / f"{k}.spv").write_bytes(spv)
        subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(tmp_path / f"{k}.spv")], check=True)
    text = "\n".join(describe_bytes(tmp_path, data))
    assert f"{len(b.shaders)} distinct shaders, {len(b.shaders)} pipelines for {len(dispatches)} dispatches" in text


def describe_bytes(tmp_path, data):
    p = tmp_path / "b.brew"
    p.write_bytes(data)
    return describe(str(p))


def cache_files(cache_dir):
    return sorted(p for p in cache_dir.rglob("*.vkcache"))


def test_pipeline_cache_is_written_then_reused(small_gpu_bundle, cache_dir):
    x = {"x": np.ones((1, 3, 16, 16), np.float32)}
    first = run_once(small_gpu_bundle, x)
    (path,) = cache_files(cache_dir)
    blob = path.read_bytes()
    magic, *_, size, checksum = CACHE_HEADER.unpack_from(blob)
    assert magic == CACHE_MAGIC and size == len(blob) - CACHE_HEADER.size > 0
    stamp = path.stat().st_mtime_ns
    again = run_once(small_gpu_bundle, x)
    assert path.stat().st_mtime_ns == stamp  # a matching cache is read, not rewritten
    np.testing.assert_array_equal(first[0], again[0])


@pytest.mark.parametrize("damage", ["data", "vendor", "uuid", "magic", "truncated"])
def test_bad_pipeline_cache_is_rejected_whole_and_rebuilt(small_gpu_bundle, small_model, cache_dir, damage):
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    run_once(small_gpu_bundle, x)
    (path,) = cache_files(cache_dir)
    good = path.read_bytes()
    bad = bytearray(good)
    if damage == "data":
        bad[-1] ^= 0xFF
    elif damage == "vendor":
        struct.pack_into("<I", bad, 8, 0xBEEF)
    elif damage == "uuid":
        bad[24] ^= 0x01
    elif damage == "magic":
        bad[0:8] = b"NOTCACHE"
    else:
        bad = bad[:len(bad) // 2]
    path.write_bytes(bytes(bad))
    out = run_once(small_gpu_bundle, x)
    assert_close(out[0], ort_run(small_model, x)[0])
    assert path.read_bytes() == good  # rebuilt for this device


def test_no_such_device_is_a_clear_error(small_gpu_bundle, monkeypatch):
    monkeypatch.setenv("COLDBREW_VULKAN_DEVICE", "42")
    with pytest.raises(coldbrew.BundleError) as e:
        coldbrew.load(small_gpu_bundle)
    assert e.value.status == "GPU" and "COLDBREW_VULKAN_DEVICE=42" in str(e.value)


def test_plans_are_refused_for_gpu_targets(small_model):
    with pytest.raises(CompileError, match="GPU targets"):
        compile_model(small_model, target="vulkan", plan="cold")


def test_jetson_preset_compiles_for_its_gpu(small_model):
    b = read_bytes(compile_model(small_model, target="jetson_nano+vulkan"))[0]
    assert b.target.triple == b"aarch64-linux-gnu" and b.target.gpuClass == b"vulkan"
    with pytest.raises(CompileError, match="no Vulkan GPU"):
        compile_model(small_model, target="aarch64+vulkan")


def test_hostile_gpu_headers_are_refused(small_gpu_bundle, tmp_path):
    data = bytearray(open(small_gpu_bundle, "rb").read())

    def shader_out_of_range(b):
        b.plan.steps[0].kind.dispatches[0].shader = 999

    def missing_binding(b):
        d = b.plan.steps[0].kind.dispatches[0]
        d.bindings = d.bindings[:-1]

    def huge_grid(b):
        b.plan.steps[0].kind.dispatches[0].grid = [70000, 1, 1]

    def shader_outside_segment(b):
        b.shaders[0].offset = 1 << 40

    def no_dispatches(b):
        b.plan.steps[0].kind.dispatches = []

    def not_vulkan(b):
        b.target.gpuClass = "metal"

    def too_many_push_words(b):
        b.plan.steps[0].kind.dispatches[0].push = list(range(33))

    for mutate in (shader_out_of_range, missing_binding, huge_grid, shader_outside_segment, no_dispatches,
                   too_many_push_words):
        expect(repack(data, mutate), "CORRUPT", tmp_path)
    expect(repack(data, not_vulkan), "TARGET", tmp_path, "metal")

    def first_run_shader_out_of_range(b):  # a GEMM layer's first-run launch is checked as its own are
        b.plan.steps[0].kind.firstRun[0].shader = 999

    def first_run_tensor_out_of_range(b):
        d = b.plan.steps[0].kind.firstRun[0]
        d.bindings = [1 << 20] + list(d.bindings[1:])

    for mutate, said in ((first_run_shader_out_of_range, "step 0 first-run dispatch 0 names shader 999"),
                         (first_run_tensor_out_of_range, "step 0 first-run dispatch 0 binds an invalid tensor")):
        expect(repack(data, mutate), "CORRUPT", tmp_path, said)

    def a_cpu_step(b):  # a GPU bundle's steps are GpuSteps
        b.plan.steps[1].kindType, b.plan.steps[1].kind = fb.StepKind.CpuStep, fb.CpuStepT()
        b.plan.steps[1].kind.kernel = "k"
    expect(repack(data, a_cpu_step), "CORRUPT", tmp_path, "plan step 1 is not a GPU step")


# name, input [n, c, h, w], out channels, kernel, stride, pads, dilation, groups, bias, epilogue
CONV_CASES = [
    ("gemm_3x3", [1, 5, 13, 11], 70, 3, 1, 1, 1, 1, True, "relu"),
    ("gemm_strided_odd", [1, 19, 15, 9], 33, 3, 2, 1, 1, 1, True, "relu6"),
    ("gemm_pointwise", [1, 67, 7, 9], 130, 1, 1, 0, 1, 1, True, None),
    ("gemm_dilated_5x5", [1, 6, 17, 12], 9, 5, 1, 4, 2, 1, False, None),
    ("gemm_7x7_s2_batch2", [2, 3, 23, 20], 16, 7, 2, 3, 1, 1, True, "relu"),
    ("gemm_residual", [1, 16, 10, 10], 16, 3, 1, 1, 1, 1, True, "residual_relu"),
    ("pointwise_residual", [2, 24, 6, 5], 24, 1, 1, 0, 1, 1, True, "residual"),
    ("depthwise_s2", [1, 32, 15, 14], 32, 3, 2, 1, 1, 32, True, "relu6"),
    ("depthwise_dilated", [1, 8, 12, 12], 8, 3, 1, 2, 2, 8, True, "relu"),
    ("grouped_2", [1, 12, 9, 9], 20, 3, 1, 1, 1, 2, True, "residual_relu"),
    ("asym_pad", [1, 4, 9, 9], 8, (2, 3), 1, (0, 1, 1, 2), 1, 1, True, None),
]


def conv_model(case):
    """One Conv (and its epilogue) as an ONNX model with seeded weights."""
    from onnx import TensorProto, helper, numpy_helper

    name, shape, k, ks, stride, pads, dil, groups, bias, epi = case
    kh, kw = ks if isinstance(ks, tuple) else (ks, ks)
    pads = list(pads) if isinstance(pads, tuple) else [pads] * 4
    rng = np.random.default_rng(len(name))
    w = (rng.standard_normal((k, shape[1] // groups, kh, kw)) / np.sqrt(shape[1] // groups * kh * kw))
    inits = [numpy_helper.from_array(w.astype(np.float32), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["y"], kernel_shape=[kh, kw], strides=[stride, stride], pads=pads,
                              dilations=[dil, dil], group=groups)]
    oh = (shape[2] + pads[0] + pads[2] - dil * (kh - 1) - 1) // stride + 1
    ow = (shape[3] + pads[1] + pads[3] - dil * (kw - 1) - 1) // stride + 1
    out, graph_in = "y", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if epi and epi.startswith("residual"):
        graph_in.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [shape[0], k, oh, ow]))
        nodes.append(helper.make_node("Add", ["y", "r"], ["s"]))
        out = "s"
    if epi and epi.endswith("relu"):
        nodes.append(helper.make_node("Relu", [out], ["z"]))
        out = "z"
    if epi == "relu6":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", [out, "lo", "hi"], ["z"]))
        out = "z"
    g = helper.make_graph(nodes, name, graph_in,
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [shape[0], k, oh, ow])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_gpu_conv_variants_match_onnxruntime_and_share_one_shader(tmp_path):
    """Every conv variant that applies, forced in turn, over strides, pads,
    dilations, groups, batch, channel counts that do not fill a tile, and
    each epilogue; Winograd with its weights cached (transformed here) and
    raw (transformed by the runtime at load). The shapes ride in push
    constants, so all the layers of one variant use one shader (its SPIR-V
    is byte-identical across these bundles)."""
    spirv_of, seen = {}, set()
    for case in CONV_CASES:
        model = conv_model(case)
        rng = np.random.default_rng(7)
        feeds = None
        for choice, form in (("winograd", "raw"), ("winograd", "cached"), ("gemm", "auto"), ("direct", "auto")):
            data = compile_model(model, target="vulkan", variants={"*": choice}, weights=form)
            b = read_bytes(data)[0]
            (step,) = b.plan.steps
            variant = step.variant.decode()
            if variant != f"gpu.conv_{choice}":  # a global choice that does not apply falls back
                assert choice != "direct" and variant != "gpu.conv_winograd", (case[0], choice, variant)
                continue
            seen.add((variant, form))
            (d,) = step.kind.dispatches
            gemm = variant == "gpu.conv_gemm"  # with its first-run launch, through conv_direct
            assert len(d.push) == 19 and len(b.shaders) == 1 + gemm and bool(step.kind.firstRun) == gemm
            transformed = step.transform.decode() if step.transform else ""
            assert transformed == ("gpu.winograd_f23" if form == "raw" and choice == "winograd" else "")
            (seg,) = [s for s in b.segments if s.kind == fb.SegmentKind.spirv]
            sh = b.shaders[d.shader]
            spirv_of.setdefault(variant, set()).add(data[seg.offset + sh.offset:seg.offset + sh.offset + sh.size])
            path = tmp_path / f"{case[0]}_{choice}_{form}.brew"
            path.write_bytes(data)
            sess = coldbrew.load(str(path))
            feeds = feeds or {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
            assert_close(sess.run(None, feeds)[0], ort_run(model, feeds)[0])
    assert {v: len(s) for v, s in spirv_of.items()} == {"gpu.conv_gemm": 1, "gpu.conv_direct": 1,
                                                        "gpu.conv_winograd": 1}
    assert {("gpu.conv_winograd", "raw"), ("gpu.conv_winograd", "cached")} <= seen


def test_gpu_variant_choice_and_weight_forms_are_checked(tmp_path):
    model = conv_model(CONV_CASES[7])  # depthwise: only the direct variant applies
    with pytest.raises(CompileError, match="GPU variant winograd does not apply to c0"):
        compile_model(model, target="vulkan", variants={"c0": "winograd"})
    with pytest.raises(CompileError, match="weight form must be raw, cached or auto"):
        compile_model(conv_model(CONV_CASES[0]), target="vulkan", weights="fp16")


def test_auto_weight_forms_transform_at_load_what_fits_under_pipeline_creation(tmp_path):
    """resnet50's Winograd layers: raw (runtime transform) in plan order while
    the modeled transform time fits under one pipeline's creation, then
    cached; the model still matches onnxruntime."""
    from coldbrew.compiler.passes import plan_weights

    model = zoo.build("resnet50")
    data = compile_model(model, target="vulkan", variants={"*": "winograd"})
    (tmp_path / "r.brew").write_bytes(data)
    x = {"input": np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    assert_close(coldbrew.load(str(tmp_path / "r.brew")).run(None, x)[0], ort_run(model, x)[0])
    b = read_bytes(data)[0]
    assert not [s for s in read_bytes(compile_model(zoo.build("squeezenet"), target="vulkan"))[0].plan.steps
                if s.variant == b"gpu.conv_winograd"]  # chosen, never by default
    wino = [s for s in b.plan.steps if s.variant == b"gpu.conv_winograd"]
    assert wino
    forms = ["raw" if s.transform else "cached" for s in wino]
    assert forms == sorted(forms, key=lambda f: f != "raw")  # raw ones first, in plan order
    pairs = [int(np.prod([b.tensors[s.transformArgs[0]].shape[i] for i in (0, 1)])) for s in wino if s.transform]
    assert sum(pairs) * plan_weights.GPU_TRANSFORM_S_PER_PAIR <= plan_weights.GPU_PIPELINE_WINDOW_S


def test_gpu_open_prepares_on_cpu_threads_ahead_of_the_gpu(small_gpu_bundle, tmp_path):
    """The traced first run reports the open's GPU mode: weights read per step
    by a reader while the context is made, then the upload and one pipeline
    event per shader made by its end (worker threads; at least every shader
    but those only the GEMM layers' own launches use), and the GPU's work on
    its own lane; the trace exports name that lane."""
    from coldbrew.compiler.tools import trace_export

    sess = coldbrew.load(small_gpu_bundle, trace=True)
    sess.run(None, {"x": np.ones((1, 3, 16, 16), np.float32)})
    ev = sess.trace()
    by = {}
    for e in ev:
        by.setdefault(e["phase"], []).append(e)
    b = read_bytes(open(small_gpu_bundle, "rb").read())[0]
    (ctx,), (up,), runs = by["gpu_context"], by["upload"], by["gpu_execute"]
    assert sorted(e["step"] for e in by["read"]) == list(range(len(b.plan.steps)))
    made = sorted(int(e["layer"].split()[-1]) for e in by["pipeline"])
    later = {d.shader for s in b.plan.steps if s.kind.firstRun for d in s.kind.dispatches}
    assert len(set(made)) == len(made) and set(range(len(b.shaders))) - later <= set(made) <= set(range(len(b.shaders)))
    assert up["start_ns"] >= max(ctx["end_ns"], max(e["end_ns"] for e in by["read"]))
    assert min(e["start_ns"] for e in by["pipeline"]) >= ctx["end_ns"]
    # the GPU's lane: one event per chunk of the first run (one when every pipeline was made in time)
    assert runs and all(r["cpu"] == -1 and r["start_ns"] >= up["end_ns"] for r in runs)
    chrome = trace_export.to_chrome(ev)["traceEvents"]
    assert {"name": "gpu"} in [x["args"] for x in chrome if x["name"] == "thread_name"]
    lay = trace_export.lanes(ev)
    assert lay["labels"][lay["lanes"][-1]] == "gpu"  # the GPU's lane, below the cores
    trace_export.to_png(ev, str(tmp_path / "t.png"))


def test_corrupt_gpu_weights_are_named_by_the_first_run(small_gpu_bundle, tmp_path):
    data = bytearray(open(small_gpu_bundle, "rb").read())
    b = read_bytes(bytes(data))[0]
    (seg,) = [s for s in b.segments if s.kind == fb.SegmentKind.weights_raw]
    data[seg.offset + 5] ^= 0x40
    path = tmp_path / "bad.brew"
    path.write_bytes(bytes(data))
    sess = coldbrew.load(str(path))  # the reader leaves the bad tensor unchecked, nothing is uploaded
    with pytest.raises(coldbrew.BundleError) as e:
        sess.run(None, {"x": np.ones((1, 3, 16, 16), np.float32)})
    assert e.value.status == "CORRUPT" and "fails its checksum" in str(e.value)


def test_coldbrew_run_prints_the_gpu_phases_with_their_lanes(small_gpu_bundle):
    from click.testing import CliRunner

    from coldbrew.compiler.tools.cli import main

    r = CliRunner().invoke(main, ["run", small_gpu_bundle, "--repeat", "2"])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("gpu first run:")]
    for phase in ("gpu_context", "read", "upload", "pipeline", "gpu_execute"):
        assert phase in line
    assert "gpu_execute" in line and line.rstrip().endswith("(gpu)")
