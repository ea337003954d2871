"""compiler/pipeline.py: the pass order is written once (PASSES,
GPU_PASSES), one loop runs any stretch of a list, and a model compiled
pass by pass through it is the bundle compile_model makes."""
import dataclasses

import pytest

from coldbrew.compiler import GPU_PASSES, PASSES, compile_model, pipeline
from coldbrew.targets import resolve
from coldbrew.compiler.options import Choices, Options

# what each pass leaves in the Compilation (a field set, or changed)
MAKES = {"load_onnx": "proto", "import_relax": "mod", "extract_layers": "graph", "codegen": "code",
         "write_bundle": "data", "select_variants": "anchors", "codegen_spirv": "spirv",
         "select_gpu_variants": "anchors"}


def one_by_one(passes, c):
    """Run the list one pass at a time, recording what each changed."""
    changed = []
    for p in passes:
        before = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        c = pipeline.run(passes, c, p.NAME, p.NAME)
        changed.append((p.NAME, {k for k, v in before.items() if getattr(c, k) is not v}))
    return c, changed


@pytest.mark.parametrize("target", ["host", "vulkan"])
def test_a_model_compiled_pass_by_pass_is_the_bundle(small_model, target):
    tgt = resolve(target)
    passes = GPU_PASSES if tgt.executes_on == "gpu" else PASSES
    c = pipeline.Compilation(model=small_model, options=Options(target=tgt), cells=tgt.executes_on != "gpu",
                             choices=Choices(weights="auto" if target == "vulkan" else "cached"),
                             producer=f"coldbrew {pipeline.version()}")
    c, changed = one_by_one(passes, c)
    assert c.data == compile_model(small_model, target=target)
    assert [n for n, _ in changed] == [p.NAME for p in passes]
    for name, fields in changed:
        if name in MAKES:
            assert MAKES[name] in fields, (name, fields)


def test_a_stretch_runs_only_its_passes(small_model, monkeypatch):
    ran = []
    for p in PASSES:
        monkeypatch.setattr(p, "run", lambda c, name=p.NAME: ran.append(name) or c)
    pipeline.run(PASSES, pipeline.Compilation(), "fuse_layers", "plan_weights")
    names = [p.NAME for p in PASSES]
    assert ran == names[names.index("fuse_layers"):names.index("plan_weights") + 1]


def test_the_ir_is_dumped_after_each_pass_of_a_stretch(small_model, tmp_path):
    front = pipeline.front_end(small_model, Options(dump_ir=str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{k:02d}_{p.NAME}.txt" for k, p in enumerate(PASSES[:5])]
    assert front.mod is not None and front.input_names == [small_model.graph.input[0].name]


def test_the_gpu_list_shares_the_front_and_the_end():
    assert GPU_PASSES[:5] == PASSES[:5] and GPU_PASSES[-1] is PASSES[-1]


def test_variant_anchors_run_the_list_up_to_select_variants(small_model):
    anchors = pipeline.variant_anchors(pipeline.front_end(small_model))
    convs = [a.id for a in anchors if a.id.startswith("c")]
    assert convs == [f"c{k}" for k in range(len(convs))] and convs and [a.index for a in anchors] == list(
        range(len(anchors)))


def test_nothing_a_pass_prints_or_logs_reaches_the_terminal(small_model, monkeypatch, capfd):
    import os
    import warnings

    from coldbrew.compiler.passes import fuse_layers

    real = fuse_layers.run

    def noisy(c):
        print("# from tvm.script import ir as I")
        warnings.warn("Field 'shape' of 'type' is required but missing.")
        os.write(2, b"[07:04:02] transform.h:1261: Warning: Fast mode segfaults\n")  # as TVM's C++ logs
        return real(c)

    monkeypatch.setattr(fuse_layers, "run", noisy)
    compile_model(small_model)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
