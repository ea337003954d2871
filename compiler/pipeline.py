"""The compiler's pipeline: one Compilation carried through the passes, in
the order of one list, by one loop.

`PASSES` (CPU targets) and `GPU_PASSES` (Vulkan targets) are the pass
modules in order (compiler/__init__.py says what each does). Every pass is
`run(c) -> c`: it reads what it needs of the Compilation (options, target,
the IR in hand) and leaves what it makes there. `run(passes, c, start,
stop)` runs a stretch of a list and writes the IR after each pass
(`--dump-ir`, numbered by the pass's place in its list); an exception that
is not a CompileError leaves it as an InternalError naming the pass.

Stretches in use: `front_end` (load_onnx to import_relax: what does not
depend on the variant choice, shared by the tuner, the profiler's columns
and a compile), `lower` (block_layout to plan_memory: the error
measurement's probe, continuous mode's warm graph) and `compile_graph`
(the rest, for a target).
"""
import dataclasses
import os
from dataclasses import dataclass, field

from .passes import (add_warm_steps, block_layout, codegen, elide_copies, extract_layers, fold_batchnorm,
                     fold_constants, fuse_layers, import_relax, legalize_onnx, load_onnx, plan_branches,
                     plan_memory, plan_weights, schedule_kernels, select_variants, write_bundle)
from .gpu import codegen_spirv, schedule_gpu, select_gpu_variants
from .errors import CompileError, InternalError, quiet

FRONT = [load_onnx, fold_constants, legalize_onnx, fold_batchnorm, import_relax]
PASSES = FRONT + [block_layout, select_variants, fuse_layers, schedule_kernels, extract_layers, plan_weights,
                  elide_copies, plan_branches, plan_memory, add_warm_steps, codegen, write_bundle]
GPU_PASSES = FRONT + [select_gpu_variants, fuse_layers, schedule_gpu, extract_layers, plan_weights, plan_memory,
                      codegen_spirv, write_bundle]


@dataclass
class Compilation:
    """What the passes share. Options first (as compile_model takes them),
    then the IR in hand, each field set by the pass named beside it."""

    model: object = None          # the source: a path, bytes or a ModelProto
    target: object = None         # targets.Target (None until compile_graph resolves it)
    input_shapes: dict = None
    constants: dict = None
    variants: dict = None         # forced kernel variants
    weights: object = "cached"    # weight forms (plan_weights)
    threads: int = 2              # execution threads of the plan
    tuning: object = None         # measured variants and parameters (compiler/measure/tune.py)
    queues: object = 0            # preparation queues (plan_weights)
    precision: object = "fp32"    # stored weight precisions (plan_weights)
    accuracy: dict = None         # measured narrow-weight error, stored in the bundle (write_bundle)
    warm: tuple = None            # continuous mode: (variants, threads) of the warm plan
    warm_graph: object = None     # ... lowered with them (add_warm_steps)
    later_threads: int = 0        # execution threads of later runs (add_warm_steps)
    dump_ir: str = None           # write the IR after each pass here
    producer: str = ""
    cells: bool = True            # recurrent cells as cell layers (legalize_onnx); False for GPU targets
    proto: object = None          # load_onnx ... fold_batchnorm: the ONNX model
    model_hash: str = ""          # load_onnx
    qdq_scales: list = field(default_factory=list)  # fold_constants: scales of int8 weights dequantized
    input_names: list = None      # load_onnx
    output_names: list = None     # load_onnx
    name: str = "model"           # import_relax
    mod: object = None            # import_relax ... schedule_kernels: the TVM IRModule
    anchors: tuple = ()           # select_variants / select_gpu_variants
    notes: list = field(default_factory=list)  # what passes report (schedule_kernels)
    graph: object = None          # extract_layers ... add_warm_steps: the coldbrew Graph
    code: bytes = None            # codegen: the CPU shared object
    spirv: tuple = None           # codegen_spirv: (segment bytes, Shader records)
    data: bytes = None            # write_bundle: the bundle

    @property
    def on_gpu(self):
        return self.target is not None and self.target.executes_on == "gpu"

    def in_hand(self):
        """The IR the last pass made (for --dump-ir)."""
        for ir in (self.data, self.spirv and self.spirv[0], self.code, self.graph, self.mod, self.proto):
            if ir is not None:
                return ir
        return b""


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


