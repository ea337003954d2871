"""The compiler's pipeline: the pass lists and what runs them.

`PASSES` (CPU targets) and `GPU_PASSES` (Vulkan targets) name the passes in
order, one module each (compiler/__init__.py says what each does).
`front_end` runs the first five, which do not depend on the variant choice
(so the tuner, the profiler's columns and a compile share them);
`compile_graph` runs the rest for a target; `lower` runs the CPU passes
from block_layout to plan_memory (the error measurement's probe).
`--dump-ir` writes the IR after every pass, numbered by its place in its
list.
"""
import os
from dataclasses import dataclass

from .errors import CompileError

PASSES = ["load_onnx", "fold_constants", "legalize_onnx", "fold_batchnorm", "import_relax", "block_layout", "select_variants",
          "fuse_layers", "schedule_kernels", "extract_layers", "plan_weights", "elide_copies", "plan_memory", "add_warm_steps", "codegen",
          "write_bundle"]
GPU_PASSES = ["load_onnx", "fold_constants", "legalize_onnx", "fold_batchnorm", "import_relax",
              "select_gpu_variants", "fuse_layers", "schedule_gpu", "extract_layers", "plan_weights", "plan_memory", "codegen_spirv", "write_bundle"]


def version():
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


def front_end(model, input_shapes=None, constants=None, dump_ir=None):
    """Load, fold, legalize and import a model (the first passes)."""
    from . import fold_batchnorm, fold_constants, import_relax, legalize_onnx, load_onnx
    from .ops import graph_inputs

    proto, model_hash = load_onnx.read_model(model)
    done = _dumper(dump_ir, PASSES, load_onnx.NAME)

    proto = done(load_onnx, load_onnx.run(proto, input_shapes, constants))
    input_names = [i.name for i in graph_inputs(proto)]
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
    graph = lower(front, tgt, dump_ir, variants, weights or "cached", threads, tuning, queues, precision)
    if accuracy:
        graph.accuracy = {k: v for k, v in accuracy.items() if k != "layers"}
        for layer in graph.layers:
            layer.output_error = accuracy.get("layers", {}).get(layer.name, 0.0) if layer.weight_precision != "fp32" else 0.0
    graph.warm_threads = later_threads
    if warm:
        alt = lower(front, tgt, None, warm[0], "cached", warm[1], tuning, 0)
        graph = add_warm_steps.run(graph, alt, warm[1])
    _dump(dump_ir, PASSES.index(add_warm_steps.NAME), add_warm_steps.NAME, graph)
    code = codegen.run(graph, tgt)
    _dump(dump_ir, PASSES.index(codegen.NAME), codegen.NAME, code)
    data = write_bundle.run(graph, code, tgt, f"coldbrew {version()}", front.model_hash)
    _dump(dump_ir, PASSES.index(write_bundle.NAME), write_bundle.NAME, data)
    if output:
        with open(output, "wb") as f:
            f.write(data)
    return data, graph


def on_gpu(target):
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
    data = done(write_bundle, write_bundle.run(graph, None, tgt, f"coldbrew {version()}", front.model_hash, spirv))
    if output:
        with open(output, "wb") as f:
            f.write(data)
    return data, graph


def lower(front, tgt, dump_ir, variants, weights, threads, tuning, queues, precision="fp32"):
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
