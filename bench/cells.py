"""Recurrent cells as kernels: every corpus model with an LSTM, GRU or RNN
compiled as coldbrew compiles it for a CPU (each cell one layer on a
recurrent kernel variant) and with its cells unrolled (as before cell
layers, and as GPU targets still get them): compile time, bundle size, the
output error against onnxruntime, and the warm medians of both and of
onnxruntime, the three interleaved in rounds on the same seeded input.

    python bench/cells.py [NAME ...] [--rounds 100] [--threads 2]

Models: the corpus's (bench/corpus/fetch.py fetches them) whose graph has
an LSTM, GRU or RNN, or onnxruntime's quantized LSTM.
"""
import argparse
import os
import statistics
import sys
import time

from harness.common import host_isa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fetch  # noqa: E402  (bench/corpus/fetch.py)
from corpus import compared, feeds, reference, shaped_model  # noqa: E402

CELLS = ("LSTM", "GRU", "RNN", "DynamicQuantizeLSTM")


def with_cells(entries):
    import onnx

    out = []
    for entry in entries:
        path = fetch.fetched(entry)
        if path and any(n.op_type in CELLS for n in onnx.load(path, load_external_data=False).graph.node):
            out.append((entry, path))
    return out


def one(entry, path, rounds, threads):
    import coldbrew
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.options import Options
    from coldbrew.compiler.pipeline import compile_graph, front_end

    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    sess = reference(path, shapes)
    x = feeds(entry, shaped_model(path, shapes))
    binds = {k: x[k] for k, v in entry["inputs"].items() if "bind" in v}
    feed = {k: v for k, v in x.items() if k not in binds}
    t = time.perf_counter()
    cell = compile_model(path, input_shapes=shapes, constants=binds, threads=threads)
    cell_s = time.perf_counter() - t
    t = time.perf_counter()
    front = front_end(path, Options(input_shapes=shapes, constants=binds), cells=False)
    unrolled, _ = compile_graph(path, front=front, threads=threads)
    unrolled_s = time.perf_counter() - t
    ref = sess.run(None, x)
    runs = {"cell layers": coldbrew.load(cell, threads=threads), "unrolled": coldbrew.load(unrolled, threads=threads)}
    errors = {k: compared(entry, ref, s.run(None, feed)).error for k, s in runs.items()}
    fns = {**{k: (lambda s=s: s.run(None, feed)) for k, s in runs.items()}, "onnxruntime": lambda: sess.run(None, x)}
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"## {entry['name']}")
    print(f"{'':<12} {'compile s':>9} {'bytes':>11} {'error':>8} {'warm ms':>9}")
    for k, data, s in (("cell layers", cell, cell_s), ("unrolled", unrolled, unrolled_s)):
        print(f"{k:<12} {s:9.1f} {len(data):11,} {errors[k]:8.1e} {med[k]:9.3f}")
    print(f"{'onnxruntime':<12} {'':>9} {'':>11} {'':>8} {med['onnxruntime']:9.3f}")
    print(f"unrolled / cell layers: compile {unrolled_s / cell_s:.1f}x, warm {med['unrolled'] / med['cell layers']:.2f}x;"
          f" cell layers / onnxruntime warm {med['cell layers'] / med['onnxruntime']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    found = with_cells(fetch.models(args.names or None))
    if not found:
        sys.exit("no corpus model with a recurrent cell is fetched (python bench/corpus/fetch.py)")
    print(f"# recurrent cells: {host_isa()}, {args.threads} threads, {args.rounds} interleaved rounds "
          "(cell layers, unrolled, onnxruntime)")
    for entry, path in found:
        one(entry, path, args.rounds, args.threads)


if __name__ == "__main__":
    main()
