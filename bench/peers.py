"""Cold start of coldbrew beside six other engines, outputs verified, in one
run: a markdown table, PNG charts and a geomean line per engine.

    python bench/peers.py [models...] [--onnx FILE --shape NAME=1x3x224x224 ...]
                          [--out DIR] [--samples 3] [--warm 20] [--threads 2] [--engines a,b,...]
    python bench/peers.py --corpus [names...] [--engines ...]

--corpus: the real-model corpus (bench/corpus/models.json, fetched by
bench/corpus/fetch.py) instead of the zoo: every fetched model (or the
names given) with the manifest's input shapes, its bound inputs written
into the model as constants (every engine converts the same model), the
corpus's seeded inputs and each model's own output tolerance; by default
the engines `coldbrew` (compile_model's defaults, untuned: what a user
gets without profiling; the cold plan profiles each model's layers first,
minutes per model), onnxruntime and onnxruntime best.

Models: zoo names (default: all ten), and ONNX files given with --onnx
(their input shapes with --shape when not fixed in the file). The engines
(bench/harness/peer_engines.py) come from the optional extra `pip install -e
.[bench]` (`.ci/setup-bench.sh`); one that is missing, fails to convert,
fails to run or gives an output that differs from onnxruntime's is shown
as such in the table with its error, never dropped.

coldbrew appears as its plans, the ablation of NNV12's Fig. 13:
`[default]` (the default plan, raw weights transformed at load),
`[select]` (cold-aware kernel selection: plan cold-greedy, weights raw),
`[cache]` (+ cached transformed weights: cold-greedy's weight forms),
`[pipeline]` (+ pipelined preparation: plan cold, coldbrew's best), and
`[continuous]` (the cold plan with warm alternates; its later runs).
Every coldbrew bundle is compiled tuned, as `coldbrew compile --tune`
does on the machine it runs on (compiler/measure/tune.py; the cost table then
times the tuned kernels).

Protocol (DESIGN.md), for every engine alike: conversion untimed; then
per sample the whole page cache dropped (root only; the header says
whether it was), then a fresh process (bench/harness/peer_engines.py child) that
imports the engine (import time apart), settles memory (writes and frees
1 GiB, the protocol's settle_memory: on this VM a first write to memory it has
handed back to its host costs a stall that depends on what the samples
before freed, so every engine starts on the same memory), evicts the
engine's files from the page cache, and times load + first result;
samples rotate over engines and models in rounds, each round in its own shuffled order; the first round
also times --warm runs after the first (warm = their median). Read
bandwidth is measured in the same run, at the start of every round (files
written once, read back after the same drop and settling the runtime's
way, compiler/measure/protocol.py read_rate, as the profiler reads; the
median over rounds);
the floor per model = max(the faster warm latency of coldbrew's best plan
and onnxruntime, coldbrew's bundle bytes ÷ that bandwidth), the cold-path
issue's.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.common import ROOT, geomean, host_isa, zoo  # noqa: E402
from harness import peer_engines as pe  # noqa: E402
from coldbrew.compiler.measure.protocol import cold_process, read_rate  # noqa: E402
from coldbrew.compiler.measure.protocol import describe as cold_protocol  # noqa: E402

COLDBREW = {  # label -> compile_model options (the ablation, in order)
    "coldbrew": {},  # compile_model's defaults, untuned (--corpus)
    "coldbrew [default]": {"weights": "raw"},
    "coldbrew [select]": {"plan": "cold-greedy", "weights": "raw"},
    "coldbrew [cache]": {"plan": "cold-greedy"},
    "coldbrew [pipeline]": {"plan": "cold"},
    "coldbrew [continuous]": {"plan": "cold", "continuous": True},
}
NARROW = {  # the cold plan with narrow weights (bench/precision.py); not run by default
    "coldbrew fp16 [pipeline]": {"plan": "cold", "precision": "fp16"},
    "coldbrew int8 [pipeline]": {"plan": "cold", "precision": "int8"},
}
BEST = "coldbrew [pipeline]"
PEERS = ["onnxruntime", "onnxruntime best", "ncnn fp16", "ncnn fp32", "MNN", "TVM", "IREE", "OpenVINO"]
# narrow weight storage; every other engine 1e-3 (relative to the output scale)
TOLERANCE = {"ncnn fp16": 3e-2, "coldbrew fp16 [pipeline]": 1e-2, "coldbrew int8 [pipeline]": 6e-2}


class Progress:
    """tqdm when installed, else a line per step."""

    def __init__(self, total, desc):
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr)
        except ImportError:
            self.bar, self.n, self.total, self.desc = None, 0, total, desc

    def step(self, what):
        if self.bar:
            self.bar.set_postfix_str(what[:40])
            self.bar.update(1)
        else:
            self.n += 1
            print(f"{self.desc} {self.n}/{self.total} {what}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar:
            self.bar.close()


def bandwidth_files(work, size=128 << 20):
    """Two files of random bytes for time_reads, written once and read again
    in every round like the engines' artifacts, so that a cache below this
    machine (a virtual disk's host) treats them as it treats the artifacts."""
    paths = []
    for k in range(2):
        paths.append(os.path.join(work, f"bandwidth{k}.bin"))
        with open(paths[-1], "wb") as f:
            f.write(np.random.default_rng(k).bytes(size))
            f.flush()
            os.fsync(f.fileno())
    return paths


def time_reads(paths):
    """Bytes per second of a cold read on this machine now: the protocol's
    read_rate (compiler/measure/protocol.py), the runtime's way of reading
    a bundle, as the profiler measures it for the cost table."""
    return read_rate(paths)


def read_bandwidth(work):
    """time_reads on fresh files (one measurement)."""
    paths = bandwidth_files(work)
    try:
        return time_reads(paths)
    finally:
        for p in paths:
            os.remove(p)


def fix_shapes(model, shapes):
    """The model with the given input shapes written into its graph inputs,
    so that every engine converts the same fixed-shape model."""
    inputs = {i.name: i for i in model.graph.input}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise SystemExit(f"--shape names {unknown}, not inputs of the model (its inputs: {sorted(inputs)})")
    for name, dims in shapes.items():
        shape = inputs[name].type.tensor_type.shape
        if shape.dim and len(shape.dim) != len(dims):
            raise SystemExit(f"--shape {name}: {len(dims)} dimensions, the model's input has {len(shape.dim)}")
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = d
    return model


def _model_inputs(model, shapes):
    import onnx

    inits = {i.name for i in model.graph.initializer}
    feeds, rng = {}, np.random.default_rng(0)
    for i in model.graph.input:
        if i.name in inits:
            continue
        dims = shapes.get(i.name) or [d.dim_value for d in i.type.tensor_type.shape.dim]
        if not dims or any(d <= 0 for d in dims):
            raise SystemExit(f"input '{i.name}' has no fixed shape: give --shape {i.name}=1x3x224x224")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        feeds[i.name] = rng.standard_normal(dims).astype(dtype) if dtype.kind == "f" else np.zeros(dims, dtype)
    return feeds


def corpus_models(names):
    """{name: (model, shapes, feeds, tolerance, reference outputs)} of the
    fetched corpus models (or `names`): bound inputs become constants of the
    model (the reference: onnxruntime on the model as shipped)."""
    from onnx import numpy_helper

    sys.path.insert(0, os.path.join(ROOT, "bench", "corpus"))
    import fetch  # bench/corpus/fetch.py
    import corpus  # bench/corpus.py

    out = {}
    for entry in fetch.models(names or None):
        path = fetch.fetched(entry)
        if path is None:
            print(f"{entry['name']}: not fetched (python bench/corpus/fetch.py {entry['name']}), left out",
                  file=sys.stderr)
            continue
        shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
        try:
            sess = corpus.reference(path, shapes)
            x = corpus.feeds(entry, corpus.shaped_model(path, shapes))
            ref = sess.run(None, x)  # the model as shipped, its bound inputs fed (onnxruntime may fail on the bound one)
        except Exception as e:  # onnxruntime cannot run it: nothing to compare with
            print(f"{entry['name']}: onnxruntime cannot run it ({str(e).strip()[:120]}), left out", file=sys.stderr)
            continue
        model = corpus.shaped_model(path, shapes)
        model.graph.ClearField("value_info")  # recorded for the exporter's shapes: inferred anew from the fixed ones
        for o, r in zip(model.graph.output, ref):  # the outputs' shapes as onnxruntime gives them
            o.type.tensor_type.ClearField("shape")
            o.type.tensor_type.shape.SetInParent()
            for d in np.shape(r):
                o.type.tensor_type.shape.dim.add().dim_value = d
        bound = [k for k, v in entry["inputs"].items() if "bind" in v]
        kept = [i for i in model.graph.input if i.name not in bound]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.graph.initializer.extend(numpy_helper.from_array(x[k], k) for k in bound)
        out[entry["name"]] = (model, shapes, {k: v for k, v in x.items() if k not in bound},
                              entry.get("tolerance", 0.0), ref, entry)
    return out


class ConversionFailed(Exception):
    """A converter's failure in its forked process, as "Type: message"."""


def isolated(convert, path, work, threads):
    """convert(path, work, threads) in a forked process: a converter that
    crashes (onnxruntime saving an ORT-format model has) fails that engine
    on that model, not the run."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            send.send(("ok", convert(path, work, threads)))
        except BaseException as ex:  # a peer's converter may raise anything, or exit
            send.send(("error", f"{type(ex).__name__}: {str(ex).strip()[:200]}"))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join()
    if not recv.poll():
        raise ConversionFailed(f"the converter crashed (exit {proc.exitcode})")
    status, value = recv.recv()
    if status != "ok":
        raise ConversionFailed(value)
    return value


def prepare(models, engines, work, threads, progress):
    """Per model: the ONNX file, inputs, onnxruntime's outputs, and per engine
    its artifacts or its conversion error."""
    import onnx
    import onnxruntime as ort

    from coldbrew.compiler import compile_model

    out = {}
    for name, (model, shapes, *_) in models.items():
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        given = models[name][2] if len(models[name]) > 2 else None  # the corpus's inputs
        onnx.save(fix_shapes(model, shapes), path)
        feeds = given if given is not None else _model_inputs(model, shapes)
        np.savez(os.path.join(d, "inputs.npz"), **feeds)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        ref = (models[name][4] if len(models[name]) > 4
               else ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds))
        arts, took = {}, {}
        for e in engines:
            t0 = time.perf_counter()
            ed = os.path.join(d, e.replace(" ", "_").replace("[", "").replace("]", ""))
            os.makedirs(ed, exist_ok=True)
            try:
                if e in COLDBREW or e in NARROW:
                    b = os.path.join(ed, "model.brew")
                    # tuned, as `coldbrew compile --tune` does on the machine it runs on
                    compile_model(path, b, threads=threads, input_shapes=shapes or None, tune=e != "coldbrew",
                                  **{**COLDBREW, **NARROW}[e])
                    arts[e] = [b]
                else:
                    convert = pe.ENGINES[e][0]
                    arts[e] = isolated(convert, path, ed, threads) if convert else [path]
            except BaseException as ex:  # a peer's converter may raise anything, or exit
                if isinstance(ex, KeyboardInterrupt):
                    raise
                what = str(ex) if isinstance(ex, ConversionFailed) else f"{type(ex).__name__}: {str(ex).strip()[:200]}"
                arts[e] = RuntimeError(f"conversion failed: {what}")
            took[e] = time.perf_counter() - t0
            progress.step(f"{name} {e}")
        out[name] = {"dir": d, "ref": ref, "artifacts": arts, "convert_s": took,
                     "tolerance": models[name][3] if len(models[name]) > 3 else 0.0,
                     "entry": models[name][5] if len(models[name]) > 5 else None}
    return out


def sample(engine, prep, threads, warm):
    """One fresh-process sample; a dict, or {"error": ...}."""
    arts = prep["artifacts"][engine]
    if isinstance(arts, Exception):
        return {"error": str(arts)}
    outs = os.path.join(prep["dir"], "out.npz")
    cmd = [sys.executable, os.path.join(ROOT, "bench", "harness", "peer_engines.py"), "child", engine,
           os.path.join(prep["dir"], "inputs.npz"), outs, str(warm), str(threads), *arts]
    try:
        r = cold_process(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timed out (900 s)"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        tail = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return {"error": f"run failed: {tail[:200]}"}
    res = json.loads(lines[-1])
    with np.load(outs) as z:
        res["outputs"] = [z[k] for k in z.files]
    return res


def check(engine, outs, ref, tolerance=0.0, entry=None):
    """None when the outputs match onnxruntime's (compiler/tools/check.py,
    within the engine's tolerance, or the model's own where larger), else
    what differs; a corpus model (`entry`) compared as bench/corpus.py
    compares it (its ranked rows as a set)."""
    from corpus import outputs  # bench/corpus.py: compiler/tools/check.py

    rel = max(TOLERANCE.get(engine, 1e-3), tolerance)
    ranked = (entry or {}).get("ranked_rows")
    outs = [np.asarray(o) for o in outs]  # a peer may drop or add unit dims: its values in the reference's shape
    outs = [o.reshape(np.shape(r)) if k < len(ref) and o.size == np.size(r) else o
            for k, (o, r) in enumerate(zip(outs, list(ref) + [None] * len(outs)))]
    verdict = outputs.compare(list(ref), outs, rel, ranked=ranked)
    return None if verdict.ok else f"wrong outputs: {verdict.message()}"


def measure(preps, engines, samples, warm, threads, progress, bandwidth_paths=()):
    """Samples in rounds (every model and engine once per round, in an order
    shuffled anew each round: what a sample leaves behind, such as memory
    the previous process freed, favours no engine); the read bandwidth
    measured at the start of each round. Returns (results, bandwidths)."""
    res = {m: {e: [] for e in engines} for m in preps}
    bws = []
    for r in range(samples):
        if bandwidth_paths:
            bws.append(time_reads(bandwidth_paths))
        order = [(m, e) for m in preps for e in engines]
        random.Random(r).shuffle(order)
        for m, e in order:
            prep = preps[m]
            s = sample(e, prep, threads, warm if r == 0 else (2 if e == "coldbrew [continuous]" else 0))
            if r == 0 and "outputs" in s:
                bad = check(e, s["outputs"], prep["ref"], prep.get("tolerance", 0.0), prep.get("entry"))
                if bad:
                    s = {"error": bad}
            s.pop("outputs", None)
            res[m][e].append(s)
            progress.step(f"round {r + 1} {m} {e}")
    return res, bws


def summarize(res, preps, bandwidth):
    """Per model and engine: medians, or the engine's error."""
    rows = {}
    for m, by_engine in res.items():
        rows[m] = {}
        for e, ss in by_engine.items():
            err = next((s["error"] for s in ss if "error" in s), None)
            if err:
                rows[m][e] = {"error": err}
                continue
            warm = [w for s in ss for w in s["warm_ms"]]
            arts = preps[m]["artifacts"][e]
            row = {k: statistics.median(s[k] for s in ss) for k in
                   ("cold_ms", "load_ms", "first_run_ms", "import_ms", "bytes_read", "peak_rss_kb")}
            row["cold_samples_ms"] = [s["cold_ms"] for s in ss]  # in round order
            row["warm_ms"] = statistics.median(warm) if warm else float("nan")
            row["artifact_bytes"] = pe.artifact_bytes(arts)
            if e == "coldbrew [continuous]":  # continuous mode: its later runs are what it is for
                row["warm_ms"] = statistics.median(s["warm_ms"][-1] for s in ss if s["warm_ms"]) if warm else row["warm_ms"]
            rows[m][e] = row
        f = floor_ms(rows[m], bandwidth)
        rows[m]["floor"] = {"cold_ms": f} if f else {"error": f"{ours(by_engine)} failed"}
    return rows




