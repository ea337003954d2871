"""Export a cold-run trace (runtime `sess.trace()` or simulator events) as
Chrome trace-event JSON (Perfetto, chrome://tracing), as a PNG timeline
(matplotlib: the package's `plot` extra), or as a summary of totals.

An event is a dict: step, layer, variant, phase (verify | thread_start |
code_load | session | load for opening the bundle, step -1; read | transform | execute per step; GPU
bundles: gpu_context, upload, pipeline per shader, gpu_execute), cpu (-1:
the GPU's own lane), start_ns, end_ns, and an optional `process` ("measured" by default; e.g.
"predicted" for simulator output). Each process is its own
timeline, timed from its own first event, so a measured and a predicted run
line up side by side. `account` splits a cold start into what the
executing thread spent its time on (phases, idle waits, page faults, the
caller's own) beside what other threads overlapped.
"""
import json

PHASES = ("verify", "thread_start", "gpu_context", "code_load", "pipeline", "session", "load", "read", "upload", "transform",
          "execute", "gpu_execute")  # in cold-run order
COLORS = {"verify": (0, 150, 136), "thread_start": (255, 193, 7), "code_load": (219, 68, 55), "session": (120, 85, 72),
          "load": (142, 68, 173),
          "read": (66, 133, 244), "transform": (245, 140, 0), "execute": (52, 168, 83),
          "gpu_context": (96, 125, 139), "pipeline": (233, 30, 99), "upload": (0, 188, 212),
          "gpu_execute": (139, 195, 74)}
OTHER = (128, 128, 128)  # a phase not listed above
_KEYS = ("step", "layer", "variant", "phase", "cpu", "start_ns", "end_ns")

def _checked(events):
    events = list(events)
    if not events:
        raise ValueError("empty trace: no events (was the session made with trace=True and run?)")
    for i, e in enumerate(events):
        missing = [k for k in _KEYS if k not in e]
        if missing:
            raise ValueError(f"trace event {i} lacks {', '.join(missing)}: {e!r}")
        if e["end_ns"] < e["start_ns"]:
            raise ValueError(f"trace event {i} ends before it starts: {e!r}")
    return events


def _processes(events):
    """Process names, "measured" first, then in order of appearance; and each one's first start."""
    names = sorted(dict.fromkeys(e.get("process", "measured") for e in events), key=lambda p: p != "measured")
    t0 = {p: min(e["start_ns"] for e in events if e.get("process", "measured") == p) for p in names}
    return names, t0


def to_chrome(events, meta=None):
    """Chrome trace-event JSON as a dict: one complete ("X") event per trace event,
    ts/dur in µs; pid = process (0 = measured), tid = core."""
    events = _checked(events)
    names, t0 = _processes(events)
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": p}}
           for pid, p in enumerate(names)]
    for pid, cpu in sorted({(names.index(e.get("process", "measured")), e["cpu"]) for e in events}):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": cpu, "args": {"name": _lane(cpu)}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": cpu, "args": {"sort_index": cpu if cpu >= 0 else 1 << 20}})
    for e in events:
        p = e.get("process", "measured")
        out.append({"name": f"{e['phase']} {e['layer']}", "cat": e["phase"], "ph": "X",
                    "ts": (e["start_ns"] - t0[p]) / 1e3, "dur": (e["end_ns"] - e["start_ns"]) / 1e3,
                    "pid": names.index(p), "tid": e["cpu"], "args": {"variant": e["variant"], "step": e["step"]}})
    return {"traceEvents": out, "displayTimeUnit": "ms", "metadata": dict(meta or {})}


def write_chrome(events, path, meta=None):
    with open(path, "w") as f:
        json.dump(to_chrome(events, meta), f, indent=1)


def _lane(cpu):
    return "gpu" if cpu < 0 else f"core {cpu}"


def summary(events):
    """Totals in ms: wall (first start to last end), per phase, per core busy (union of its events)."""
    events = _checked(events)
    present = {e["phase"] for e in events}
    order = [p for p in PHASES if p in present] + sorted(present - set(PHASES))
    phase_ms = {p: sum(e["end_ns"] - e["start_ns"] for e in events if e["phase"] == p) / 1e6 for p in order}
    core_busy_ms = {}
    for cpu in sorted({e["cpu"] for e in events}):
        busy, end = 0, None
        for s, t in sorted((e["start_ns"], e["end_ns"]) for e in events if e["cpu"] == cpu):
            s = s if end is None else max(s, end)
            busy, end = busy + max(0, t - s), t if end is None else max(end, t)
        core_busy_ms[cpu] = busy / 1e6
    wall = max(e["end_ns"] for e in events) - min(e["start_ns"] for e in events)
    return {"events": len(events), "wall_ms": wall / 1e6, "phase_ms": phase_ms, "core_busy_ms": core_busy_ms}


