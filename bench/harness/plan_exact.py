"""The optimal cold plan of a small model, by mixed-integer programming: the
yardstick for the scheduler (compiler/plan/scheduler.py). Needs scipy (HiGHS), an
extra of the tests and benchmarks, so it lives beside them, not in the compiler.

It solves the simulator's model (compiler/plan/simulate.py) for one execution
configuration with dedicated preparation cores (`threads` execution
threads, one worker on a core of its own), exactly: per layer, one
(variant, weight form) pair and where its preparation runs (inline on the
execution threads, right before the layer executes, or on the worker, in
plan order); a layer executes once its preparation is done and the previous
layer has executed. Minimizes the last layer's end.

Variables per layer i: binaries z[i, j, w] (pair j, w = 0 inline / 1 on the
worker) and times ws, we (worker start / end of i's preparation), es, ee
(execution start / end). Constraints, with P0 / P1 the inline / worker
preparation times and E the execution time:

    sum_{j,w} z[i, j, w] = 1
    we_i = ws_i + sum_j z[i, j, 1] P1[i, j],     ws_i >= we_{i-1}  (ws_0 >= open)
    es_i >= ee_{i-1} + sum_j z[i, j, 0] P0[i, j] (ee_{-1} = open),  es_i >= we_i
    ee_i = es_i + sum_{j,w} z[i, j, w] E[i, j]
"""
import numpy as np

from coldbrew.compiler.plan.scheduler import layer_pairs


def optimal_makespan(table, threads, time_limit=None):
    """The least predicted cold latency over every plan of the configuration
    (ms), with the worker on a dedicated core; RuntimeError where the solver
    does not prove it (within `time_limit` seconds, if given)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    layers = table["layers"]
    load = table["load"]
    open_ms = load["verify"]["median"] + load["code_load"]["median"] + load["session"]["median"]
    # every pair, in both placements (worker preparation: one thread)
    inline = [layer_pairs(layer, table, threads, threads) for layer in layers]
    worker = [layer_pairs(layer, table, threads, 1) for layer in layers]
    n = len(layers)
    z_index, k = {}, 0
    for i in range(n):
        for j in range(len(inline[i])):
            for w in (0, 1):
                z_index[i, j, w] = k
                k += 1
    t0 = k  # then per layer: ws, we, es, ee
    nvar = t0 + 4 * n

    def t(i, what):
        return t0 + 4 * i + ("ws", "we", "es", "ee").index(what)

    rows, lo, hi = [], [], []

    def add(coeffs, low, high):
        row = np.zeros(nvar)
        for idx, v in coeffs:
            row[idx] += v
        rows.append(row)
        lo.append(low)
        hi.append(high)

    for i in range(n):
        add([(z_index[i, j, w], 1) for j in range(len(inline[i])) for w in (0, 1)], 1, 1)
        add([(t(i, "we"), 1), (t(i, "ws"), -1)] + [(z_index[i, j, 1], -worker[i][j][2])
                                                   for j in range(len(inline[i]))], 0, 0)
        if i:
            add([(t(i, "ws"), 1), (t(i - 1, "we"), -1)], 0, np.inf)
            add([(t(i, "es"), 1), (t(i - 1, "ee"), -1)] + [(z_index[i, j, 0], -inline[i][j][2])
                                                           for j in range(len(inline[i]))], 0, np.inf)
        else:
            add([(t(i, "ws"), 1)], open_ms, np.inf)
            add([(t(i, "es"), 1)] + [(z_index[i, j, 0], -inline[i][j][2]) for j in range(len(inline[i]))],
                open_ms, np.inf)
        add([(t(i, "es"), 1), (t(i, "we"), -1)], 0, np.inf)
        add([(t(i, "ee"), 1), (t(i, "es"), -1)] + [(z_index[i, j, w], -inline[i][j][3])
                                                   for j in range(len(inline[i])) for w in (0, 1)], 0, 0)
    cost = np.zeros(nvar)
    cost[t(n - 1, "ee")] = 1
    integrality = np.zeros(nvar)
    integrality[:t0] = 1
    bounds = Bounds(np.zeros(nvar), np.concatenate([np.ones(t0), np.full(4 * n, np.inf)]))
    res = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit} if time_limit else None)
    if not res.success:
        raise RuntimeError(f"exact plan: the solver failed ({res.message})")
    return float(res.fun) + load.get("run_overhead", {}).get("median", 0.0)
