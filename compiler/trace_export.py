"""Export a cold-run trace (runtime `sess.trace()` or simulator events) as
Chrome trace-event JSON (Perfetto, chrome://tracing), as a PNG timeline, or as
a summary of totals.

An event is a dict: step, layer, variant, phase (verify | code_load | load
for opening the bundle, step -1; read | transform | execute per step; GPU
bundles: gpu_context, upload, pipeline per shader, gpu_execute), cpu (-1:
the GPU's own lane), start_ns, end_ns, and an optional `process` ("measured" by default; e.g.
"predicted" for simulator output). Each process is its own
timeline, timed from its own first event, so a measured and a predicted run
line up side by side.
"""
import json
import struct
import zlib

import numpy as np

PHASES = ("verify", "gpu_context", "code_load", "pipeline", "session", "load", "read", "upload", "transform",
          "execute", "gpu_execute")  # in cold-run order
COLORS = {"verify": (0, 150, 136), "code_load": (219, 68, 55), "session": (120, 85, 72),
          "load": (142, 68, 173),
          "read": (66, 133, 244), "transform": (245, 140, 0), "execute": (52, 168, 83),
          "gpu_context": (96, 125, 139), "pipeline": (233, 30, 99), "upload": (0, 188, 212),
          "gpu_execute": (139, 195, 74)}
OTHER = (128, 128, 128)  # a phase not listed above
_KEYS = ("step", "layer", "variant", "phase", "cpu", "start_ns", "end_ns")

# 5x7 bitmap font: per glyph, 7 rows of 2 hex digits (bit 4 = leftmost pixel).
# Letters are drawn lower-case whatever their case; other characters are blank.
_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz.:-_()/%+,="
_GLYPHS = """
0e11131519110e 040c040404040e 0e11010204081f 1f02040201110e 02060a121f0202 1f101e0101110e
0608101e11110e 1f010204080808 0e11110e11110e 0e11110f01020c 00000e010f110f 1010161911111e
00000e1010110e 01010d1311110f 00000e111f100e 0609081c080808 000f11110f010e 10101619111111
04000c0404040e 0200060202120c 10101214181412 0c04040404040e 00001a15151111 00001619111111
00000e1111110e 00001e111e1010 00000d130f0101 00001619101010 00000e100e011e 08081c08080906
0000111111130d 00001111110a04 0000111115150a 0000110a040a11 000011110f010e 00001f0204081f
00000000000c0c 000c0c000c0c00 0000001f000000 0000000000001f 02040808080402 08040202020408
00010204081000 18190204081303 0004041f040400 000000000c0408 00001f001f0000
""".split()
_FONT = {ch: np.unpackbits(np.frombuffer(bytes.fromhex(g), np.uint8)[:, None], axis=1)[:, 3:].astype(bool)
         for ch, g in zip(_CHARS, _GLYPHS, strict=True)}


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


def _text(img, x, y, s, color=(0, 0, 0), scale=2):
    for ch in s.lower():
        g = _FONT.get(ch)
        if g is not None:
            region = img[y:y + 7 * scale, x:x + 5 * scale]
            mask = np.kron(g, np.ones((scale, scale), bool))[:region.shape[0], :region.shape[1]]
            region[mask] = color
        x += 6 * scale


def _nice_step(span, ticks=10):
    raw = span / ticks
    mag = 10 ** np.floor(np.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def write_png(img, path):
    """An RGB uint8 array (h, w, 3) as a PNG: one IDAT, filter type 0 on every row."""
    h, w, _ = img.shape
    raw = np.hstack([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)]).tobytes()

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def png_layout(events, width=1600, title=None):
    """Geometry of the timeline: image size, plot x range [left, right] for
    [0, span_ms], and per lane its label and y range [y0, y1). Lanes are
    (process index, cpu), sorted."""
    events = _checked(events)
    names, t0 = _processes(events)
    lanes = sorted({(names.index(e.get("process", "measured")), e["cpu"]) for e in events},
                   key=lambda lane: (lane[0], lane[1] < 0, lane[1]))  # the GPU's lane below the cores
    labels = {(pid, cpu): _lane(cpu) if len(names) == 1 else f"{names[pid]} {_lane(cpu)}" for pid, cpu in lanes}
    span_ms = max(max(e["end_ns"] - t0[e.get("process", "measured")] for e in events) / 1e6, 1e-3)
    top, lane_h, gap, left = (40 if title else 12), 28, 6, 24 + 12 * max(map(len, labels.values()))
    if width - 24 - left < 100:
        raise ValueError(f"width {width} leaves no room for the timeline (at least {left + 124} needed)")
    y_axis = top + len(lanes) * (lane_h + gap)
    rows = {lane: (top + i * (lane_h + gap), top + i * (lane_h + gap) + lane_h) for i, lane in enumerate(lanes)}
    return {"width": width, "height": y_axis + 80, "left": left,
            "right": width - 24, "top": top, "y_axis": y_axis, "span_ms": span_ms, "names": names, "t0": t0,
            "lanes": rows, "labels": labels, "events": events}


def to_png(events, path, width=1600, title=None):
    """A timeline picture: one lane per core, events colored by phase, ms axis,
    legend of the phases present."""
    geo = png_layout(events, width, title)
    left, right, y_axis, span = geo["left"], geo["right"], geo["y_axis"], geo["span_ms"]
    img = np.full((geo["height"], width, 3), 255, np.uint8)
    if title:
        _text(img, left, 12, title)
    names = geo["names"]
    for lane, (y0, y1) in geo["lanes"].items():
        img[y0:y1, left:right] = 240
        _text(img, 8, y0 + 7, geo["labels"][lane])

    def x_of(ms):
        return left + int(round(ms / span * (right - left)))
    step = _nice_step(span)
    for i in range(int(span / step + 1e-9) + 1):
        x = x_of(i * step)
        img[geo["top"]:y_axis, x] = 215
        img[y_axis:y_axis + 6, x] = 0
        label = f"{round(i * step, 9):g}"
        _text(img, max(0, min(x - len(label) * 6 + 1, width - len(label) * 12)), y_axis + 10, label)
    img[y_axis, left:right + 1] = 0
    _text(img, right - 4 * 12, y_axis + 30, "(ms)")
    for e in geo["events"]:
        p = e.get("process", "measured")
        y0, y1 = geo["lanes"][(names.index(p), e["cpu"])]
        x0, x1 = x_of((e["start_ns"] - geo["t0"][p]) / 1e6), x_of((e["end_ns"] - geo["t0"][p]) / 1e6)
        color = np.array(COLORS.get(e["phase"], OTHER))
        img[y0 + 2:y1 - 2, x0:max(x1, x0 + 1)] = color
        if x1 - x0 >= 3:  # a darker left edge keeps back-to-back events apart
            img[y0 + 2:y1 - 2, x0] = color * 3 // 5
    x, present = left, {e["phase"] for e in geo["events"]}
    for phase in [p for p in PHASES if p in present] + sorted(present - set(PHASES)):
        img[y_axis + 52:y_axis + 66, x:x + 14] = COLORS.get(phase, OTHER)
        _text(img, x + 20, y_axis + 52, phase)
        x += 20 + len(phase) * 12 + 30
    write_png(img, path)
