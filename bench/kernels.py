"""Kernel benchmark: every compute-heavy layer of a model run alone in
coldbrew and in onnxruntime, same thread count, samples interleaved.

    python bench/kernels.py MODEL [--candidates] [--threads 2] [--target host|x86_64-avx2]
    python bench/kernels.py --corpus [NAME ...] [--json bench/results/kernels-corpus.json]

MODEL: a zoo model (resnet50), a corpus model (ch_pp_ocrv2_rec_infer: its
manifest's input shapes; bench/corpus/fetch.py fetches it) or an ONNX file.

Layers (bench/harness/units.py): each Conv / ConvInteger, MatMul / Gemm / Einsum, ConvTranspose,
normalization (an operator or written out in elementary ones), Softmax,
reduction, Resize, pooling and recurrent cell of the model, with the
quantization nodes feeding it, made into a model of its own whose inputs are
the values the whole model computes there; distinct shapes once. coldbrew
compiles it as a user would (default plan) and runs it through its Python
API; onnxruntime runs the same model; each figure is the median over
interleaved rounds. Prints per layer both times, the ratio (< 1: coldbrew
faster), the variants coldbrew chose, and per kind of layer the slowest and
those over 2x (the issue's bound).

--candidates adds, per distinct conv / dense / cell layer, every kernel
variant's execute and weight-transform time (the tuner's search,
compiler/measure/tune.py, measured afresh) beside onnxruntime running that
layer alone. --corpus runs every fetched corpus model (each in its own
process) and prints the whole corpus's summary per kind.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from harness.common import geomean, host_isa, median_ms, ort_session, zoo
from harness import units as U
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "corpus"))
import fetch  # noqa: E402  (bench/corpus/fetch.py)

BOUND = 2.0  # the issue's: no layer slower than 2x onnxruntime's same layer alone
TARGET_SAMPLE_MS = 30  # per round and engine


def _model(name):
    """(ONNX ModelProto, input shapes or None, feeds) of a zoo or corpus model or an ONNX file."""
    import onnx

    import corpus  # bench/corpus.py

    known = {e["name"]: e for e in fetch.models()}
    if name in known:
        entry = known[name]
        path = fetch.fetched(entry)
        if path is None:
            sys.exit(f"not fetched: python bench/corpus/fetch.py {name}")
        shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
        model = corpus.shaped_model(path, shapes)
        return model, shapes, corpus.feeds(entry, model)
    model = onnx.load(name) if os.path.exists(name) else zoo().build(name)
    sess = ort_session(model, 1)
    rng = np.random.default_rng(0)
    return model, None, {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
                         .astype(np.float32) for i in sess.get_inputs()}


def layer_rows(model, x, target, threads, rounds=3):
    """One row per distinct heavy layer of `model` (fed `x`): kind, label,
    shapes, how often it occurs, coldbrew's and onnxruntime's ms alone, the
    variants coldbrew ran it with, the largest output difference, or why
    coldbrew could not compile it alone. A layer with a kernel variant over
    the bound with coldbrew's defaults is measured again tuned (its fastest
    candidate, `tuned`; the defaults' figures kept in `default`)."""
    from coldbrew.compiler import CompileError, compile_model

    found = U.units(model.graph)
    names = [n for u in found for side in U.interface(model.graph, u) for n in side]
    values = U.captured(model, x, names)
    rows = {}
    for u in found:
        um, feeds, key = U.unit_model(model, u, values)
        if key in rows:
            rows[key]["count"] += 1
            continue
        sig = json.loads(key)[1]
        row = rows[key] = {"kind": u.kind, "label": u.label, "count": 1,
                           "shape": " ".join(("w" if role == "const" else "") + "x".join(map(str, s)) or "scalar"
                                             for role, s, _ in sig if len(s) > 0 or role == "in")}
        try:
            data = compile_model(um, target=target, threads=threads)
        except CompileError as e:
            row["error"] = str(e)
            continue
        row.update(_measured(data, um, feeds, threads, rounds))
        if row["kernel_ratio"] > BOUND and set(row["variants"]) != {"generic"}:
            # over the bound with a kernel variant: its fastest candidate (the tuner's search, cached per shape)
            tuned = _measured(compile_model(um, target=target, threads=threads, tune=True), um, feeds, threads, rounds)
            row["default"] = {k: row[k] for k in ("kernel_ratio", "ratio", "coldbrew_kernel_ms", "coldbrew_ms", "variants")}
            if tuned["coldbrew_kernel_ms"] < row["coldbrew_kernel_ms"]:
                row.update(tuned, tuned=True)
    return list(rows.values())


