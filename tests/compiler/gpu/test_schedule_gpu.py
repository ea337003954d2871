"""compiler/gpu/schedule_gpu.py: TVM's dlight rules schedule every fused
PrimFunc but the shape-generic variants' (select_gpu_variants) for a GPU
thread hierarchy within Vulkan's guaranteed limits: matmuls with
shared-memory tiles, reductions cooperatively, the rest one element per
thread; a failure is a CompileError."""
import re

import numpy as np
import pytest
from gpu_models import chain_model, front, make_model, prim_funcs
from onnx import helper, numpy_helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.gpu import codegen_spirv, glsl, schedule_gpu
from coldbrew.compiler.gpu import select_gpu_variants as sgv
from coldbrew.compiler.ir.anchors import GPU_ANCHOR_RE, GPU_TVM_TARGET
from coldbrew.compiler.passes import fuse_layers


def fused(model):
    """The module as schedule_gpu gets it: variants selected, layers fused."""
    return fuse_layers.apply(sgv.apply(front(model).mod)[0], cpu=False)


def _matmul_softmax():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("Reshape", ["s", "shape"], ["y"])]
    shape = numpy_helper.from_array(np.array([64 * 64], np.int64), "shape")
    return make_model(nodes, [w, shape], (64, 64), {"y": (64 * 64,)})


def _threaded(func):
    return "T.thread_binding" in func.script()


def test_every_non_variant_function_gets_a_gpu_schedule(small_model):
    mod = fused(small_model)
    before = prim_funcs(mod)
    plain = {n for n in before if not GPU_ANCHOR_RE.search(n)}
    assert len(plain) >= 3 and len(before) > len(plain)  # mean, reshape, matmul; and the conv variant
    assert not any(_threaded(before[n]) for n in plain)
    after = prim_funcs(schedule_gpu.apply(mod))
    assert set(after) == set(before)
    for n in plain:
        assert _threaded(after[n]), n
    # the variants bring their own shaders: their functions are left as they were
    for n in set(before) - plain:
        assert after[n].same_as(before[n]) and not _threaded(after[n])
    # what the schedule makes lowers to GPU launches (an unscheduled function does not: no threads)
    lowered = codegen_spirv.lower({n: after[n] for n in plain})
    assert all(lowered[n] for n in plain)
    with pytest.raises(CompileError, match="has no GPU launch"):
        codegen_spirv.lower({n: before[n] for n in plain})


def test_rules_by_kind_and_vulkan_limits():
    """The matmul gets shared-memory tiles, softmax a cooperative reduction (shared buffers and barriers),
    the reshape one element per thread; every kernel within the limits every Vulkan device meets."""
    funcs = prim_funcs(schedule_gpu.apply(fused(_matmul_softmax())))
    lowered = codegen_spirv.lower(funcs)
    shaders = {n: [glsl.emit(dev, k) for k, dev in ks] for n, ks in lowered.items()}
    shared = {n: sum(int(x) for s in ss for x in re.findall(r"^shared float \w+\[(\d+)\];", s.source, re.M)) * 4
              for n, ss in shaders.items()}
    kind = {n: next(k for k in ("matmul", "softmax", "reshape") if k in n) for n in funcs}
    assert sorted(kind.values()) == ["matmul", "reshape", "softmax"], list(funcs)
    for n, ss in shaders.items():
        for s in ss:
            x, y, z = s.local_size
            assert x * y * z <= GPU_TVM_TARGET["max_threads_per_block"]
        assert shared[n] <= GPU_TVM_TARGET["max_shared_memory_per_block"]
        if kind[n] == "reshape":
            assert shared[n] == 0 and len(ss) == 1 and ss[0].local_size[1:] == (1, 1)
        else:
            assert shared[n] > 0 and "barrier();" in ss[0].source, n
        if kind[n] == "matmul":  # 2-D tiles of threads, each computing a block of outputs
            assert ss[0].local_size[0] > 1 and ss[0].local_size[1] > 1


def _broken_dlight(monkeypatch):
    from tvm import s_tir

    calls = []

    def apply_default(*rules):
        def fail(mod):
            calls.append(mod)
            raise RuntimeError("Traceback (most recent call last):\n  dlight internals\nValueError: no rule applies")
        return fail

    monkeypatch.setattr(s_tir.dlight, "ApplyDefaultSchedule", apply_default)
    return calls


def test_a_failing_schedule_is_a_compile_error_naming_the_cause(small_model, monkeypatch):
    mod = fused(small_model)
    calls = _broken_dlight(monkeypatch)
    with pytest.raises(CompileError, match=r"cannot run on the GPU: the GPU scheduler \(dlight\) cannot schedule its "
                                           r"kernel \w+ \(ValueError: no rule applies\)$"):
        schedule_gpu.apply(mod)
    assert calls and not any(GPU_ANCHOR_RE.search(gv.name_hint) for gv in calls[0].functions)


def test_a_module_of_variants_only_is_not_scheduled(monkeypatch):
    mod = fused(chain_model()[0])
    before = prim_funcs(mod)
    assert before and all(GPU_ANCHOR_RE.search(n) for n in before)
    calls = _broken_dlight(monkeypatch)
    out = schedule_gpu.apply(mod)
    assert not calls
    after = prim_funcs(out)
    assert all(after[n].same_as(before[n]) for n in before)


def test_run_schedules_the_compilation_module(small_model):
    c = front(small_model)
    c.mod = fused(small_model)
    c = schedule_gpu.run(c)
    assert all(_threaded(f) for n, f in prim_funcs(c.mod).items() if not GPU_ANCHOR_RE.search(n))
