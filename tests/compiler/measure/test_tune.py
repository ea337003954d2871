"""Per-target tuning on a small model: every layer shape measured through
coldbrew's runtime, cached per target and kernel code, applied by the
compiler and labeled in the bundle; cross targets stay derived."""
import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run

from coldbrew.compiler import compile_model
from coldbrew.compiler.measure import tune as tn
from coldbrew.compiler.tools.cli import main
from coldbrew.compiler.options import Options
from coldbrew.compiler.pipeline import front_end
from coldbrew.compiler.bundle.reader import read
from coldbrew.compiler.kernels import applicable
from coldbrew.targets import resolve


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, small_model):
    mp = pytest.MonkeyPatch()
    mp.setenv("COLDBREW_CACHE", str(tmp_path_factory.mktemp("cache")))
    tuning = tn.tune(front_end(small_model), 2)
    bundle = tmp_path_factory.mktemp("b") / "tuned.brew"
    compile_model(small_model, str(bundle), tune=True)
    yield tuning, str(bundle)
    mp.undo()


def test_every_shape_is_measured(tuned, small_model):
    tuning, _ = tuned
    isa = resolve("host").vector
    anchors = tn.anchors_of(front_end(small_model))
    assert {tn.spec_key(a.spec) for a in anchors} == set(tuning.entries)
    for a in anchors:
        e = tuning.entries[tn.spec_key(a.spec)]
        names = {v.name for v in applicable(a.spec, a.variant.op, isa)}
        assert e["best"] in names
        measured = {json.loads(k)[0] for k in e["execute_ms"]}
        assert measured == names  # every applicable variant, at least its default
        assert all(ms > 0 for ms in e["execute_ms"].values())
        assert min(e["execute_ms"].values()) == e["execute_ms"][json.dumps([e["best"], e["params"][e["best"]]],
                                                                           sort_keys=True)]


def test_tuned_bundle_is_labeled_and_correct(tuned, small_model):
    import coldbrew

    tuning, bundle = tuned
    b, _, _ = read(bundle)
    anchored = [s.kind for s in b.plan.steps if s.kind.params]
    assert anchored and all(c.tuned for c in anchored)
    for c in anchored:
        layer_params = json.loads(c.params)
        assert isinstance(layer_params, dict) and layer_params
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (y,) = coldbrew.load(bundle).run(None, {"x": x})
    assert_close(y, ort_run(small_model, {"x": x})[0])
    out = CliRunner().invoke(main, ["inspect", bundle])
    assert out.exit_code == 0 and "(tuned)" in out.output


def test_cache_hit_measures_nothing(tuned, small_model, monkeypatch):
    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(tn, "measure_shapes", no_measuring)
    again = tn.tune(front_end(small_model), 2)
    assert again.entries == tuned[0].entries


def test_cross_target_is_derived(tmp_path, small_model):
    assert tn.tune(front_end(small_model, Options(target="x86_64-avx2")), 2) is None
    path = tmp_path / "avx2.brew"
    compile_model(small_model, str(path), target="x86_64-avx2", tune=True)
    b, _, _ = read(str(path))
    anchored = [s.kind for s in b.plan.steps if s.kind.params]
    assert anchored and not any(c.tuned for c in anchored)
    out = CliRunner().invoke(main, ["inspect", str(path)])
    assert "(derived)" in out.output and "(tuned)" not in out.output


def test_targets_command_shows_vector_units():
    out = CliRunner().invoke(main, ["targets"])
    assert out.exit_code == 0, out.output
    assert "x86_64-avx2" in out.output and "neon" in out.output and "avx512" in out.output


def _count_front_ends(monkeypatch):
    """The list every run of the first passes in this process (the pass
    load_onnx, however it is reached) appends its result to, from now on."""
    from coldbrew.compiler.passes import load_onnx

    fronts, real_run = [], load_onnx.run

    def load_spy(c):
        fronts.append(real_run(c))
        return fronts[-1]

    monkeypatch.setattr(load_onnx, "run", load_spy)
    return fronts


