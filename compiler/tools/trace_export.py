"""Export a cold-run trace (runtime `sess.trace()` or simulator events) as
Chrome trace-event JSON (Perfetto, chrome://tracing), as a PNG timeline
(matplotlib: the package's `plot` extra), or as a summary of totals.

An event is a dict: step, layer, variant, phase (verify | code_load | load
for opening the bundle, step -1; read | transform | execute per step; GPU
bundles: gpu_context, upload, pipeline per shader, gpu_execute), cpu (-1:
the GPU's own lane), start_ns, end_ns, and an optional `process` ("measured" by default; e.g.
"predicted" for simulator output). Each process is its own
timeline, timed from its own first event, so a measured and a predicted run
line up side by side.
"""
import json

PHASES = ("verify", "gpu_context", "code_load", "pipeline", "session", "load", "read", "upload", "transform",
          "execute", "gpu_execute")  # in cold-run order
COLORS = {"verify": (0, 150, 136), "code_load": (219, 68, 55), "session": (120, 85, 72),
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
