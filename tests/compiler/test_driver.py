"""compiler/driver.py and compiler/options.py: one Options, built alike by
the command line and compile_model and checked when made; the front end
run once per compile, whatever stages follow it."""
import dataclasses

import pytest
from click.testing import CliRunner

from coldbrew.compiler import CompileError, compile_model, driver
from coldbrew.compiler.options import Options
from coldbrew.compiler.tools.cli import main


def _count_load_onnx(monkeypatch):
    """The list each run of the pass load_onnx in this process appends to."""
    from coldbrew.compiler.passes import load_onnx

    runs, real = [], load_onnx.run

    def spy(c):
        runs.append(c.model)
        return real(c)

    monkeypatch.setattr(load_onnx, "run", spy)
    return runs


def test_compile_plan_cold_runs_the_front_end_once(small_model, tmp_path, monkeypatch):
    """The profile, the plan and the bundle's compile share one front end:
    `coldbrew compile --plan cold` runs load_onnx once in this process."""
    from coldbrew.compiler.measure import profile as prof

    monkeypatch.setattr(prof, "REPEAT", {"cold": 2, "default": 2, "warm": 2, "reads": 2})
    monkeypatch.setenv("COLDBREW_CACHE", str(tmp_path / "cache"))  # measured here, not read from a cache
    tables = []
    real_profile = prof.profile
    monkeypatch.setattr(prof, "profile", lambda *a, **k: tables.append(real_profile(*a, **k)) or tables[-1])
    runs = _count_load_onnx(monkeypatch)
    model = tmp_path / "small.onnx"
    model.write_bytes(small_model.SerializeToString())
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "cold.brew"), "--plan", "cold"])
    assert r.exit_code == 0, r.output
    assert len(tables) == 1 and not tables[0]["cached"]
    assert len(runs) == 1, runs


def test_the_counter_sees_a_second_front_end(small_model, monkeypatch):
    from coldbrew.compiler.pipeline import front_end

    runs = _count_load_onnx(monkeypatch)
    front_end(small_model)
    front_end(small_model)
    assert len(runs) == 2


def test_the_command_line_and_compile_model_build_the_same_options(small_model, tmp_path, monkeypatch):
    seen = []
    real = driver.compile
    monkeypatch.setattr(driver, "compile", lambda model, options, *a, **k: seen.append(options) or real(
        model, options, *a, **k))
    model = tmp_path / "small.onnx"
    model.write_bytes(small_model.SerializeToString())
    args = ["--threads", "1", "--weights", "raw", "--variant", "c0=conv2d.im2col_gemm", "--prep-queue", "1"]
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "a.brew"), *args])
    assert r.exit_code == 0, r.output
    compile_model(small_model, str(tmp_path / "b.brew"), threads=1, weights={"*": "raw"},
                  variants={"c0": "conv2d.im2col_gemm"}, queues={"*": 1})
    assert len(seen) == 2 and seen[0] == seen[1]
    assert (tmp_path / "a.brew").read_bytes() == (tmp_path / "b.brew").read_bytes()


@pytest.mark.parametrize("fields, message", [
    ({"precision": "bf16"}, "weight precision must be one of"),
    ({"plan": "fastest"}, "plan must be one of"),
    ({"threads": 0}, "threads must be a positive integer"),
    ({"max_error": 0.01}, "a maximum error applies to narrow weights"),
    ({"target": "vulkan", "precision": "fp16"}, "fp16 weights are not available for GPU targets"),
    ({"target": "vulkan", "plan": "cold"}, "plans, tuning and continuous mode are not available for GPU"),
    ({"target": "no-such-cpu"}, "no-such-cpu"),
])
def test_options_are_checked_when_made(fields, message):
    with pytest.raises(CompileError, match=message):
        Options(**fields)


def test_options_are_frozen_and_resolve_their_target():
    o = Options(target="x86_64-avx2")
    assert o.target.name == "x86_64-avx2" and not o.on_gpu
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.threads = 4
    assert dataclasses.replace(o, threads=4).threads == 4


def test_default_choices_follow_the_target_and_precision():
    assert Options().default_choices().weights == "cached"
    assert Options(target="vulkan").default_choices().weights == "auto"
    assert Options(precision="int8").default_choices().weights == "direct"
    assert Options(precision="int8", weights="raw").default_choices().weights == "raw"