def floor_ms(by_engine, bandwidth):
    """The cold-path issue's floor for one model: max(the faster warm latency
    of coldbrew's best plan and onnxruntime, the bundle's bytes / the read
    bandwidth measured in the run); 0 where coldbrew's best plan failed."""
    best = ours(by_engine)
    ok = [by_engine[e] for e in (best, "onnxruntime") if e in by_engine and "error" not in by_engine[e]]
    if best not in by_engine or "error" in by_engine[best]:
        return 0.0
    return max(min(r["warm_ms"] for r in ok), by_engine[best]["artifact_bytes"] / bandwidth * 1e3)


def ours(engines):
    """The coldbrew engine the comparisons are made with: its best plan, or
    its defaults where the best plan is not run (--corpus)."""
    return BEST if BEST in engines or "coldbrew" not in engines else "coldbrew"


def cold_goal(rows, engines):
    """Per model, onnxruntime's best cold configuration (the faster of its
    two) over coldbrew's cold time; their geomean and the models where
    coldbrew is slower or fails (the no-slow-layer issue's cold goal)."""
    mine, ratios, slower, failed = ours(engines), {}, [], []
    for m, r in rows.items():
        theirs = [r[e]["cold_ms"] for e in ("onnxruntime", "onnxruntime best") if e in r and "error" not in r[e]]
        if "error" in r.get(mine, {"error": 1}):
            failed.append(m)
        elif theirs:
            ratios[m] = min(theirs) / r[mine]["cold_ms"]
            slower += [f"{m} {ratios[m]:.2f}x"] if ratios[m] < 1 else []
    if not ratios:
        return [f"{mine} against onnxruntime's best cold configuration: not measured"]
    return [f"{mine} against onnxruntime's best cold configuration (the faster of onnxruntime and onnxruntime best, "
            f"per model): geomean {geomean(list(ratios.values())):.2f}x faster over {len(ratios)} models; "
            f"slower on {len(slower)}" + (": " + ", ".join(slower) if slower else "")
            + (f"; {mine} failed on {len(failed)}: {', '.join(failed)}" if failed else "")]


