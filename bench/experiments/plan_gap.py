"""The scheduler against the optimum: random small cost tables (a chain of
conv layers, each with a winograd candidate — raw weights + a transform, or
cached — and a GEMM one), the scheduler's plan for a configuration with a
dedicated preparation core beside 2 execution threads, and the exact
optimum of the same model (bench/harness/plan_exact.py, MILP). Prints the gap
distribution and the scheduler's planning time.

With --cached, real models' cost tables instead: every table in the
profile cache (~/.cache/coldbrew/costs, or COLDBREW_CACHE's; one per model
and machine, the newest kept per model name), planned for one execution
thread and a worker on the other core (the configuration the exact model
solves), the storage stream left out of both (the MILP does not model
it): the scheduler's prediction against the optimum, per model.

    python bench/experiments/plan_gap.py [--tables 200] [--layers 4,6,8] [--seed 1]
    python bench/experiments/plan_gap.py --cached [--time-limit 120]
"""
import argparse
import random
import statistics
import os
import sys
import time

from coldbrew.compiler.plan.scheduler import schedule_config

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.plan_exact import optimal_makespan  # noqa: E402


def _stat(ms):
    return {"median": ms, "min": ms, "max": ms, "n": 1}


def random_table(rnd, n):
    def cand(variant, transform):
        x = rnd.uniform(0.5, 6)
        return {"variant": variant, "raw_bytes": 1000, "transformed_bytes": 2000, "has_transform": transform,
                "read_ms": {"raw": _stat(rnd.uniform(0.1, 3)), "cached": _stat(rnd.uniform(0.1, 4))},
                "transform_ms": {"core": {"1": _stat(x if transform else 0), "2": _stat(x / 2 if transform else 0)}},
                "execute_first_ms": {"core": {"2": _stat(rnd.uniform(0.5, 3))}}}

    return {"classes": [{"name": "core", "ids": [0, 1, 2]}], "threads": 2, "modeled": False,
            "load": {"verify": _stat(0.5), "code_load": _stat(0.5), "session": _stat(0.5), "bundle_bytes": 1000},
            "layers": [{"name": f"c{i}", "candidates": [cand("conv2d.winograd_f4", True),
                                                         cand("conv2d.im2col_gemm", False)]} for i in range(n)]}


def cached_tables():
    """{model name: its newest cached cost table with more than one layer}."""
    import glob
    import json
    import os

    from coldbrew.compiler.measure.protocol import cache_dir

    newest = {}
    for path in sorted(glob.glob(os.path.join(cache_dir(), "costs", "*.json")), key=os.path.getmtime):
        with open(path) as f:
            t = json.load(f)
        if len(t.get("layers", [])) > 1 and sum(len(c["ids"]) for c in t["classes"]) >= 2:
            newest[t.get("model", os.path.basename(path))] = t
    return newest


def real_gaps(time_limit):
    for name, t in sorted(cached_tables().items()):
        t = dict(t, storage={}, check_ms_per_byte=0.0)  # the stream: not in the exact model
        t0 = time.perf_counter()
        plan = schedule_config(t, 1, 1)
        plan_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        try:
            best = optimal_makespan(t, 1, time_limit)
        except RuntimeError as e:
            print(f"{name:<20} {len(t['layers']):>4} layers: no optimum ({e})")
            continue
        pairs = max(len(c) for c in ([l["candidates"] for l in t["layers"]]))
        print(f"{name:<20} {len(t['layers']):>4} layers (up to {pairs} candidates): scheduler "
              f"{plan['predicted_ms']:.3f} ms, optimum {best:.3f} ms, gap {100 * (plan['predicted_ms'] / best - 1):.2f} %"
              f" (scheduler {plan_ms:.0f} ms, solver {time.perf_counter() - t0:.1f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--layers", default="4,6,8")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cached", action="store_true", help="real models' cached cost tables instead")
    ap.add_argument("--time-limit", type=float, default=120.0, help="solver seconds per model (--cached)")
    a = ap.parse_args()
    if a.cached:
        real_gaps(a.time_limit)
        return
    rnd = random.Random(a.seed)
    for n in map(int, a.layers.split(",")):
        gaps, plan_ms = [], []
        for _ in range(a.tables):
            t = random_table(rnd, n)
            t0 = time.perf_counter()
            heuristic = schedule_config(t, 2, True)["predicted_ms"]
            plan_ms.append((time.perf_counter() - t0) * 1e3)
            gaps.append(100 * (heuristic / optimal_makespan(t, 2) - 1))
        q = statistics.quantiles(gaps, n=20)
        print(f"{n} layers, {a.tables} tables: gap to optimum mean {statistics.mean(gaps):.2f} %, median "
              f"{statistics.median(gaps):.2f} %, p90 {q[17]:.2f} %, max {max(gaps):.2f} %, optimal in "
              f"{sum(g < 1e-6 for g in gaps)}/{a.tables}; scheduler {statistics.median(plan_ms):.2f} ms per plan")


if __name__ == "__main__":
    main()
