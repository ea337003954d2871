"""Parallel loops split by core speed on the phone and Jetson presets
(modeled: the simulator over the host's cost table scaled per core class,
targets/README.md) against the even split.

    python bench/experiments/split.py [models...] [--threads 2 4 8]

Per model and preset, for T execution threads (the runtime's order: fastest
class first), the predicted execution time of one run (every layer's first
execution; T other than the profiled thread counts scales the 1-thread time
by 1/T) with loops split evenly and split by speed (targets.task_shares),
and the scheduler's cold plan predicted both ways. Everything printed here
is modeled.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness
from harness.common import geomean, host_isa, zoo  # noqa: E402

from coldbrew.compiler.plan.scheduler import choose, simulated_plan  # noqa: E402
from coldbrew.compiler.measure.profile import modeled_table, profile  # noqa: E402
from coldbrew.compiler.pipeline import front_end  # noqa: E402
from coldbrew.compiler.plan.simulate import loop_factor, simulate  # noqa: E402
from coldbrew.targets import resolve, task_shares  # noqa: E402

PRESETS = ["sd855", "sd765g", "helio_g80", "jetson_tx2", "jetson_nano"]


def execute_ms(table, threads):
    """Sum over layers of the first execution on `threads` threads of the
    fastest class, the plan's variant being each layer's first candidate."""
    cls, total = table["classes"][0]["name"], 0.0
    for layer in table["layers"]:
        runs = layer["candidates"][0]["execute_first_ms"][cls]
        total += runs[str(threads)]["median"] if str(threads) in runs else runs["1"]["median"] / threads
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["squeezenet", "mobilenet_v2"])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4, 8])
    a = ap.parse_args()
    print(f"host (cost tables measured here): {host_isa()}; every figure below is MODELED")
    gains = {}
    for m in a.models:
        host = profile(front_end(zoo().build(m)), 2, direct=[])
        for name in PRESETS:
            tgt = resolve(name)
            t = modeled_table(host, tgt)
            for n in a.threads:
                speeds = tgt.exec_speeds(n)
                base = execute_ms(t, n)
                even, fast = base * loop_factor(t, n, "even"), base * loop_factor(t, n)
                gains.setdefault(n, []).append(even / fast)
                print(f"{m:13s} {name:11s} T={n}  speeds {','.join(f'{s:g}' for s in speeds):38s} "
                      f"shares {':'.join(map(str, task_shares(speeds))):16s} execute even {even:8.1f} ms  "
                      f"by speed {fast:8.1f} ms  gain {even / fast:5.2f}x")
            plan = choose(t, "cold")
            steps = simulated_plan(t, plan)
            even, fast = simulate(dict(steps, split="even"), t), simulate(steps, t)
            print(f"{m:13s} {name:11s} cold plan (T={plan['threads']}): predicted even {even['latency_ms']:8.1f} ms, "
                  f"by speed {fast['latency_ms']:8.1f} ms")
    for n, g in gains.items():
        print(f"geomean execute gain by speed over even, T={n}: {geomean(g):.2f}x (modeled)")


if __name__ == "__main__":
    main()
