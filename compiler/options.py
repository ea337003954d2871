"""What a compile is asked for, and what its back end is given.

`Options` are the user's, written once: `coldbrew compile` and
`compile_model` both build one, and it is checked here, when it is made.
`Choices` are what the driver decides for one bundle from the options and
the plan (compiler/plan/scheduler.py): each layer's variant, weight form,
preparation queue and precision; the passes read them from the pass
context (compiler/pipeline.py Compilation), never from the options."""
import re
from dataclasses import dataclass, replace

from .errors import CompileError
from .ir.forms import NARROW, PRECISIONS

PLANS = ("default", "warm", "cold-greedy", "cold")


@dataclass(frozen=True)
class Options:
    target: object = "host"        # a target name (targets/) or Target; resolved to a Target when made;
                                   # names joined by commas: one bundle for each (bundle/multi.py)
    input_shapes: dict = None      # {input: [dims]}: each an int, a Dim, or text: "1x3x[32:640:32]x[W=32:640]"
    typical_shapes: dict = None    # {input: [ints]}: the sizes the plan is weighed for (default: each range's max)
    constants: dict = None         # {input: ndarray}: inputs frozen to values (shape parameters)
    bounds: dict = None            # {tensor: int}: the most entries an output sized by the data may hold
                                   # (NonZero, Compress, NonMaxSuppression, Unique; default: all it could)
    variants: dict = None          # forced kernel variants {"*" | op | layer: variant}; win over the plan's
    weights: object = None         # "cached" | "raw" | "direct" | "auto" (GPU), or {"*": .., layer: ..};
                                   # None: "auto" on a GPU, "direct" for narrow weights unplanned, else "cached"
    threads: int = 2               # execution threads the plan is made for
    queues: object = 0             # first-run preparation: 0 inline, q >= 1 worker q (or {"*": q, layer: q})
    plan: str = "default"          # "warm", "cold-greedy", "cold": from the device cost table (measure/profile.py)
    tune: bool = False             # measure each layer's variant and parameters (measure/tune.py; host only)
    continuous: bool = False       # also store each layer's warm-fastest variant (passes/add_warm_steps.py)
    precision: str = "fp32"        # stored weights: "fp32", "fp16" or "int8" (passes/plan_weights.py)
    max_error: float = None        # narrow weights: keep layers fp32 until the outputs' error is under it
    calibration: str = None        # .npz of sample inputs for the narrow-weight error (else generated)
    calibration_samples: int = 4   # ... how many generated, when no calibration data is given
    sign: str = None               # secret key file (coldbrew keygen): sign the bundle (bundle/sign.py)
    dump_ir: str = None            # write the IR after each pass here
    targets: tuple = None          # set from a target list: its names (target: the first's Target)

    def __post_init__(self):
        from coldbrew.targets import resolve

        if isinstance(self.target, str) and "," in self.target:
            names = tuple(n.strip() for n in self.target.split(","))
            if len(set(names)) != len(names) or "" in names:
                raise CompileError(f"--target {self.target}: each target is named once")
            object.__setattr__(self, "targets", names)
            object.__setattr__(self, "target", names[0])
        try:
            target = resolve(self.target) if isinstance(self.target, str) else self.target
        except ValueError as e:
            raise CompileError(str(e)) from None
        object.__setattr__(self, "target", target)
        for name in ("input_shapes", "typical_shapes", "constants", "variants", "bounds"):  # none given, however written
            object.__setattr__(self, name, getattr(self, name) or None)
        object.__setattr__(self, "input_shapes", input_dims(self.input_shapes, self.typical_shapes))
        if self.typical_shapes:  # as sizes, however written (the typical sizes are the Dims' own)
            object.__setattr__(self, "typical_shapes", {k: [int(d) for d in re.findall(r"\d+", v)] if isinstance(
                v, str) else [int(d) for d in v] for k, v in self.typical_shapes.items()})
        self._check()

    @property
    def on_gpu(self):
        return self.target.executes_on == "gpu"

    @property
    def dims(self):
        """{name: Dim} of the input dimensions declared as ranges."""
        return {d.name: d for dims in (self.input_shapes or {}).values() for d in dims if isinstance(d, Dim)}

    def _check(self):
        """CompileError for values out of range and options that do not go together."""
        if self.plan not in PLANS:
            raise CompileError(f"plan must be one of {', '.join(PLANS)}, not {self.plan!r}")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise CompileError(f"threads must be a positive integer, not {self.threads!r}")
        if not isinstance(self.calibration_samples, int) or self.calibration_samples < 1:
            raise CompileError(f"calibration samples must be a positive integer, not {self.calibration_samples!r}")
        if self.precision not in PRECISIONS:
            raise CompileError(f"weight precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.precision != "fp32" and self.on_gpu:
            raise CompileError(f"{self.precision} weights are not available for GPU targets yet (compile with fp32)")
        if self.max_error is not None and self.precision == "fp32":
            raise CompileError("a maximum error applies to narrow weights: give a precision (fp16 or int8) with it")
        for name, n in (self.bounds or {}).items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise CompileError(f"bound of '{name}' must be a whole number of entries, not {n!r}")
        if self.dims and self.continuous:
            raise CompileError("continuous mode is not available with input dimensions given as ranges yet "
                               "(compile without --continuous, or give fixed sizes)")
        if self.dims and self.on_gpu:
            raise CompileError("input dimensions given as ranges are not available for GPU targets yet "
                               "(give fixed sizes)")
        if (self.plan != "default" or self.continuous or self.tune) and self.on_gpu:
            raise CompileError("plans, tuning and continuous mode are not available for GPU targets yet "
                               "(compile with the default plan)")

    def default_choices(self):
        """The Choices of a compile without a plan: the options as given."""
        weights = self.weights or ("auto" if self.on_gpu else
                                   "direct" if self.precision in NARROW and self.plan == "default" else "cached")
        return Choices(self.variants, weights, self.threads, self.queues, self.precision)


@dataclass(frozen=True)
class Choices:
    variants: dict = None          # kernel variant per layer {"*" | op | layer: variant}
    weights: object = "cached"     # weight form per layer (passes/plan_weights.py)
    threads: int = 2               # execution threads of the first run
    queues: object = 0             # preparation queue per layer
    precision: object = "fp32"     # stored weight precision, or {"*": p, layer: p}
    later_threads: int = 0         # execution threads of later runs (0: `threads`)
    warm: tuple = None             # continuous mode: (variants, threads) of the warm plan


@dataclass(frozen=True)
class Dim:
    """An input dimension declared as a range: any multiple of `step` from
    `min` to `max`; `typical` is the size the plan is weighed for. A
    `counted` Dim is no input's: a kernel counts it from the data (how many
    entries a NonZero finds: kernels/counted.py), from 0 to its bound."""
    name: str
    min: int
    max: int
    step: int = 1
    typical: int = 0  # 0: max
    counted: bool = False

    def __post_init__(self):
        if not (isinstance(self.min, int) and isinstance(self.max, int) and isinstance(self.step, int)):
            raise CompileError(f"dimension {self.name}: bounds must be integers")
        if not (0 if self.counted else 1) <= self.min <= self.max or self.step < 1 or self.min % self.step or self.max % self.step:
            raise CompileError(f"dimension {self.name}: [{self.min}:{self.max}:{self.step}] is not a range "
                               f"(1 <= min <= max, both multiples of the step)")
        typical = self.typical or self.max
        if not self.min <= typical <= self.max or typical % self.step:
            raise CompileError(f"dimension {self.name}: typical size {typical} is not in {self}")
        object.__setattr__(self, "typical", typical)

    def __str__(self):
        return f"[{self.min}:{self.max}" + (f":{self.step}]" if self.step > 1 else "]")

    def holds(self, n):
        return self.min <= n <= self.max and n % self.step == 0


_RANGE = re.compile(r"\[(?:([A-Za-z_][\w.]*)=)?(\d+):(\d+)(?::(\d+))?\]")


def _dims_of(name, spec):
    """[int | Dim | str (a name declared elsewhere)] of one input's dimensions."""
    items = re.findall(r"\[[^\]]*\]|[^xX\[\]]+", spec) if isinstance(spec, str) else spec
    out = []
    for axis, d in enumerate(items):
        if isinstance(d, (Dim, int)) and not isinstance(d, bool):
            out.append(d)
            continue
        text = str(d).strip()
        m = _RANGE.fullmatch(text)
        if m:
            out.append(Dim(m.group(1) or f"{name}.{axis}", int(m.group(2)), int(m.group(3)), int(m.group(4) or 1)))
        elif text.isdigit():
            out.append(int(text))
        elif re.fullmatch(r"\[?[A-Za-z_][\w.]*\]?", text):  # a name declared elsewhere ([NAME] if it holds an x)
            out.append(text.strip("[]"))
        else:
            raise CompileError(f"input '{name}' dimension {axis}: '{d}' is not a size, a range like [32:640] or "
                               f"[32:640:32] (a multiple of 32), or [NAME=32:640]")
    return out


def input_dims(shapes, typical=None):
    """The input shapes with each range a Dim (a name used twice is one Dim,
    declared once), each Dim's typical size from `typical`; None for none."""
    if not shapes:
        return None
    parsed = {name: _dims_of(name, spec) for name, spec in shapes.items()}
    declared = {}
    for name, dims in parsed.items():
        for d in dims:
            if isinstance(d, Dim) and declared.setdefault(d.name, d) != d:
                raise CompileError(f"dimension {d.name} is declared twice, as {declared[d.name]} and {d}")
    for name, sizes in (typical or {}).items():
        sizes = [int(s) for s in (sizes.lower().split("x") if isinstance(sizes, str) else sizes)]
        dims = parsed.get(name)
        if dims is None or len(sizes) != len(dims):
            raise CompileError(f"--typical-shape {name}: expected {len(dims or [])} sizes for input '{name}'")
        for d, n in zip(dims, sizes):
            d = declared.get(d) if isinstance(d, str) else d
            if isinstance(d, Dim):
                declared[d.name] = replace(d, typical=n)
            elif d != n:
                raise CompileError(f"--typical-shape {name}: size {n} where the input's size is fixed to {d}")
    out = {}
    for name, dims in parsed.items():
        for d in dims:
            if isinstance(d, str) and d not in declared:
                raise CompileError(f"input '{name}': dimension '{d}' is not declared (write [{d}=MIN:MAX] once)")
        out[name] = tuple(declared[d.name if isinstance(d, Dim) else d] if isinstance(d, (Dim, str)) else d
                          for d in dims)
    return out
