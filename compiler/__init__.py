"""coldbrew compiler: ONNX model -> cold-start bundle.

The whole pipeline, in order (one pass per module):

    load_onnx        read + check the ONNX model, fix input shapes
    fold_constants   fold shape subgraphs and other compile-time constants
    legalize_onnx    rewrite forms the importer lacks; require static shape inputs
    fold_batchnorm   fold BatchNormalization into the preceding Conv
    import_relax     ONNX -> TVM Relax
    block_layout     activations between convolutions in the vector's blocked layout (NCHW{lanes}c)
    select_variants  a kernel variant per conv / dense layer; its transformed weights
    fuse_layers      legalize to TIR, fuse into layers (anchors take their epilogue)
    schedule_kernels the variants' explicit schedules; a generic one elsewhere
    extract_layers   Relax -> coldbrew Graph (tensors, layers, kernels)
    plan_weights     per layer: raw weights + transform kernel, or cached transformed ones;
                     fp32, or narrow (fp16, int8) widened by the transform
    elide_copies     concatenations and reshapes that only move bytes become aliases
    plan_memory      static arena offsets for intermediate and prepared tensors
    add_warm_steps   continuous mode only: each layer's warm-fastest variant as an alternate
    codegen          kernels -> one CPU shared object (TVM LLVM)
    write_bundle     header + segments -> bytes

GPU targets (`vulkan`, `<preset>+vulkan`) take GPU_PASSES:
select_gpu_variants (convolutions and their epilogues -> shape-generic GPU
variants, compiler/kernels/gpu_conv.py) in place of select_variants,
schedule_gpu (TVM dlight GPU schedules for every other layer) in place of
schedule_kernels, codegen_spirv (the variants' shaders; coldbrew's GLSL
emitter for the rest; glslang, spirv-val) in place of codegen.
"""
import os
from dataclasses import dataclass

from coldbrew.command import missing_compiler_modules

if missing_compiler_modules():  # a runtime-only install (pip install coldbrew)
    raise ImportError(f"coldbrew's compiler needs packages that are not installed here "
                      f"(missing: {', '.join(missing_compiler_modules())}): pip install 'coldbrew[compiler]'")

from .errors import CompileError, UnsupportedOperatorError  # noqa: E402
from .graph import NARROW, PRECISIONS  # noqa: E402  (stored weight precisions)

__all__ = ["compile_model", "compile_graph", "CompileError", "UnsupportedOperatorError", "PASSES"]

PASSES = ["load_onnx", "fold_constants", "legalize_onnx", "fold_batchnorm", "import_relax", "block_layout", "select_variants",
          "fuse_layers", "schedule_kernels", "extract_layers", "plan_weights", "elide_copies", "plan_memory", "add_warm_steps", "codegen",
          "write_bundle"]
GPU_PASSES = ["load_onnx", "fold_constants", "legalize_onnx", "fold_batchnorm", "import_relax",
              "select_gpu_variants", "fuse_layers", "schedule_gpu", "extract_layers", "plan_weights", "plan_memory", "codegen_spirv", "write_bundle"]


def _version():
    try:
        from importlib.metadata import version

        return version("coldbrew")
    except Exception:
        return "0.0.0+local"


def _dump(dump_dir, index, name, ir):
    if not dump_dir:
        return
    os.makedirs(dump_dir, exist_ok=True)
    if hasattr(ir, "graph") and hasattr(ir, "opset_import"):  # ONNX
        import onnx

        text = onnx.printer.to_text(ir.graph)
    elif hasattr(ir, "script"):  # TVM IRModule
        text = ir.script(show_meta=False)
    elif hasattr(ir, "dump"):
        text = ir.dump()
    else:
        text = f"<{len(ir)} bytes>"
    with open(os.path.join(dump_dir, f"{index:02d}_{name}.txt"), "w") as f:
        f.write(text)


def _dumper(dump_ir, passes, first):
    """done(pass module, ir) -> ir: dumps each pass's output (dump_ir) under
    its number in `passes`, the passes run in order from `first`."""
    step = iter(range(passes.index(first), len(passes)))

    def done(p, ir):
        _dump(dump_ir, next(step), p.NAME, ir)
        return ir
    return done


