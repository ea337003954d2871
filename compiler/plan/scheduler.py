"""Choose kernel variants, weight forms and where each layer's preparation
runs, from a device cost table (compiler/measure/profile.py).

    warm         per layer, the variant that executes fastest (warm, the
                 plan's threads, fastest core class); weights cached
    cold-greedy  per layer, the (variant, weight form) with the least
                 sequential cold cost: read (raw or transformed bytes) +
                 transform (raw form) + first execution; all inline
    cold         the scheduler: NNV12's Algorithm 1 (papers/nnv12-cold-
                 inference.txt, section 3.3), adapted as below

The scheduler, for each execution configuration the cores allow (every
preparation inline on the execution threads; 1 to W preparation workers
beside them, W the cores the execution threads leave free, at most the
runtime's 8 queues, or one worker sharing a core where none is free; the
same with one execution thread fewer):

1. drops the (variant, form) pairs of a layer that another pair beats in
   both preparation (read + transform) and execution;
2. starts from each layer's least sequential cold cost, the first layer's
   preparation on the execution threads and every other on a worker:
   largest preparation first, each to the least loaded worker;
3. balances the workers (the paper's little-core loop): moves the largest
   preparation of the most loaded worker that fits the gap to the least
   loaded one while that shortens the predicted completion;
4. moves preparations from the head of the workers' queues onto the
   execution threads while that shortens the predicted completion (the
   paper's big-core loop);
5. tries every remaining pair of every layer in turn and keeps a change
   when it shortens the predicted completion, until a pass changes nothing
   (the paper enumerates kernel combinations; after step 1 a layer has one
   to three pairs left, and a coordinate search over them visits the
   combinations worth visiting in time linear in the layers).

The completion time of a candidate plan is the simulator's
(compiler/plan/simulate.py), which models the runtime's queues; the plan with
the smallest one wins, except that a plan with a preparation worker must
predict WORKER_MARGIN less than the best plan without one. The simulator
charges a worker's reads, checks and transforms, not the thread itself:
its start, a hand-off per step, its turns on a shared core. Where the two
predictions lie within a hair of each other, the worker's plan measured
slower (mobilenet_v2 on the 2-core AMD EPYC host, AVX-512: predicted
7.409 ms with the worker against 7.412 inline; measured, 12 rounds
interleaved, medians 8.95 against 8.25 ms).
"""
import time

from ..ir.forms import DIRECT_FORMS, cost_form, is_narrow_form, plan_form
from .simulate import first_execute_ms, median_ms, narrow_transform_ms, read_ms, simulate

OBJECTIVES = ("warm", "cold-greedy", "cold")
WORKER_MARGIN = 0.02  # the share of the inline plan's completion a worker must save
MAX_WORKERS = 8  # preparation queues the runtime serves (CB_MAX_PREP_QUEUES)


