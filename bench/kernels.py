"""Kernel benchmark: per distinct conv / dense layer of a model and per
kernel variant (and schedule parameters of the fastest), the weight
transform and execute time measured by coldbrew's runtime (the tuner's
search, compiler/measure/tune.py, measured afresh), beside onnxruntime running the
same layer alone with the same thread count.

    python bench/kernels.py resnet50 [--threads 2] [--target host|x86_64-avx2]

Prints the host's ISA, every candidate per layer, and per layer how the
fastest compares with onnxruntime (the issue's bound: no conv layer slower
than 2x).
"""
import argparse
import json

from harness.common import geomean, host_isa, median_ms, ort_session, zoo
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="host", help="code built for this target, run on this machine")
    args = ap.parse_args()
    from coldbrew.compiler.measure.tune import anchors_of, layers_model, measure_shapes, spec_key
    from coldbrew.targets import resolve

    target = resolve(args.target)
    print(f"host: {host_isa()}; kernels built for {target.name} ({target.vector.isa}); {args.threads} threads")
    anchors = anchors_of(zoo().build(args.model), target)
    specs = {spec_key(a.spec): a for a in anchors}
    print(f"measuring {len(specs)} distinct layers ...", flush=True)
    found = measure_shapes([a.spec for a in specs.values()], target, args.threads, lambda *a: None)
    print(f"{'layer':<6} {'shape':<44} {'variant':<26} {'params':<22} {'transform':>9} {'execute':>8} {'ort':>8}")
    ratios, worst = [], []
    for key, a in specs.items():
        e = found[key]
        sess = ort_session(layers_model([a.spec], [a.raw]), args.threads)
        inp = sess.get_inputs()[0]
        x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
        ort_ms = median_ms(lambda: sess.run(None, {inp.name: x}))
        for k, (cand, ms) in enumerate(e["execute_ms"].items()):
            name, params = json.loads(cand)
            p = ",".join(f"{pk}={pv}" for pk, pv in params.items())
            print(f"{a.id if k == 0 else '':<6} {_describe(a.spec) if k == 0 else '':<44} {name:<26} {p:<22} "
                  f"{e['transform_ms'][cand]:>8.3f}m {ms:>7.3f}m {ort_ms if k == 0 else float('nan'):>7.3f}m")
        best = min(e["execute_ms"].values())
        ratios.append(best / ort_ms)
        if hasattr(a.spec, "out_h"):
            worst.append((best / ort_ms, a.id, _describe(a.spec)))
    worst.sort(reverse=True)
    print(f"\nfastest candidate vs onnxruntime per layer (execute time ratio, <1 = coldbrew faster): "
          f"geomean {geomean(ratios):.2f}x over {len(ratios)} distinct layers ({host_isa()})")
    if worst:
        r, lid, shape = worst[0]
        over = [w for w in worst if w[0] > 2.0]
        print(f"slowest conv layer: {lid} {shape} at {r:.2f}x onnxruntime; conv layers over 2x: {len(over)}"
              + (" (" + ", ".join(f"{w[1]} {w[0]:.2f}x" for w in over) + ")" if over else ""))


def _describe(spec):
    if hasattr(spec, "out_h"):
        return (f"c{spec.c}x{spec.h}x{spec.w}->k{spec.k} {spec.r}x{spec.s} s{spec.stride[0]} "
                f"g{spec.groups}" + (f" d{spec.dilation[0]}" if spec.dilation != (1, 1) else ""))
    return f"dense {spec.m}x{spec.k}x{spec.n}"


if __name__ == "__main__":
    main()