def _measured(data, um, feeds, threads, rounds):
    """A layer's bundle `data` against onnxruntime running its model `um`:
    both measures, the variants, coldbrew's steps, the outputs' largest
    difference."""
    import coldbrew
    from coldbrew.compiler.tools.trace_export import layer_times
    from warm import interleaved_ms  # bench/warm.py

    cb = coldbrew.load(data, threads=threads, trace=True)
    ort = ort_session(um, threads)
    got, ref = cb.run(None, feeds), ort.run(None, feeds)
    row = {"max_abs_diff": max(float(np.max(np.abs(np.asarray(g, np.float64) - r))) if r.size else 0.0
                               for g, r in zip(got, ref)),
           "variants": sorted({v or "generic" for _, _, v, _ in layer_times(cb.trace())})}
    once = median_ms(lambda: cb.run(None, feeds), repeat=3, warmup=1)
    per_round = max(3, min(50, int(TARGET_SAMPLE_MS / max(once, 1e-3))))
    row["coldbrew_ms"], row["ort_ms"] = interleaved_ms([lambda: cb.run(None, feeds), lambda: ort.run(None, feeds)],
                                                       rounds, per_round)
    row["ratio"] = row["coldbrew_ms"] / row["ort_ms"]
    row["coldbrew_kernel_ms"], row["ort_kernel_ms"], steps = kernel_ms(cb, um, feeds, threads, rounds, per_round)
    row["kernel_ratio"] = row["coldbrew_kernel_ms"] / max(row["ort_kernel_ms"], 1e-3)
    row["steps"] = [[layer, variant or "generic", ms] for _, layer, variant, ms in steps]
    return row


def kernel_ms(cb, model, feeds, threads, rounds, per_round, settle=3, pause=0.2):
    """(coldbrew's, onnxruntime's) median time inside the engine per run of
    a layer alone, samples interleaved in rounds: the sum of coldbrew's
    traced steps, the sum of onnxruntime's profiled node times (its
    profiler's resolution is 1 us); and coldbrew's last traced steps. The
    calls' own cost and the copies of inputs and outputs are left out."""
    import onnxruntime as ort
    from coldbrew.compiler.tools.trace_export import layer_times

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_profiling, so.log_severity_level = True, 3
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        mine, timed = [], []
        for _ in range(rounds):
            time.sleep(pause)
            for k in range(settle + per_round):
                cb.run(None, feeds)
                steps = layer_times(cb.trace())
                if k >= settle:
                    mine.append(sum(ms for *_, ms in steps))
            time.sleep(pause)
            timed += [False] * settle + [True] * per_round
            for _ in range(settle + per_round):
                sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    theirs = [0.0] * len(runs)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            k = next((k for k, (a, b) in enumerate(runs) if a <= e["ts"] <= b), None)
            if k is not None:
                theirs[k] += e["dur"] / 1e3
    theirs = [t for t, keep in zip(theirs, timed[-len(theirs):]) if keep]
    return statistics.median(mine), statistics.median(theirs), steps


def print_rows(rows, title, steps=False):
    print(f"{'kind':<15} {'layer':<34} {'shapes':<40} {'n':>3} {'coldbrew':>9} {'ort':>9} {'ratio':>6} "
          f"{'kernels':>19} {'ratio':>6}  variants")
    for r in rows:
        if "error" in r:
            print(f"{r['kind']:<15} {r['label'][:34]:<34} {r['shape'][:40]:<40} {r['count']:>3}  not compiled alone: "
                  f"{r['error'][:120]}")
            continue
        print(f"{r['kind']:<15} {r['label'][:34]:<34} {r['shape'][:40]:<40} {r['count']:>3} {r['coldbrew_ms']:>8.3f}m "
              f"{r['ort_ms']:>8.3f}m {r['ratio']:>5.2f}x {r['coldbrew_kernel_ms']:>8.3f}m {r['ort_kernel_ms']:>8.3f}m "
              f"{r['kernel_ratio']:>5.2f}x  {','.join(r['variants'])}")
        for layer, variant, ms in r["steps"] if steps else ():
            print(f"{'':<15} {'':<34} {layer + ' ' + variant:<40} {'':>3} {ms:>8.3f}m")
    summary(rows, title)


