"""Predict a cold run from a plan and a device cost table (compiler/measure/profile.py).

This is the model the scheduler plans with, and it mirrors what the runtime
does on a cold start:

    open     verify the bundle's header and code (measured), load the code,
             create the session
    stream   the file is read front to back from the open on (the
             runtime's streamer): with a measured storage bandwidth, a
             step's weights arrive when the disk has brought every byte
             before them, after the header and code; a reader checks
             them as they arrive, 2 MB at a time (the table's
             check_ms_per_byte), so its check ends one chunk's check after
             the last byte, or, where the bytes came first, after the
             whole check (split across the execution threads for a
             tensor of 256 KB or more read inline, as the runtime does).
             Without a bandwidth, each step's measured cold read stands
             for both
    per step read its weights, transform them (raw form with a transform
             kernel), execute (first-run time)
    after    the first run's overhead beyond its steps (binding inputs and
             outputs, the step loop)

Queue 0 is the executing thread: preparation (read + transform) queued
there runs inline right before the step executes, with the execution
threads. Preparation on queue q > 0 runs on a worker, in plan order, as
early as it can; a step executes once its preparation is done and the
previous step has executed. The worker has a core of its own when the
execution threads leave one free; otherwise it shares an execution core:
its reads wait on storage while execution goes on, and its CPU work
(transforms, checksums; one thread) delays the executions by all of its
time: a parallel loop split evenly waits for its slowest thread, the one
whose core the worker takes.

A plan is {"steps": [{"layer", "variant", "form", "prep_queue",
"exec_queue"}, ...], "threads": T}. The result has the
predicted latency and a timeline of events shaped like the runtime's trace.
"""


from coldbrew.targets import split_factor, task_shares

from ..ir.forms import FORM_BYTES, NARROW, PRECISION_OF_DTYPE, cost_form, is_direct
from ..measure.protocol import STREAM_CHUNK


PARALLEL_CHECK_MIN = 256 << 10  # weights the execution threads check together (CB_PARALLEL_CHECK_MIN)


class PlanError(ValueError):
    pass


def plan_of_bundle(data):
    """The plan a bundle carries (its bytes or path)."""
    from ..bundle.reader import WEIGHT_FORMS, cpu_step, read, read_bytes

    bundle, _, _ = read_bytes(data) if isinstance(data, (bytes, bytearray)) else read(data)
    steps = []
    for s in bundle.plan.steps:
        layer = bundle.layers[s.layer]
        # the cost table knows narrow forms of variant layers only: a generic
        # layer's fp16 weights are costed as its fp32 ones
        p = PRECISION_OF_DTYPE.get(s.weightPrecision, "fp32")
        form = cost_form(WEIGHT_FORMS.get(s.weightForm, "cached"), p, _s(s.variant) != "generic")
        steps.append({"layer": _s(layer.name), "variant": _s(s.variant), "form": form,
                      "prep_queue": s.prepQueue,
                      "exec_queue": s.execQueue})
    tuned = any(c.tuned for c in map(cpu_step, bundle.plan.steps) if c)  # its kernels' parameters measured (--tune)
    return {"steps": steps, "threads": bundle.plan.threads or 1, "tuned": tuned}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def candidate(table, layer, variant):
    for entry in table["layers"]:
        if entry["name"] == layer:
            for c in entry["candidates"]:
                if c["variant"] == variant:
                    return c
            raise PlanError(f"cost table has no measurement of {variant} for layer {layer} "
                            f"(measured: {[c['variant'] for c in entry['candidates']]})")
    raise PlanError(f"cost table has no layer {layer}: was it profiled from the same model?")


def median_ms(per_class, cls, threads):
    """Median ms for a core class and thread count (nearest measured count)."""
    runs = per_class.get(cls) or next(iter(per_class.values()), None)
    if not runs:
        return 0.0
    key = str(threads) if str(threads) in runs else min(runs, key=lambda n: abs(int(n) - threads))
    return runs[key]["median"]




