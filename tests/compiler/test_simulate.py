"""The simulator on synthetic cost tables (exact expected timelines), the
per-layer plan choice, and modeled tables."""
import pytest

from coldbrew.compiler.plan import choose
from coldbrew.compiler.profile import modeled_table
from coldbrew.compiler.simulate import PlanError, simulate
from coldbrew.targets import resolve


def _stat(ms):
    return {"median": ms, "min": ms, "max": ms, "n": 1}


def _cand(variant, read_raw, read_cached, transform, execute, warm=None, raw_bytes=1000, transformed_bytes=2000):
    return {"variant": variant, "raw_bytes": raw_bytes, "transformed_bytes": transformed_bytes,
            "has_transform": transform is not None,
            "read_ms": {"raw": _stat(read_raw), "cached": _stat(read_cached)},
            "transform_ms": {"core": {"1": _stat(transform or 0), "2": _stat((transform or 0) / 2)}},
            "execute_first_ms": {"core": {"2": _stat(execute)}},
            "execute_ms": {"core": {"2": _stat(warm if warm is not None else execute)}}}


def _table():
    return {"classes": [{"name": "core", "ids": [0, 1, 2]}], "threads": 2, "modeled": False,
            "load": {"verify": _stat(4.0), "code_load": _stat(1.0), "session": _stat(0.5), "bundle_bytes": 1000},
            "layers": [
                {"name": "c0", "candidates": [_cand("conv2d.winograd_f4", 1.0, 3.0, 8.0, 2.0),
                                              _cand("conv2d.im2col_gemm", 1.0, 1.0, 1.0, 5.0)]},
                {"name": "L1", "candidates": [_cand("generic", 0.0, 0.0, None, 1.0)]},
            ]}


def _plan(form="raw", queue=0, variant="conv2d.winograd_f4"):
    return {"threads": 2, "bundle_bytes": 2000, "steps": [
        {"layer": "c0", "variant": variant, "form": form, "prep_queue": queue, "exec_queue": 0},
        {"layer": "L1", "variant": "generic", "form": "raw", "prep_queue": queue, "exec_queue": 0}]}


def test_sequential_plan_adds_every_phase():
    # open: verify header + code 4 + code load 1 + session 0.5 = 5.5;
    # c0: cold read 1 + transform with the execution threads 4 + execute 2; L1: read 0 + execute 1
    r = simulate(_plan(), _table())
    assert r["open_ms"] == pytest.approx(5.5)
    assert r["latency_ms"] == pytest.approx(5.5 + 1 + 4 + 2 + 1)
    reads = [e for e in r["events"] if e["phase"] == "read"]
    assert (reads[0]["end_ns"] - reads[0]["start_ns"]) / 1e6 == pytest.approx(1.0)


def test_run_overhead_when_measured():
    # 0.25 ms after the last step
    table = _table()
    table["load"]["run_overhead"] = _stat(0.25)
    assert simulate(_plan(), table)["latency_ms"] == pytest.approx(5.5 + 1 + 4 + 2 + 1 + 0.25, abs=1e-3)


def test_prep_queue_overlaps_preparation_with_execution():
    # prep on queue 1 (its own core, 1 thread): c0 read 1 + transform 8 from t=5.5;
    # c0 executes at 14.5 .. 16.5; L1 prepared at 14.5, executes 16.5 .. 17.5
    r = simulate(_plan(queue=1), _table())
    assert r["latency_ms"] == pytest.approx(17.5)
    ex = [e for e in r["events"] if e["phase"] == "execute"]
    prep = [e for e in r["events"] if e["phase"] in ("read", "transform")]
    assert {e["cpu"] for e in ex} == {0} and {e["cpu"] for e in prep} == {2}
    assert ex[0]["start_ns"] == pytest.approx(14.5e6, abs=1)


def test_cached_form_reads_transformed_bytes_and_skips_the_transform():
    r = simulate(_plan(form="cached"), _table())
    assert r["latency_ms"] == pytest.approx(5.5 + 3 + 2 + 1)
    assert not [e for e in r["events"] if e["phase"] == "transform"]


def test_unknown_layer_or_variant_is_a_clear_error():
    with pytest.raises(PlanError, match="no measurement of conv2d.direct"):
        simulate(_plan(variant="conv2d.direct"), _table())
    plan = _plan()
    plan["steps"][1]["layer"] = "L9"
    with pytest.raises(PlanError, match="no layer L9"):
        simulate(plan, _table())


def test_choose_warm_and_cold():
    variants, forms = choose(_table(), "warm")
    assert variants == {"c0": "conv2d.winograd_f4"} and forms == {"c0": "cached"}
    # cold: winograd raw 1 + 4 + 2 = 7, cached 3 + 2 = 5; gemm raw 1 + 0.5 + 5, cached 1 + 5 = 6
    variants, forms = choose(_table(), "cold")
    assert variants == {"c0": "conv2d.winograd_f4"} and forms == {"c0": "cached"}
    t = _table()
    t["layers"][0]["candidates"][0]["read_ms"]["cached"] = _stat(9.0)
    assert choose(t, "cold") == ({"c0": "conv2d.im2col_gemm"}, {"c0": "cached"})
    with pytest.raises(ValueError):
        choose(t, "fastest")


def test_modeled_table_scales_each_phase_per_core_class():
    host = _table()
    host["fingerprint"], host["storage"] = "host", {}
    sd855 = resolve("sd855")
    t = modeled_table(host, sd855)
    assert t["modeled"] and t["target"] == "sd855"
    assert [c["name"] for c in t["classes"]] == [c.name for c in sd855.core_classes]
    little, big = sd855.core_classes[-1], sd855.core_classes[0]
    c = t["layers"][0]["candidates"][0]
    assert c["execute_first_ms"][little.name]["2"]["median"] == pytest.approx(2.0 * little.scale["execute"])
    assert c["transform_ms"][little.name]["1"]["median"] == pytest.approx(8.0 * little.scale["transform"])
    assert c["read_ms"]["raw"]["median"] == pytest.approx(1.0 * big.scale["read"])
    r = simulate(_plan(queue=1), t)
    assert r["modeled"] and r["latency_ms"] > simulate(_plan(queue=1), host)["latency_ms"]
