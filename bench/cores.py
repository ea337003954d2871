"""Preparation spread over cores (papers/nnv12-cold-inference.txt, Fig. 13's
last step): cold start with raw weights, every transform inline on the
execution threads, against the same layers with their preparation on 1, 2,
4 and 8 worker cores (Algorithm 1's queues), the simulator's prediction
beside each measured figure.

    python bench/cores.py [MODEL[,MODEL...]] [--threads T] [--workers 1,2,4,8] [--rounds 5]

Per model, one cost table on this machine (compiler/measure/profile.py,
T execution threads) and one bundle per arm, all with raw weights and the
warm-fastest variant of every layer (the ablation's baseline: what an
engine that prepares at load runs), so the arms differ only in where the
preparation runs:

  inline    every layer's read and transform on the execution threads
  W cores   the scheduler's queues over W preparation workers
            (compiler/plan/scheduler.py: largest preparation first to the
            least loaded worker, then the balancing loop), the workers on
            the cores after the T execution threads

Samples are fresh processes (bench/harness/cold_sample.py: memory settled,
file evicted, load + first result), every arm of every model once per
round, each round in its own shuffled order. Printed per model: the
medians and predictions, the speedup of the best W >= 4 over inline, and
whether the simulator ranks the W arms as measured (strictly).
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile

from harness.common import geomean, host_isa, zoo
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402

from coldbrew.compiler import compile_model
from coldbrew.compiler.measure.profile import profile
from coldbrew.compiler.pipeline import front_end
from coldbrew.compiler.plan.scheduler import balance, layer_pairs, predict_ms, spread
from coldbrew.compiler.plan.simulate import median_ms, plan_of_bundle, simulate

SAMPLER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness", "cold_sample.py")
FEW = {"cold": 3, "default": 3, "warm": 5, "reads": 3}  # the profile's repeats: a cost table per model fits a lease


def raw_plan(table, threads, workers):
    """{"variants", "queues"}: per layer its warm-fastest variant with raw
    weights; its preparation inline (workers 0) or on the scheduler's
    queues over `workers` workers."""
    cls = table["classes"][0]["name"]
    sel = []
    for layer in table["layers"]:
        pairs = layer_pairs(layer, table, threads, 1 if workers else threads)
        best = min(layer["candidates"], key=lambda c: median_ms(c["execute_ms"], cls, threads))["variant"]
        ours = [p for p in pairs if p[0] == best]
        sel.append(next((p for p in ours if p[1] == "raw"), ours[0]))
    queues = [0] * len(sel)
    if workers:
        prep = [p[2] for p in sel]
        queues, _ = balance(spread(prep, workers), prep, workers, lambda q: predict_ms(table, sel, q, threads))
    names = [layer["name"] for layer in table["layers"]]
    return {"variants": {n: p[0] for n, p in zip(names, sel)}, "queues": dict(zip(names, queues))}


def sample(path, threads):
    out = cold_process([sys.executable, SAMPLER, path, "--threads", str(threads), "--runs", "0"],
                       capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["cold_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="?", default="resnet50,googlenet,alexnet")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    models, threads = args.models.split(","), args.threads
    workers = [int(w) for w in args.workers.split(",")]
    arms = ["inline"] + [f"{w} cores" for w in workers]
    with tempfile.TemporaryDirectory(prefix="coldbrew-cores-") as d:
        paths, predicted = {}, {}
        for m in models:
            proto = zoo().build(m)
            table = profile(front_end(proto), threads, repeat=FEW, direct=[])
            for arm, w in zip(arms, [0] + workers):
                plan = raw_plan(table, threads, w)
                path = paths[(m, arm)] = f"{d}/{m}.{w}.brew"
                compile_model(proto, path, weights="raw", threads=threads, **plan)
                predicted[(m, arm)] = simulate(plan_of_bundle(path), table)["latency_ms"]
            print(f"{m}: profiled in {table.get('profile_s', 0):.0f} s, compiled", flush=True)
        res = {}
        for r in range(args.rounds):
            order = list(paths)
            random.Random(r).shuffle(order)
            for key in order:
                res.setdefault(key, []).append(sample(paths[key], threads))
    med = statistics.median
    print(f"\npreparation cores on {host_isa()}, {os.cpu_count()} cores, {threads} execution threads, raw weights, "
          f"{args.rounds} interleaved rounds, fresh process per sample; ms, medians; {cold_protocol()}")
    print(f"{'model':14s} " + " ".join(f"{a:>17s}" for a in arms) + "  inline / best >=4  ranking as predicted? "
          "(strictly, with ties)")
    speedups, agree, agree_ties = [], 0, 0
    for m in models:
        cold = {a: med(res[(m, a)]) for a in arms}
        cells = " ".join(f"{cold[a]:8.1f} ({predicted[(m, a)]:6.1f})" for a in arms)
        wide = [a for a, w in zip(arms[1:], workers) if w >= 4]
        speed = cold["inline"] / min(cold[a] for a in wide) if wide else float("nan")
        ws = arms[1:]
        same = sorted(ws, key=lambda a: cold[a]) == sorted(ws, key=lambda a: predicted[(m, a)])
        # with ties: no two arms the simulator orders one way and the measurement the other
        ties = not any(predicted[(m, a)] < predicted[(m, b)] and cold[a] > cold[b] for a in ws for b in ws)
        agree, agree_ties = agree + same, agree_ties + ties
        speedups.append(speed)
        print(f"{m:14s} {cells}  {speed:17.2f}  {'yes' if same else 'no'}, {'yes' if ties else 'no'}")
    print("(measured, in parentheses the simulator's prediction)")
    print(f"geomean inline / best >=4 cores {geomean(speedups):.2f} (goal >= 1.3 on each); simulator ranks the "
          f"worker counts as measured on {agree} of {len(models)} strictly, {agree_ties} with ties (goal >= 2 of 3)")


if __name__ == "__main__":
    main()
