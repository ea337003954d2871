"""Warm latency: coldbrew vs onnxruntime, same models, same thread count,
measured side by side in one run.

    python bench/warm.py [models...] [--threads 2] [--untuned] [--target host]

Prints the host's ISA first. Bundles are compiled for `--target` (host, or
x86_64-avx2 to run AVX2 code on an AVX-512 machine); for the host each
layer's variant and schedule parameters are tuned by measurement
(compiler/measure/tune.py, cached), unless --untuned (the register/cache model's
defaults). Samples of the two engines are interleaved in rounds, so a drift
of the machine hits both alike. Prints per-model medians and the geomean
ratio (coldbrew / onnxruntime; < 1 means coldbrew is faster).
"""
import argparse
import os
import statistics
import tempfile
import time

from harness.common import geomean, host_isa, ort_session, zoo
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)

DEFAULT = ["resnet50", "mobilenet_v2", "squeezenet", "googlenet"]


def interleaved_ms(fns, rounds, per_round, settle=3, pause=0.2):
    """Median ms of each function, its runs taken in rounds over all of them.
    An engine's thread pool keeps spinning for a while after its last run
    (onnxruntime's for longer than a few of coldbrew's runs) and would take
    a core from the other engine's runs: each turn starts with a `pause`
    (seconds) that lets the other's threads go idle, then `settle` untimed
    runs (its own caches are cold after the other's, its threads asleep)."""
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            time.sleep(pause)
            for _ in range(settle):
                fn()
            for _ in range(per_round):
                t = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t)
    return [statistics.median(s) * 1e3 for s in samples]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="host")
    ap.add_argument("--untuned", action="store_true", help="the register/cache model's defaults, no measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=6)
    args = ap.parse_args()
    import coldbrew
    from coldbrew.compiler import compile_model

    print(f"host: {host_isa()}; target {args.target}; {args.threads} threads; "
          f"{'untuned' if args.untuned else 'tuned'}; {args.rounds} rounds x {args.per_round} runs per engine")
    ratios = []
    print(f"{'model':<16} {'coldbrew ms':>12} {'onnxruntime ms':>15} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = zoo().build(name)
            path = os.path.join(tmp, f"{name}.brew")
            compile_model(model, path, target=args.target, threads=args.threads, tune=not args.untuned)
            sess = coldbrew.load(path, threads=args.threads)
            inp = sess.get_inputs()[0]
            x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
            ort = ort_session(model, args.threads)
            ours, theirs = interleaved_ms([lambda: sess.run(None, {inp.name: x}),
                                           lambda: ort.run(None, {inp.name: x})], args.rounds, args.per_round)
            sess.close()
            ratios.append(ours / theirs)
            print(f"{name:<16} {ours:>12.2f} {theirs:>15.2f} {ours / theirs:>6.2f}x", flush=True)
    print(f"geomean coldbrew/onnxruntime warm latency ({host_isa()}, target {args.target}, {args.threads} threads"
          f"{', untuned' if args.untuned else ', tuned'}): {geomean(ratios):.2f}x")


if __name__ == "__main__":
    main()
