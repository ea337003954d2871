"""The profiler on a small model: a complete, cached cost table whose
layers are the bundle's; the CLI's profile / trace / simulate commands."""
import json
import re

import pytest
from click.testing import CliRunner

from coldbrew.compiler import compile_model
from coldbrew.compiler.measure import profile as prof
from coldbrew.compiler.options import Options
from coldbrew.compiler.pipeline import front_end
from coldbrew.compiler.tools.cli import main
from coldbrew.compiler.plan.simulate import plan_of_bundle, simulate
from coldbrew.compiler.passes.block_layout import conv_blocks
from coldbrew.targets import resolve

FEW = {"cold": 2, "default": 2, "warm": 2, "reads": 2}


@pytest.fixture(scope="module")
def table_and_bundle(tmp_path_factory, small_model):
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("COLDBREW_CACHE", str(cache))
    seen = []
    table = prof.profile(front_end(small_model), progress=lambda d, n, w: seen.append((d, n)), repeat=FEW)
    bundle = tmp_path_factory.mktemp("b") / "small.brew"
    compile_model(small_model, str(bundle))
    yield table, str(bundle), seen, cache
    mp.undo()


def test_table_covers_every_layer_and_candidate(table_and_bundle):
    table, bundle, seen, _ = table_and_bundle
    assert not table["cached"] and not table["modeled"] and seen[-1][0] == seen[-1][1]
    plan = plan_of_bundle(bundle)
    assert [s["layer"] for s in plan["steps"]] == [layer["name"] for layer in table["layers"]]
    conv = next(layer for layer in table["layers"] if layer["name"] == "c0")
    names = {c["variant"] for c in conv["candidates"]}
    # its 8 output channels fill an 8-lane vector's blocks (AVX2): the blocked variants on RGB input
    blocked = conv_blocks(3, 8, 1, resolve("host").vector.lanes)[1]
    assert ({"conv2d.blocked", "conv2d.im2col_blocked"}
            if blocked else {"conv2d.direct", "conv2d.im2col_gemm", "conv2d.winograd_f2", "conv2d.winograd_f4"}) <= names
    cls = table["classes"][0]["name"]
    for c in conv["candidates"]:
        assert c["raw_bytes"] == 8 * 3 * 3 * 3 * 4 + 8 * 4  # weights + bias
        assert c["read_ms"]["raw"]["n"] == 2 and c["read_ms"]["cached"]["median"] > 0
        assert set(c["execute_first_ms"][cls]) == {"1", "2"} and c["execute_ms"][cls]["2"]["n"] == 2
        if "winograd" in c["variant"]:
            assert c["has_transform"] and c["transformed_bytes"] > c["raw_bytes"]
            assert c["transform_ms"][cls]["1"]["median"] > 0
            assert "direct" not in c["read_ms"]  # its transform computes values: no direct form
        else:  # the direct fp16 form: half the weight bytes (the bias stays fp32), its own kernel's times
            assert c["direct_bytes"] == c["transformed_bytes"] - (c["transformed_bytes"] - 8 * 4) // 2
            assert c["read_ms"]["direct"]["n"] == 2 and c["execute_first_direct_ms"][cls]["2"]["n"] == 2
            assert c["execute_direct_ms"][cls]["2"]["n"] == 2
    assert table["load"]["verify"]["n"] == 2 and table["storage"]["read_mb_s"] > 0
    assert table["load"]["run_overhead"]["n"] == 2 and table["load"]["run_overhead"]["median"] >= 0
    assert simulate(plan, table)["latency_ms"] > table["load"]["verify"]["median"]


def test_second_profile_comes_from_the_cache(table_and_bundle, small_model, monkeypatch):
    _, _, _, cache = table_and_bundle
    monkeypatch.setenv("COLDBREW_CACHE", str(cache))

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(prof, "_measure", no_measuring)
    again = prof.profile(front_end(small_model), repeat=FEW)
    assert again["cached"]
    # a plan compile reads the same cached table
    data = compile_model(small_model, plan="cold")
    assert data[:8] == b"COLDBREW"
    modeled = prof.profile(front_end(small_model, Options(target="sd855")), repeat=FEW)
    assert modeled["modeled"] and modeled["target"] == "sd855"


