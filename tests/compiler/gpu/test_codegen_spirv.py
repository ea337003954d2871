"""compiler/gpu/codegen_spirv.py: every layer's kernels become validated
SPIR-V in one segment (16-byte aligned shaders, identical ones stored
once) with a Shader record each, and every layer its dispatches: the
variant's shader with the layer's shapes as push words, or the dlight
kernels' in launch order with their tensors bound by parameter name;
missing tools, shaders the tools reject and kernels without a GPU launch
are CompileErrors."""
import os
import stat
from types import SimpleNamespace

import numpy as np
import pytest
from gpu_models import SPIRV_MAGIC, chain_model, gpu_compilation, make_model, needs_tools, spirv_val
from onnx import helper, numpy_helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.gpu import codegen_spirv, glsl
from coldbrew.compiler.gpu import conv as gpu_conv

tvm = pytest.importorskip("tvm")
from tvm.script import tirx as T  # noqa: E402


def _two_blocks():
    """(x @ W -> softmax) twice: two layers of each kernel (one shader each, two dispatches)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Softmax", ["h"], ["r"], axis=-1),
             helper.make_node("MatMul", ["r", "W"], ["h2"]), helper.make_node("Softmax", ["h2"], ["y"], axis=-1)]
    return make_model(nodes, [w], (16, 32), {"y": (16, 32)})


def compiled(model, **options):
    """(Compilation at plan_memory, spirv segment, Shader records)."""
    c = gpu_compilation(model, "plan_memory", **options)
    blob, shaders = codegen_spirv.apply(c.graph, c.target, c.anchors)
    return c, blob, shaders


def shader_bytes(blob, sh):
    return blob[sh["offset"]:sh["offset"] + sh["size"]]


@needs_tools
def test_segment_holds_one_valid_spirv_module_per_shader(small_model, tmp_path):
    c, blob, shaders = compiled(small_model)
    assert shaders and len(blob) % 16 == 0
    end = 0
    for k, sh in enumerate(shaders):
        assert sh["offset"] == end and sh["offset"] % 16 == 0 and sh["size"] % 4 == 0  # packed, aligned
        end = sh["offset"] + sh["size"] + (-sh["size"] % 16)
        spv = shader_bytes(blob, sh)
        assert spv[:4] == SPIRV_MAGIC
        (tmp_path / f"{k}.spv").write_bytes(spv)
        spirv_val(tmp_path / f"{k}.spv")
    assert end == len(blob)
    # the GEMM conv's first-run shader (conv_direct, made first), its own, then one per dlight kernel (one launch
    # each here), in layer order
    assert [sh["name"] for sh in shaders] == ["gpu.conv_direct", "gpu.conv_gemm"] + \
        [f"{la.kernel}_kernel" for la in c.graph.layers[1:]]


@needs_tools
def test_every_layer_dispatches_with_bindings_matching_its_shader(small_model):
    c, _, shaders = compiled(small_model)
    used = set()
    for layer in c.graph.layers:
        assert layer.dispatches, layer.name
        for shader, grid, binds, push in layer.dispatches + layer.first_dispatches:
            sh = shaders[shader]
            used.add(shader)
            assert len(binds) == sh["bindings"] and set(binds) <= set(layer.args)
            assert len(grid) == 3 and all(1 <= g <= glsl.MAX_GROUPS for g in grid)
            assert push == [] or layer.name in {a.id for a in c.anchors}
    assert used == set(range(len(shaders)))


@needs_tools
def test_dlight_kernels_bind_the_layer_tensors_by_parameter_name(small_model):
    """mean(r) -> g: the kernel's parameters are the layer's arguments of those names."""
    c, _, shaders = compiled(small_model)
    (mean,) = [la for la in c.graph.layers if la.kernel == "mean"]
    (shader, grid, binds, push), = mean.dispatches
    names = [p.name for p in c.graph.kernels["mean"].params]
    (kernel, dev), = codegen_spirv.lower({"mean": c.graph.kernels["mean"]})["mean"]
    params = [p.removesuffix("_ptr") for p in glsl.emit(dev, kernel).params]
    assert binds == [mean.args[names.index(p)] for p in params] and push == []
    assert sorted(binds) == sorted(mean.args)
    assert shaders[shader]["local_size"][0] > 1 and grid[0] >= 1


@needs_tools
def test_variant_layers_dispatch_the_variant_shader_with_push_words():
    c, blob, shaders = compiled(chain_model()[0])
    by_id = {a.id: a for a in c.anchors}
    for layer in c.graph.layers:
        a = by_id[layer.name]
        (shader, grid, binds, push), = layer.dispatches
        v = gpu_conv.get(a.variant.name)
        sh = shaders[shader]
        assert sh["name"] == v.name and sh["local_size"] == list(v.local_size) and sh["bindings"] == 5
        assert shader_bytes(blob, sh)[:4] == SPIRV_MAGIC
        assert grid == v.grid(a.conv) and push == gpu_conv.push(a.conv, a.epilogue)
        x, w, b, *res, out = layer.args
        # bindings: input, weights, bias, residual (the output itself when there is none), output
        assert binds == [x, w, b, res[0] if res else out, out] and bool(res) == a.epilogue.residual
        # a GEMM layer's first-run launch: conv_direct over the same tensors and shapes (its own grid)
        cold = [(shaders[s]["name"], g, bd, p) for s, g, bd, p in layer.first_dispatches]
        direct = gpu_conv.get("gpu.conv_direct")
        assert cold == ([(direct.name, direct.grid(a.conv), binds, push)] if v.name == "gpu.conv_gemm" else [])
    # c0 and c1 (GEMM, one with a residual) share one shader, their first-run launches and the depthwise layer
    # another: shapes are push constants; the first-run shader is numbered first (made first)
    assert [sh["name"] for sh in shaders] == ["gpu.conv_direct", "gpu.conv_gemm"]


@needs_tools
def test_raw_winograd_weights_bind_what_the_runtime_transform_prepares():
    c, _, shaders = compiled(chain_model()[0], variants={"*": "winograd"}, weights="raw")
    (layer,) = [la for la in c.graph.layers if la.name == "c0"]
    (shader, _, binds, push), = layer.dispatches
    assert shaders[shader]["name"] == "gpu.conv_winograd" and layer.transform == "gpu.winograd_f23"
    prepared = layer.transform_args[1]
    assert binds[1] == prepared != layer.args[1]
    assert c.graph.tensors[prepared].kind == "prepared"
    # cached: U is stored, the layer's weight tensor itself is bound
    c, _, _ = compiled(chain_model()[0], variants={"*": "winograd"}, weights="cached")
    (layer,) = [la for la in c.graph.layers if la.name == "c0"]
    assert not layer.transform and layer.dispatches[0][2][1] == layer.args[1]


@needs_tools
def test_identical_shaders_are_stored_once():
    c, blob, shaders = compiled(_two_blocks())
    layers = c.graph.layers
    assert [la.kernel for la in layers] == ["matmul", "softmax", "matmul", "softmax"]
    assert [la.dispatches[0][0] for la in layers] == [0, 1, 0, 1]
    assert [sh["name"] for sh in shaders] == ["matmul_kernel", "softmax_kernel"]
    assert layers[0].dispatches[0][2] != layers[2].dispatches[0][2]  # one shader, each layer's own tensors
    assert len(blob) == shaders[1]["offset"] + shaders[1]["size"] + (-shaders[1]["size"] % 16)


def test_run_leaves_the_segment_and_records_on_the_compilation(small_model):
    c = gpu_compilation(small_model, "plan_memory")
    c = codegen_spirv.run(c)
    blob, shaders = c.spirv
    assert isinstance(blob, bytes) and len(shaders) == 5  # the conv's GEMM and first-run shaders, three dlight kernels


def test_missing_tools_are_named_with_their_packages(small_model, monkeypatch):
    c = gpu_compilation(small_model, "plan_memory")
    monkeypatch.setattr(codegen_spirv.shutil, "which", lambda t: None if t == "spirv-val" else "/usr/bin/" + t)
    with pytest.raises(CompileError, match=r"^GPU bundles need spirv-val \(Debian package spirv-tools\)$"):
        codegen_spirv.apply(c.graph, c.target, c.anchors)
    monkeypatch.setattr(codegen_spirv.shutil, "which", lambda t: None)
    with pytest.raises(CompileError, match="glslangValidator .Debian package glslang-tools. and spirv-val"):
        codegen_spirv.apply(c.graph, c.target, c.anchors)


@needs_tools
def test_compile_glsl_validates_and_rejects(tmp_path, monkeypatch):
    good = gpu_conv.get("gpu.conv_direct").source()
    assert codegen_spirv.compile_glsl(good, str(tmp_path), "ok")[:4] == SPIRV_MAGIC
    with pytest.raises(CompileError, match="(?s)^GPU kernel bad: glslang rejected the shader: .*'NOPE' : undeclared"):
        codegen_spirv.compile_glsl(good.replace("acc += X", "acc += NOPE"), str(tmp_path), "bad")
    # a SPIR-V module the validator refuses (a stand-in spirv-val that refuses everything)
    fake = tmp_path / "bin" / "spirv-val"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'error: invalid module'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(CompileError, match="^GPU kernel v: spirv-val rejected the shader: error: invalid module$"):
        codegen_spirv.compile_glsl(good, str(tmp_path), "v")


@T.prim_func
def two_launches(a_h: T.handle, b_h: T.handle, c_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    C = T.match_buffer(c_h, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = A[tx] + T.float32(1)
    for tx in T.thread_binding(128, thread="threadIdx.x"):
        C[tx] = B[tx] * T.float32(3)
        C[tx + 128] = B[tx + 128] * T.float32(3)


@T.prim_func
def no_threads(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    for i in range(256):
        B[i] = A[i]


def test_lower_splits_a_layer_into_its_kernels_in_launch_order():
    out = codegen_spirv.lower({"two": two_launches})
    (first, f0), (second, f1) = out["two"]
    assert (first, second) == ("two_kernel", "two_kernel_1")
    assert glsl.emit(f0, first).local_size == (256, 1, 1) and glsl.emit(f1, second).local_size == (128, 1, 1)


def test_lower_refuses_a_kernel_without_gpu_threads():
    with pytest.raises(CompileError, match="^layer kernel plain has no GPU launch"):
        codegen_spirv.lower({"plain": no_threads})


def test_a_lowering_failure_is_a_compile_error(monkeypatch):
    def pipeline(target):
        def fail(mod):
            raise RuntimeError("Traceback:\n  passes\nInternalError: cannot lower")
        return fail, None, None

    monkeypatch.setattr(tvm.tirx, "get_default_tir_pipeline", pipeline)
    with pytest.raises(CompileError, match="^GPU lowering failed: InternalError: cannot lower$"):
        codegen_spirv.lower({"two": two_launches})


def test_bindings_map_kernel_parameters_to_layer_arguments():
    layer = SimpleNamespace(args=[10, 11, 12])
    func = two_launches  # parameters A, B, C
    assert codegen_spirv._bindings(layer, func, ["C_ptr", "A_ptr"], "k") == [12, 10]
    with pytest.raises(CompileError, match="^GPU kernel k: parameter 'D_ptr' matches no single argument"):
        codegen_spirv._bindings(layer, func, ["A_ptr", "D_ptr"], "k")
