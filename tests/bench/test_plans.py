"""bench/plans.py's judging: one plan under two arms' names is one bundle
measured once, and the simulator's ranking is checked strictly and with
the criterion's 5 % ties."""
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import plans  # noqa: E402

from coldbrew.compiler import compile_model  # noqa: E402
from coldbrew.compiler.plan.simulate import plan_of_bundle  # noqa: E402


def test_arms_with_the_same_plan_are_one_bundle(small_model, tmp_path):
    paths = {}
    for arm, kw in (("default", {}), ("again", {}), ("raw", {"weights": "raw"}), ("cached", {"weights": "cached"})):
        paths[arm] = str(tmp_path / f"{arm}.brew")
        compile_model(small_model, paths[arm], **kw)
    same = plans.same_plans({arm: plan_of_bundle(path) for arm, path in paths.items()})
    assert same["default"] == "default" and same["again"] == "default"
    assert same["raw"] == "raw"  # every weight transformed at run time: a plan of its own
    assert same["cached"] == "default"  # the default plan ships every weight cached


def test_the_simulator_ranks_strictly_only_when_every_pair_is_ordered_alike():
    assert plans.ranks_agree([10, 10.2, 12, 15], [5, 5.1, 6, 7]) == (True, True)
    assert plans.ranks_agree([10, 10.2, 12, 15], [5, 5.1, 7, 6]) == (False, False)  # 12 and 15 swapped
    assert plans.ranks_agree([10, 10, 12], [5, 5, 6]) == (True, True)  # one plan under two names


def test_ties_forgive_only_pairs_both_put_within_five_percent():
    # 10.2 and 10.1 measured 1 % apart, predicted the other way 2 % apart: a tie
    assert plans.ranks_agree([10, 10.2, 10.1, 15], [5, 5.1, 5.0, 7]) == (False, True)
    # measured 20 % apart but predicted equal: the simulator did not rank them
    assert plans.ranks_agree([10, 12], [5, 5]) == (False, False)
    # predicted 20 % apart, measured the other way within 5 %: not forgiven
    assert plans.ranks_agree([10.2, 10], [5, 6]) == (False, False)


def test_spread_is_the_samples_quartiles():
    samples = [{"cold_ms": v} for v in (8.0, 8.3, 10.4, 10.8, 11.6)]
    assert plans.spread(samples) == "8.2-11.2"  # statistics.quantiles' exclusive method
    assert plans.spread(samples[:1]) == "-"


def test_every_sample_is_saved(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(plans, "OUT", str(tmp_path))
    plans.save_samples({("squeezenet", "cold"): [{"cold_ms": 7.1}, {"cold_ms": 9.5}]}, 2)
    saved = json.loads((tmp_path / "samples.json").read_text())
    assert saved == {"rounds": 2, "cold_ms": {"squeezenet/cold": [7.1, 9.5]}}


def test_the_cold_and_file_cached_samples_run_the_bundle(small_bundle):
    """The sample process in both ways the floor table uses: the file
    evicted (cold), and read into the page cache first (--file-cached)."""
    for extra in ([], ["--file-cached"]):
        s = plans.sample([small_bundle, *extra])
        assert s["cold_ms"] > 0 and s["cold_ms"] >= s["load_ms"]
        assert len(s["runs_ms"]) == plans.WARM_RUNS


def test_the_a_a_control_is_the_gap_between_two_medians_of_one_bundle():
    cold = {("a", "cold"): 10.0, ("a", plans.AA): 11.0, ("b", "cold"): 8.0, ("b", plans.AA): 8.0,
            ("c", "cold"): 6.0, ("c", plans.AA): 5.0}
    gaps, noise = plans.aa_noise(cold, ["a", "b", "c"])
    assert [round(g, 3) for g in gaps.values()] == [0.091, 0.0, 0.2]
    assert round(noise, 3) == 0.091  # the median over the models


def test_verdicts_count_fastest_and_ranking_at_the_margin_given():
    meas = dict(zip(plans.COMPARED, [10.0, 10.0, 9.0, 14.0, 10.0, 9.8]))  # cold 9.8 against cold-greedy 9.0
    pred = dict(zip(plans.COMPARED, [8.0, 8.0, 7.5, 11.0, 8.0, 7.4]))
    cold = {("m", a): v for a, v in meas.items()}
    predicted = {("m", a): v for a, v in pred.items()}
    assert plans.verdicts(cold, predicted, ["m"], 0.05) == (0, 0, 0)  # 8.9 % slower; 9.0 < 9.8 ranked the other way
    assert plans.verdicts(cold, predicted, ["m"], 0.10) == (1, 0, 1)  # within 10 %: both ties