def layer_times(events):
    """Per step executed (measured events only): (step, layer, variant, ms),
    the span of its execute events, slowest first (variant "generic": a
    layer on the generic schedule)."""
    spans = {}
    for e in _checked(events):
        if e["phase"] == "execute" and e.get("process", "measured") == "measured" and e["step"] >= 0:
            s, t, layer, variant = spans.get(e["step"], (e["start_ns"], e["end_ns"], e["layer"], e["variant"]))
            spans[e["step"]] = (min(s, e["start_ns"]), max(t, e["end_ns"]), layer, variant)
    rows = [(k, layer, variant, (t - s) / 1e6) for k, (s, t, layer, variant) in spans.items()]
    return sorted(rows, key=lambda r: -r[3])


def lanes(events):
    """The timeline's lanes, top to bottom: (process index, cpu) in process
    order (measured above predicted), each process's cores in order and its
    GPU lane last; with their labels and the processes' names and origins."""
    events = _checked(events)
    names, t0 = _processes(events)
    keys = sorted({(names.index(e.get("process", "measured")), e["cpu"]) for e in events},
                  key=lambda lane: (lane[0], lane[1] < 0, lane[1]))
    labels = {(pid, cpu): _lane(cpu) if len(names) == 1 else f"{names[pid]} {_lane(cpu)}" for pid, cpu in keys}
    return {"lanes": keys, "labels": labels, "names": names, "t0": t0, "events": events}


