"""Kernel benchmark: per distinct conv / dense / recurrent cell layer of a
model and per kernel variant (and schedule parameters of the fastest), the
weight transform and execute time measured by coldbrew's runtime (the
tuner's search, compiler/measure/tune.py, measured afresh), beside
onnxruntime running the same layer alone with the same thread count (a
cell: its ONNX cell on an input of one feature, so nearly all of it is the
recurrence the cell layer computes).

    python bench/kernels.py MODEL [--threads 2] [--target host|x86_64-avx2]

MODEL: a zoo model (resnet50), a corpus model (ch_pp_ocrv2_rec_infer: its
manifest's input shapes; bench/corpus/fetch.py fetches it) or an ONNX file.
Prints the host's ISA, every candidate per layer, and per layer how the
fastest compares with onnxruntime; per kind of layer the slowest and those
over 2x (the issues' bound).
"""
import argparse
import json
import os
import sys

from harness.common import geomean, host_isa, median_ms, ort_session, zoo
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
import fetch  # noqa: E402  (bench/corpus/fetch.py)


def _model(name):
    """(model or path, input shapes) of a zoo or corpus model or an ONNX file."""
    if os.path.exists(name):
        return name, None
    known = {e["name"]: e for e in fetch.models()}
    if name in known:
        path = fetch.fetched(known[name])
        if path is None:
            sys.exit(f"not fetched: python bench/corpus/fetch.py {name}")
        return path, {k: list(v["shape"]) for k, v in known[name]["inputs"].items() if "shape" in v}
    return zoo().build(name), None


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
    model, shapes = _model(args.model)
    anchors = anchors_of(model, target, shapes)
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
        worst.append((best / ort_ms, a.id, _describe(a.spec), a.variant.op))
    worst.sort(reverse=True)
    print(f"\nfastest candidate vs onnxruntime per layer (execute time ratio, <1 = coldbrew faster): "
          f"geomean {geomean(ratios):.2f}x over {len(ratios)} distinct layers ({host_isa()})")
    for kind in sorted({w[3] for w in worst}):
        mine = [w for w in worst if w[3] == kind]
        r, lid, shape, _ = mine[0]
        over = [w for w in mine if w[0] > 2.0]
        print(f"slowest {kind} layer: {lid} {shape} at {r:.2f}x onnxruntime; {kind} layers over 2x: {len(over)}"
              + (" (" + ", ".join(f"{w[1]} {w[0]:.2f}x" for w in over) + ")" if over else ""))


def _describe(spec):
    if hasattr(spec, "out_h"):
        return (f"c{spec.c}x{spec.h}x{spec.w}->k{spec.k} {spec.r}x{spec.s} s{spec.stride[0]} "
                f"g{spec.groups}" + (f" d{spec.dilation[0]}" if spec.dilation != (1, 1) else ""))
    if hasattr(spec, "hidden"):
        return f"{spec.kind} {spec.seq} steps x{spec.batch} H{spec.hidden} {spec.dirs} dir" + " int8 h" * spec.quantize_h
    return f"dense {spec.m}x{spec.k}x{spec.n}"


if __name__ == "__main__":
    main()
