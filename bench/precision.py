"""fp32, fp16 and int8 weights side by side: bundle bytes, cold start, warm
latency and output error, with onnxruntime's best cold configuration in the
same run (the peer benchmark's protocol and code, bench/peers.py).

    python bench/precision.py [models...] [--samples 3] [--warm 20] [--threads 2] [--out DIR] [--bytes-only]

Every coldbrew bundle is the scheduler's (`--plan cold`): fp32, and with
`--weights-precision fp16` / `int8` (the scheduler picks per layer among
the fp32 forms and the narrow one). Samples rotate over models and engines
in rounds. Printed: per model the bytes (and ratio to fp32), cold and warm
medians, the output error against onnxruntime fp32 (max |y' - y| / max |y|
on the benchmark's input) and the one the compiler measured and stored;
then the issue's criteria:

- bytes: fp16 / fp32 and int8 / fp32 per model and geomean;
- read-floor models (fp32 weights / read bandwidth >= fp32 warm latency):
  fp16 cold speed-up over fp32 (geomean) and fp16 warm / fp32 warm; beside
  it the bound this machine sets (both at their floor, max(bytes / read
  bandwidth, warm): the speed-up a perfect pipeline would show) and how far
  each cold start sits above its floor;
- onnxruntime best cold / coldbrew fp16 cold over all models (geomean);
- after the timed part, the default plan's bundle bytes (every conv/dense
  layer narrowed) per precision, and the extra models' accuracy (an OCR
  text detector's probability map: error and thresholded-map agreement
  with onnxruntime) (`--bytes-only`: just these).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.common import ROOT, geomean, host_isa, zoo  # noqa: E402
from coldbrew.compiler.measure.protocol import describe as cold_protocol  # noqa: E402
import peers  # noqa: E402

FP32, FP16, INT8, ORT = "coldbrew [pipeline]", "coldbrew fp16 [pipeline]", "coldbrew int8 [pipeline]", "onnxruntime best"
ENGINES = [FP32, FP16, INT8, ORT]


def errors(prep, engine):
    """(error against onnxruntime on the bench input, error stored in the bundle)."""
    import coldbrew
    from coldbrew.compiler.bundle.reader import read_bytes
    from coldbrew.compiler.measure.error import output_error

    arts = prep["artifacts"][engine]
    if isinstance(arts, Exception):
        return None, None
    with open(arts[0], "rb") as f:
        data = f.read()
    feeds = dict(np.load(os.path.join(prep["dir"], "inputs.npz")))
    ours = coldbrew.load(data).run(None, feeds)
    acc = read_bytes(data)[0].accuracy
    return output_error([prep["ref"]], [ours])[0], (acc.outputError if acc else 0.0)


def report(rows, preps, bw):
    head = ("| model | weights | bundle MB | / fp32 | cold ms | warm ms | error vs onnxruntime | error stored | "
            "on the read floor |")
    lines = [head, "|" + " --- |" * 9]
    floor_models, ratios = [], {FP16: [], INT8: []}
    for m, by in rows.items():
        f32 = by[FP32]
        on_floor = "error" not in f32 and f32["artifact_bytes"] / bw * 1e3 >= f32["warm_ms"]
        if on_floor:
            floor_models.append(m)
        for e in (FP32, FP16, INT8, ORT):
            r = by[e]
            if "error" in r:
                lines.append(f"| {m} | {e} | failed | | | | | | {r['error'].replace('|', '/')} |")
                continue
            ratio = r["artifact_bytes"] / f32["artifact_bytes"] if "error" not in f32 else float("nan")
            if e in ratios:
                ratios[e].append(ratio)
            vs, stored = errors(preps[m], e) if e != ORT else (0.0, None)
            lines.append(f"| {m} | {e} | {r['artifact_bytes'] / 1e6:.2f} | {ratio:.3f} | {r['cold_ms']:.1f} | "
                         f"{r['warm_ms']:.2f} | {vs:.2g} | {'' if stored is None else f'{stored:.2g}'} | "
                         f"{'yes' if on_floor and e == FP32 else ''} |")
    ok = lambda ms, es: [m for m in ms if all("error" not in rows[m][e] for e in es)]  # noqa: E731
    g = lambda e, ms, k="cold_ms": geomean([rows[m][e][k] for m in ms])  # noqa: E731
    out = ["", "criteria (geomeans):"]
    for e, goal in ((FP16, 0.52), (INT8, 0.27)):
        worst = max(ratios[e]) if ratios[e] else float("nan")
        out.append(f"  bytes {e} / fp32: geomean {geomean(ratios[e]):.3f}, worst model {worst:.3f} (goal <= {goal})")
    fm = ok(floor_models, [FP32, FP16])
    if fm:
        out.append(f"  read-floor models ({', '.join(fm)}): fp32 / fp16 cold = {g(FP32, fm) / g(FP16, fm):.2f}x "
                   f"(goal >= 1.4x); fp16 / fp32 warm = {g(FP16, fm, 'warm_ms') / g(FP32, fm, 'warm_ms'):.2f}x "
                   "(goal <= 1.1x)")
        # what the machine allows: a perfect pipeline's cold = max(bytes / bandwidth, warm), per engine
        floor = lambda e, m: max(rows[m][e]["artifact_bytes"] / bw * 1e3, rows[m][e]["warm_ms"])  # noqa: E731
        gf = lambda e: geomean([floor(e, m) for m in fm])  # noqa: E731
        out.append(f"    bound on this machine: with cold = max(bytes / read bandwidth, warm) for both (a perfect "
                   f"pipeline), fp32 / fp16 = {gf(FP32) / gf(FP16):.2f}x; measured cold / that floor: "
                   f"fp32 {g(FP32, fm) / gf(FP32):.2f}x, fp16 {g(FP16, fm) / gf(FP16):.2f}x")
    else:
        out.append("  read-floor models: none in this run (fp32 weights / read bandwidth < fp32 warm everywhere)")
    for e in (FP16, FP32, INT8):
        ms = ok(rows, [e, ORT])
        out.append(f"  {ORT} / {e} cold = {g(ORT, ms) / g(e, ms):.2f}x on {len(ms)} models"
                   + (" (goal >= 2x)" if e == FP16 else ""))
    return lines + out


def default_bytes(models, threads):
    """Bundle bytes of the default plan (every conv/dense layer narrowed) per
    model and precision, and the ratios to fp32; printed lines."""
    from coldbrew.compiler import compile_model

    lines = ["", "default plan (every conv/dense layer narrowed): bundle bytes", "",
             "| model | fp32 MB | fp16 MB | fp16 / fp32 | int8 MB | int8 / fp32 | fp16 error stored | int8 error stored "
             "| top-1 held (fp16, int8) |",
             "|" + " --- |" * 9]
    from coldbrew.compiler.bundle.reader import read_bytes

    ratios = {"fp16": [], "int8": []}
    for name, (model, shapes) in models.items():
        size, err, top1 = {}, {}, {}
        for p in ("fp32", "fp16", "int8"):
            data = compile_model(model, threads=threads, input_shapes=shapes or None, precision=p)
            size[p] = len(data)
            acc = read_bytes(data)[0].accuracy
            err[p], top1[p] = (acc.outputError, acc.top1Agree) if acc else (0.0, 1.0)
        for p in ratios:
            ratios[p].append(size[p] / size["fp32"])
        lines.append(f"| {name} | {size['fp32'] / 1e6:.2f} | {size['fp16'] / 1e6:.2f} | {size['fp16'] / size['fp32']:.3f} "
                     f"| {size['int8'] / 1e6:.2f} | {size['int8'] / size['fp32']:.3f} | {err['fp16']:.2g} | {err['int8']:.2g} "
                     f"| {top1['fp16']:.0%}, {top1['int8']:.0%} |")
    for p, goal in (("fp16", 0.52), ("int8", 0.27)):
        lines.append(f"  {p} / fp32 bytes: geomean {geomean(ratios[p]):.4f}, worst {max(ratios[p]):.4f} (goal <= {goal})")
    return lines


MAP_THRESHOLD = 0.3  # a DB text detector's post-process binarizes its map here


def extra_accuracy(threads, samples=4):
    """The extra models (examples/zoo.py's EXTRA_MODELS: other tasks than
    classification) per precision, default plan: the error stored, the
    error against onnxruntime fp32 over `samples` normal inputs and, for a
    probability map, the fraction of pixels on the same side of the
    threshold; printed lines."""
    import coldbrew
    import onnxruntime as ort
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes
    from coldbrew.compiler.measure.error import output_error

    z = zoo()
    lines = ["", f"extra models, default plan ({samples} normal samples; map: pixels on the same side of "
             f"{MAP_THRESHOLD} as onnxruntime's)", "",
             "| model | weights | bundle / fp32 | error stored | error vs onnxruntime | map agreement |",
             "|" + " --- |" * 6]
    for name in z.EXTRA_MODELS:
        model = z.build(name)
        ref_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        size = {}
        for p in ("fp32", "fp16", "int8"):
            data = compile_model(model, threads=threads, precision=p)
            size[p] = len(data)
            sess = coldbrew.load(data)
            refs, ours = [], []
            for k in range(samples):
                feeds = {i.name: np.random.default_rng(k).standard_normal(i.shape).astype(i.dtype)
                         for i in sess.get_inputs()}
                refs.append(ref_sess.run(None, feeds))
                ours.append(sess.run(None, feeds))
            err = output_error(refs, ours)[0]
            agree = np.mean([np.mean((o[0] > MAP_THRESHOLD) == (r[0] > MAP_THRESHOLD)) for o, r in zip(ours, refs)])
            acc = read_bytes(data)[0].accuracy
            lines.append(f"| {name} | {p} | {size[p] / size['fp32']:.3f} | {acc.outputError if acc else 0:.2g} | "
                         f"{err:.2g} | {agree:.2%} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "precision"))
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bytes-only", action="store_true", help="only the default plan's bundle bytes (no timing)")
    args = ap.parse_args()
    z = zoo()
    names = args.models or list(z.MODELS)
    models = {n: (z.build(n), {}) for n in names}
    os.makedirs(args.out, exist_ok=True)
    if args.bytes_only:
        print("\n".join(default_bytes(models, args.threads) + extra_accuracy(args.threads)))
        return
    work = tempfile.mkdtemp(prefix="cb-precision-")
    t0 = time.perf_counter()
    try:
        progress = peers.Progress(len(models) * len(ENGINES) * (1 + args.samples), "precision")
        preps = peers.prepare(models, ENGINES, work, args.threads, progress)
        res, bws = peers.measure(preps, ENGINES, args.samples, args.warm, args.threads, progress,
                                 peers.bandwidth_files(work))
        bw = statistics.median(bws)
        progress.close()
        rows = peers.summarize(res, preps, bw)
        lines = [f"# fp32 / fp16 / int8 weights ({host_isa()}, {os.cpu_count()} cores, {args.threads} threads; "
                 f"read bandwidth {bw / 1e9:.2f} GB/s; {args.samples} samples per figure, medians, rounds "
                 f"interleaved over models and engines; {cold_protocol()})", ""] + report(rows, preps, bw)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines.append(f"\nwall time {(time.perf_counter() - t0) / 60:.1f} min (timed part)")
    print("\n".join(lines), flush=True)  # the timed part, before the long default-plan compiles
    more = default_bytes(models, args.threads) + extra_accuracy(args.threads)  # after every timed sample
    print("\n".join(more), flush=True)
    lines += more
    with open(os.path.join(args.out, "precision.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
