"""What a compile is asked for, and what its back end is given.

`Options` are the user's, written once: `coldbrew compile` and
`compile_model` both build one, and it is checked here, when it is made.
`Choices` are what the driver decides for one bundle from the options and
the plan (compiler/plan/scheduler.py): each layer's variant, weight form,
preparation queue and precision; the passes read them from the pass
context (compiler/pipeline.py Compilation), never from the options."""
from dataclasses import dataclass

from .errors import CompileError
from .ir.forms import NARROW, PRECISIONS

PLANS = ("default", "warm", "cold-greedy", "cold")


@dataclass(frozen=True)
class Options:
    target: object = "host"        # a target name (targets/) or Target; resolved to a Target when made
    input_shapes: dict = None      # {input: [dims]}: input dimensions fixed
    constants: dict = None         # {input: ndarray}: inputs frozen to values (shape parameters)
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

    def __post_init__(self):
        from coldbrew.targets import resolve

        try:
            target = resolve(self.target) if isinstance(self.target, str) else self.target
        except ValueError as e:
            raise CompileError(str(e)) from None
        object.__setattr__(self, "target", target)
        for name in ("input_shapes", "constants", "variants"):  # none given, however written
            object.__setattr__(self, name, getattr(self, name) or None)
        self._check()

    @property
    def on_gpu(self):
        return self.target.executes_on == "gpu"

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