def run(passes, c, start=None, stop=None):
    """Run `passes` from the one named `start` through the one named `stop`
    (default: all of them) on `c`; the IR after each is dumped (c.dump_ir)."""
    names = [p.NAME for p in passes]
    first = names.index(start) if start else 0
    last = names.index(stop) if stop else len(passes) - 1
    for k in range(first, last + 1):
        try:
            with quiet():
                c = passes[k].run(c)
        except CompileError:
            raise
        except Exception as e:  # a bug: one sentence naming the pass, not a traceback
            raise InternalError(f"pass {names[k]}", e) from e
        _dump(c.dump_ir, k, names[k], c.in_hand())
    return c


def front_end(model, input_shapes=None, constants=None, dump_ir=None, cells=True):
    """The first passes, load_onnx to import_relax: a Compilation holding
    the Relax module, the model's hash and its input and output names.
    `cells`: recurrent cells as cell layers (CPU targets; False unrolls
    them, as GPU targets need: the cell kernel is CPU code)."""
    return run(PASSES, Compilation(model=model, input_shapes=input_shapes, constants=constants, dump_ir=dump_ir,
                                   cells=cells), stop=import_relax.NAME)


def _from_front(front, **options):
    """A copy of `front` (front_end's) with these options, for one compile
    of its own: what the later passes make is set on the copy alone."""
    return dataclasses.replace(front, notes=list(front.notes), anchors=(), graph=None, code=None, spirv=None,
                               data=None, warm_graph=None, **options)


def variant_anchors(front, tgt):
    """The passes block_layout and select_variants on `front` for target
    `tgt`, options left at their defaults: the anchors (conv and dense
    layers) with the variants made for the target (the layers the tuner
    and the profiler measure)."""
    return run(PASSES, _from_front(front, target=tgt), block_layout.NAME, select_variants.NAME).anchors


def lower(front, tgt, dump_ir, variants, weights, threads, tuning, queues, precision="fp32"):
    """The CPU passes from block_layout to plan_memory on `front`: the Graph."""
    c = _from_front(front, target=tgt, dump_ir=dump_ir, variants=variants, weights=weights, threads=threads,
                    tuning=tuning, queues=queues, precision=precision)
    return run(PASSES, c, block_layout.NAME, plan_memory.NAME).graph


def compile_graph(model, output=None, target="host", input_shapes=None, constants=None, dump_ir=None,
                  variants=None, weights=None, threads=2, front=None, tuning=None, queues=0, warm=None,
                  precision="fp32", accuracy=None, later_threads=0):
    """compile_model without planning, also returning the final Graph
    (layers, weights raw and transformed). `front` (front_end's result for
    this model and these inputs) skips the first passes; `tuning`
    (compiler/measure/tune.py) supplies measured variants and parameters; `warm`
    ((variants, threads) of the warm plan) adds continuous mode's warm
    alternates; `precision` (a precision or {"*": p, "<layer>": p}) the
    stored weights' (compiler/passes/plan_weights.py); `accuracy` (measure_error's)
    is stored in the bundle; `later_threads` (without `warm`) the execution
    threads of runs after the first (0: `threads`)."""
    from coldbrew.targets import resolve

    try:
        tgt = resolve(target) if isinstance(target, str) else target
    except ValueError as e:
        raise CompileError(str(e)) from None
    front = front or front_end(model, input_shapes, constants, dump_ir, tgt.executes_on != "gpu")
    if front.cells and tgt.executes_on == "gpu":
        raise ValueError("a front end made for a CPU target (recurrent cells as cell layers) given a GPU target")
    c = _from_front(front, target=tgt, dump_ir=dump_ir, variants=variants, threads=threads, tuning=tuning,
                    queues=queues, precision=precision, accuracy=accuracy, warm=warm, later_threads=later_threads,
                    producer=f"coldbrew {version()}")
    if c.on_gpu:
        c.weights = weights or "auto"
        c = run(GPU_PASSES, c, select_gpu_variants.NAME)
    else:
        c.weights = weights or "cached"
        c = run(PASSES, c, block_layout.NAME, plan_memory.NAME)
        if warm:
            c.warm_graph = lower(front, tgt, None, warm[0], "cached", warm[1], tuning, 0)
        c = run(PASSES, c, add_warm_steps.NAME)
    if output:
        with open(output, "wb") as f:
            f.write(c.data)
    return c.data, c.graph


def on_gpu(target):
    from coldbrew.targets import resolve

    try:
        return (resolve(target) if isinstance(target, str) else target).executes_on == "gpu"
    except ValueError:
        return False  # compile_graph reports the bad name