def summary(rows, title):
    """Per kind of layer, for both measures (the call alone, and the time
    inside the engines): how many, their geomean ratio, the slowest, those
    over the bound."""
    timed = [r for r in rows if "ratio" in r]
    for key, what in (("kernel_ratio", "time inside the engines (coldbrew's traced steps, onnxruntime's "
                                       "profiled nodes)"),
                      ("ratio", "the call through each Python API (inputs and outputs copied)")):
        print(f"\n{title}: each layer alone, coldbrew / onnxruntime (< 1: coldbrew faster), {what}: geomean "
              f"{geomean([r[key] for r in timed]):.2f}x over {len(timed)} distinct layers ({host_isa()})")
        for kind in sorted({r["kind"] for r in timed}):
            mine = sorted((r for r in timed if r["kind"] == kind), key=lambda r: -r[key])
            w = mine[0]
            over = [r for r in mine if r[key] > BOUND]
            ms = ("coldbrew_kernel_ms", "ort_kernel_ms") if key == "kernel_ratio" else ("coldbrew_ms", "ort_ms")
            print(f"  {kind:<15} {len(mine):>4} layers, geomean {geomean([r[key] for r in mine]):.2f}x; slowest "
                  f"{w.get('model', '')} {w['label'][:30]} {w['shape'][:40]} {w[key]:.2f}x ({w[ms[0]]:.3f} vs "
                  f"{w[ms[1]]:.3f} ms); over {BOUND:g}x: {len(over)}"
                  + (" (" + ", ".join(f"{r.get('model', '')} {r['label'][:24]} {r[key]:.2f}x" for r in over) + ")"
                     if over else ""))
    failed = [r for r in rows if "error" in r]
    if failed:
        print(f"  not compiled alone: {len(failed)} (" + "; ".join(f"{r.get('model', '')} {r['label']}: "
                                                             f"{r['error'][:160]}" for r in failed) + ")")


def candidates(model, shapes, target, threads):
    """Every kernel variant of each distinct conv / dense / cell layer
    against onnxruntime running that layer alone."""
    from coldbrew.compiler.measure.tune import anchors_of, layers_model, measure_shapes, spec_key
    from coldbrew.compiler.options import Options
    from coldbrew.compiler.pipeline import front_end

    anchors = anchors_of(front_end(model, Options(target=target, input_shapes=shapes)))
    specs = {spec_key(a.spec): a for a in anchors}
    print(f"\nmeasuring every candidate of {len(specs)} distinct conv / dense / cell layers ...", flush=True)
    found = measure_shapes([a.spec for a in specs.values()], target, threads, lambda *a: None)
    print(f"{'layer':<6} {'shape':<44} {'variant':<26} {'params':<22} {'transform':>9} {'execute':>8} {'ort':>8}")
    for key, a in specs.items():
        e = found[key]
        sess = ort_session(layers_model([a.spec], [a.raw]), threads)
        inp = sess.get_inputs()[0]
        x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
        ort_ms = median_ms(lambda: sess.run(None, {inp.name: x}))
        for k, (cand, ms) in enumerate(e["execute_ms"].items()):
            name, params = json.loads(cand)
            p = ",".join(f"{pk}={pv}" for pk, pv in params.items())
            print(f"{a.id if k == 0 else '':<6} {_describe(a.spec) if k == 0 else '':<44} {name:<26} {p:<22} "
                  f"{e['transform_ms'][cand]:>8.3f}m {ms:>7.3f}m {ort_ms if k == 0 else float('nan'):>7.3f}m")
        print(f"{'':<6} fastest {min(e['execute_ms'].values()) / ort_ms:.2f}x onnxruntime")


def _describe(spec):
    if hasattr(spec, "out_h"):
        return (f"c{spec.c}x{spec.h}x{spec.w}->k{spec.k} {spec.r}x{spec.s} s{spec.stride[0]} "
                f"g{spec.groups}" + (f" d{spec.dilation[0]}" if spec.dilation != (1, 1) else ""))
    if hasattr(spec, "hidden"):
        return f"{spec.kind} {spec.seq} steps x{spec.batch} H{spec.hidden} {spec.dirs} dir" + " int8 h" * spec.quantize_h
    return f"dense {spec.m}x{spec.k}x{spec.n}"


