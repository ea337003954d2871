"""coldbrew's own graph: what the later passes and the bundle writer see.

A Graph is a list of tensors and a list of layers in execution order. Each
layer calls one kernel with tensor arguments (inputs, weights, then
outputs). Weights carry their numpy data; the others get an arena offset
from the memory planner.
"""
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import CompileError

BLOCKED_MARK = "@"  # a blocked value's name: its NCHW value's, this mark, the layout (NCHW8c)


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple
    kind: str  # input | output | intermediate | weight | prepared | dim (a Dim's size: `dim`)
    data: np.ndarray = None  # weights only
    arena_offset: int = 0    # arena (input/output/intermediate) or prepared area (prepared)
    cached: bool = False     # weight: holds transformed weights (weights_cached segment)
    anchor: object = None    # weight: the select_variants Anchor whose transformed weights these are
    source: str = ""         # the ONNX tensor whose value it holds ("": one the compiler made)
    layout: str = ""         # its layout where not the ONNX tensor's (NCHW{b}c)
    extents: tuple = None    # sized at run time: its extents (TVM expressions of the dims' variables);
                             # `shape` holds their largest values
    dim: object = None       # kind dim: the Dim (compiler/options.py) whose size it holds
    count: int = None        # kind dim, counted: the tensor (one int64) whose value a kernel counts it into

    @property
    def nbytes(self):
        if self.kind == "dim":  # a size handed to kernels as a number: no bytes
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Layer:
    name: str
    op: str
    kernel: str          # symbol of the execute kernel
    args: list           # tensor indices: inputs, weights, outputs
    num_outputs: int
    variant: str = "generic"
    transform: str = ""  # symbol of the weight transform kernel ("" = none at run time)
    transform_args: list = field(default_factory=list)  # raw tensor(s), then prepared tensor(s)
    weight_form: str = "raw"
    weight_precision: str = "fp32"  # the stored weights' precision (compiler/passes/plan_weights.py)
    weight_error: float = 0.0       # their max |w' - w| / max |w|
    output_error: float = 0.0       # the model's output error with only this layer narrowed (measure_error.py)
    params: dict = field(default_factory=dict)  # the variant's schedule parameters
    tuned: bool = False  # params measured on the device, not derived from the target's model
    prep_queue: int = 0
    exec_queue: int = 0
    warm: dict = None  # continuous mode's warm-fastest alternate: variant, kernel, args, params
    guard: tuple = None  # a branch step's (bool tensor, value): executed only when it holds it (ir/branches.py)
    loop: dict = None  # a run-time loop's START or END layer: its LOOP record (ir/loops.py)


@dataclass
class Graph:
    name: str
    tensors: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    inputs: list = field(default_factory=list)   # tensor indices
    outputs: list = field(default_factory=list)  # tensor indices
    kernels: dict = field(default_factory=dict)  # symbol -> tvm PrimFunc
    sizes_as: dict = field(default_factory=dict)  # symbol -> {its variable: the Dim variable its calls bind}
    arena_size: int = 0
    prepared_size: int = 0
    threads: int = 1
    warm_threads: int = 0  # execution threads after the first run (0: threads)
    notes: list = field(default_factory=list)
    accuracy: dict = None  # narrowed weights' measured effect on the outputs (compiler/measure/error.py)
    aliases: dict = field(default_factory=dict)  # tensor -> (tensor, byte offset) its bytes lie in (elide_copies)
    variables: dict = field(default_factory=dict)  # {Dim: tir var}: the sizes set at run time (ir/dims.py)
    loops: list = field(default_factory=list)  # [(START layer, END layer)] of the run-time loops (ir/loops.py)

    def add_tensor(self, tensor):
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def dump(self):
        lines = [f"graph {self.name}: {len(self.tensors)} tensors, {len(self.layers)} layers, "
                 f"arena {self.arena_size} B, prepared {self.prepared_size} B"]
        lines += [f"  input  %{i} {self._shape(i)}" for i in self.inputs]
        for i, t in enumerate(self.tensors):
            if t.kind == "dim":  # its variable: the size over the step
                step = f" ({self.variables[t.dim]} = size / {t.dim.step})" if t.dim.step > 1 else ""
                counted = f" counted into %{t.count}" if t.count is not None else ""
                lines.append(f"  dim    %{i} {t.name} {t.dim} typical {t.dim.typical}{step}{counted}")
            elif t.extents is not None and t.kind not in ("input", "output"):
                lines.append(f"  sized  %{i} {self._shape(i)}")
        for layer in self.layers:
            args = ", ".join(f"%{a}" for a in layer.args)
            prep = f" <- {layer.transform}({', '.join(f'%{a}' for a in layer.transform_args)})" if layer.transform else ""
            warm = f" / warm {layer.warm['variant']}" if layer.warm else ""
            prec = f" {layer.weight_precision} err {layer.weight_error:.2g}" if layer.weight_precision != "fp32" else ""
            lines.append(f"  {layer.name}: {layer.op} [{layer.variant}, {layer.weight_form}{prec}{warm}] ({args}){prep}")
        for i, (r, offset) in sorted(self.aliases.items()):
            lines.append(f"  alias  %{i} = bytes {offset}.. of %{r}")
        lines += [f"  output %{i} {self._shape(i)}" for i in self.outputs]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _shape(self, i):
        """Tensor i's name, dtype and shape: sized at run time, its largest and its extents."""
        t = self.tensors[i]
        extents = ", ".join(re.sub(r"T\.int64\((-?\d+)\)", r"\1", str(e)) for e in t.extents or ())
        return f"{t.name} {t.dtype}{list(t.shape)}" + (f" = [{extents}]" if t.extents is not None else "")


def resolve(graph, tensor):
    """(root tensor, byte offset) of `tensor`'s bytes: itself, or the region it aliases."""
    offset = 0
    while tensor in graph.aliases:
        tensor, at = graph.aliases[tensor]
        offset += at
    return tensor, offset


def signatures(graph):
    """[(symbol, [(dtype, byte size)])] of every kernel in the code, sorted
    by symbol: the calling contract the runtime checks the plan's calls
    against (each argument of that dtype and size is read and written inside
    its bytes; one sized at run time, inside its largest bytes; a size set
    at run time is ("int64", 0))."""
    from . import dims

    out = []
    for sym, func in sorted(graph.kernels.items()):
        args = []
        named = {v.name: d for d, v in graph.variables.items()}
        named.update({own: named[bound] for own, bound in graph.sizes_as.get(sym, {}).items() if bound in named})
        for p in func.params:
            if not hasattr(p, "shape"):
                if p.name not in named:
                    raise CompileError(f"kernel {sym} takes a non-tensor argument '{p.name}'")
                args.append(("int64", 0))
                continue
            n = np.dtype(str(p.dtype)).itemsize
            bound = {named[v.name]: v for d in p.shape for v in _variables(d) if v.name in named}
            for d in (dims.largest(p.shape, bound) if bound else p.shape):
                if not isinstance(d, int) and not hasattr(d, "value"):
                    raise CompileError(f"kernel {sym}: argument '{p.name}' has a symbolic dimension ({d})")
                n *= int(d)
            args.append((str(p.dtype), n))
        out.append((sym, args))
    return out


def _variables(e):
    """The variables an extent reads."""
    from tvm.tirx.analysis import undefined_vars

    return [] if isinstance(e, int) or hasattr(e, "value") else list(undefined_vars(e))
