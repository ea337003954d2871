"""Trace export on synthetic events: Chrome JSON, the matplotlib timeline
(its bars, lanes and legend read back from the figure; the PNG's header),
summary totals."""
import json
import struct

import pytest

from coldbrew.compiler.tools import trace_export as te

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


def _bars(fig):
    """(lane label, start ms, width ms, rgb) of every bar of the timeline."""
    ax = fig.axes[0]
    ticks = {round(t): lbl.get_text() for t, lbl in zip(ax.get_yticks(), ax.get_yticklabels())}
    out = []
    for r in ax.patches:
        rgb = tuple(round(c * 255) for c in r.get_facecolor()[:3])
        out.append((ticks[round(r.get_y() + r.get_height() / 2)], r.get_x(), r.get_width(), rgb))
    return out


def test_timeline_bars_lanes_colors_and_legend():
    import matplotlib.pyplot as plt

    fig = te.timeline(EVENTS, title="Cold run: small_cnn")
    try:
        bars = _bars(fig)
        assert len(bars) == len(EVENTS)
        for e in EVENTS:
            want = (f"core {e['cpu']}", (e["start_ns"] - T0) / 1e6, (e["end_ns"] - e["start_ns"]) / 1e6,
                    te.COLORS[e["phase"]])
            assert any(b[0] == want[0] and b[1] == pytest.approx(want[1]) and b[2] == pytest.approx(want[2])
                       and b[3] == want[3] for b in bars), e
        ax = fig.axes[0]
        top_down = [t.get_text() for t in ax.get_yticklabels()][::-1]  # matplotlib lists them bottom up
        assert top_down == ["core 0", "core 1", "core 2"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["verify", "code_load", "read", "transform",
                                                                        "execute"]
        assert ax.get_title(loc="left") == "Cold run: small_cnn" and ax.get_xlabel() == "ms"
    finally:
        plt.close(fig)
    assert len({te.COLORS[p] for p in te.PHASES}) == len(te.PHASES)


def test_timeline_measured_above_predicted_and_gpu_lane_last():
    import matplotlib.pyplot as plt

    predicted = [dict(e, process="predicted", start_ns=e["start_ns"] - T0, end_ns=e["end_ns"] - T0) for e in EVENTS]
    gpu = [ev(-1, "gpu_execute", -1, 3000, 3500, layer="bundle")]
    fig = te.timeline(EVENTS + gpu + predicted)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()][::-1]
        assert labels == ["measured core 0", "measured core 1", "measured core 2", "measured gpu",
                          "predicted core 0", "predicted core 1", "predicted core 2"]
        starts = sorted(b[1] for b in _bars(fig) if b[0].startswith("predicted"))
        assert starts[0] == pytest.approx(0.0)  # each process timed from its own first event
    finally:
        plt.close(fig)


def test_png_header_width(tmp_path):
    path = tmp_path / "t.png"
    te.to_png(EVENTS[:3], path, width=640)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert w == 640 and h > 100


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


def test_layer_times_are_each_steps_execute_span_slowest_first():
    events = EVENTS + [ev(2, "execute", 1, 2100, 3500), ev(1, "execute", 0, 0, 1, process="predicted")]
    rows = te.layer_times(events)
    assert [(k, ms) for k, _, _, ms in rows] == [(2, 1.5), (0, 0.6), (1, 0.5)]
    assert rows[0][1:3] == ("conv2", "sgemm")


def test_account_of_the_executing_thread():
    """Every instant of the executing thread (worker 0) goes to the
    innermost phase under way (thread_start inside verify), its gaps before
    the first step to `between`, later ones to `wait` and to the step that
    follows; the rest of the measured cold time
    is `outside`; preparation workers' phases are overlapped, not added."""
    events = [
        ev(-1, "verify", 0, 0, 400, layer="bundle", worker=0, faults=3),
        ev(-1, "thread_start", 0, 100, 150, layer="bundle", worker=0, faults=1),
        ev(-1, "code_load", 0, 400, 450, layer="bundle", worker=0, faults=2),  # the caller's 450-500
        ev(0, "read", 0, 500, 700, worker=0, faults=10), ev(0, "execute", 0, 700, 1000, worker=0, faults=20),
        ev(1, "read", 1, 500, 1500, worker=1, faults=50), ev(1, "transform", 1, 1500, 1800, worker=1),
        ev(1, "execute", 0, 1800, 2000, worker=0, faults=4),  # waited 1000-1800 for the worker
    ]
    a = te.account(events, wall_ms=2.5, fault_us=0.5)
    assert a["span_ms"] == pytest.approx(2.0) and a["outside_ms"] == pytest.approx(0.5)
    assert a["phase_ms"] == pytest.approx({"verify": 0.35, "thread_start": 0.05, "code_load": 0.05, "read": 0.2,
                                           "execute": 0.5})
    assert a["wait_ms"] == pytest.approx(0.8) and a["between_ms"] == pytest.approx(0.05)
    assert sum(a["phase_ms"].values()) + a["wait_ms"] + a["between_ms"] == pytest.approx(a["span_ms"])
    assert a["faults"] == 39 and a["fault_ms"] == pytest.approx(0.0195)  # (thread_start's 1 is verify's too)
    assert a["overlapped_ms"] == pytest.approx({"read": 1.0, "transform": 0.3})
    (l0, l1) = a["layers"]
    assert (l0["step"], l0["read_ms"], l0["execute_ms"], l0["wait_ms"]) == (0, pytest.approx(0.2), pytest.approx(0.3), 0)
    assert (l1["step"], l1["execute_ms"], l1["wait_ms"]) == (1, pytest.approx(0.2), pytest.approx(0.8))
    text = "\n".join(te.account_lines(a, layers=2))
    assert "wait 0.80" in text and "outside the runtime 0.50" in text and "page faults 39" in text
    with pytest.raises(ValueError, match="executing thread"):
        te.account([ev(0, "read", 1, 0, 10, worker=1)])


def test_fault_cost_is_measured():
    us = te.fault_cost_us(mb=8)
    assert 0 < us < 1000
