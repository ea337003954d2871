"""bench/peers.py's harness on a small model with onnxruntime and coldbrew
(the other peers are optional): every engine is measured in fresh
processes, and a peer that fails to convert, fails to run or gives a wrong
output is reported in the table with its error, never dropped."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
from harness import peer_engines as pe  # noqa: E402
from coldbrew.compiler.measure.protocol import SETTLE_BYTES  # noqa: E402
import peers  # noqa: E402


@pytest.fixture(scope="module")
def measured(tmp_path_factory, small_model):
    work = str(tmp_path_factory.mktemp("peers"))
    engines = ["coldbrew [default]", "onnxruntime", "onnxruntime best", "converter that raises", "crashes",
               "lies"]

    def raises(model, work, threads):
        raise ValueError("no such operator: Conv")

    pe.ENGINES["converter that raises"] = (raises, pe.ort_load, pe.ort_run)
    try:
        progress = peers.Progress(1, "test")
        preps = peers.prepare({"small": (small_model, {})}, engines[:4], work, 2, progress)
    finally:
        pe.ENGINES.pop("converter that raises")
    prep = preps["small"]
    # two peers that the child runs as onnxruntime: one whose artifact is gone
    # (its run fails), one checked against a shifted reference (its output is wrong)
    prep["artifacts"]["crashes"] = [os.path.join(work, "missing.onnx")]
    prep["artifacts"]["lies"] = prep["artifacts"]["onnxruntime"]
    res = {}
    for e in engines:
        child = "onnxruntime" if e in ("crashes", "lies") else e
        p = dict(prep, artifacts={**prep["artifacts"], child: prep["artifacts"][e]})
        s = peers.sample(child, p, 2, 3)
        if "outputs" in s:
            ref = [r + 1.0 for r in prep["ref"]] if e == "lies" else prep["ref"]
            bad = peers.check(e, s.pop("outputs"), ref)
            s = {"error": bad} if bad else s
        res[e] = [s]
    rows = peers.summarize({"small": res}, preps, bandwidth=1e9)
    return engines, rows


def test_engines_are_measured_and_failures_are_reported(measured):
    engines, rows = measured
    r = rows["small"]
    for e in ("coldbrew [default]", "onnxruntime", "onnxruntime best"):
        assert "error" not in r[e], r[e]
        assert r[e]["cold_ms"] > 0 and r[e]["warm_ms"] > 0 and r[e]["import_ms"] > 0
        assert r[e]["artifact_bytes"] > 0 and r[e]["peak_rss_kb"] > 0
        # the settling write before the clock is not the engine's memory
        assert r[e]["peak_rss_kb"] < (SETTLE_BYTES >> 10) // 2, r[e]["peak_rss_kb"]
        assert r[e]["cold_samples_ms"] == [r[e]["cold_ms"]]
    assert r["converter that raises"]["error"].startswith("conversion failed: ValueError: no such operator")
    assert r["crashes"]["error"].startswith("run failed")
    assert r["lies"]["error"].startswith("wrong outputs: output 0")
    table = "\n".join(peers.table(rows, engines))
    for e in engines:  # every engine has its row, failed ones with their error
        assert f"| small | {e} |" in table
    assert "| small | lies | failed |" in table and "| small | floor |" in table
    summary = "\n".join(peers.geomeans(rows, engines))
    assert "lies: failed on every model" in summary
    assert "onnxruntime best: cold geomean" in summary


def test_check_compares_with_onnxruntime_within_the_engine_tolerance():
    ref = [np.array([[1.0, -2.0, 10.0]], np.float32)]
    assert peers.check("TVM", [ref[0] + 1e-3], ref) is None
    assert "wrong outputs: output 0" in peers.check("TVM", [ref[0] + 0.1], ref)
    assert peers.check("ncnn fp16", [ref[0] + 0.1], ref) is None  # fp16 storage: 3e-2 of the scale
    assert "2 outputs where the reference has 1" in peers.check("TVM", [ref[0], ref[0]], ref)


def test_an_onnx_file_with_its_input_shape_runs_from_the_command_line(small_model, tmp_path):
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(small_model)
    x = model.graph.input[0]
    dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
    x.type.tensor_type.shape.dim[0].dim_param = "batch"  # a symbolic batch: --shape fixes it
    path = tmp_path / "external_net.onnx"
    onnx.save(model, str(path))
    shape = "x".join(str(d) for d in dims)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "peers.py"), "--onnx", str(path), "--shape", f"{x.name}={shape}",
           "--engines", "coldbrew [default],onnxruntime best", "--samples", "2", "--warm", "3",
           "--out", str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "out" / "peers.md").read_text()
    assert "2 samples per figure" in table and "wall time:" in table
    for e in ("coldbrew [default]", "onnxruntime best"):
        row = next(ln for ln in table.splitlines() if ln.startswith(f"| external_net | {e} |"))
        assert row.endswith("| ok |"), row
    assert "| external_net | floor |" in table
    bad = subprocess.run(cmd[:4] + ["--shape", "nope=1x3", "--out", str(tmp_path / "bad")],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "not inputs of the model" in bad.stderr


def test_a_symbolic_input_without_a_shape_is_refused(small_model):
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(small_model)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(SystemExit, match="has no fixed shape: give --shape"):
        peers._model_inputs(peers.fix_shapes(model, {}), {})


def test_charts_are_drawn(measured, tmp_path):
    engines, rows = measured
    assert peers.charts(rows, engines, str(tmp_path)) is None
    for f in ("cold.png", "cold_warm.png"):
        assert (tmp_path / f).read_bytes()[:4] == b"\x89PNG"


def test_scheduler_goals_use_the_cold_path_issues_floor():
    def row(cold, warm, nbytes=2_000_000):
        return {"cold_ms": cold, "warm_ms": warm, "artifact_bytes": nbytes}

    rows = {"a": {peers.BEST: row(10.0, 4.0), "onnxruntime": row(40.0, 3.0), "onnxruntime best": row(15.0, 3.5),
                  "ncnn fp32": {"error": "wrong output 0"}, "ncnn fp16": row(20.0, 5.0)}}
    lines = peers.scheduler_goals(rows, bandwidth=1e9)  # floor = max(3.0 ms warm, 2 MB / 1 GB/s = 2 ms) = 3 ms
    assert f"{peers.BEST} / its floor = 3.33x (goal <= 1.3x)" in lines[1]
    assert any(f"onnxruntime best / {peers.BEST} = 1.50x faster (goal >= 1.5x)" in ln for ln in lines)
    assert any(f"onnxruntime / {peers.BEST} = 4.00x faster (goal >= 4.0x)" in ln for ln in lines)
    assert any("ncnn fp32: failed or not run" in ln for ln in lines)
    del rows["a"]["onnxruntime"]
    assert "not measured" in peers.scheduler_goals(rows, 1e9)[0]


def test_the_cold_goal_compares_with_onnxruntimes_faster_configuration():
    """Per model onnxruntime's faster cold configuration over coldbrew's;
    a model where coldbrew is slower is named, one where it fails too."""
    rows = {"a": {"coldbrew": {"cold_ms": 10.0}, "onnxruntime": {"cold_ms": 40.0}, "onnxruntime best": {"cold_ms": 20.0}},
            "b": {"coldbrew": {"cold_ms": 30.0}, "onnxruntime": {"cold_ms": 15.0}, "onnxruntime best": {"error": "x"}},
            "c": {"coldbrew": {"error": "refused"}, "onnxruntime": {"cold_ms": 5.0}, "onnxruntime best": {"cold_ms": 6.0}}}
    line = peers.cold_goal(rows, ["coldbrew", "onnxruntime", "onnxruntime best"])[0]
    assert f"geomean {np.sqrt(2.0 * 0.5):.2f}x faster over 2 models" in line
    assert "slower on 1: b 0.50x" in line and "coldbrew failed on 1: c" in line