def compile_model(model, output=None, target="host", input_shapes=None, constants=None, dump_ir=None,
                  variants=None, weights=None, threads=2, plan="default", progress=None, tune=False,
                  queues=0, on_plan=None, continuous=False, sign=None, precision="fp32", max_error=None,
                  calibration=None):
    """Compile an ONNX model (path, bytes or ModelProto) into a bundle.

    `input_shapes` fixes input dimensions ({name: [dims]}); `constants`
    freezes inputs to values ({name: ndarray}), e.g. shape parameters.
    `variants` forces kernel variants ({"*": name, "c3": name, "conv2d": name});
    `weights` is "cached" or "raw" (or {"*": ..., "c3": ...}; default cached;
    GPU targets also take and default to "auto": raw weights + the runtime's
    CPU transform where it fits under pipeline creation); `threads` is the
    execution thread count the plan is made for; `queues` places each layer's
    first-run preparation (0: inline, q >= 1: preparation worker q; or
    {"*": q, "c3": q}). `plan` "warm", "cold-greedy" or "cold"
    picks variants (and, for cold, weight forms) from the model's device
    cost table (compiler/profile.py: measured once, then cached); "cold"
    also places preparation and picks the execution thread count
    (compiler/plan.py); forced `variants` / `weights` / `queues` entries win
    over the plan's; `on_plan` receives the plan (compiler/plan.choose). `tune` searches each
    layer's variant and schedule parameters by measurement (compiler/tune.py,
    cached per target); only the host can be measured, so for other targets
    it changes nothing and every layer's parameters stay derived.
    `continuous` also stores each layer's warm-fastest variant (the "warm"
    plan from the same cost table; weights cached, after the plan's) for
    runs after the first in continuous mode (compiler/add_warm_steps.py).
    `sign` (a secret key file from `coldbrew keygen`) appends an Ed25519
    signature over every byte (compiler/sign_bundle.py).
    `precision` ("fp32", "fp16" or "int8") stores the variant layers'
    weights narrow (compiler/plan_weights.py): by default in the direct
    form (`weights` "direct": the kernels read fp16 or int8 and widen in
    registers), else widened on the first run by the runtime or the
    layer's transform; the effect on the outputs is measured on
    sample inputs (`calibration`: a .npz of arrays per input, else
    generated) and stored in the bundle, and `max_error` keeps the fewest
    layers fp32 that hold the outputs' relative error under it
    (compiler/measure_error.py).

    Returns the bundle bytes, and writes them to `output` when given.
    """
    warm, narrow_only, later_threads = None, None, 0  # narrow_only: the layers a plan chose narrow (None: all)
    if precision not in PRECISIONS:
        raise CompileError(f"weight precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision != "fp32" and _on_gpu(target):
        raise CompileError(f"{precision} weights are not available for GPU targets yet (compile with fp32)")
    if max_error is not None and precision == "fp32":
        raise CompileError("a maximum error applies to narrow weights: give a precision (fp16 or int8) with it")
    if not weights:  # narrow weights default to the direct form: the fewest bytes and nothing to widen
        weights = "auto" if _on_gpu(target) else "direct" if precision in NARROW and plan == "default" else "cached"
    if (plan != "default" or continuous or tune) and _on_gpu(target):
        raise CompileError("plans, tuning and continuous mode are not available for GPU targets yet "
                           "(compile with the default plan)")
    tuning = front = accuracy = None
    if tune:  # before the plan: the cost table then times the tuned kernels the bundle ships
        front, tuning = tuned_front(model, target, threads, input_shapes, constants, progress, dump_ir)
    if plan != "default" or continuous:
        from .plan import choose
        from .profile import profile

        table = profile(model, target, threads, input_shapes, constants, progress, tuning=tuning, front=front)
        if continuous:
            best = choose(table, "warm")
            warm = (best["variants"], best["threads"])
    if plan != "default":
        planned = choose(table, plan, precision)
        if on_plan:
            on_plan(planned)
        given = weights if isinstance(weights, dict) else {"*": weights}
        variants = {**planned["variants"], **(variants or {})}
        weights = {**{"*": "cached"}, **planned["forms"], **given}
        given_queues = queues if isinstance(queues, dict) else ({"*": queues} if queues else {})
        queues = {**planned["queues"], **given_queues}
        # a first run that keeps cores for preparation: later runs execute on all of them
        later_threads = threads if planned["threads"] < threads and not continuous else 0
        threads = planned["threads"]
        narrow_only = {name for name, p in planned["precisions"].items() if p != "fp32"}
    if precision != "fp32" and narrow_only != set():
        from . import measure_error

        front = front or front_end(model, input_shapes, constants, dump_ir)

        if progress:
            progress(0, 1, f"measure the {precision} weights' error")
        chosen, solo, accuracy = measure_error.choose(front, precision, max_error, calibration, narrow_only)
        accuracy["layers"] = solo
        precision = {"*": "fp32", **chosen}
    data, _ = compile_graph(model, None if sign else output, target, input_shapes, constants, dump_ir, variants,
                            weights, threads, front=front, tuning=tuning, queues=queues, warm=warm,
                            precision=precision, accuracy=accuracy, later_threads=later_threads)
    if sign:
        from .sign_bundle import sign as sign_with

        data = sign_with(data, sign)
        if output:
            with open(output, "wb") as f:
                f.write(data)
    return data


@dataclass
class Front:
    """What the passes up to Relax import produce; it does not depend on the
    variant choice, so one model compiled several ways (the profiler's
    columns) runs them once."""

    mod: object
    model_hash: str
    name: str
    input_names: list
    output_names: list


def tuned_front(model, target, threads, input_shapes=None, constants=None, progress=None, dump_ir=None):
    """(front, tuning): the first passes' result and the layers' measured
    tuning made from it (compiler/tune.py), shared by a tuned compile, the
    cost table its plan is made from and the bundle's own compile."""
    from .tune import tune as measure_tuning

    front = front_end(model, input_shapes, constants, dump_ir)
    return front, measure_tuning(model, target, threads, front=front, progress=progress)


def front_end(model, input_shapes=None, constants=None, dump_ir=None):
    """Load, fold, legalize and import a model (the first passes)."""
    from . import fold_batchnorm, fold_constants, import_relax, legalize_onnx, load_onnx

    proto, model_hash = load_onnx.read_model(model)
    done = _dumper(dump_ir, PASSES, load_onnx.NAME)

    proto = done(load_onnx, load_onnx.run(proto, input_shapes, constants))
    input_names = [i.name for i in load_onnx.graph_inputs(proto)]
    output_names = [o.name for o in proto.graph.output]
    proto = done(fold_constants, fold_constants.run(proto))
    proto = done(legalize_onnx, legalize_onnx.run(proto))
    proto = done(fold_batchnorm, fold_batchnorm.run(proto))
    mod = done(import_relax, import_relax.run(proto))
    return Front(mod, model_hash, proto.graph.name or "model", input_names, output_names)


def compile_graph(model, output=None, target="host", input_shapes=None, constants=None, dump_ir=None,
                  variants=None, weights=None, threads=2, front=None, tuning=None, queues=0, warm=None,
                  precision="fp32", accuracy=None, later_threads=0):
    """compile_model without planning, also returning the final Graph
    (layers, weights raw and transformed). `front` (front_end's result for
    this model and these inputs) skips the first passes; `tuning`
    (compiler/tune.py) supplies measured variants and parameters; `warm`
    ((variants, threads) of the warm plan) adds continuous mode's warm
    alternates; `precision` (a precision or {"*": p, "<layer>": p}) the
    stored weights' (compiler/plan_weights.py); `accuracy` (measure_error's)
    is stored in the bundle; `later_threads` (without `warm`) the execution
    threads of runs after the first (0: `threads`)."""
    from coldbrew.targets import resolve

    from . import add_warm_steps, codegen, write_bundle

    try:
        tgt = resolve(target) if isinstance(target, str) else target
    except ValueError as e:
        raise CompileError(str(e)) from None
    front = front or front_end(model, input_shapes, constants, dump_ir)
    if tgt.executes_on == "gpu":
        return _compile_gpu(front, output, tgt, dump_ir, variants, weights)
    graph = _lower(front, tgt, dump_ir, variants, weights or "cached", threads, tuning, queues, precision)
    if accuracy:
        graph.accuracy = {k: v for k, v in accuracy.items() if k != "layers"}
        for layer in graph.layers:
            layer.output_error = accuracy.get("layers", {}).get(layer.name, 0.0) if layer.weight_precision != "fp32" else 0.0
    graph.warm_threads = later_threads
    if warm:
        alt = _lower(front, tgt, None, warm[0], "cached", warm[1], tuning, 0)
        graph = add_warm_steps.run(graph, alt, warm[1])
    _dump(dump_ir, PASSES.index(add_warm_steps.NAME), add_warm_steps.NAME, graph)
    code = codegen.run(graph, tgt)
    _dump(dump_ir, PASSES.index(codegen.NAME), codegen.NAME, code)
    data = write_bundle.run(graph, code, tgt, f"coldbrew {_version()}", front.model_hash)
    _dump(dump_ir, PASSES.index(write_bundle.NAME), write_bundle.NAME, data)
    if output:
        with open(output, "wb") as f:
            f.write(data)
    return data, graph


def _on_gpu(target):
    from coldbrew.targets import resolve

    try:
        return (resolve(target) if isinstance(target, str) else target).executes_on == "gpu"
    except ValueError:
        return False  # compile_graph reports the bad name


def _compile_gpu(front, output, tgt, dump_ir, variants=None, weights=None):
    """The GPU passes after import_relax (GPU_PASSES)."""
    from . import (codegen_spirv, extract_layers, fuse_layers, plan_memory, plan_weights, schedule_gpu,
                   select_gpu_variants, write_bundle)

    done = _dumper(dump_ir, GPU_PASSES, select_gpu_variants.NAME)

    mod, anchors = select_gpu_variants.run(front.mod, variants)
    done(select_gpu_variants, mod)
    mod = done(fuse_layers, fuse_layers.run(mod, cpu=False))
    mod = done(schedule_gpu, schedule_gpu.run(mod))
    graph = done(extract_layers, extract_layers.run(mod, front.name, front.input_names, front.output_names,
                                                    anchors))
    for layer in graph.layers:
        if layer.variant == "generic":
            layer.variant = "gpu.dlight"
    graph.threads = 1
    try:
        graph = done(plan_weights, plan_weights.run_gpu(graph, anchors, weights or "auto"))
    except ValueError as e:
        raise CompileError(str(e)) from None
    graph = done(plan_memory, plan_memory.run(graph, plan_memory.GPU_ALIGN))
    spirv = codegen_spirv.run(graph, tgt, anchors)
    done(codegen_spirv, spirv[0])
    data = done(write_bundle, write_bundle.run(graph, None, tgt, f"coldbrew {_version()}", front.model_hash, spirv))
    if output:
        with open(output, "wb") as f:
            f.write(data)
    return data, graph


def _lower(front, tgt, dump_ir, variants, weights, threads, tuning, queues, precision="fp32"):
    """The passes from block_layout to plan_memory."""
    from . import (block_layout, elide_copies, extract_layers, fuse_layers, plan_memory, plan_weights, schedule_kernels,
                   select_variants)

    done = _dumper(dump_ir, PASSES, block_layout.NAME)

    direct = plan_weights.direct_layers(weights, precision)
    mod = done(block_layout, block_layout.run(front.mod, tgt.vector, variants))
    mod, anchors = select_variants.run(mod, tgt.vector, variants, tuning, direct)
    done(select_variants, mod)
    mod = done(fuse_layers, fuse_layers.run(mod))
    mod, notes = schedule_kernels.run(mod, anchors, tgt.vector)
    done(schedule_kernels, mod)
    graph = extract_layers.run(mod, front.name, front.input_names, front.output_names, anchors)
    graph.notes += notes
    graph.threads = threads
    graph = done(extract_layers, graph)
    try:
        graph = done(plan_weights, plan_weights.run(graph, weights, queues, precision))
    except ValueError as e:
        raise CompileError(str(e)) from None
    graph = done(elide_copies, elide_copies.run(graph))
    return done(plan_memory, plan_memory.run(graph))
