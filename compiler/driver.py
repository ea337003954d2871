"""The compile driver: an ONNX model and its Options in, a bundle out.

    front    = front_end(model, options)             load_onnx .. import_relax, once
    tuning   = tune(front, options)                  each layer shape's variant and parameters, measured
    table    = profile(front, options, tuning)       the device cost table the plan is made from
    choices  = choose(table, options)                variants, weight forms, queues, threads, precisions
    choices, accuracy = narrow(front, options, choices)   the narrow weights' measured error
    data     = back_end(front, choices, ...)         the passes for the target, to the bundle's bytes
    data     = sign(data, options)

A target list (`--target host,aarch64,vulkan`) runs the stages for each
target and packs the bundles as one (compiler/bundle/multi.py). Each stage is skipped when its option is off: no tuning unless asked; no
cost table unless a plan or continuous mode needs one; the default plan's
choices are the options as given. The passes of the front and back end,
in order (compiler/pipeline.py runs them; one module each):

    load_onnx        read + check the ONNX model, fix input shapes
    fold_constants   fold shape subgraphs and other compile-time constants
    legalize_onnx    rewrite forms the importer lacks (compiler/onnx/); require static shape inputs
    fold_batchnorm   fold BatchNormalization into the preceding Conv
    import_relax     ONNX -> TVM Relax
    block_layout     activations between convolutions in the vector's blocked layout (NCHW{lanes}c)
    select_variants  a kernel variant per conv / dense layer; its transformed weights
    fuse_layers      legalize to TIR, fuse into layers (anchors take their epilogue)
    schedule_kernels the variants' explicit schedules; the generic one elsewhere
    extract_layers   Relax -> coldbrew Graph (tensors, layers, kernels)
    plan_weights     per layer: raw weights + transform kernel, or cached transformed ones;
                     fp32, or narrow (fp16, int8) widened by the transform
    elide_copies     concatenations and reshapes that only move bytes become aliases
    plan_branches    layers of an If decided at run time become branch steps
    plan_memory      static arena offsets for intermediate and prepared tensors
    add_warm_steps   continuous mode only: each layer's warm-fastest variant as an alternate
    codegen          kernels -> one CPU shared object (TVM LLVM)
    write_bundle     header + segments -> bytes

GPU targets (`vulkan`, `<preset>+vulkan`) take GPU_PASSES:
select_gpu_variants (convolutions and their epilogues -> shape-generic GPU
variants, compiler/gpu/conv.py) in place of select_variants, schedule_gpu
(TVM dlight GPU schedules for every other layer) in place of
schedule_kernels, codegen_spirv (the variants' shaders; coldbrew's GLSL
emitter for the rest; glslang, spirv-val) in place of codegen.
"""
import dataclasses

from .errors import CompileError, InternalError
from .ir.forms import NARROW
from .options import Choices, Options
from .passes import schedule_kernels
from .pipeline import back_end, front_end


def compile(model, options, output=None, progress=None, on_plan=None):
    """The bundle's bytes for `model` (a path, bytes or ModelProto) under
    `options` (an Options); written to `output` too when given.
    `progress(done, total, what)` hears the measuring stages advance;
    `on_plan` receives the plan the cost table gave (compiler/plan/scheduler.py).
    Every failure is a CompileError (an unexpected one an InternalError
    naming where it happened)."""
    try:
        data = sign(_each_target(model, options, progress, on_plan) if options.targets else
                    _one_target(model, options, progress, on_plan)[0], options)
    except CompileError:
        raise
    except Exception as e:
        raise InternalError("compile", e) from e
    if output:
        with open(output, "wb") as f:
            f.write(data)
    return data


def _one_target(model, options, progress, on_plan):
    """(bundle bytes, Choices) for one target."""
    front = front_end(model, options)
    tuning = tune(front, options, progress)
    table = profile(front, options, tuning, progress)
    choices = choose(table, options, on_plan)
    choices, accuracy = narrow(front, options, choices, progress)
    c = back_end(front, choices, tuning, accuracy)
    schedule_kernels.warn_fallbacks(c.notes)
    return c.data, choices


def _each_target(model, options, progress, on_plan):
    """One bundle for every target of a list (`--target host,aarch64,vulkan`):
    the model compiled for each, then packed as its sections, bytes they
    share stored once (compiler/bundle/multi.py); the runtime opens the
    best section a machine runs. The later CPU targets share the first's
    cached weights: their kernels are scheduled for its vector model
    (Target.blocks_of: its blocked layout, NEON taking 8 lanes as two
    registers) and take its per-layer variants and weight forms, unless
    --variant or --weights say otherwise."""
    from .bundle.multi import pack
    from .passes.write_bundle import verify

    parts, first = [], None
    for name in options.targets:
        one = dataclasses.replace(options, target=name, targets=None, sign=None)
        if first is not None and not one.on_gpu:
            one = _sharing(one, *first)
        try:
            data, choices = _one_target(model, one, progress, on_plan)
        except CompileError as e:
            raise CompileError(f"target {name}: {e}") from None
        if first is None and not one.on_gpu:
            first = (one.target.vector, choices)
        parts.append((name, data))
    data = pack(parts)
    verify(data)
    return data


