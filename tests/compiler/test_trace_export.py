"""Trace export on synthetic events: Chrome JSON, PNG timeline (decoded here
by hand), summary totals."""
import json
import struct
import zlib

import numpy as np
import pytest

from coldbrew.compiler import trace_export as te

T0 = 5_000_000_000  # CLOCK_MONOTONIC-like origin


def ev(step, phase, cpu, start_us, end_us, layer=None, **kw):
    return {"step": step, "layer": layer or f"conv{step}", "variant": "sgemm", "phase": phase, "cpu": cpu,
            "start_ns": T0 + start_us * 1000, "end_ns": T0 + end_us * 1000, **kw}


EVENTS = [
    ev(-1, "verify", 0, 0, 100, layer="bundle"), ev(-1, "code_load", 0, 100, 400, layer="bundle"),
    ev(0, "read", 1, 400, 600), ev(0, "transform", 1, 600, 900), ev(0, "execute", 0, 900, 1500),
    ev(1, "read", 2, 600, 700), ev(1, "transform", 2, 700, 1400), ev(1, "execute", 0, 1500, 2000),
    ev(2, "read", 1, 900, 1000), ev(2, "execute", 0, 2000, 3000),
]


def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, pos = {}, 8
    while pos < len(data):
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body)
        chunks[tag] = chunks.get(tag, b"") + body
        pos += 12 + n
    w, h, depth, ctype = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, ctype) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == h * (1 + 3 * w)
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return rows[:, 1:].reshape(h, w, 3)


def test_chrome_events_and_lanes():
    trace = te.to_chrome(EVENTS, meta={"model": "small_cnn"})
    json.loads(json.dumps(trace))
    assert trace["displayTimeUnit"] == "ms" and trace["metadata"] == {"model": "small_cnn"}
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(EVENTS)
    for x, e in zip(xs, EVENTS):
        assert x["ts"] == pytest.approx((e["start_ns"] - T0) / 1e3)
        assert x["dur"] == pytest.approx((e["end_ns"] - e["start_ns"]) / 1e3)
        assert (x["pid"], x["tid"], x["cat"]) == (0, e["cpu"], e["phase"])
        assert x["name"] == f"{e['phase']} {e['layer']}"
        assert x["args"] == {"variant": "sgemm", "step": e["step"]}
    threads = {(m["pid"], m["tid"]): m["args"]["name"] for m in trace["traceEvents"] if m["name"] == "thread_name"}
    assert threads == {(0, 0): "core 0", (0, 1): "core 1", (0, 2): "core 2"}
    procs = [m["args"]["name"] for m in trace["traceEvents"] if m["name"] == "process_name"]
    assert procs == ["measured"]


def test_chrome_measured_and_predicted_each_from_zero(tmp_path):
    predicted = [dict(e, process="predicted", start_ns=e["start_ns"] - T0, end_ns=e["end_ns"] - T0) for e in EVENTS]
    path = tmp_path / "t.json"
    te.write_chrome(predicted + EVENTS, path)
    trace = json.loads(path.read_text())
    procs = {m["pid"]: m["args"]["name"] for m in trace["traceEvents"] if m["name"] == "process_name"}
    assert procs == {0: "measured", 1: "predicted"}
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [x["pid"] for x in xs] == [1] * len(EVENTS) + [0] * len(EVENTS)
    assert [x["ts"] for x in xs[:len(EVENTS)]] == [x["ts"] for x in xs[len(EVENTS):]]


def test_png_size_and_event_colors(tmp_path):
    path = tmp_path / "t.png"
    te.to_png(EVENTS, path, width=900, title="Cold run: small_cnn")
    img = read_png(path)
    geo = te.png_layout(EVENTS, width=900, title="x")
    assert img.shape == (geo["height"], 900, 3)
    left, right, span = geo["left"], geo["right"], geo["span_ms"]
    assert span == pytest.approx(3.0)
    for e in EVENTS:
        y0, y1 = geo["lanes"][(0, e["cpu"])]
        x0 = left + ((e["start_ns"] - T0) / 1e6) / span * (right - left)
        x1 = left + ((e["end_ns"] - T0) / 1e6) / span * (right - left)
        inside = img[(y0 + y1) // 2, int(x0) + 3:int(x1) - 2]
        assert len(inside) and (inside == te.COLORS[e["phase"]]).all(), e
    assert len({te.COLORS[p] for p in te.PHASES}) == len(te.PHASES)
    merged = [dict(e, phase="load") if e["step"] < 0 else e for e in EVENTS][1:]  # brief's single load phase
    te.to_png(merged, path, width=900)
    img, geo = read_png(path), te.png_layout(merged, width=900)
    y0, y1 = geo["lanes"][(0, 0)]
    assert (img[(y0 + y1) // 2, geo["left"] + 3:geo["left"] + 40] == te.COLORS["load"]).all()
    # lane labels and axis drew dark pixels left of the plot and below it
    assert (img[geo["lanes"][(0, 2)][0]:geo["lanes"][(0, 2)][1], :left] < 100).any()
    assert (img[geo["y_axis"], left:right] == 0).all()


def test_png_header_width_height(tmp_path):
    path = tmp_path / "t.png"
    te.to_png(EVENTS[:3], path, width=640)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (640, te.png_layout(EVENTS[:3], width=640)["height"])
    read_png(path)


def test_font_covers_labels():
    for text in [" ".join(te.PHASES), "core 0123456789 predicted measured", "(ms) 0.5", "cold run: a_b/c-d 50%"]:
        assert all(ch == " " or ch in te._FONT for ch in text.lower())


def test_summary():
    s = te.summary(EVENTS)
    assert s["events"] == len(EVENTS)
    assert s["wall_ms"] == pytest.approx(3.0)
    assert list(s["phase_ms"]) == ["verify", "code_load", "read", "transform", "execute"]
    assert s["phase_ms"] == pytest.approx({"verify": 0.1, "code_load": 0.3, "read": 0.4, "transform": 1.0,
                                           "execute": 2.1})
    assert s["core_busy_ms"] == pytest.approx({0: 2.5, 1: 0.6, 2: 0.8})
    overlapping = [ev(0, "read", 3, 0, 100), ev(1, "read", 3, 50, 150)]
    assert te.summary(overlapping)["core_busy_ms"] == pytest.approx({3: 0.15})


@pytest.mark.parametrize("fn", [te.to_chrome, te.summary, lambda e: te.to_png(e, "/nonexistent/x.png")])
def test_empty_and_malformed_traces_are_refused(fn):
    with pytest.raises(ValueError, match="empty trace"):
        fn([])
    with pytest.raises(ValueError, match="lacks end_ns"):
        fn([{k: v for k, v in EVENTS[0].items() if k != "end_ns"}])
    with pytest.raises(ValueError, match="ends before it starts"):
        fn([dict(EVENTS[0], end_ns=T0 - 1)])