def test_a_tuned_plan_is_made_from_the_times_of_the_tuned_kernels(tuned, small_model, tmp_path, monkeypatch):
    """compile --plan cold with tuning profiles the kernels it ships: every
    bundle the profile compiles (in its column workers) carries the model's
    tuning, and so does the bundle's own compile; the table is cached apart
    from an untuned one. The first passes run once in this process, shared
    by the tuner, the profile and the bundle's compile."""
    import coldbrew.compiler as comp
    from coldbrew.compiler.passes import load_onnx
    from coldbrew.compiler.measure import profile as prof

    monkeypatch.setattr(prof, "REPEAT", {"cold": 2, "default": 2, "warm": 2, "reads": 2})
    given, tables = [], []
    real_compile, real_profile, real_columns = comp.pipeline.compile_graph, prof.profile, prof.compile_all
    real_back_end = comp.driver.back_end

    def compile_spy(*a, **k):
        given.append(k.get("tuning"))
        return real_compile(*a, **k)

    def back_end_spy(front, choices, tuning=None, accuracy=None):
        given.append(tuning)
        return real_back_end(front, choices, tuning, accuracy)

    def columns_spy(jobs, *a, **k):
        given.extend(job["tuning"] for job in jobs)
        return real_columns(jobs, *a, **k)

    def profile_spy(*a, **k):
        tables.append((k.get("tuning"), real_profile(*a, **k)))
        return tables[-1][1]

    fronts = _count_front_ends(monkeypatch)
    monkeypatch.setattr(comp.pipeline, "compile_graph", compile_spy)
    monkeypatch.setattr(comp.driver, "back_end", back_end_spy)
    monkeypatch.setattr(prof, "profile", profile_spy)
    monkeypatch.setattr(prof, "compile_all", columns_spy)
    compile_model(small_model, str(tmp_path / "cold.brew"), plan="cold", tune=True)
    assert len(fronts) == 1
    (tuning, table), = tables
    assert tuning.entries == tuned[0].entries and table["tuned"]
    assert len(given) > 2 and all(t is not None and t.entries == tuned[0].entries for t in given)
    _, model_hash = load_onnx.read_model(small_model)
    host = resolve("host")
    assert prof.cache_key(model_hash, host, 2, tuning=tuning) != prof.cache_key(model_hash, host, 2)


def test_the_profile_command_profiles_the_tuned_kernels_with_one_front_end(tuned, small_model, tmp_path, monkeypatch):
    """`coldbrew profile --tune` on the host tunes as compile --tune does, and hands the
    tuner's first passes to the profile rather than running them again."""
    from coldbrew.compiler.measure import profile as prof

    monkeypatch.setattr(prof, "REPEAT", {"cold": 2, "default": 2, "warm": 2, "reads": 2})
    fronts = _count_front_ends(monkeypatch)
    model, out = tmp_path / "small.onnx", tmp_path / "costs.json"
    model.write_bytes(small_model.SerializeToString())
    r = CliRunner().invoke(main, ["profile", str(model), "-o", str(out), "--tune"])
    assert r.exit_code == 0, r.output
    assert len(fronts) == 1 and json.loads(out.read_text())["tuned"]


def test_cli_and_compile_model_share_defaults(tmp_path, small_model):
    """`coldbrew compile` with no flags gives compile_model()'s bundle byte
    for byte (neither tunes unless asked), and inspect says it is derived."""
    model = tmp_path / "small.onnx"
    model.write_bytes(small_model.SerializeToString())
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "cli.brew")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cli.brew").read_bytes() == compile_model(small_model)
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "cli.brew")])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("tuning ")]
    assert line.split()[1] == "derived:", line


def test_inspect_says_a_bundle_is_tuned(tuned):
    _, bundle = tuned
    r = CliRunner().invoke(main, ["inspect", bundle])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("tuning ")]
    n = len([s for s in read(bundle)[0].plan.steps if s.kind.params])
    assert line.split()[1:3] == ["tuned:", f"{n}/{n}"], line


def test_tuning_another_target_is_refused(tmp_path, small_model):
    model = tmp_path / "small.onnx"
    model.write_bytes(small_model.SerializeToString())
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "x.brew"), "--tune", "--target", "sd855"])
    assert r.exit_code == 2 and "--tune measures kernels on this machine: it needs --target host" in r.output


def test_the_layers_model_keeps_a_quantized_layers_spec():
    """A QDQ dense layer (its input's grid) and a quantized LSTM cell (its
    int8 weights) are measured as what they are: the layers model writes
    them as a quantized model does, so its anchors have the same specs (the
    tuner's entries are looked up by them) and the integer variants apply."""
    from coldbrew.compiler.kernels import DenseSpec, RecurrentSpec
    from coldbrew.compiler.pipeline import front_end

    specs = [DenseSpec(6, 40, 32, in_scale=float(np.float32(0.02)), in_shift=131),  # a model's float32 scale
             RecurrentSpec("lstm", 3, 1, 16, 1, activation="Sigmoid", quantize_h=True, int8_weights=True)]
    got = [a.spec for a in tn.anchors_of(front_end(tn.layers_model(specs)))]
    assert specs[0] in got and specs[1] in got


def test_a_candidate_that_does_not_compile_is_left_out(monkeypatch):
    """One candidate whose code cannot be generated fails its column: the
    column's other candidates are measured one by one, the failing one is
    not (its layer keeps the others' figures)."""
    from coldbrew.compiler import pipeline
    from coldbrew.compiler.errors import CompileError
    from coldbrew.compiler.kernels import DenseSpec

    real = pipeline.compile_graph

    def failing(model, path, front, variants=None, **kw):
        if any(params == {"mb": 1, "nb": 16} for _, params in (variants or {}).values()):
            raise CompileError("kernel code generation failed: no")
        return real(model, path, front, variants=variants, **kw)

    monkeypatch.setattr(pipeline, "compile_graph", failing)
    specs = [DenseSpec(4, 32, 16), DenseSpec(2, 16, 48)]
    found = tn.measure_shapes(specs, resolve("host"), 2, lambda *a: None)
    assert set(found) == {repr(s) for s in specs}
    for entry in found.values():
        assert entry["execute_ms"] and not any('"nb": 16' in k and '"mb": 1' in k for k in entry["execute_ms"])