def corpus_run(names, args):
    """Every fetched corpus model's layers, one process per model."""
    rows = []
    entries = [e for e in fetch.models(names or None) if fetch.fetched(e)]
    for k, e in enumerate(entries):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, os.path.abspath(__file__), e["name"], "--threads", str(args.threads),
                   "--target", args.target, "--json", out.name, "--quiet"]
            try:
                done = subprocess.run(cmd, timeout=args.timeout, capture_output=True, text=True)
                mine = json.load(open(out.name)) if done.returncode == 0 else []
                status = "ok" if done.returncode == 0 else f"FAILED: {(done.stderr or done.stdout).strip()[-300:]}"
            except subprocess.TimeoutExpired:
                mine, status = [], f"timed out after {args.timeout} s"
        for r in mine:
            r["model"] = e["name"]
        rows += mine
        worst = [max((r[key] for r in mine if key in r), default=float("nan")) for key in ("kernel_ratio", "ratio")]
        print(f"[{k + 1}/{len(entries)}] {e['name']:<32} {len(mine):>3} distinct layers, slowest {worst[0]:.2f}x inside "
              f"the engines, {worst[1]:.2f}x through the API  {status}", flush=True)
    summary(rows, f"corpus ({len(entries)} models)")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="*")
    ap.add_argument("--corpus", action="store_true", help="every fetched corpus model (or those named)")
    ap.add_argument("--candidates", action="store_true", help="also every variant of each conv / dense / cell layer")
    ap.add_argument("--steps", action="store_true", help="each layer's steps in coldbrew (a traced warm run), slowest first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="host", help="code built for this target, run on this machine")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--markdown", help="write the summary and the layers over the bound here (a results file)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per model (--corpus)")
    ap.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from coldbrew.targets import resolve

    target = resolve(args.target)
    print(f"host: {host_isa()}; kernels built for {target.name} ({target.vector.isa}); {args.threads} threads")
    if args.corpus:
        rows = corpus_run(args.model, args)
    else:
        if len(args.model) != 1:
            ap.error("one MODEL (or --corpus)")
        model, shapes, x = _model(args.model[0])
        rows = layer_rows(model, x, target, args.threads)
        if not args.quiet:
            print_rows(rows, args.model[0], args.steps)
        if args.candidates:
            candidates(model, shapes, target, args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, " ".join(["python bench/kernels.py"] + sys.argv[1:])))


def markdown(rows, command):
    """A results file: the command, the host, per kind of layer both
    measures (geomean, slowest, over the bound), every layer over it."""
    timed = [r for r in rows if "ratio" in r]
    out = [f"# Every heavy layer alone: coldbrew / onnxruntime\n\n`{command}`; {host_isa()}; onnxruntime "
           f"{_ort_version()}; 2 threads each, samples interleaved in rounds. Inside: coldbrew's traced steps against "
           f"onnxruntime's profiled nodes (the calls and the copies of inputs and outputs left out); API: the call "
           f"through each Python API. < 1: coldbrew faster. {len(timed)} distinct layers over "
           f"{len({r.get('model') for r in rows})} models.\n",
           "| kind | layers | inside: geomean | slowest | over 2x | API: geomean | slowest | over 2x |",
           "| --- | ---: | ---: | --- | ---: | ---: | --- | ---: |"]
    for kind in sorted({r["kind"] for r in timed}):
        mine = [r for r in timed if r["kind"] == kind]
        cells = []
        for key in ("kernel_ratio", "ratio"):
            w = max(mine, key=lambda r: r[key])
            cells += [f"{geomean([r[key] for r in mine]):.2f}x", f"{w.get('model', '')} {w['label'][:28]} {w['shape'][:36]} "
                      f"{w[key]:.2f}x", str(sum(r[key] > BOUND for r in mine))]
        out.append(f"| {kind} | {len(mine)} | " + " | ".join(cells) + " |")
    over = sorted((r for r in timed if r["kernel_ratio"] > BOUND), key=lambda r: -r["kernel_ratio"])
    out += ["\n## Layers over 2x inside the engines\n", "| model | kind | layer | shapes | coldbrew ms | onnxruntime ms | "
            "ratio | coldbrew's steps |", "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
    out += [f"| {r.get('model', '')} | {r['kind']} | {r['label'][:40]}{' (tuned)' if r.get('tuned') else ''} | "
            f"{r['shape'][:48]} | {r['coldbrew_kernel_ms']:.3f} | "
            f"{r['ort_kernel_ms']:.3f} | {r['kernel_ratio']:.2f}x | "
            + ", ".join(f"{v} {ms:.3f}" for _, v, ms in r["steps"][:4]) + " |" for r in over]
    failed = [r for r in rows if "error" in r]
    if failed:
        out += ["\n## Not compiled alone\n"] + [f"- {r.get('model', '')} {r['label']}: {r['error'][:200]}" for r in failed]
    return "\n".join(out) + "\n"


def _ort_version():
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    main()
