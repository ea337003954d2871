"""Cold start: coldbrew vs onnxruntime, the simulator's prediction, the
trace's overhead and the profiler's cost, measured side by side in one run.

    python bench/cold.py [models...] [--samples 9] [--threads 2] [--fresh] [--table2]

Per model: compile the default bundle, profile the model (the device cost
table; cached after the first time: the time printed is this run's) and
predict the cold latency with the simulator. Then take fresh-process cold
samples (bench/harness/cold_sample.py: import first, evict, time load + first
result) of each bundle untraced and traced, and of onnxruntime on the ONNX
file, in rounds over all models, so that each median spans the whole run
as each table's samples span its profile (shared machines drift over
minutes). --fresh re-profiles every model even when its table is cached.
Prints medians, prediction error, trace overhead and the coldbrew /
onnxruntime cold ratio (< 1: coldbrew starts faster).

--table2 prints, for every 3x3 conv of the models, winograd beside the best
GEMM/direct variant: read, transform and execute from the cost table (the
NNV12 paper's Table 2 trade-off).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from harness.common import ROOT, geomean, zoo
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402

SAMPLER = os.path.join(ROOT, "bench", "harness", "cold_sample.py")


def samples(n, *kinds):
    """n fresh-process samples of each (path, flags) kind, taken in turns so
    that every kind sees the same drift of the machine's state; the order
    rotates every round, so no kind always follows the same one."""
    out = [[] for _ in kinds]
    for r in range(n):
        for j in range(len(kinds)):
            k = (j + r) % len(kinds)
            path, flags = kinds[k]
            proc = cold_process([sys.executable, SAMPLER, path, *flags], capture_output=True, text=True, check=True)
            out[k].append(json.loads(proc.stdout))
    return out


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def trace_cost_ms(brew, threads, runs=60):
    """What tracing adds to one run: interleaved warm runs of a traced and an
    untraced session, difference of medians (steadier than cold samples)."""
    import numpy as np

    import coldbrew

    plain, traced = coldbrew.load(brew, threads=threads), coldbrew.load(brew, threads=threads, trace=True)
    feeds = {i.name: np.zeros(i.shape, i.dtype) for i in plain.get_inputs()}
    times = {False: [], True: []}
    for k in range(2 * runs):
        sess = traced if k % 2 else plain
        t = time.perf_counter()
        sess.run(None, feeds)
        times[bool(k % 2)].append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[True]) - statistics.median(times[False])


def table2(name, table):
    from coldbrew.compiler.plan.simulate import median_ms

    cls, threads = table["classes"][0]["name"], table["threads"]
    for layer in table["layers"]:
        wino = [c for c in layer["candidates"] if "winograd" in c["variant"]]
        other = [c for c in layer["candidates"] if "winograd" not in c["variant"]]
        if not wino or not other:
            continue
        best = min(other, key=lambda c: median_ms(c["execute_ms"], cls, threads))
        for c in sorted(wino, key=lambda c: c["variant"]) + [best]:
            print(f"  {name:<14} {layer['name']:<5} {c['variant']:<24} read raw {c['read_ms']['raw']['median']:6.3f} "
                  f"cached {c['read_ms']['cached']['median']:6.3f}  transform(1 thread) "
                  f"{median_ms(c['transform_ms'], cls, 1):7.3f}  execute {median_ms(c['execute_ms'], cls, threads):7.3f} ms "
                  f"({c['transformed_bytes']:,} B prepared)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=list(zoo().MODELS))
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fresh", action="store_true", help="re-measure cost tables even when cached")
    ap.add_argument("--table2", action="store_true")
    args = ap.parse_args()
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.measure.profile import profile
    from coldbrew.compiler.pipeline import front_end
    from coldbrew.compiler.plan.simulate import plan_of_bundle, simulate

    tables, kinds, predicted, prof_s = {}, [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:  # bundles, cost tables, predictions
            model = zoo().build(name)
            onnx_path, brew = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}.brew")
            with open(onnx_path, "wb") as f:
                f.write(model.SerializeToString())
            compile_model(model, brew, threads=args.threads)
            t = time.perf_counter()
            tables[name] = profile(front_end(onnx_path), args.threads, force=args.fresh, direct=[])
            prof_s[name] = "cached" if tables[name]["cached"] else f"{time.perf_counter() - t:.0f}"
            predicted[name] = simulate(plan_of_bundle(brew), tables[name])["latency_ms"]
            print(f"  {name}: profile {prof_s[name]} s, predicted {predicted[name]:.2f} ms", flush=True)
            kinds += [(brew, []), (brew, ["--trace"]), (onnx_path, ["--ort", "--threads", str(args.threads)])]
        # every model's samples in one round after another: each median spans
        # the whole run, as each cost table's samples span its profile
        measured = samples(args.samples, *kinds)
        print(f"\n{'model':<16} {'predicted':>9} {'cold':>8} {'error':>7} {'traced':>8} {'trace+':>7} {'warm +':>7} "
              f"{'ort cold':>9} {'cb/ort':>7} {'profile s':>9}   (ms, medians of {args.samples} fresh processes; "
              f"{cold_protocol()})")
        rows = []
        for m, name in enumerate(args.models):
            plain, traced, ort = measured[3 * m: 3 * m + 3]
            cold, tr, oc = med(plain, "cold_ms"), med(traced, "cold_ms"), med(ort, "cold_ms")
            extra = trace_cost_ms(kinds[3 * m][0], args.threads)
            p = predicted[name]
            rows.append((name, p, cold, tr, oc, extra))
            print(f"{name:<16} {p:>9.2f} {cold:>8.2f} {(p / cold - 1) * 100:>+6.1f}% {tr:>8.2f} "
                  f"{(tr / cold - 1) * 100:>+6.1f}% {extra:>7.3f} {oc:>9.2f} {cold / oc:>6.2f}x {prof_s[name]:>9}",
                  flush=True)
    errors = [abs(p / c - 1) for _, p, c, _, _, _ in rows]
    print(f"\nsimulator: |error| median {statistics.median(errors) * 100:.1f}%, max {max(errors) * 100:.1f}% "
          f"({sum(e <= 0.15 for e in errors)}/{len(errors)} models within 15%)")
    print(f"trace overhead: traced vs untraced cold samples, median {statistics.median(t / c - 1 for _, _, c, t, _, _ in rows) * 100:+.1f}% "
          f"(sample noise included); per run (interleaved warm runs, 'warm +') median "
          f"{statistics.median(x / c for _, _, c, _, _, x in rows) * 100:+.2f}% of the cold run")
    print(f"geomean cold start coldbrew / onnxruntime: {geomean([c / o for _, _, c, _, o, _ in rows]):.2f}x")
    if args.table2:
        print("\nwinograd vs the best GEMM/direct variant per 3x3 layer (cost table, host):")
        for name, table in tables.items():
            table2(name, table)


if __name__ == "__main__":
    main()
