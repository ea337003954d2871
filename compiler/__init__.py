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
variants, compiler/gpu/conv.py) in place of select_variants,
schedule_gpu (TVM dlight GPU schedules for every other layer) in place of
schedule_kernels, codegen_spirv (the variants' shaders; coldbrew's GLSL
emitter for the rest; glslang, spirv-val) in place of codegen.
"""
from coldbrew.command import missing_compiler_modules

_missing = missing_compiler_modules()
if _missing:  # a runtime-only install (pip install coldbrew)
    raise ImportError(f"coldbrew's compiler needs packages that are not installed here "
                      f"(missing: {', '.join(_missing)}): pip install 'coldbrew[compiler]'")

from .errors import CompileError, InternalError, UnsupportedOperatorError  # noqa: E402
from .ir.forms import NARROW, PRECISIONS  # noqa: E402  (stored weight precisions)

_FROM_PIPELINE = ("PASSES", "GPU_PASSES", "compile_graph", "front_end", "Compilation")


def __getattr__(name):
    """The pipeline's names, imported on first use: importing the pipeline
    imports every pass, and with them TVM (a second or so), which
    `coldbrew run` and `inspect` do not need."""
    if name in _FROM_PIPELINE or name == "pipeline":
        pipeline = _pipeline()
        return pipeline if name == "pipeline" else getattr(pipeline, name)
    raise AttributeError(f"module 'coldbrew.compiler' has no attribute '{name}'")

__all__ = ["compile_model", "compile_graph", "front_end", "tuned_front", "Compilation", "CompileError",
           "InternalError", "UnsupportedOperatorError", "PASSES", "GPU_PASSES"]


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
    cost table (compiler/measure/profile.py: measured once, then cached); "cold"
    also places preparation and picks the execution thread count
    (compiler/plan/scheduler.py); forced `variants` / `weights` / `queues` entries win
    over the plan's; `on_plan` receives the plan (compiler/plan.choose). `tune` searches each
    layer's variant and schedule parameters by measurement (compiler/measure/tune.py,
    cached per target); only the host can be measured, so for other targets
    it changes nothing and every layer's parameters stay derived.
    `continuous` also stores each layer's warm-fastest variant (the "warm"
    plan from the same cost table; weights cached, after the plan's) for
    runs after the first in continuous mode (compiler/passes/add_warm_steps.py).
    `sign` (a secret key file from `coldbrew keygen`) appends an Ed25519
    signature over every byte (compiler/bundle/sign.py).
    `precision` ("fp32", "fp16" or "int8") stores the variant layers'
    weights narrow (compiler/passes/plan_weights.py): by default in the direct
    form (`weights` "direct": the kernels read fp16 or int8 and widen in
    registers), else widened on the first run by the runtime or the
    layer's transform; the effect on the outputs is measured on
    sample inputs (`calibration`: a .npz of arrays per input, else
    generated) and stored in the bundle, and `max_error` keeps the fewest
    layers fp32 that hold the outputs' relative error under it
    (compiler/measure/error.py).

    Returns the bundle bytes, and writes them to `output` when given.
    Every failure is a CompileError (an unexpected one an InternalError
    that names where it happened).
    """
    try:
        return _compile(model, output, target, input_shapes, constants, dump_ir, variants, weights, threads, plan,
                        progress, tune, queues, on_plan, continuous, sign, precision, max_error, calibration)
    except CompileError:
        raise
    except Exception as e:
        raise InternalError("compile_model", e) from e