def timeline(events, title=None, width=1600):
    """A matplotlib Figure of the trace: one lane per core (and the GPU's),
    each process's lanes grouped (measured above predicted), events as bars
    colored by phase, a ms axis and a legend of the phases present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lay = lanes(events)
    keys, labels, names, t0 = lay["lanes"], lay["labels"], lay["names"], lay["t0"]
    dpi = 100
    fig, ax = plt.subplots(figsize=(width / dpi, max(2.2, 0.45 * len(keys) + 1.4)), dpi=dpi)
    row = {k: len(keys) - 1 - i for i, k in enumerate(keys)}  # first lane on top
    by_phase = {}
    for e in lay["events"]:
        p = e.get("process", "measured")
        start = (e["start_ns"] - t0[p]) / 1e6
        by_phase.setdefault(e["phase"], []).append((row[(names.index(p), e["cpu"])], start,
                                                    max((e["end_ns"] - e["start_ns"]) / 1e6, 1e-6)))
    order = [p for p in PHASES if p in by_phase] + sorted(set(by_phase) - set(PHASES))
    for phase in order:
        color = tuple(c / 255 for c in COLORS.get(phase, OTHER))
        for y, x, w in by_phase[phase]:
            ax.barh(y, w, left=x, height=0.7, color=color, edgecolor=(0, 0, 0, 0.35), linewidth=0.4)
    ax.set_yticks(range(len(keys)), [labels[k] for k in reversed(keys)])
    ax.set_ylim(-0.6, len(keys) - 0.4)
    ax.set_xlabel("ms")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(handles=[Patch(color=tuple(c / 255 for c in COLORS.get(p, OTHER)), label=p) for p in order],
              loc="upper center", bbox_to_anchor=(0.5, -0.22 if len(keys) > 2 else -0.35), ncol=min(len(order), 8),
              fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    return fig


def to_png(events, path, width=1600, title=None):
    """The timeline (timeline()) as a PNG `width` pixels wide."""
    import matplotlib.pyplot as plt

    fig = timeline(events, title, width)
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


_OFF_PATH = ("read", "pipeline")  # GPU bundles: a reader thread's and the pipeline workers' (the opening thread waits)


def _critical(events):
    """The events of the thread that opened the bundle and ran the first
    result (worker 0; a GPU bundle's: not its reader's or pipelines')."""
    gpu = any(e["phase"] == "gpu_execute" for e in events)
    return [e for e in events if e.get("process", "measured") == "measured" and e.get("worker", 0) == 0
            and not (gpu and e["phase"] in _OFF_PATH)]


def account(events, wall_ms=None, fault_us=None):
    """Where a cold start's time went, on the thread that opened the bundle
    and ran it: every instant of that thread's timeline given to the
    innermost phase under way then (the pool's thread start inside verify,
    say), its gaps before the run's first step to `between` (the caller's
    and the language binding's own between the runtime's calls: open,
    session, run), its later gaps to `wait` (the executing thread idle,
    waiting for a preparation worker's step or the streamer's bytes), and,
    given the whole cold time measured around load and run (`wall_ms`),
    the rest to `outside` (the caller's and the library's own, before the
    open and after the result). `faults`: the page faults that thread took
    (`fault_ms`: times `fault_us`, a cost per fault measured apart: inside
    the phases, not added). `overlapped`: what other threads did meanwhile
    (preparation workers' reads and transforms). `layers`: per step, its
    phases and the wait before it, on that thread."""
    events = _checked(events)
    crit = _critical(events)
    if not crit:
        raise ValueError("no event of the executing thread in this trace")
    t0, t1 = min(e["start_ns"] for e in crit), max(e["end_ns"] for e in crit)
    cuts = sorted({t for e in crit for t in (e["start_ns"], e["end_ns"])})
    phases, layers, wait, between = {}, {}, 0, 0
    ordered = sorted(crit, key=lambda e: e["start_ns"])
    active, k = [], 0
    first_step = min((e["start_ns"] for e in crit if e["step"] >= 0), default=t1)
    for a, b in zip(cuts, cuts[1:]):  # a sweep: the events under way over [a, b)
        while k < len(ordered) and ordered[k]["start_ns"] <= a:
            active.append(ordered[k])
            k += 1
        active = [e for e in active if e["end_ns"] >= b]
        on = active
        if on:  # the innermost: started last, shortest
            e = max(on, key=lambda e: (e["start_ns"], -(e["end_ns"] - e["start_ns"])))
            phases[e["phase"]] = phases.get(e["phase"], 0) + (b - a)
            if e["step"] >= 0:
                row = layers.setdefault(e["step"], {"step": e["step"], "layer": e["layer"], "wait_ms": 0.0})
                row[e["phase"] + "_ms"] = row.get(e["phase"] + "_ms", 0) + (b - a) / 1e6
        elif b <= first_step:  # before the run's first step: the caller's
            between += b - a
        else:
            wait += b - a
            nxt = next((e for e in ordered[k:] if e["step"] >= 0), None)  # (every event from k starts at b or later)
            if nxt is not None:
                row = layers.setdefault(nxt["step"], {"step": nxt["step"], "layer": nxt["layer"], "wait_ms": 0.0})
                row["wait_ms"] += (b - a) / 1e6
    # an open event nested in another (the pool's thread start inside verify): its faults are the outer's too
    opens = [e for e in crit if e["step"] < 0]
    nested = sum(c.get("faults", 0) for c in opens for e in opens
                 if c is not e and e["start_ns"] <= c["start_ns"] and c["end_ns"] <= e["end_ns"])
    faults = sum(e.get("faults", 0) for e in crit) - nested
    crit_ids = {id(e) for e in crit}
    overlapped = {}
    for e in events:
        if id(e) not in crit_ids and e.get("process", "measured") == "measured":
            overlapped[e["phase"]] = overlapped.get(e["phase"], 0) + (e["end_ns"] - e["start_ns"]) / 1e6
    span_ms = (t1 - t0) / 1e6
    out = {"span_ms": span_ms, "phase_ms": {p: v / 1e6 for p, v in phases.items()}, "wait_ms": wait / 1e6,
           "between_ms": between / 1e6,
           "faults": faults, "overlapped_ms": overlapped,
           "layers": [layers[k] for k in sorted(layers)]}
    if wall_ms is not None:
        out.update(wall_ms=wall_ms, outside_ms=max(0.0, wall_ms - span_ms))
    if fault_us is not None:
        out.update(fault_us=fault_us, fault_ms=faults * fault_us / 1e3)
    return out


def fault_cost_us(mb=64):
    """The cost of one page fault on fresh anonymous memory here, in µs (a
    mapping touched once per page, its pages then given back)."""
    import mmap
    import time

    size, page = mb << 20, mmap.PAGESIZE
    best = None
    for _ in range(3):
        m = mmap.mmap(-1, size)
        t = time.perf_counter_ns()
        for off in range(0, size, page):
            m[off] = 1
        ns = time.perf_counter_ns() - t
        m.close()
        best = ns if best is None else min(best, ns)
    loop = time.perf_counter_ns()
    b = bytearray(1)
    for _ in range(0, size, page):  # the Python loop's own cost, taken off
        b[0] = 1
    loop = time.perf_counter_ns() - loop
    return max(0.0, (best - loop) / (size // page) / 1e3)


def account_lines(a, layers=0):
    """The account as text: totals, then the `layers` slowest steps."""
    ph = a["phase_ms"]
    order = [p for p in PHASES if p in ph] + sorted(set(ph) - set(PHASES))
    parts = [f"{p} {ph[p]:.2f}" for p in order] + [f"between calls {a['between_ms']:.2f}", f"wait {a['wait_ms']:.2f}"]
    if "outside_ms" in a:
        parts.append(f"outside the runtime {a['outside_ms']:.2f}")
    head = (f"account of {a.get('wall_ms', a['span_ms']):.2f} ms (the executing thread, ms): " + ", ".join(parts))
    fl = f"page faults {a['faults']}" + (f" (~{a['fault_ms']:.2f} ms at {a['fault_us']:.2f} us each, inside the phases)"
                                        if "fault_ms" in a else "")
    ov = ", ".join(f"{p} {v:.2f}" for p, v in sorted(a["overlapped_ms"].items()))
    lines = [head, fl + (f"; on other threads meanwhile: {ov}" if ov else "")]
    if layers:
        cols = ("wait", "read", "transform", "execute")
        rows = sorted(a["layers"], key=lambda r: -sum(r.get(c + "_ms", 0) for c in cols))[:layers]
        lines.append(f"{'step':>5} {'layer':32s} " + " ".join(f"{c:>9s}" for c in cols))
        for r in rows:
            lines.append(f"{r['step']:5d} {r['layer'][:32]:32s} " + " ".join(f"{r.get(c + '_ms', 0):9.3f}" for c in cols))
    return lines
