"""Cold start with a CPU hog pinned to one core, against the same machine
unloaded: work stealing keeps a busy core from holding up the run.

    python bench/hog.py [models...] [--rounds 7] [--core N]

Per model, a bundle whose layers (all but the first) are prepared by a
worker (`--prep-queue 1 --prep-queue c0=0`) and one with all preparation
inline. Each round takes one cold sample of every bundle unloaded and one
with a busy-looping process pinned to core N (default: the last core this
process may use), in turns (bench/harness/cold_sample.py: fresh process, bundle
evicted, load + first result). The worker bundle is also run with its
executing thread placed on another core than the hog and parallel loops
split 2:1 toward it ("split": the app tells the runtime that the second
core runs at about half speed, exec_shares). Prints medians and the hogged
/ unloaded ratio (the goal: <= 1.5x with work stealing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from harness.common import ROOT, geomean, zoo
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402

HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def sample(path, *flags):
    out = cold_process([sys.executable, os.path.join(ROOT, "bench", "harness", "cold_sample.py"), path, *flags],
                       capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return j["load_ms"] + j["first_run_ms"]


def main():
    from coldbrew.compiler import compile_model

    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["mobilenet_v2", "squeezenet", "googlenet"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="coldbrew-hog-") as d:
        bundles = []
        for m in a.models:
            proto = zoo().build(m)
            paths = {}
            for name, queues in (("worker", {"*": 1, "c0": 0}), ("inline", 0)):
                paths[name] = os.path.join(d, f"{m}.{name}.brew")
                compile_model(proto, paths[name], queues=queues)
                bundles.append((m, name, paths[name], ()))
            other = min(c for c in os.sched_getaffinity(0) if c != a.core)
            bundles.append((m, "split", paths["worker"], ("--home-core", str(other), "--exec-shares", "2,1")))
        times = {}
        for _ in range(a.rounds):
            for m, name, path, flags in bundles:
                times.setdefault((m, name, "unloaded"), []).append(sample(path, *flags))
                hog = subprocess.Popen([sys.executable, "-c", HOG, str(a.core)])
                try:
                    times.setdefault((m, name, "hog"), []).append(sample(path, *flags))
                finally:
                    hog.kill()
                    hog.wait()
    print(f"cold start (ms, medians of {a.rounds} interleaved rounds), hog pinned to core {a.core}; {cold_protocol()}")
    ratios = {}
    for m, name, _, _ in bundles:
        quiet, busy = statistics.median(times[(m, name, "unloaded")]), statistics.median(times[(m, name, "hog")])
        ratios.setdefault(name, []).append(busy / quiet)
        print(f"{m:14s} {name:7s} unloaded {quiet:8.2f}  hog {busy:8.2f}  ratio {busy / quiet:5.2f}x")
    for name, r in ratios.items():
        print(f"geomean hog/unloaded, {name}: {geomean(r):.2f}x")


if __name__ == "__main__":
    main()