def test_cli_trace_and_simulate(table_and_bundle, tmp_path):
    table, bundle, _, _ = table_and_bundle
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(table))
    r = CliRunner().invoke(main, ["trace", bundle, "-o", str(tmp_path / "t.json"), "--png", str(tmp_path / "t.png"),
                                  "--costs", str(costs)])
    assert r.exit_code == 0, r.output
    trace = json.loads((tmp_path / "t.json").read_text())
    phases = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"verify", "code_load", "read", "execute"} <= phases
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"warm run: execute [\d.]+ ms over \d+ layers; \d+ on the generic schedule", r.output), r.output
    assert re.search(r"account of [\d.]+ ms .*execute [\d.]+.*between calls [\d.]+, wait [\d.]+", r.output), r.output
    assert re.search(r"page faults \d+ \(~[\d.]+ ms at [\d.]+ us each", r.output), r.output
    r = CliRunner().invoke(main, ["simulate", bundle, "--costs", str(costs)])
    assert r.exit_code == 0 and "predicted cold latency on host" in r.output, r.output


def test_the_storage_bandwidth_is_read_by_the_protocol(tmp_path, monkeypatch):
    """The cost table's storage bandwidth is the protocol's cold read (the
    runtime's way, compiler/measure/protocol.py), of a 32 MiB file."""
    import os

    calls = []
    monkeypatch.setattr(prof, "cold_read_ms", lambda p: calls.append(os.path.getsize(p)) or 10.0)
    storage = prof._storage(str(tmp_path))
    assert calls == [32 << 20] * 3 and round(storage["read_mb_s"]) == round((32 << 20) / 10.0 / 1e3)


def test_the_cold_plan_is_the_plan_in_the_bundle(table_and_bundle, small_model, monkeypatch):
    """What `--plan cold` chose (variant, weight form, preparation queue,
    threads per layer) is what the bundle's steps hold. The plan is pushed
    away from the defaults first (each layer with a choice takes its last
    candidate, raw where it has a transform, on preparation queue 1), so a
    compile that dropped the plan would not match."""
    import coldbrew.compiler.plan.scheduler as scheduler
    from coldbrew.compiler.bundle.reader import WEIGHT_FORMS, read_bytes

    _, _, _, cache = table_and_bundle
    monkeypatch.setenv("COLDBREW_CACHE", str(cache))
    real, chosen = scheduler.choose, {}

    def pushed(table, objective, precision="fp32"):
        out = real(table, objective, precision)
        for layer in table["layers"][1:]:
            c = layer["candidates"][-1]
            if len(layer["candidates"]) > 1 or c["has_transform"]:
                out["variants"][layer["name"]] = c["variant"]
                out["forms"][layer["name"]] = "raw" if c["has_transform"] else "cached"
                out["precisions"][layer["name"]] = "fp32"
                out["queues"][layer["name"]] = 1
        chosen.update(out)
        return out

    monkeypatch.setattr(scheduler, "choose", pushed)
    b = read_bytes(compile_model(small_model, plan="cold"))[0]
    assert chosen["variants"] and any(chosen["queues"].values())
    steps = {b.layers[s.layer].name.decode(): s for s in b.plan.steps}
    for name, variant in chosen["variants"].items():
        s = steps[name]
        assert s.variant.decode() == variant, name
        assert WEIGHT_FORMS[s.weightForm] == chosen["forms"][name], name
        assert s.prepQueue == chosen["queues"][name], name
    assert b.plan.threads == chosen["threads"]


def test_a_plan_for_fp32_weights_measures_no_direct_form(small_model, tmp_path, monkeypatch):
    """A table for fp32 plans compiles and samples no direct (narrow in
    place) column, is cached apart, and is what `--plan cold` of fp32
    weights reads; a plan for fp16 weights measures the direct fp16 form
    (and not int8's). Without the narrowing the first profile would
    compile the direct columns and the compile would measure again."""
    monkeypatch.setenv("COLDBREW_CACHE", str(tmp_path))
    steps = []
    table = prof.profile(front_end(small_model), repeat=FEW, direct=[], progress=lambda d, n, w: steps.append(w))
    assert not table["cached"] and table["direct_measured"] == []
    assert any("compile column" in w for w in steps) and not any("direct" in w for w in steps)
    cands = [c for layer in table["layers"] for c in layer["candidates"]]
    assert not any(k.startswith(("execute_direct", "execute_first_direct")) or k.startswith("direct")
                   for c in cands for k in c)
    assert not any(f in c["read_ms"] for c in cands for f in ("direct", "direct_int8"))
    real = prof._measure

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(prof, "_measure", no_measuring)
    assert compile_model(small_model, plan="cold")[:8] == b"COLDBREW"  # from the fp32 table
    monkeypatch.setattr(prof, "_measure", real)
    fp16 = prof.profile(front_end(small_model), repeat=FEW, direct=["fp16"])
    assert not fp16["cached"] and fp16["direct_measured"] == ["fp16"]
    cands = [c for layer in fp16["layers"] for c in layer["candidates"]]
    assert any("direct" in c["read_ms"] for c in cands) and not any("direct_int8" in c["read_ms"] for c in cands)