def table(rows, engines):
    head = ("| model | engine | cold ms | warm ms | cold/warm | load ms | first run ms | import ms | artifact MB "
            "| read MB | peak RSS MB | output |")
    lines = [head, "|" + " --- |" * 12]
    for m, by in rows.items():
        for e in engines:
            r = by[e]
            if "error" in r:
                lines.append(f"| {m} | {e} | failed | | | | | | | | | {r['error'].replace('|', '/')} |")
                continue
            lines.append(f"| {m} | {e} | {r['cold_ms']:.1f} | {r['warm_ms']:.2f} | {r['cold_ms'] / r['warm_ms']:.1f} "
                         f"| {r['load_ms']:.1f} | {r['first_run_ms']:.1f} | {r['import_ms']:.0f} "
                         f"| {r['artifact_bytes'] / 1e6:.1f} | {max(r['bytes_read'], 0) / 1e6:.1f} "
                         f"| {r['peak_rss_kb'] / 1e3:.0f} | ok |")
        f = by["floor"]
        lines.append(f"| {m} | floor | {f['cold_ms']:.1f} | | | | | | | | | |" if "error" not in f
                     else f"| {m} | floor | failed | | | | | | | | | {f['error']} |")
    return lines


def geomeans(rows, engines):
    """Per engine: cold geomean over the models it passed, and coldbrew's best
    against it on the same models."""
    out = []
    for e in engines + ["floor"]:
        ms = [m for m in rows if "error" not in rows[m][e]]
        if not ms:
            out.append(f"{e}: failed on every model")
            continue
        g = geomean([rows[m][e]["cold_ms"] for m in ms])
        line = f"{e}: cold geomean {g:.1f} ms over {len(ms)}/{len(rows)} models"
        best = ours(engines)
        mine = [m for m in ms if "error" not in rows[m].get(best, {"error": 1})]
        if e != best and mine:
            ratio = geomean([rows[m][e]["cold_ms"] for m in mine]) / geomean([rows[m][best]["cold_ms"] for m in mine])
            line += f"; {e} / {best} = {ratio:.2f}x on {len(mine)} models"
        out.append(line)
    return out