def _integer_instructions(vector):
    """What the integer variants multiply with: VNNI, AMX tiles, AVX2's vpmaddwd."""
    return vector.int8_dot, vector.int8_tiles, vector.isa in ("avx2", "avx512")


def _sharing(options, vector, choices):
    """`options` for a later CPU target, on the first CPU target's vector
    model, variants and weight forms (what the user gave wins); integer
    variants only where both have the same integer instructions."""
    from .kernels import variants as known

    target = dataclasses.replace(options.target, blocks_of=vector)
    same_int8 = _integer_instructions(target.vector) == _integer_instructions(vector)
    integer = {v.name for v in known(vector) if v.integer}
    variants = {k: v for k, v in (choices.variants or {}).items()
                if same_int8 or (v if isinstance(v, str) else v[0]) not in integer}
    weights = choices.weights if isinstance(choices.weights, dict) else {"*": choices.weights}
    return dataclasses.replace(options, target=target, variants={**variants, **(options.variants or {})},
                               weights=options.weights if options.weights is not None else weights)


def tune(front, options, progress=None):
    """The layers' measured variants and parameters (compiler/measure/tune.py),
    or None: not asked, or a target other than this machine."""
    if not options.tune:
        return None
    from .measure.tune import tune as measure

    return measure(front, options.threads, progress=progress)


def profile(front, options, tuning, progress=None):
    """The device cost table (compiler/measure/profile.py), or None when
    neither a plan nor continuous mode needs it. A plan's narrow weights
    read in place need their direct forms measured; fp32 needs none."""
    if options.plan == "default" and not options.continuous:
        return None
    from .measure.profile import profile as measure

    direct = [options.precision] if options.precision in NARROW else []
    return measure(front, options.threads, progress, tuning=tuning, direct=direct)


def choose(table, options, on_plan=None):
    """The Choices: the options as given, or the plan's from the cost table
    (compiler/plan/scheduler.py) under them: forced variants, weight forms
    and queues win over the plan's."""
    given = options.default_choices()
    if not table:
        return given
    from .plan.scheduler import choose as plan

    best = plan(table, "warm") if options.continuous else None
    warm = (best["variants"], best["threads"]) if best else None
    if options.plan == "default":
        return dataclasses.replace(given, warm=warm)
    planned = plan(table, options.plan, options.precision)
    if on_plan:
        on_plan(planned)
    weights = options.weights if isinstance(options.weights, dict) else {"*": given.weights}
    queues = options.queues if isinstance(options.queues, dict) else ({"*": options.queues} if options.queues else {})
    # a first run that keeps cores for preparation: later runs execute on all of them
    keep = planned["threads"] < options.threads and not options.continuous
    return Choices(variants={**planned["variants"], **(options.variants or {})},
                   weights={"*": "cached", **planned["forms"], **weights},
                   threads=planned["threads"], queues={**planned["queues"], **queues},
                   precision={"*": "fp32", **{k: p for k, p in planned["precisions"].items() if p != "fp32"}},
                   later_threads=options.threads if keep else 0, warm=warm)


def narrow(front, options, choices, progress=None):
    """(choices, accuracy): narrow weights' per-layer precisions, chosen by
    their measured error (compiler/measure/error.py) among the layers the
    plan chose narrow (all, unplanned), the layers holding `max_error` kept
    fp32; accuracy None for fp32 weights."""
    if isinstance(choices.precision, dict):  # the plan's: the layers it chose narrow
        only = {k for k, p in choices.precision.items() if p != "fp32"}
    else:
        only = None
    precision = options.precision
    if precision == "fp32" or only == set():
        return dataclasses.replace(choices, precision="fp32"), None
    from .measure import error

    if progress:
        progress(0, 1, f"measure the {precision} weights' error")
    chosen, solo, accuracy = error.choose(front, precision, options.max_error, options.calibration, only,
                                          options.calibration_samples)
    accuracy["layers"] = solo
    return dataclasses.replace(choices, precision={"*": "fp32", **chosen}), accuracy


def sign(data, options):
    """The bundle signed with the options' key (compiler/bundle/sign.py), or as it is."""
    if not options.sign:
        return data
    from .bundle.sign import sign as sign_with

    return sign_with(data, options.sign)


def compile_model(model, output=None, progress=None, on_plan=None, **options):
    """compile() with the Options given as keywords (see Options for each)."""
    return compile(model, Options(**options), output, progress, on_plan)