def test_layers_of_one_shape_share_their_columns():
    """Three layers of one shape with five candidates take two columns, not
    five (every candidate once, the default in column 0), and each layer
    then holds every candidate: its own measurements first, the rest from
    the sibling that measured them. Without the sharing each would hold
    only what its own columns gave it."""
    from types import SimpleNamespace as NS

    names = ["conv2d.blocked", "conv2d.im2col_blocked", "conv2d.winograd_f2_blocked",
             "conv2d.winograd_f4_blocked", "conv2d.winograd_f6_blocked"]
    anchors = [NS(id=f"c{k}", spec="3x3", variant=NS(name=names[0]), alternatives=names) for k in range(3)]
    anchors.append(NS(id="c3", spec="1x1", variant=NS(name="conv2d.blocked"),
                      alternatives=["conv2d.blocked", "conv2d.gemm_1x1_blocked"]))
    groups = prof._groups(anchors)
    columns = prof._columns(groups)
    assert len(columns) == 2
    assert columns[0] == {"c0": names[0], "c1": names[1], "c2": names[2], "c3": "conv2d.blocked"}
    assert [columns[1][a] for a in ("c0", "c1", "c3")] == [names[3], names[4], "conv2d.gemm_1x1_blocked"]
    measured = {(a, v) for col in columns for a, v in col.items()}
    assert {v for a, v in measured if a != "c3"} == set(names)
    # the direct columns leave out what keep() refuses (Winograd's transform computes values)
    direct = prof._columns(groups, lambda n: "winograd" not in n)
    assert len(direct) == 2 and [direct[0][a] for a in ("c0", "c1")] == names[:2]
    assert all("winograd" not in v for col in direct for v in col.values())

    layers = {a: {"name": a, "candidates": []} for a in ("c0", "c1", "c2", "c3")}
    for col in columns:
        for a, v in col.items():
            if not any(c["variant"] == v for c in layers[a]["candidates"]):
                layers[a]["candidates"].append({"variant": v, "execute_ms": int(a[1]), "read_ms": {"raw": 1}})
    layers["c1"]["candidates"][0]["direct_bytes"] = 7  # a direct field only c1 measured
    prof._share(layers, groups)
    for a in ("c0", "c1", "c2"):
        by = {c["variant"]: c for c in layers[a]["candidates"]}
        assert set(by) == set(names), a
        assert by[columns[0][a]]["execute_ms"] == int(a[1])  # its own measurement kept
        assert by[names[1]]["direct_bytes"] == 7 and by[names[1]]["read_ms"] == {"raw": 1}
    assert {c["variant"] for c in layers["c3"]["candidates"]} == {"conv2d.blocked", "conv2d.gemm_1x1_blocked"}


def test_a_slow_first_round_takes_fewer_rounds(monkeypatch):
    """Where the first round of samples takes longer than ROUNDS_S, the
    profile takes as many rounds as fit (at least ROUNDS_MIN), the warm runs
    in the last of them, and its progress still ends at its total; a fast
    round keeps every round asked for."""
    import time

    calls = []

    def fake(bundle, cores, threads, warm=0, into=None, warm_ms=None):
        calls.append((bundle, warm))
        time.sleep(delay)
        return into

    monkeypatch.setattr(prof, "sample", fake)
    monkeypatch.setattr(prof, "ROUNDS_S", 0.5)
    bundles = {"fp32": ["c0", "c1"]}
    configs = [("core", 1, [0]), ("core", 2, [0, 1])]
    repeat = {"cold": 5, "default": 5, "warm": 4}
    for delay, expect in ((0.05, 3), (0.0, 5)):
        calls.clear()
        done = []
        step = prof._Steps(lambda d, n, w: done.append((d, n)), 5 * (2 * 2 + 1))
        *_, rounds = prof._sample_rounds(bundles, "default", configs, 5, repeat, step)
        assert rounds == expect
        columns = [w for b, w in calls if b != "default"]
        assert len(columns) == 4 * expect and columns[-4:] == [4] * 4 and not any(columns[:-4])
        assert [b for b, _ in calls].count("default") == 5
        assert step.done == step.total
