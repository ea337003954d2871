"""The profile's column compiles in worker processes: the same records as
a compile in this process, every job in a worker, failures as CompileErrors."""
import pytest

from coldbrew.compiler import CompileError
from coldbrew.compiler.measure import columns
from coldbrew.targets import resolve


def _jobs(small_model, tmp_path, variants):
    model = tmp_path / "model.onnx"
    model.write_bytes(small_model.SerializeToString())
    base = {"model": str(model), "target": resolve("host"), "input_shapes": None, "constants": None, "tuning": None}
    return [{**base, "bundle": str(tmp_path / f"c{k}.brew"), "options": {"variants": v, "threads": 2, "weights": "raw"},
             "names": None if k == 0 else {"c0"}, "direct": False, "what": f"column {k}"}
            for k, v in enumerate(variants)]


def test_workers_compile_every_column_as_this_process_would(small_model, tmp_path, monkeypatch):
    variants = [{"c0": "conv2d.im2col_gemm"}, {"c0": "conv2d.winograd_f2"}, {"c0": "conv2d.direct"}]
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    here = columns.compile_all(_jobs(small_model, tmp_path / "a", variants), lambda w: None, workers=1)
    assert not columns._FRONTS  # the calling process keeps no model's first passes after its jobs
    jobs = _jobs(small_model, tmp_path / "b", variants)

    def not_here(job):
        raise AssertionError("compiled in the calling process")

    monkeypatch.setattr(columns, "_run", not_here)  # the workers are other processes: their _run is the real one
    seen = []
    there = columns.compile_all(jobs, seen.append, workers=2)
    assert sorted(seen) == ["column 0", "column 1", "column 2"]
    assert [[(r["name"], r["variant"]) for r in recs] for recs in there] == \
           [[(r["name"], r["variant"]) for r in recs] for recs in here]
    assert [r["variant"] for r in there[1]] == ["conv2d.winograd_f2"]  # column 1 describes only c0
    assert there == here  # the same bytes of every form
    assert all((tmp_path / "b" / f"c{k}.brew").read_bytes()[:8] == b"COLDBREW" for k in range(3))


def test_a_failed_compile_in_a_worker_is_a_compile_error(small_model, tmp_path):
    jobs = _jobs(small_model, tmp_path, [{"c0": "conv2d.im2col_gemm"}, {"c0": "conv2d.no_such_variant"}])
    with pytest.raises(CompileError, match="no_such_variant"):
        columns.compile_all(jobs, lambda w: None, workers=2)