def narrow_transform_ms(table, c, precision, cls, threads):
    """First-run widening of a candidate's narrow weights: fp16 in the
    kernel's layout is widened by the runtime (modeled: the table's
    `widen_ms_per_byte` of fp32 output); raw narrow weights go through the
    variant's transform kernel (measured for fp32), or a widening kernel
    for a variant without one (modeled as above)."""
    widen = c["transformed_bytes"] * table.get("widen_ms_per_byte", 0.0)
    if precision == "fp16" and c.get("transform_rearranges", True):
        return widen
    return median_ms(c["transform_ms"], cls, threads) if c["has_transform"] else widen


def stream_rate(table):
    """Bytes per ms the disk delivers (the table's storage bandwidth), or
    None where it was not measured or modeled."""
    mb_s = (table.get("storage") or {}).get("read_mb_s")
    return mb_s * 1e3 if mb_s else None


def read_ms(table, c, form):
    """A candidate's read of `form` on a cold start, alone: with a storage
    bandwidth, its bytes' share of the stream (bytes / bandwidth, then the
    check), what the simulator charges it; without one, its measured cold
    read. The scheduler compares pairs by this, so a form that the stream
    brings in as fast as another is not dropped on the noise of two
    separate cold reads."""
    rate = stream_rate(table)
    if rate is None:
        return c["read_ms"][form]["median"]
    nbytes = c.get(FORM_BYTES.get(form, "transformed_bytes"), 0)
    return nbytes / rate + nbytes * table.get("check_ms_per_byte", 0.0)


def step_costs(table, step, threads, prep_cls, exec_cls, inline):
    """(read, transform, execute) ms of one plan step and its weight bytes. Forms: "cached",
    "raw", "direct" / "direct_int8" (fp16 / int8 weights read in place by
    their own kernel, no transform), or a narrow precision ("fp16", "int8": raw weights stored narrow;
    the variant's transform widens them as it reads them, and a variant
    without one runs a widening pass, modeled at the table's
    `widen_ms_per_byte` of fp32 output)."""
    c = candidate(table, step["layer"], step["variant"])
    form = step["form"]
    direct = is_direct(form)
    raw = form != "cached" and not direct
    if form not in c["read_ms"]:
        raise PlanError(f"cost table has no {form} weights for {step['variant']} of layer {step['layer']}")
    read = c["read_ms"][form]["median"]
    if form in NARROW:
        transform = narrow_transform_ms(table, c, form, prep_cls, threads if inline else 1)
    elif raw and c["has_transform"]:
        transform = median_ms(c["transform_ms"], prep_cls, threads if inline else 1)
    else:
        transform = 0.0
    nbytes = c.get(FORM_BYTES.get(form, "transformed_bytes"), 0)  # as the bundle stores them
    return read, transform, first_execute_ms(c, form, exec_cls, threads), nbytes


def first_execute_ms(c, form, cls, threads):
    """A candidate's first-run execution with its weights in `form`. The
    profile measures first runs in its columns (raw weights; the direct
    forms in columns of their own) and, for cached weights, in the default
    bundle it ships. Where both are measured for a layer, the column's
    figure ran slower (resnet18 on the AMD EPYC host: 2.1-2.3 ms in the
    columns against 1.1-1.5 ms in the default bundle, whose warm runs are
    alike), so the ratio of the two carries over to the direct forms: their
    kernels, like cached weights, read the bundle's bytes in place, and
    without it the plan would weigh a column's first run against a shipped
    bundle's."""
    first = median_ms(c["execute_first_ms"], cls, threads)
    shipped = c.get("execute_first_cached_ms", {}).get(cls, {}).get(str(threads))
    in_place = shipped["median"] / first if shipped and first > 0 else 1.0
    if is_direct(form):
        return median_ms(c[f"execute_first_{form}_ms"], cls, threads) * in_place
    return first * in_place if form == "cached" else first


