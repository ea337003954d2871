"""Measure kernel variants on this machine: execute and transform time of a
layer's candidates, used to pick the fastest variant and schedule parameters
(and, later, by the cost-table profiler). Compile-time only: runs kernels
through TVM's runtime."""
from dataclasses import dataclass

import numpy as np

from .kernels import applicable
from .kernels import build as kb


@dataclass
class Measurement:
    variant: str
    params: dict
    exec_ms: float
    transform_ms: float
    raw_bytes: int
    transformed_bytes: int


def anchors_of(model, input_shapes=None, constants=None, front=None):
    """The anchors (conv / dense layers with their specs) of an ONNX model
    (or of its `front`, compiler.front_end's result)."""
    from . import front_end, select_variants

    _, anchors = select_variants.run((front or front_end(model, input_shapes, constants)).mod)
    return anchors


def _time(fn, args, repeat):
    import time

    fn(*args)
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - t)
    return float(np.median(samples)) * 1e3


def measure(variant, spec, params, target, repeat=10):
    import tvm

    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    funcs = {"exe": kb.schedule(kb.execute_func(variant, spec, params=params), variant, spec, params)}
    tf = kb.transform_func(variant, spec)
    if tf is not None:
        from .plan_weights import scheduled_transform

        funcs["tr"] = scheduled_transform(variant, tf)
    lib = kb.build(funcs, target)
    x = tvm.runtime.tensor(rng.standard_normal(kb.input_shape(spec)).astype(spec.dtype), dev)
    w = tvm.runtime.tensor(rng.standard_normal(spec.weight_shape).astype(spec.dtype), dev)
    wt = tvm.runtime.tensor(np.zeros(variant.transformed_shape(spec), spec.dtype), dev) if tf is not None else w
    t_ms = _time(lib["tr"], (w, wt), max(3, repeat // 3)) if tf is not None else 0.0
    out_shape = ((spec.n, spec.k, spec.out_h, spec.out_w) if hasattr(spec, "out_h") else (spec.m, spec.n))
    out = tvm.runtime.tensor(np.zeros(out_shape, spec.dtype), dev)
    e_ms = _time(lib["exe"], (x, wt, out), repeat)
    item = np.dtype(spec.dtype).itemsize
    return Measurement(variant.name, dict(params), e_ms, t_ms, int(np.prod(spec.weight_shape)) * item,
                       int(np.prod(variant.transformed_shape(spec))) * item)


def candidates(spec, op, target, search=True, repeat=10):
    """Every applicable variant at its default parameters; then the whole
    parameter space of the fastest one. Returns measurements, fastest first."""
    results = [measure(v, spec, v.space(spec)[0], target, repeat) for v in applicable(spec, op)]
    results.sort(key=lambda m: m.exec_ms)
    if search and results:
        from .kernels import get

        best = get(results[0].variant)
        for params in best.space(spec)[1:]:
            results.append(measure(best, spec, params, target, repeat))
        results.sort(key=lambda m: m.exec_ms)
    return results
