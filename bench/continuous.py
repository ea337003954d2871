"""Continuous mode (papers/nnv12-cold-inference.txt section 3.5): the first,
second and third runs of a `--plan cold --continuous` bundle opened with
mode="continuous", against the warm latency of the `--plan warm` bundle
(the warm-fastest variants). Every sample is a fresh process
(bench/harness/cold_sample.py: bundle evicted, load + first result timed, then
runs back to back with no idle time between them); the two bundles'
samples alternate in rounds.

    python bench/continuous.py [MODEL[,MODEL...]] [ROUNDS]

Printed per model (medians over rounds): cold = load + first run; run 2 and
run 3 of the continuous session; warm = the warm bundle's median over runs
4..23 of each of its samples. The ratios run2 / warm and run3 / warm are the
criterion (<= 1.1 and = 1.0). "switched" is how many of the continuous
bundle's layers carry a warm alternate (a layer whose cold-plan variant is
not the warm-fastest one: runs after the first execute the alternate), of
its layers with a kernel variant. The warm bundle's own 2nd and 3rd runs are
printed too: both bundles run in a process that has just started, so
whatever the machine does in a new process's first milliseconds shows up in
both alike. Kernels are untuned (the same in every arm).
"""
import json
import os
import statistics
import sys
import tempfile

from harness.common import ROOT, geomean, host_isa, zoo
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402

from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes

RUNS = 23  # runs after the first: 2nd, 3rd, then 20 for the warm median


def switched(path):
    """(layers with a warm alternate, layers with a kernel variant) of a continuous bundle."""
    with open(path, "rb") as f:
        b = read_bytes(f.read(), path)[0]
    steps = [s for s in b.plan.steps if s.variant]
    return sum(1 for s in steps if s.kind.warm), len(steps)


def main():
    args = sys.argv[1:]
    models = args[0].split(",") if args else ["mobilenet_v2", "resnet50", "squeezenet", "googlenet"]
    rounds = int(args[1]) if len(args) > 1 else 5
    sampler = os.path.join(ROOT, "bench", "harness", "cold_sample.py")
    with tempfile.TemporaryDirectory(prefix="coldbrew-continuous-") as d:
        arms, switches = [], {}
        for m in models:
            proto = zoo().build(m)
            compile_model(proto, f"{d}/{m}.cont.brew", plan="cold", continuous=True, tune=False)
            compile_model(proto, f"{d}/{m}.warm.brew", plan="warm", tune=False)
            switches[m] = switched(f"{d}/{m}.cont.brew")
            arms += [(m, "continuous", [f"{d}/{m}.cont.brew", "--mode", "continuous"]),
                     (m, "warm", [f"{d}/{m}.warm.brew"])]
        res = {}
        for _ in range(rounds):
            for m, arm, argv in arms:
                out = cold_process([sys.executable, sampler, *argv, "--runs", str(RUNS)], capture_output=True,
                                   text=True, check=True)
                res.setdefault((m, arm), []).append(json.loads(out.stdout))
    med = statistics.median
    print(f"continuous mode on {host_isa()}, {rounds} interleaved rounds, fresh process per sample (ms, medians; {cold_protocol()})")
    print(f"{'model':14s} {'cold':>8s} {'run 2':>8s} {'run 3':>8s} {'warm':>8s} {'run2/warm':>10s} "
          f"{'run3/warm':>10s} {'switched':>9s}   warm bundle: cold, run 2, run 3")
    r2s, r3s = [], []
    for m in models:
        c, w = res[(m, "continuous")], res[(m, "warm")]
        warm = med(med(x["runs_ms"][2:]) for x in w)
        r2, r3 = med(x["runs_ms"][0] for x in c), med(x["runs_ms"][1] for x in c)
        r2s.append(r2 / warm)
        r3s.append(r3 / warm)
        print(f"{m:14s} {med(x['cold_ms'] for x in c):8.2f} {r2:8.2f} {r3:8.2f} {warm:8.2f} {r2 / warm:10.2f} "
              f"{r3 / warm:10.2f} {'%d/%d' % switches[m]:>9s}   {med(x['cold_ms'] for x in w):8.2f} "
              f"{med(x['runs_ms'][0] for x in w):8.2f} "
              f"{med(x['runs_ms'][1] for x in w):8.2f}")
    print(f"geomean run2/warm {geomean(r2s):.2f}, run3/warm {geomean(r3s):.2f}; "
          f"{sum(1 for m in models if switches[m][0])} of {len(models)} models switch at least one layer")


if __name__ == "__main__":
    main()
