"""The compiler's pipeline: one Compilation carried through the passes, in
the order of one list, by one loop.

`PASSES` (CPU targets) and `GPU_PASSES` (Vulkan targets) are the pass
modules in order (compiler/driver.py says what each does). Every pass is
`run(c) -> c`: it reads what it needs of the Compilation (options, target,
the IR in hand) and leaves what it makes there. `run(passes, c, start,
stop)` runs a stretch of a list and writes the IR after each pass
(`--dump-ir`, numbered by the pass's place in its list); an exception that
is not a CompileError leaves it as an InternalError naming the pass.

Stretches in use: `front_end` (load_onnx to import_relax: what does not
depend on the variant choice, run once per compile and shared by the tuner,
the profiler and the back end), `lower` (block_layout to plan_memory: the
error measurement's probe, continuous mode's warm graph) and `back_end`
(the rest, for the target). The stages around them are compiler/driver.py's.
"""
import dataclasses
import os
from dataclasses import dataclass, field

from .passes import (add_warm_steps, block_layout, codegen, elide_copies, extract_layers, fold_batchnorm,
                     fold_constants, fuse_layers, import_relax, legalize_onnx, load_onnx, plan_branches,
                     plan_memory, plan_weights, schedule_kernels, select_variants, write_bundle)
from .gpu import codegen_spirv, schedule_gpu, select_gpu_variants
from .errors import CompileError, InternalError, quiet
from .options import Choices, Options

FRONT = [load_onnx, fold_constants, legalize_onnx, fold_batchnorm, import_relax]
PASSES = FRONT + [block_layout, select_variants, fuse_layers, schedule_kernels, extract_layers, plan_weights,
                  elide_copies, plan_branches, plan_memory, add_warm_steps, codegen, write_bundle]
GPU_PASSES = FRONT + [select_gpu_variants, fuse_layers, schedule_gpu, extract_layers, plan_weights, plan_memory,
                      codegen_spirv, write_bundle]


@dataclass
class Compilation:
    """What the passes share: the source, the options (compiler/options.py)
    and the choices made for this bundle, then the IR in hand, each field
    set by the pass named beside it."""

    model: object = None          # the source: a path, bytes or a ModelProto
    options: Options = field(default_factory=Options)  # the user's, whole (the target resolved)
    choices: Choices = field(default_factory=Choices)  # each layer's variant, weight form, queue, precision
    tuning: object = None         # measured variants and parameters (compiler/measure/tune.py)
    accuracy: dict = None         # measured narrow-weight error, stored in the bundle (write_bundle)
    warm_graph: object = None     # continuous mode: the warm plan's Graph (add_warm_steps)
    producer: str = ""
    cells: bool = True            # recurrent cells as cell layers (legalize_onnx); False for GPU targets
    proto: object = None          # load_onnx ... fold_batchnorm: the ONNX model
    model_hash: str = ""          # load_onnx
    qdq_scales: list = field(default_factory=list)  # fold_constants: scales of int8 weights dequantized
    input_names: list = None      # load_onnx
    output_names: list = None     # load_onnx
    name: str = "model"           # import_relax
    dims: dict = None             # import_relax: {Dim: tir var} of the input dimensions declared as ranges
    mod: object = None            # import_relax ... schedule_kernels: the TVM IRModule
    anchors: tuple = ()           # select_variants / select_gpu_variants
    notes: list = field(default_factory=list)  # what passes report (schedule_kernels)
    graph: object = None          # extract_layers ... add_warm_steps: the coldbrew Graph
    code: bytes = None            # codegen: the CPU shared object
    spirv: tuple = None           # codegen_spirv: (segment bytes, Shader records)
    data: bytes = None            # write_bundle: the bundle

    @property
    def target(self):
        return self.options.target

    @property
    def on_gpu(self):
        return self.options.on_gpu

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
    (default: all of them) on `c`; the IR after each is dumped (--dump-ir)."""
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
        _dump(c.options.dump_ir, k, names[k], c.in_hand())
    return c


def front_end(model, options=None, cells=None):
    """The first passes, load_onnx to import_relax: a Compilation holding
    the Relax module, the model's hash and its input and output names.
    `cells`: recurrent cells as cell layers (default: on CPU targets;
    False unrolls them, as GPU targets need: the cell kernel is CPU code)."""
    options = options or Options()
    cells = not options.on_gpu if cells is None else cells
    return run(PASSES, Compilation(model=model, options=options, cells=cells), stop=import_relax.NAME)


def _from_front(front, **fields):
    """A copy of `front` (front_end's) with these fields, for one compile
    of its own: what the later passes make is set on the copy alone."""
    return dataclasses.replace(front, notes=list(front.notes), anchors=(), graph=None, code=None, spirv=None,
                               data=None, warm_graph=None, **fields)


def variant_anchors(front):
    """The passes block_layout and select_variants on `front`, the choices
    left at their defaults: the anchors (conv and dense layers) with the
    variants made for the target (the layers the tuner and the profiler
    measure)."""
    return run(PASSES, _from_front(front, choices=Choices()), block_layout.NAME, select_variants.NAME).anchors


def lower(front, choices, tuning=None):
    """The CPU passes from block_layout to plan_memory on `front`: the Graph."""
    c = _from_front(front, choices=choices, tuning=tuning,
                    options=dataclasses.replace(front.options, dump_ir=None))
    return run(PASSES, c, block_layout.NAME, plan_memory.NAME).graph


def back_end(front, choices, tuning=None, accuracy=None):
    """The passes after the front end, for the front's target: the
    Compilation holding the bundle (`data`) and its Graph. `choices`: each
    layer's variant, weight form, queue and precision; `tuning`
    (compiler/measure/tune.py) the measured parameters; `accuracy`
    (compiler/measure/error.py) is stored in the bundle."""
    if front.cells and front.on_gpu:
        raise ValueError("a front end made for a CPU target (recurrent cells as cell layers) given a GPU target")
    c = _from_front(front, choices=choices, tuning=tuning, accuracy=accuracy, producer=f"coldbrew {version()}")
    if c.on_gpu:
        return run(GPU_PASSES, c, select_gpu_variants.NAME)
    c = run(PASSES, c, block_layout.NAME, plan_memory.NAME)
    if choices.warm:
        variants, threads = choices.warm
        c.warm_graph = lower(front, Choices(variants, "cached", threads), tuning)
    return run(PASSES, c, add_warm_steps.NAME)


def compile_graph(model, output=None, front=None, tuning=None, accuracy=None, **given):
    """One bundle without planning, and its Graph: (data, graph). `given`
    are Options' fields (target, input_shapes, constants, dump_ir) and
    Choices' (variants, weights, threads, queues, precision, later_threads,
    warm); `front` (front_end's result for this model, target and inputs)
    skips the first passes. The profile's columns and the tests compile
    this way; an app's compile goes through compiler/driver.py."""
    names = {f.name for f in dataclasses.fields(Choices)}
    asked = {"dump_ir": None, **{k: v for k, v in given.items() if k not in names}}
    if front:  # the front's target and bindings, with these
        front = dataclasses.replace(front, options=dataclasses.replace(front.options, **asked))
    front = front or front_end(model, Options(**asked))
    chosen = {k: v for k, v in given.items() if k in names and v is not None}
    choices = Choices(**{"weights": "auto" if front.on_gpu else "cached", **chosen})
    c = back_end(front, choices, tuning, accuracy)
    if output:
        with open(output, "wb") as f:
            f.write(c.data)
    return c.data, c.graph