def exec_cores(table, threads):
    """[(class, core id, relative speed)] of the execution threads (the
    runtime's order: fastest class first; more threads than cores share the
    slowest) and of the cores left for preparation workers."""
    cores = [(c["name"], i, c.get("relative_speed", 1.0)) for c in table["classes"] for i in c["ids"]]
    return [cores[min(k, len(cores) - 1)] for k in range(threads)], cores[threads:]


def loop_factor(table, threads, split="speed"):
    """How much slower a parallel loop runs on the plan's execution cores
    than on `threads` cores of the fastest class: the slowest thread's part
    over its speed, the loop split by speed (the runtime's task shares) or
    evenly."""
    speeds = [s for _, _, s in exec_cores(table, threads)[0]]
    shares = task_shares(speeds) if split == "speed" else [1] * len(speeds)
    return split_factor(speeds, shares)


def simulate(plan, table):
    """{"latency_ms", "open_ms", "events"}; events use the trace's shape
    (phase, step, layer, variant, cpu, start_ns, end_ns) with process "predicted".
    plan["split"] ("speed", the default, or "even") is how parallel loops are
    divided across execution cores of different speeds."""
    threads = plan.get("threads", 1)
    classes = table["classes"]
    execs, others = exec_cores(table, threads)
    exec_cls, exec_ids = classes[0]["name"], [i for _, i, _ in execs]
    others = [(name, i) for name, i, _ in others]
    slow = loop_factor(table, threads, plan.get("split", "speed"))
    load = table["load"]
    events, t = [], 0.0

    def add(phase, step, layer, variant, cpu, start, dur):
        events.append({"phase": phase, "step": step, "layer": layer, "variant": variant, "cpu": cpu,
                       "start_ns": int(start * 1e6), "end_ns": int((start + dur) * 1e6), "process": "predicted"})
        return start + dur

    verify = load["verify"]["median"]
    t = add("verify", -1, "bundle", "", exec_ids[0], t, verify)
    t = add("code_load", -1, "bundle", "", exec_ids[0], t, load["code_load"]["median"])
    t = add("session", -1, "bundle", "", exec_ids[0], t, load["session"]["median"])
    open_ms = t
    queue_free = {}  # prep queue -> time its core is free
    exec_end = t
    rate, check = stream_rate(table), table.get("check_ms_per_byte", 0.0)
    streamed = 0  # weight bytes the disk delivers before the current step's end
    for i, step in enumerate(plan["steps"]):
        q = step.get("prep_queue", 0)
        inline, shared = q == 0, q > 0 and not others
        if inline:
            prep_cls, prep_cpu = exec_cls, exec_ids[0]
        elif shared:
            prep_cls, prep_cpu = exec_cls, exec_ids[min(threads, len(exec_ids)) - 1]
        else:
            prep_cls, prep_cpu = others[(q - 1) % len(others)]
        read, transform, execute, nbytes = step_costs(table, step, threads, prep_cls, exec_cls, inline)
        execute *= slow
        if inline:
            transform *= slow
        start = exec_end if inline else queue_free.get(q, open_ms)
        if rate:  # check the bytes as they arrive: the last stripe's after the last byte
            streamed += nbytes
            checkers = threads if inline and nbytes >= PARALLEL_CHECK_MIN else 1
            read = max(max(0.0, verify + streamed / rate - start) + min(nbytes, STREAM_CHUNK) * check,
                       nbytes * check / checkers)
            if shared:  # the check delays the executions (see above)
                execute += nbytes * check
        end = add("read", i, step["layer"], step["variant"], prep_cpu, start, read)
        if transform:
            end = add("transform", i, step["layer"], step["variant"], prep_cpu, end, transform)
            if shared:
                execute += transform
        if not inline:
            queue_free[q] = end
        exec_end = add("execute", i, step["layer"], step["variant"], exec_ids[0], max(end, exec_end), execute)
    exec_end += load.get("run_overhead", {}).get("median", 0.0)  # binding inputs/outputs, the step loop
    return {"latency_ms": exec_end, "open_ms": open_ms, "events": events, "modeled": table.get("modeled", False)}
