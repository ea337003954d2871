"""The simulator on synthetic cost tables (exact expected timelines), the
per-layer plan choice, and modeled tables."""
import os
import sys

import pytest

from conftest import ROOT

from coldbrew.compiler.plan.scheduler import choose
from coldbrew.compiler.measure.profile import modeled_table
from coldbrew.compiler.plan.simulate import PlanError, loop_factor, simulate
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
    return {"threads": 2, "steps": [
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


def test_choose_warm_and_cold_greedy():
    p = choose(_table(), "warm")
    assert p["variants"] == {"c0": "conv2d.winograd_f4"} and p["forms"] == {"c0": "cached"}
    assert set(p["queues"].values()) == {0} and p["threads"] == 2
    # cold-greedy: winograd raw 1 + 4 + 2 = 7, cached 3 + 2 = 5; gemm raw 1 + 0.5 + 5, cached 1 + 5 = 6
    p = choose(_table(), "cold-greedy")
    assert p["variants"] == {"c0": "conv2d.winograd_f4"} and p["forms"] == {"c0": "cached"}
    t = _table()
    t["layers"][0]["candidates"][0]["read_ms"]["cached"] = _stat(9.0)
    p = choose(t, "cold-greedy")
    assert (p["variants"], p["forms"]) == ({"c0": "conv2d.im2col_gemm"}, {"c0": "cached"})
    with pytest.raises(ValueError):
        choose(t, "fastest")


def _chain(n, classes):
    """n conv layers, each: winograd (slow read of big cached weights, or a
    raw read + a costly transform, fast execute) or gemm (cheap to prepare,
    slow execute)."""
    layers = [{"name": f"c{i}", "candidates": [_cand("conv2d.winograd_f4", 1.0, 4.0, 6.0, 1.0),
                                                _cand("conv2d.im2col_gemm", 1.0, 1.0, None, 3.0)]}
              for i in range(n)]
    return {"classes": classes, "threads": 2, "modeled": False,
            "load": {"verify": _stat(0.5), "code_load": _stat(0.5), "session": _stat(0.5), "bundle_bytes": 1000},
            "layers": layers}


def _with_one_thread(t, slower=2.0):
    """`t` with every candidate's execution on one thread measured too, `slower` times its two threads'."""
    for layer in t["layers"]:
        for c in layer["candidates"]:
            for key in ("execute_first_ms", "execute_ms"):
                runs = c[key]["core"]
                runs["1"] = _stat(runs["2"]["median"] * slower)
    return t


def test_scheduler_weighs_a_pair_beaten_on_its_own_costs_in_the_whole_timeline():
    # c1's cached form (2000 bytes: 2 ms of the stream) loses to raw (1 ms
    # + a 0.8 ms transform on the execution threads) counted alone, but
    # its bytes stream in while c0 executes for 20 ms and it has nothing to
    # transform: the timeline is 0.8 ms shorter with it. A scheduler that
    # dropped pairs beaten on both of their own costs would never try it.
    from coldbrew.compiler.plan.scheduler import layer_pairs, schedule_config, simulated_plan

    t = _streamed(mb_s=1.0)
    t["layers"] = [{"name": "c0", "candidates": [_cand("generic", 0.1, 0.1, None, 20.0, raw_bytes=100,
                                                        transformed_bytes=100)]},
                   {"name": "c1", "candidates": [_cand("conv2d.winograd_f4", 1.0, 2.0, 1.6, 1.0)]}]
    pairs = {p[1]: p for p in layer_pairs(t["layers"][1], t, 2, 2)}
    assert pairs["raw"][2] < pairs["cached"][2] and pairs["raw"][3] <= pairs["cached"][3]
    inline = schedule_config(t, 2, 0)  # every preparation on the execution threads
    assert inline["forms"]["c1"] == "cached" and not any(inline["queues"].values())
    raw = dict(inline, forms={**inline["forms"], "c1": "raw"})
    assert simulate(simulated_plan(t, raw), t)["latency_ms"] == pytest.approx(inline["predicted_ms"] + 0.8)
    assert choose(t, "cold")["predicted_ms"] <= inline["predicted_ms"]


def test_scheduler_pipelines_preparation_on_a_free_core():
    # 3 cores, 2 execution threads: a worker on the third core prepares
    # the next layers' weights while earlier layers execute (one thread
    # executes at half the speed of two: not worth a second worker)
    t = _with_one_thread(_chain(6, [{"name": "core", "ids": [0, 1, 2]}]))
    greedy, cold = choose(t, "cold-greedy"), choose(t, "cold")
    assert cold["predicted_ms"] < greedy["predicted_ms"]
    assert cold["queues"]["c0"] == 0 and any(q == 1 for q in cold["queues"].values())
    assert cold["threads"] == 2
    assert cold["plan_ms"] < 1000
    # the prediction is the simulator's for the plan the scheduler returns
    steps = [{"layer": f"c{i}", "variant": cold["variants"][f"c{i}"], "form": cold["forms"][f"c{i}"],
              "prep_queue": cold["queues"][f"c{i}"], "exec_queue": 0} for i in range(6)]
    assert simulate({"threads": cold["threads"], "steps": steps}, t)["latency_ms"] == pytest.approx(
        cold["predicted_ms"])


def test_a_worker_must_save_more_than_the_margin(monkeypatch):
    # the simulator does not charge the worker thread itself: a plan with
    # one wins only by WORKER_MARGIN of the best inline plan's completion
    import coldbrew.compiler.plan.scheduler as plan

    predicted = {(2, 0): 10.0, (2, 1): 9.9, (1, 1): 9.95}
    monkeypatch.setattr(plan, "schedule_config", lambda t, threads, workers, precision="fp32": {
        "predicted_ms": predicted[(threads, workers)], "threads": threads, "workers": workers})
    table = {"threads": 2, "classes": [{"name": "core", "ids": [0, 1]}]}
    assert sorted(plan.configurations(table)) == sorted(predicted)
    chosen = plan._schedule(table)
    assert (chosen["threads"], chosen["workers"]) == (2, 0)
    predicted[(1, 1)] = 10.0 * (1 - plan.WORKER_MARGIN) - 0.01
    chosen = plan._schedule(table)
    assert (chosen["threads"], chosen["workers"]) == (1, 1)


def test_scheduler_never_predicts_worse_than_greedy():
    import random

    rnd = random.Random(5)
    for trial in range(20):
        t = _chain(5, [{"name": "core", "ids": [0, 1]}])
        for layer in t["layers"]:
            for c in layer["candidates"]:
                c["read_ms"] = {"raw": _stat(rnd.uniform(0.1, 3)), "cached": _stat(rnd.uniform(0.1, 3))}
                c["execute_first_ms"] = {"core": {"2": _stat(rnd.uniform(0.5, 3)), "1": _stat(rnd.uniform(1, 6))}}
        cold, greedy = choose(t, "cold"), choose(t, "cold-greedy")
        assert cold["predicted_ms"] <= greedy["predicted_ms"] + 1e-9


def test_shared_worker_overlaps_reads_but_charges_transforms():
    # 2 cores, 2 execution threads: the worker shares a core; its reads
    # overlap execution, its transforms delay the executions by all their
    # time (an evenly split loop waits for the thread whose core it takes)
    t = _chain(2, [{"name": "core", "ids": [0, 1]}])
    steps = [{"layer": "c0", "variant": "conv2d.im2col_gemm", "form": "cached", "prep_queue": 0, "exec_queue": 0},
             {"layer": "c1", "variant": "conv2d.winograd_f4", "form": "raw", "prep_queue": 1, "exec_queue": 0}]
    r = simulate({"threads": 2, "steps": steps}, t)
    # open 1.5; c0 inline: read 1, execute 3 -> 5.5; c1 on the worker from 1.5:
    # read 1, transform 6 (one thread) -> 8.5; c1 executes 8.5 .. 9.5 + 6
    assert r["latency_ms"] == pytest.approx(8.5 + 1 + 6)


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


def test_scheduler_within_ten_percent_of_the_optimum():
    """Random small cost tables: the scheduler's plan for a configuration
    with a dedicated preparation core against the exact optimum (MILP) of
    the same model; the mean gap stays under 10 %."""
    import random

    from coldbrew.compiler.plan.scheduler import schedule_config
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from harness.plan_exact import optimal_makespan

    rnd = random.Random(11)
    gaps = []
    for trial in range(20):
        t = _chain(5, [{"name": "core", "ids": [0, 1, 2]}])
        for layer in t["layers"]:
            for c in layer["candidates"]:
                c["read_ms"] = {"raw": _stat(rnd.uniform(0.1, 3)), "cached": _stat(rnd.uniform(0.1, 4))}
                c["execute_first_ms"] = {"core": {"2": _stat(rnd.uniform(0.5, 3))}}
                if c["has_transform"]:
                    x = rnd.uniform(0.5, 6)
                    c["transform_ms"] = {"core": {"1": _stat(x), "2": _stat(x / 2)}}
        heuristic = schedule_config(t, 2, True)["predicted_ms"]
        best = optimal_makespan(t, 2)
        assert best <= heuristic + 1e-6
        gaps.append(heuristic / best - 1)
    assert sum(gaps) / len(gaps) <= 0.10, gaps


def test_loops_split_by_core_speed():
    host = _table()
    host["fingerprint"], host["storage"] = "host", {}
    assert loop_factor(host, 2) == loop_factor(host, 2, "even") == 1.0  # symmetric cores
    t = modeled_table(host, resolve("sd855"))
    # 2 threads: prime (1.0) + a big core (0.85); shares 4:3 vs 1:1
    assert loop_factor(t, 2, "even") == pytest.approx(1 / 0.85)
    assert loop_factor(t, 2) == pytest.approx(2 * max(4 / 7, 3 / 7 / 0.85))
    plan = _plan(queue=1)
    by_speed, even = simulate(plan, t), simulate(dict(plan, split="even"), t)
    execute = [e for e in by_speed["events"] if e["phase"] == "execute"]
    assert [e["cpu"] for e in execute] == [7, 7]  # task 0 on the prime core
    assert by_speed["latency_ms"] < even["latency_ms"]
    # the worker takes the first core the execution threads leave free
    assert next(e["cpu"] for e in by_speed["events"] if e["phase"] == "read") == 5


def _narrow_table(fp16_read):
    """c0's gemm also measured with fp16 weights (read `fp16_read` ms);
    widening modeled at 1e-3 ms per fp32 byte (2000 bytes: 2 ms)."""
    table = _table()
    table["widen_ms_per_byte"] = 1e-3
    for c in table["layers"][0]["candidates"]:
        c["read_ms"]["fp16"] = _stat(fp16_read)
    return table


def test_fp16_form_reads_narrow_bytes_and_widens():
    # gemm packs (rearranges): fp16 in its layout, widened by the runtime: read 0.2 + widen 2 + execute 5
    plan = _plan(form="fp16", variant="conv2d.im2col_gemm")
    r = simulate(plan, _narrow_table(0.2))
    assert r["latency_ms"] == pytest.approx(5.5 + 0.2 + 2 + 5 + 1)
    # Winograd computes its weights: its fp16 weights go through its transform (8 on 1 thread, 4 on 2)
    table = _narrow_table(0.2)
    table["layers"][0]["candidates"][0]["transform_rearranges"] = False
    r = simulate(_plan(form="fp16"), table)
    assert r["latency_ms"] == pytest.approx(5.5 + 0.2 + 4 + 2 + 1)
    with pytest.raises(PlanError, match="no int8 weights"):
        simulate(_plan(form="int8"), table)


def test_plan_stores_fp16_only_when_asked_and_then_even_where_fp32_reads_faster():
    cheap = _narrow_table(0.01)
    cheap["layers"][0]["candidates"][1]["read_ms"]["cached"] = _stat(9.0)  # gemm's fp32 read is slow
    cheap["layers"][0]["candidates"][0]["read_ms"]["cached"] = _stat(9.0)
    cheap["layers"][0]["candidates"][0]["read_ms"]["raw"] = _stat(9.0)
    assert choose(cheap, "cold-greedy")["precisions"] == {"c0": "fp32"}  # fp32 unless a precision is given
    p = choose(cheap, "cold-greedy", "fp16")
    assert p["precisions"] == {"c0": "fp16"} and p["forms"] == {"c0": "cached"}
    dear = _narrow_table(50.0)  # reading the fp16 weights is slower than anything fp32
    assert choose(dear, "cold", "fp16")["precisions"] == {"c0": "fp16"}  # the precision asked is stored
    assert choose(dear, "cold-greedy", "fp16")["precisions"] == {"c0": "fp16"}
    assert choose(dear, "warm", "fp16")["precisions"] == {"c0": "fp32"}  # the warm plan keeps fp32


def _direct_table(read, execute):
    """_narrow_table(0.2) with c0's gemm also measured in the direct form:
    fp16 read in place (`read` ms), its own kernel's first execution."""
    table = _narrow_table(0.2)
    gemm = table["layers"][0]["candidates"][1]
    gemm["read_ms"]["direct"] = _stat(read)
    gemm["execute_first_direct_ms"] = {"core": {"2": _stat(execute)}}
    gemm["execute_direct_ms"] = {"core": {"2": _stat(execute)}}
    return table


def test_direct_form_reads_fp16_and_runs_its_own_kernel_without_a_transform():
    r = simulate(_plan(form="direct", variant="conv2d.im2col_gemm"), _direct_table(0.2, 5.5))
    assert r["latency_ms"] == pytest.approx(5.5 + 0.2 + 5.5 + 1)  # no widening
    assert not [e for e in r["events"] if e["phase"] == "transform" and e["layer"] == "c0"]
    with pytest.raises(PlanError, match="no direct weights"):  # Winograd has no direct form
        simulate(_plan(form="direct"), _direct_table(0.2, 5.5))


def test_plan_weighs_the_direct_form_against_widening():
    # gemm direct: read 0.2 + execute 3.5 beats gemm fp16 widened (0.2 + 2 + 5), gemm fp32 (1 + 5),
    # Winograd fp32 cached (3 + 2) and Winograd fp16 (0.2 + 2 + 2)
    p = choose(_direct_table(0.2, 3.5), "cold-greedy", "fp16")
    assert p["forms"] == {"c0": "direct"} and p["precisions"] == {"c0": "fp16"}
    assert p["variants"] == {"c0": "conv2d.im2col_gemm"}
    # a direct kernel much slower than widening loses to it
    slow = choose(_direct_table(0.2, 9.0), "cold-greedy", "fp16")
    assert slow["forms"]["c0"] == "cached" and slow["precisions"] == {"c0": "fp16"}
    assert choose(_direct_table(0.2, 3.5), "cold-greedy")["forms"]["c0"] != "direct"  # fp32 unless asked
    assert choose(_direct_table(0.2, 3.5), "cold", "fp16")["forms"] == {"c0": "direct"}
    from coldbrew.compiler.plan.scheduler import simulated_plan

    assert simulated_plan(_direct_table(0.2, 3.5), p)["steps"][0]["form"] == "direct"


def test_plan_takes_the_direct_int8_form_as_int8_weights_in_place():
    # int8 read in place (0.1) by its own kernel (4.0): no transform, the fewest bytes
    table = _direct_table(0.2, 9.0)
    gemm = table["layers"][0]["candidates"][1]
    gemm["read_ms"]["direct_int8"] = _stat(0.1)
    gemm["execute_first_direct_int8_ms"] = {"core": {"2": _stat(4.0)}}
    gemm["direct_int8_bytes"] = 100
    p = choose(table, "cold-greedy", "int8")
    assert p["forms"] == {"c0": "direct"} and p["precisions"] == {"c0": "int8"}
    from coldbrew.compiler.plan.scheduler import simulated_plan

    plan = simulated_plan(table, p)
    assert plan["steps"][0]["form"] == "direct_int8"
    assert simulate(plan, table)["latency_ms"] == pytest.approx(5.5 + 0.1 + 4.0 + 1)
    assert choose(table, "cold-greedy", "fp16")["precisions"]["c0"] != "int8"  # int8 only when asked


def _streamed(mb_s=1.0, check=0.0):
    """_table() with a storage bandwidth: 1 MB/s = 1000 bytes per ms."""
    t = _table()
    t["storage"] = {"read_mb_s": mb_s, "latency_us": 100.0, "measured": True}
    t["check_ms_per_byte"] = check
    return t


def test_streamed_weights_arrive_in_file_order_from_the_open():
    # the disk streams the weights from the end of verify (4 ms) at 1000 B/ms:
    # c0's 1000 raw bytes are in at 5 ms, before the executing thread asks
    # at 5.5 (no wait), checked at 1e-3 ms/B (1 ms); transform 4, execute 2;
    # L1's raw bytes (1000) arrived at 6 ms: checked 1 ms, execute 1
    r = simulate(_plan(), _streamed(check=1e-3))
    assert r["latency_ms"] == pytest.approx(5.5 + 1 + 4 + 2 + 1 + 1)
    # a slow disk (0.1 MB/s: 100 B/ms): c0 in at 4 + 10 = 14, L1 at 24
    r = simulate(_plan(), _streamed(mb_s=0.1))
    ex = [e for e in r["events"] if e["phase"] == "execute"]
    assert ex[0]["start_ns"] == pytest.approx((14 + 4) * 1e6, abs=1)
    assert r["latency_ms"] == pytest.approx(24 + 1)


def test_a_large_tensor_is_checked_as_it_streams_in():
    # c0's 10 MiB of cached weights at 1e-6 ms/B: 10.49 ms to check in all
    mib = 1 << 20
    t = _streamed(mb_s=1000.0, check=1e-6)
    t["layers"][0]["candidates"][0]["transformed_bytes"] = 10 * mib

    def read_ms(plan, table):
        ev = next(e for e in simulate(plan, table)["events"] if e["phase"] == "read" and e["layer"] == "c0")
        return (ev["end_ns"] - ev["start_ns"]) / 1e6

    # a slow disk (1e6 B/ms from the end of verify, 4 ms): the bytes are in
    # at 14.49 ms; checked as they come, the check ends one 2 MiB stripe's
    # check (2.10 ms) after the last byte, not the whole tensor's
    assert read_ms(_plan(form="cached"), t) == pytest.approx(4 + 10 * mib / 1e6 - 5.5 + 2 * mib * 1e-6)
    # a fast disk: everything is in before the read starts; the whole check,
    # split across the 2 execution threads inline, on 1 thread on a worker
    t["storage"]["read_mb_s"] = 1e6
    assert read_ms(_plan(form="cached"), t) == pytest.approx(10 * mib * 1e-6 / 2)
    assert read_ms(_plan(form="cached", queue=1), t) == pytest.approx(10 * mib * 1e-6)


def test_streamed_cached_weights_are_their_transformed_bytes():
    # cached c0: 2000 bytes, in at 4 + 2 = 6 ms; L1's 1000 more at 7
    r = simulate(_plan(form="cached"), _streamed())
    ex = [e for e in r["events"] if e["phase"] == "execute"]
    assert ex[0]["start_ns"] == pytest.approx(6e6, abs=1) and r["latency_ms"] == pytest.approx(max(6 + 2, 7) + 1)


def test_a_shared_worker_checking_streamed_weights_delays_the_executions():
    # 2 cores, 2 execution threads, the disk at 1000 B/ms from the end of
    # verify (0.5): c1's worker (on an execution core) checks its 2000
    # cached bytes at 1e-3 ms/B, 2 ms of CPU that c1's execution waits out
    t = _chain(2, [{"name": "core", "ids": [0, 1]}])
    t["storage"], t["check_ms_per_byte"] = {"read_mb_s": 1.0}, 1e-3
    steps = [{"layer": "c0", "variant": "conv2d.im2col_gemm", "form": "cached", "prep_queue": 0, "exec_queue": 0},
             {"layer": "c1", "variant": "conv2d.im2col_gemm", "form": "cached", "prep_queue": 1, "exec_queue": 0}]
    r = simulate({"threads": 2, "steps": steps}, t)
    # c0 inline: bytes in at 0.5 + 2 = 2.5, checked 2 -> 4.5, executes 3 -> 7.5;
    # c1: bytes in at 0.5 + 4 = 4.5, checked 2 -> 6.5; executes 7.5 .. 10.5 + 2
    assert r["latency_ms"] == pytest.approx(12.5)


def test_scheduler_compares_streamed_forms_by_their_bytes_not_two_cold_reads():
    # one dense layer, cached and raw about the same bytes; the two separate
    # cold reads measured 6.5 and 5.3 ms (noise). With a bandwidth, each
    # form costs its bytes' share of the stream, so cached (no transform)
    # is not dropped as dominated by raw + transform, and the plan keeps it
    from coldbrew.compiler.plan.scheduler import layer_pairs

    t = _streamed(mb_s=1.0)
    t["layers"] = [{"name": "d0", "candidates": [
        _cand("dense.packed_gemm", 5.3, 6.5, 0.7, 0.05, raw_bytes=5000, transformed_bytes=5100)]}]
    pairs = layer_pairs(t["layers"][0], t, 2, 2)
    assert {p[1]: p[2] for p in pairs} == pytest.approx({"cached": 5.1, "raw": 5.0 + 0.35})
    assert choose(t, "cold")["forms"]["d0"] == "cached"
    # without a bandwidth the measured cold reads stand: raw + transform wins
    del t["storage"]
    assert choose(t, "cold-greedy")["forms"]["d0"] == "raw"


def test_direct_first_runs_carry_the_shipped_bundles_ratio_like_cached_ones():
    # gemm's first run: 5 ms in the profile's column, 2.5 ms in the shipped
    # (default) bundle with its weights read in place; its direct kernel's
    # 5.5 ms, measured in a column too, is halved alike (2.75)
    from coldbrew.compiler.plan.scheduler import layer_pairs
    from coldbrew.compiler.plan.simulate import first_execute_ms

    table = _direct_table(0.2, 5.5)
    gemm = table["layers"][0]["candidates"][1]
    assert first_execute_ms(gemm, "direct", "core", 2) == pytest.approx(5.5)  # nothing shipped measured
    gemm["execute_first_cached_ms"] = {"core": {"2": _stat(2.5)}}
    assert first_execute_ms(gemm, "cached", "core", 2) == pytest.approx(2.5)
    assert first_execute_ms(gemm, "direct", "core", 2) == pytest.approx(2.75)
    assert first_execute_ms(gemm, "raw", "core", 2) == pytest.approx(5.0)  # transformed in the run: the column's
    r = simulate(_plan(form="direct", variant="conv2d.im2col_gemm"), table)
    assert r["latency_ms"] == pytest.approx(5.5 + 0.2 + 2.75 + 1)
    pairs = {p[1]: p[3] for p in layer_pairs(table["layers"][0], table, 2, 2, "fp16") if p[0] == "conv2d.im2col_gemm"}
    assert pairs["direct"] == pytest.approx(2.75) and pairs["cached"] == pytest.approx(2.5)


def test_preparation_is_spread_over_every_free_core_and_balanced():
    """Algorithm 1 with several preparation workers: 6 cores, 2 execution
    threads, a chain whose raw preparations (a costly transform each) take
    longer than the executions. The plan puts them on more than one of
    the 4 free cores, predicts less than the best plan with one worker, and
    the workers' loads are balanced to within one preparation."""
    from coldbrew.compiler.plan.scheduler import configurations, schedule_config

    t = _with_one_thread(_chain(12, [{"name": "core", "ids": list(range(6))}]))
    for layer in t["layers"]:
        layer["candidates"] = layer["candidates"][:1]  # winograd only: raw 1 + 6 ms, or cached 4 ms
    assert (2, 4) in configurations(t) and (1, 5) in configurations(t)
    one, four = schedule_config(t, 2, 1), schedule_config(t, 2, 4)
    assert four["predicted_ms"] < 0.8 * one["predicted_ms"]
    used = [q for q in four["queues"].values() if q]
    assert len(set(used)) > 1 and max(used) <= 4
    cold = choose(t, "cold")
    assert len({q for q in cold["queues"].values() if q}) > 1
    assert cold["predicted_ms"] <= four["predicted_ms"] + 1e-9


def test_balancing_moves_the_largest_fitting_preparation():
    """The little-core loop on its own (the predictor here: the most loaded
    queue): queue 1 holds 5 + 3 + 1 ms, queue 2 holds 1 ms; the 5 ms item
    (the largest under the 8 ms gap) moves (9 / 1 -> 4 / 6), then queue 2's
    1 ms item (under the 2 ms gap: 5 / 5), then nothing fits."""
    from coldbrew.compiler.plan.scheduler import _loads, balance

    prep = [0.0, 5.0, 3.0, 1.0, 1.0]
    queues = [0, 1, 1, 1, 2]
    got, cost = balance(queues, prep, 2, lambda q: max(_loads(q, prep, 2)))
    assert got == [0, 2, 1, 1, 1] and cost == 5.0
