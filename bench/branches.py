"""Branch steps at work: a model with an If decided at run time, compiled as
coldbrew compiles it (the branch its condition does not take is skipped) and
with the pass plan_branches switched off (both branches computed, then
selected), run warm on the same seeded input, the two interleaved in rounds;
the medians, their ratio, and how many branch steps the trace shows executed.

    python bench/branches.py [MODEL.onnx] [--rounds 300] [--threads 2]

The default model is the corpus's hey_jarvis_v0_1 (openwakeword: a verifier
head under an If on the wake-word score; bench/corpus/fetch.py fetches it).
"""
import argparse
import glob
import os
import statistics
import sys
import time

import numpy as np
from harness.common import host_isa


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import onnx

    import coldbrew
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.passes import plan_branches
    from coldbrew.compiler.bundle.reader import read_bytes

    path = args.model or next(iter(glob.glob(os.path.expanduser(
        "~/.cache/coldbrew/corpus/models/hey_jarvis_v0_1/*.onnx"))), None)
    if path is None:
        sys.exit("no model given and the corpus is not fetched (python bench/corpus/fetch.py)")
    model = onnx.load(path)
    data = compile_model(model, threads=args.threads)
    real = plan_branches.apply
    plan_branches.apply = lambda graph: graph  # both branches computed, as before branch steps
    try:
        both = compile_model(model, threads=args.threads)
    finally:
        plan_branches.apply = real
    b = read_bytes(data)[0]
    guarded = {k for k, s in enumerate(b.plan.steps) if s.kind.guard}
    x = b.tensors[b.inputs[0]]
    feed = {x.name.decode(): np.random.default_rng(0).standard_normal([int(d) for d in x.shape]).astype(np.float32)}
    skip, full = coldbrew.load(data, threads=args.threads, trace=True), coldbrew.load(both, threads=args.threads)
    same = all(np.array_equal(a, c) for a, c in zip(skip.run(None, feed), full.run(None, feed)))
    ran = {e["step"] for e in skip.trace() if e["phase"] == "execute"}
    times = {"branch steps": [], "both branches": []}
    for _ in range(args.rounds):
        for name, s in (("branch steps", skip), ("both branches", full)):
            t = time.perf_counter()
            s.run(None, feed)
            times[name].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# {os.path.basename(path)}: {len(b.plan.steps)} steps, {len(guarded)} branch steps, "
          f"{len(guarded & ran)} of them executed on this input; outputs equal: {same}; "
          f"{host_isa()}, {args.threads} threads, {args.rounds} interleaved rounds")
    for k, v in med.items():
        print(f"{k:<14} warm median {v:8.4f} ms")
    print(f"both branches / branch steps: {med['both branches'] / med['branch steps']:.2f}x")


if __name__ == "__main__":
    main()