def scheduler_goals(rows, bandwidth):
    """The cold-path issue's goals, measured on this run's rows: coldbrew's
    best plan against its floor (max(the faster warm latency of coldbrew and
    onnxruntime, the bundle's bytes / read bandwidth)), onnxruntime's best
    cold configuration and default, and ncnn; geomeans over the models where
    all of them passed."""
    need = [BEST, "onnxruntime", "onnxruntime best"]
    ms = [m for m in rows if all(e in rows[m] and "error" not in rows[m][e] for e in need)]
    if not ms:
        return ["scheduler goals: not measured (coldbrew's best plan or onnxruntime missing or failed)"]
    ours = [rows[m][BEST]["cold_ms"] for m in ms]
    floor = [floor_ms(rows[m], bandwidth) for m in ms]
    lines = [f"scheduler goals ({len(ms)} models, geomeans):",
             f"  {BEST} / its floor = {geomean(ours) / geomean(floor):.2f}x (goal <= 1.3x)"]
    for e, goal in (("onnxruntime best", 1.5), ("onnxruntime", 4.0), ("ncnn fp32", None), ("ncnn fp16", None)):
        both = [m for m in ms if e in rows[m] and "error" not in rows[m][e]]
        if not both:
            lines.append(f"  {e}: failed or not run")
            continue
        r = geomean([rows[m][e]["cold_ms"] for m in both]) / geomean([rows[m][BEST]["cold_ms"] for m in both])
        lines.append(f"  {e} / {BEST} = {r:.2f}x faster" + (f" (goal >= {goal}x)" if goal else "")
                     + (f" on {len(both)} models" if len(both) != len(ms) else ""))
    return lines


