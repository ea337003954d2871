"""Warm latency: coldbrew vs onnxruntime, same models, same thread count,
measured side by side in one run.

    python bench/warm.py [models...] [--threads 2] [--tuned]

--tuned picks, per layer, the fastest-executing variant and schedule
parameters by measurement (bench/kernels.py's search); otherwise the
compiler's default choice. Prints per-model medians and the geomean ratio
(coldbrew / onnxruntime; < 1 means coldbrew is faster).
"""
import argparse
import os
import tempfile

from common import geomean, median_ms, ort_session, zoo
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)

DEFAULT = ["resnet50", "mobilenet_v2", "squeezenet", "googlenet"]


def tuned_choice(model, threads):
    from coldbrew.compiler.measure import anchors_of, candidates
    from coldbrew.targets import resolve

    target, best, choice = resolve("host"), {}, {}
    for a in anchors_of(model):
        if a.spec not in best:
            best[a.spec] = candidates(a.spec, a.variant.op, target, repeat=5)[0]
        choice[a.id] = (best[a.spec].variant, best[a.spec].params)
    return choice


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tuned", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import coldbrew
    from coldbrew.compiler import compile_model

    ratios = []
    print(f"{'model':<16} {'coldbrew ms':>12} {'onnxruntime ms':>15} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = zoo().build(name)
            choice = tuned_choice(model, args.threads) if args.tuned else None
            path = os.path.join(tmp, f"{name}.brew")
            compile_model(model, path, variants=choice, threads=args.threads)
            sess = coldbrew.load(path, threads=args.threads)
            inp = sess.get_inputs()[0]
            x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
            ort = ort_session(model, args.threads)
            ours = median_ms(lambda: sess.run(None, {inp.name: x}), args.repeat)
            theirs = median_ms(lambda: ort.run(None, {inp.name: x}), args.repeat)
            ratios.append(ours / theirs)
            print(f"{name:<16} {ours:>12.2f} {theirs:>15.2f} {ours / theirs:>6.2f}x", flush=True)
    print(f"geomean coldbrew/onnxruntime warm latency ({args.threads} threads"
          f"{', tuned' if args.tuned else ''}): {geomean(ratios):.2f}x")


if __name__ == "__main__":
    main()