def _compile(model, output, target, input_shapes, constants, dump_ir, variants, weights, threads, plan, progress,
             tune, queues, on_plan, continuous, sign, precision, max_error, calibration):
    on_gpu = _pipeline().on_gpu(target)
    _check_options(precision, max_error, plan, continuous, tune, on_gpu)
    if not weights:  # narrow weights default to the direct form: the fewest bytes and nothing to widen
        weights = "auto" if on_gpu else "direct" if precision in NARROW and plan == "default" else "cached"
    tuning = front = accuracy = warm = None
    if tune:  # before the plan: the cost table then times the tuned kernels the bundle ships
        front, tuning = tuned_front(model, target, threads, input_shapes, constants, progress, dump_ir)
    chosen = {"variants": variants, "weights": weights, "queues": queues, "threads": threads, "later_threads": 0,
              "narrow_only": None}  # narrow_only: the layers a plan chose narrow (None: all)
    if plan != "default" or continuous:
        from .measure.profile import profile

        # a plan's narrow weights read in place need their direct forms measured; fp32 needs none
        table = profile(model, target, threads, input_shapes, constants, progress, tuning=tuning, front=front,
                        direct=[precision] if precision in NARROW else [])
        if continuous:
            from .plan.scheduler import choose

            best = choose(table, "warm")
            warm = (best["variants"], best["threads"])
        if plan != "default":
            chosen = _planned(table, plan, precision, chosen, continuous, on_plan)
    if precision != "fp32" and chosen["narrow_only"] != set():
        front = front or _pipeline().front_end(model, input_shapes, constants, dump_ir, not on_gpu)
        precision, accuracy = _narrow(front, precision, max_error, calibration, chosen["narrow_only"], progress)
    data, _ = _pipeline().compile_graph(model, None if sign else output, target, input_shapes, constants, dump_ir,
                                        chosen["variants"], chosen["weights"], chosen["threads"], front=front,
                                        tuning=tuning, queues=chosen["queues"], warm=warm, precision=precision,
                                        accuracy=accuracy, later_threads=chosen["later_threads"])
    if sign:
        from .bundle.sign import sign as sign_with

        data = sign_with(data, sign)
        if output:
            with open(output, "wb") as f:
                f.write(data)
    return data


def _check_options(precision, max_error, plan, continuous, tune, on_gpu):
    """CompileError for options that do not go together."""
    if precision not in PRECISIONS:
        raise CompileError(f"weight precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision != "fp32" and on_gpu:
        raise CompileError(f"{precision} weights are not available for GPU targets yet (compile with fp32)")
    if max_error is not None and precision == "fp32":
        raise CompileError("a maximum error applies to narrow weights: give a precision (fp16 or int8) with it")
    if (plan != "default" or continuous or tune) and on_gpu:
        raise CompileError("plans, tuning and continuous mode are not available for GPU targets yet "
                           "(compile with the default plan)")


def _planned(table, objective, precision, given, continuous, on_plan):
    """The plan's choices (compiler/plan/scheduler.py) under the given ones:
    forced variants, weight forms and queues win over the plan's."""
    from .plan.scheduler import choose

    planned = choose(table, objective, precision)
    if on_plan:
        on_plan(planned)
    weights, queues, threads = given["weights"], given["queues"], given["threads"]
    weights = weights if isinstance(weights, dict) else {"*": weights}
    queues = queues if isinstance(queues, dict) else ({"*": queues} if queues else {})
    return {"variants": {**planned["variants"], **(given["variants"] or {})},
            "weights": {**{"*": "cached"}, **planned["forms"], **weights},
            "queues": {**planned["queues"], **queues},
            "threads": planned["threads"],
            # a first run that keeps cores for preparation: later runs execute on all of them
            "later_threads": threads if planned["threads"] < threads and not continuous else 0,
            "narrow_only": {name for name, p in planned["precisions"].items() if p != "fp32"}}


def _narrow(front, precision, max_error, calibration, narrow_only, progress):
    """(per-layer precisions, accuracy): the narrow weights' measured error
    (compiler/measure/error.py) and the layers that stay fp32 under max_error."""
    from .measure import error as measure_error

    if progress:
        progress(0, 1, f"measure the {precision} weights' error")
    chosen, solo, accuracy = measure_error.choose(front, precision, max_error, calibration, narrow_only)
    accuracy["layers"] = solo
    return {"*": "fp32", **chosen}, accuracy


def tuned_front(model, target, threads, input_shapes=None, constants=None, progress=None, dump_ir=None):
    """(front, tuning): the first passes' result and the layers' measured
    tuning made from it (compiler/measure/tune.py), shared by a tuned compile, the
    cost table its plan is made from and the bundle's own compile."""
    from .measure.tune import tune as measure_tuning

    front = _pipeline().front_end(model, input_shapes, constants, dump_ir)
    return front, measure_tuning(model, target, threads, front=front, progress=progress)


def _pipeline():
    import importlib

    return importlib.import_module(".pipeline", __name__)  # not `from . import`: that asks __getattr__ first