def charts(rows, engines, out):
    """cold.png (cold ms per model per engine, log scale), cold_warm.png."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no charts: matplotlib is not installed (pip install -e .[plot])"
    models = list(rows)
    for key, fname, ylabel in (("cold_ms", "cold.png", "cold start: load + first result (ms, log)"),
                               ("ratio", "cold_warm.png", "cold / warm")):
        fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(models) * len(engines) / 6), 4.8))
        width = 0.8 / len(engines)
        for k, e in enumerate(engines):
            vals = []
            for m in models:
                r = rows[m][e]
                v = float("nan") if "error" in r else (r["cold_ms"] if key == "cold_ms" else r["cold_ms"] / r["warm_ms"])
                vals.append(v)
            ax.bar(np.arange(len(models)) + k * width - 0.4 + width / 2, vals, width, label=e,
                   color=plt.get_cmap("tab20")(k % 20))  # 13 engines: tab10 would repeat colors
        if key == "cold_ms":
            ax.set_yscale("log")
            ax.scatter(np.arange(len(models)), [rows[m]["floor"].get("cold_ms", float("nan")) for m in models], marker="_", s=400,
                       color="black", label="floor", zorder=3)
        ax.set_xticks(np.arange(len(models)), models, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(f"{host_isa()}: missing bar = failed (see table)", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--onnx", action="append", default=[], help="an ONNX file to add")
    ap.add_argument("--shape", action="append", default=[], help="NAME=1x3x224x224 for --onnx inputs")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "peers"))
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", help="comma-separated subset (default: every coldbrew plan and peer)")
    ap.add_argument("--corpus", action="store_true", help="the real-model corpus's models (names: a subset)")
    args = ap.parse_args()
    import onnx

    z = zoo()
    if args.corpus:
        models, default_engines = corpus_models(args.models), ["coldbrew", "onnxruntime", "onnxruntime best"]
        names = []
    else:
        default_engines = [e for e in COLDBREW if e != "coldbrew"] + PEERS
        names = args.models or ([] if args.onnx else list(z.MODELS))
    unknown = [n for n in names if n not in z.MODELS]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {unknown}; the zoo has {list(z.MODELS)}")
    shapes = {k: [int(d) for d in v.split("x")] for k, v in (s.split("=", 1) for s in args.shape)}
    models = models if args.corpus else {n: (z.build(n), {}) for n in names}
    for f in args.onnx:
        models[os.path.splitext(os.path.basename(f))[0]] = (onnx.load(f), shapes)
    engines = args.engines.split(",") if args.engines else default_engines
    bad = [e for e in engines if e not in COLDBREW and e not in NARROW and e not in pe.ENGINES]
    if bad:
        raise SystemExit(f"unknown engine(s) {bad}; engines: {list(COLDBREW) + PEERS}")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="cb-peers-")
    clock = {"start": time.perf_counter()}
    try:
        progress = Progress(len(models) * len(engines) * (1 + args.samples), "peers")
        preps = prepare(models, engines, work, args.threads, progress)
        clock["prepared"] = time.perf_counter()
        res, bws = measure(preps, engines, args.samples, args.warm, args.threads, progress, bandwidth_files(work))
        bw = statistics.median(bws)
        clock["measured"] = time.perf_counter()
        progress.close()
        rows = summarize(res, preps, bw)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"# coldbrew and peers, cold start ({host_isa()}, {os.cpu_count()} cores, {args.threads} threads; "
             f"read bandwidth {bw / 1e9:.2f} GB/s, the median of one measurement per round "
             f"({', '.join(f'{b / 1e9:.2f}' for b in bws)}); {args.samples} samples per figure, medians; "
             f"{cold_protocol()})", ""]
    lines += table(rows, engines) + [""] + geomeans(rows, engines) + [""] + cold_goal(rows, engines) + [""]
    lines += scheduler_goals(rows, bw)
    lines += ["", f"wall time: {(time.perf_counter() - clock['start']) / 60:.1f} min (conversions "
                  f"{(clock['prepared'] - clock['start']) / 60:.1f}, samples {(clock['measured'] - clock['prepared']) / 60:.1f})",
              "conversion seconds per engine (all models): " + ", ".join(
                  f"{e} {sum(p['convert_s'][e] for p in preps.values()):.0f}" for e in engines)]
    note = charts(rows, engines, args.out)
    if note:
        lines.append(note)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "peers.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(text)
    print(f"wrote {args.out}/peers.md, peers.json, cold.png, cold_warm.png")


if __name__ == "__main__":
    main()