def choose(table, objective, precision="fp32"):
    """{"variants": {layer: variant}, "forms": {layer: "raw" | "cached"},
    "precisions": {layer: "fp32" | precision}, "queues": {layer: q},
    "threads": T, "predicted_ms": ms, "plan_ms": ms}. A narrow `precision`
    ("fp16", "int8") stores every variant layer's weights that way where the
    table measured them, and the plan chooses how (widened on the first
    run, or read in place by a direct kernel) and which variant, by cost;
    the "warm" objective keeps fp32 (cached weights)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"plan objective must be one of {OBJECTIVES}, not {objective!r}")
    t0 = time.perf_counter()
    if objective == "cold":
        out = _schedule(table, precision)
    else:
        threads = table["threads"]
        sel = [_greedy(layer, table, threads, objective, precision) for layer in table["layers"]]
        out = _result(table, sel, [0] * len(sel), threads)
    out["plan_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def layer_pairs(layer, table, threads, prep_threads, precision="fp32"):
    """[(variant, form, prep_ms, exec_ms)] of a layer (also the exact
    yardstick's, compiler/plan/exact.py): every candidate
    cached, raw where it has a transform, and with a narrow `precision` its
    weights stored narrow (form "fp16" or "int8", widened on the first run)
    where the table measured them, and its direct form (fp16 or int8 read
    in place by the kernel: no widening, its own execution times). A read
    costs what the simulator charges it (simulate.read_ms)."""
    cls = table["classes"][0]["name"]
    out = []
    for c in layer["candidates"]:
        prep = {"cached": read_ms(table, c, "cached")}
        if c["has_transform"]:
            prep["raw"] = read_ms(table, c, "raw") + median_ms(c["transform_ms"], cls, prep_threads)
        if precision != "fp32" and precision in c["read_ms"]:
            prep[precision] = read_ms(table, c, precision) + narrow_transform_ms(table, c, precision, cls, prep_threads)
        direct = DIRECT_FORMS.get(precision)
        if direct in c["read_ms"]:
            prep[direct] = read_ms(table, c, direct)
        out += [(c["variant"], form, ms, first_execute_ms(c, form, cls, threads)) for form, ms in prep.items()]
    return out


def narrow_pairs(pairs, precision):
    """A layer's pairs that store its weights at the asked `precision`
    (narrow, widened or read in place) where it has any: narrow weights are
    the user's choice, so the plan keeps a layer wide only where narrowing
    is not available (compiler/measure/error.py keeps layers wide for
    accuracy after the plan)."""
    if precision == "fp32":
        return pairs
    return [p for p in pairs if is_narrow_form(p[1])] or pairs


def _greedy(layer, table, threads, objective, precision="fp32"):
    pairs = layer_pairs(layer, table, threads, threads, precision)
    if objective == "warm":
        cls = table["classes"][0]["name"]
        best = min(layer["candidates"], key=lambda c: median_ms(c["execute_ms"], cls, threads))
        return next(p for p in pairs if p[0] == best["variant"] and p[1] == "cached")
    return min(narrow_pairs(pairs, precision), key=lambda p: p[2] + p[3])


def _steps(table, sel, queues):
    return [{"layer": layer["name"], "variant": p[0], "form": p[1], "prep_queue": q, "exec_queue": 0}
            for layer, p, q in zip(table["layers"], sel, queues)]


def simulated_plan(table, chosen):
    """choose()'s result as the simulator's plan (every layer a step)."""
    return {"threads": chosen["threads"], "steps": [
        {"layer": layer["name"], "variant": chosen["variants"].get(layer["name"], layer["candidates"][0]["variant"]),
         "form": _form(chosen, layer["name"]), "prep_queue": chosen["queues"][layer["name"]],
         "exec_queue": 0} for layer in table["layers"]]}


def _form(chosen, name):
    """A chosen layer's simulator form: direct, its narrow precision, else its form."""
    return cost_form(chosen["forms"].get(name, "cached"), chosen.get("precisions", {}).get(name, "fp32"))


def predict_ms(table, sel, queues, threads):
    return simulate({"threads": threads, "steps": _steps(table, sel, queues)}, table)["latency_ms"]


def _result(table, sel, queues, threads):
    # layers with one candidate and no transform have nothing to choose
    chosen = [(layer["name"], p) for layer, p in zip(table["layers"], sel)
              if len(layer["candidates"]) > 1 or any(c["has_transform"] for c in layer["candidates"])
              or is_narrow_form(p[1])]
    return {"variants": {name: p[0] for name, p in chosen},
            # fp16 in the kernel's layout where the variant allows it (compiler/passes/plan_weights.py)
            "forms": {name: plan_form(p[1])[0] for name, p in chosen},
            "precisions": {name: plan_form(p[1])[1] for name, p in chosen},
            "queues": {layer["name"]: q for layer, q in zip(table["layers"], queues)},
            "threads": threads, "predicted_ms": predict_ms(table, sel, queues, threads)}


def configurations(table):
    """(execution threads, preparation workers) pairs worth planning for:
    every preparation inline; with `threads` and with one execution thread
    fewer, 1 to W workers, W the cores left free (one worker sharing an
    execution core where none is)."""
    threads = table["threads"]
    cores = sum(len(c["ids"]) for c in table["classes"])
    configs = [(threads, 0)]
    for t in ([threads, threads - 1] if threads > 1 else [threads]):
        configs += [(t, w) for w in range(1, min(max(cores - t, 1), MAX_WORKERS) + 1)]
    return configs


def _schedule(table, precision="fp32"):
    best = {}  # with workers? -> the plan with the least predicted completion
    for threads, workers in configurations(table):
        plan = schedule_config(table, threads, workers, precision)
        key = workers > 0
        if key not in best or plan["predicted_ms"] < best[key]["predicted_ms"]:
            best[key] = plan
    inline, pipelined = best[False], best.get(True)
    if pipelined and pipelined["predicted_ms"] < inline["predicted_ms"] * (1 - WORKER_MARGIN):
        return pipelined
    return inline


def _loads(queues, prep, workers):
    """Each worker's preparation time (queue q's at index q - 1)."""
    load = [0.0] * workers
    for q, ms in zip(queues, prep):
        if q:
            load[q - 1] += ms
    return load


def spread(prep, workers):
    """Queues for every layer but the first (inline): largest preparation
    first, each to the least loaded worker."""
    queues, load = [0] * len(prep), [0.0] * workers
    for i in sorted(range(1, len(prep)), key=lambda i: -prep[i]):
        q = min(range(workers), key=lambda w: load[w])
        queues[i], load[q] = q + 1, load[q] + prep[i]
    return queues


def balance(queues, prep, workers, predict):
    """The little-core loop: the most loaded worker's largest preparation
    that is smaller than its gap to the least loaded one moves there, while
    that shortens `predict(queues)`. Returns (queues, predicted)."""
    cost = predict(queues)
    while workers > 1:
        load = _loads(queues, prep, workers)
        hi, lo = max(range(workers), key=lambda w: load[w]), min(range(workers), key=lambda w: load[w])
        gap = load[hi] - load[lo]
        movable = [i for i, q in enumerate(queues) if q == hi + 1 and 0 < prep[i] < gap]
        if not movable:
            break
        i = max(movable, key=lambda i: prep[i])
        trial = queues[:i] + [lo + 1] + queues[i + 1:]
        c = predict(trial)
        if c >= cost:
            break
        queues, cost = trial, c
    return queues, cost


def schedule_config(table, threads, workers, precision="fp32"):
    """The plan for `threads` execution threads and `workers` preparation
    workers (0: every preparation inline)."""
    workers = int(workers)
    layers = table["layers"]
    # preparation on a worker runs on one thread; inline, on the execution threads. Every pair
    # stays: one beaten on both of its own costs can still shorten the timeline (a cached read
    # streams in behind earlier layers' execution, a raw one's transform holds the execution threads)
    options = [narrow_pairs(layer_pairs(layer, table, threads, 1 if workers else threads, precision), precision)
               for layer in layers]
    sel = [min(opts, key=lambda p: p[2] + p[3]) for opts in options]

    def predict(queues):
        return predict_ms(table, sel, queues, threads)

    if workers:
        prep = [p[2] for p in sel]
        queues, cost = balance(spread(prep, workers), prep, workers, predict)
    else:
        queues = [0] * len(layers)
        cost = predict(queues)
    # big-core loop: the workers' heads move inline while that helps
    for i in range(1, len(layers) if workers else 1):
        if not queues[i]:
            continue
        trial = queues[:i] + [0] + queues[i + 1:]
        c = predict(trial)
        if c >= cost:
            break
        queues, cost = trial, c
    # coordinate search over each layer's remaining pairs
    changed = True
    while changed:
        changed = False
        for i, opts in enumerate(options):
            for p in opts:
                if p == sel[i]:
                    continue
                trial = sel[:i] + [p] + sel[i + 1:]
                c = predict_ms(table, trial, queues, threads)
                if c < cost - 1e-9:
                    sel, cost, changed = trial, c, True
    return _result(table, sel, queues, threads)
