"""Plans compared cold, the simulator's ranking, the paper's ablation and the
floor, in one run.

    python bench/plans.py [MODEL[,MODEL...]] [ROUNDS]
    python bench/plans.py MODEL[,corpus:NAME...] [ROUNDS] --ablation

Per model, one device cost table (compiler/measure/profile.py) and these bundles
(2 threads; kernels tuned, as `coldbrew compile --tune` does on the
machine it runs on, with the same tuning in every arm, and the cost table times the
tuned kernels):

  plans compared (the scheduler's criterion)
    default      default variants, cached weights, preparation inline
    warm         warm-greedy: the fastest warm variant per layer, cached
    cold-greedy  least sequential cold cost per layer, inline
    all-raw      the scheduler's plan with every weight raw (transformed at run time)
    all-cached   the scheduler's plan with every weight cached
    cold         the scheduler (compile --plan cold)
  ablation (papers/nnv12-cold-inference.txt, Fig. 13)
    baseline     warm variants, every weight raw and transformed inline (what
                 an engine that prepares at load does)
    + kernels    per layer the variant with the least cold cost among raw
                 weights only (cold-aware kernel selection), inline
    + cached     cold-greedy: variant and weight form together, inline
    + pipeline   the scheduler: preparation placed on a worker, threads chosen

(--ablation: these four arms alone, on zoo models or corpus:NAME ones,
with how many layers the warm and the cold plan choose differently and
whether "+ kernels" beats the baseline where they do) and onnxruntime
default and its best cold configuration (ORT format
optimized offline, memory mapped, optimizations and prepacking off).
Samples are fresh processes (bench/harness/cold_sample.py: memory settled, file
evicted, load + first result), all arms interleaved in rounds, each round
in its own shuffled order; each sample also times 20 warm runs. Arms
whose bundles carry the same plan (the same variant, weight form and
queues per layer, the same threads) are one bundle measured once and
shown under each arm's name, marked "=": the same plan has one latency,
and two samplings of it would only rank noise. The simulator's ranking
is checked two ways: strictly (the orders of the six medians equal), and
with ties (no two plans ordered one way by the simulator and the other
way by the measurement where either puts them more than 5 % apart, the
criterion's own margin for "fastest"). Storage bandwidth is measured in
every round (the largest bundle read cold by the protocol's read_rate,
the runtime's way, as the profiler measures it). Floor per model = max(faster warm of coldbrew and
onnxruntime, bundle bytes / bandwidth). Under each model's medians, each
arm's first to third quartile (q1-q3), and every sample is written to
out/plans/samples.json: this host's cold samples can fall in two clusters
a quarter apart (the disk), and a median of five then moves with them.
How far that moves a median is measured in the same run: the scheduler's
bundle is sampled twice in every round, under two names (an A/A control:
one plan, so any gap between its two medians is the run's noise). The
ranking and "fastest" are printed once more with that noise as their
margin where it exceeds 5 %: a gap smaller than two samplings of one
bundle show orders nothing.
"""
import json
import os
import random
import statistics
import sys
import tempfile

from harness.common import save_ort_best
from harness.common import ROOT, geomean, host_isa, model_source, zoo
from coldbrew.compiler.measure.protocol import cold_process, cold_read_ms, read_rate  # noqa: E402
from coldbrew.compiler.measure.protocol import describe as cold_protocol  # noqa: E402

from coldbrew.compiler import compile_model
from coldbrew.compiler.plan.scheduler import choose, layer_pairs
from coldbrew.compiler.measure.profile import profile
from coldbrew.compiler.measure.tune import tune
from coldbrew.compiler.options import Options
from coldbrew.compiler.pipeline import front_end
from coldbrew.compiler.plan.simulate import plan_of_bundle, simulate

SAMPLER = os.path.join(ROOT, "bench", "harness", "cold_sample.py")
OUT = os.path.join(ROOT, "out", "plans")  # samples.json: every arm's cold samples
COMPARED = ["default", "warm", "cold-greedy", "all-raw", "all-cached", "cold"]
AA = "cold (A/A)"  # the scheduler's bundle sampled a second time in every round
ABLATION = [("baseline", "baseline"), ("+ kernels", "kernels"), ("+ cached", "cold-greedy"), ("+ pipeline", "cold")]
WARM_RUNS = 20


def raw_only_variants(table):
    """Per layer, the variant with the least read + transform + first
    execution when every weight ships raw."""
    out = {}
    for layer in table["layers"]:
        pairs = layer_pairs(layer, table, table["threads"], 1)
        raw = [p for p in pairs if p[1] == "raw"] or pairs
        out[layer["name"]] = min(raw, key=lambda p: p[2] + p[3])[0]
    return out


def compile_arms(proto, table, d, m, only=None, shapes=None, binds=None):
    """{arm: bundle path}; every plan compiled once (`only`: these arms)."""
    cold, warm = choose(table, "cold"), choose(table, "warm")
    forced = {"variants": cold["variants"], "queues": cold["queues"], "threads": cold["threads"]}
    specs = {
        "default": {},
        "warm": {"plan": "warm"},
        "cold-greedy": {"plan": "cold-greedy"},
        "all-raw": {**forced, "weights": "raw"},
        "all-cached": {**forced, "weights": "cached"},
        "cold": {"plan": "cold"},
        "baseline": {"variants": warm["variants"], "weights": "raw"},
        "kernels": {"variants": raw_only_variants(table), "weights": "raw"},
    }
    paths = {}
    for arm, kw in specs.items() if only is None else ((a, specs[a]) for a in only):
        paths[arm] = f"{d}/{m}.{arm}.brew"
        # the tuning is cached: every arm gets the same
        compile_model(proto, paths[arm], tune=True, input_shapes=shapes, constants=binds, **kw)
    return paths


def same_plans(plans):
    """{arm: the first arm (in `plans`' order) with the same plan}, from
    {arm: the plan its bundle carries (plan_of_bundle)}; arms with a plan of
    their own map to themselves."""
    first, out = {}, {}
    for arm, plan in plans.items():
        out[arm] = first.setdefault(json.dumps(plan, sort_keys=True), arm)
    return out


def ranks_agree(meas, pred, margin=0.05):
    """(strict, with ties): whether the simulator orders the plans as
    measured. Strictly: every pair ordered alike (equal only where both
    are equal: one plan under two names). With ties, a pair counts as
    ordered by a source only when its two figures differ by more than
    `margin`; no pair may be ordered one way by one source and the other
    way (or not at all) by the other."""
    idx = range(len(meas))

    def apart(v, i, j):
        return abs(v[i] - v[j]) > margin * min(v[i], v[j])

    def sign(v, i, j):
        return (v[i] > v[j]) - (v[i] < v[j])

    strict = all(sign(meas, i, j) == sign(pred, i, j) for i in idx for j in idx if i < j)
    ties = all(sign(meas, i, j) == sign(pred, i, j) for i in idx for j in idx
               if i < j and (apart(meas, i, j) or apart(pred, i, j)))
    return strict, ties


def aa_noise(cold, models):
    """The A/A control's noise: per model, how far apart the two medians of
    the scheduler's one bundle fell (|a / b - 1|), and their median over the
    models, the run's margin of noise."""
    gaps = {m: abs(cold[(m, "cold")] / cold[(m, AA)] - 1) for m in models}
    return gaps, statistics.median(gaps.values())


def model_verdict(cold, predicted, m, margin):
    """(fastest, strictly, with ties) for model m: whether the scheduler's
    plan is fastest (within `margin`), and whether the simulator ranks the
    plans as measured, strictly and with ties of `margin`."""
    meas = [cold[(m, a)] for a in COMPARED]
    pred = [predicted[(m, a)] for a in COMPARED]
    return (meas[-1] <= (1 + margin) * min(meas), *ranks_agree(meas, pred, margin))


def verdicts(cold, predicted, models, margin):
    """(fastest, strictly, with ties): over the models, how many each of
    model_verdict's three holds for."""
    per = [model_verdict(cold, predicted, m, margin) for m in models]
    return tuple(sum(v[k] for v in per) for k in range(3))


def bandwidth_mb_s(path):
    """The protocol's storage bandwidth (read_rate), on this file."""
    return read_rate(path) / 1e6


def sample(argv):
    out = cold_process([sys.executable, SAMPLER, *argv, "--threads", "2", "--runs", str(WARM_RUNS)],
                       capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def spread(samples):
    """An arm's cold samples' first to third quartile, "q1-q3" (ms): how far
    apart its rounds fell, beside the median the comparisons use."""
    cold = [x["cold_ms"] for x in samples]
    if len(cold) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(cold, n=4)
    return f"{q1:.1f}-{q3:.1f}"


def save_samples(res, rounds):
    """Every arm's cold samples in round order, for a later look at their
    spread: out/plans/samples.json."""
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "samples.json"), "w") as f:
        json.dump({"rounds": rounds, "cold_ms": {f"{m}/{arm}": [x["cold_ms"] for x in v] for (m, arm), v in res.items()}},
                  f, indent=1)
    print(f"samples: {os.path.join(OUT, 'samples.json')}")


def ablation(models, rounds):
    """--ablation: the ablation's arms alone, on zoo or corpus:NAME models
    (no onnxruntime arms, so any model the corpus binds works), sampled
    cold in interleaved rounds, the simulator's prediction under each;
    per model how many layers the warm and the cold plan choose
    differently, and whether "+ kernels" is faster than the baseline where
    they differ (the issue's criterion; 5 % apart to count)."""
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="coldbrew-ablation-") as d:
        arms, alias, predicted, differ, names = {}, {}, {}, {}, []
        for m in models:
            src, shapes, binds = model_source(m)
            name = m.split(":")[-1]
            names.append(name)
            front = front_end(src, Options(input_shapes=shapes, constants=binds))
            table = profile(front, 2, tuning=tune(front, 2), direct=[])
            warm, cold = choose(table, "warm"), choose(table, "cold")
            differ[name] = sum(v != warm["variants"].get(n) for n, v in cold["variants"].items())
            paths = compile_arms(src, table, d, name, [a for _, a in ABLATION], shapes, binds)
            plans = {arm: plan_of_bundle(path) for arm, path in paths.items()}
            for arm, first in same_plans(plans).items():
                alias[(name, arm)] = (name, first)
                if first == arm:
                    arms[(name, arm)] = [paths[arm]]
                predicted[(name, arm)] = simulate(plans[arm], table)["latency_ms"]
            print(f"{name}: compiled", flush=True)
        res = {}
        for r in range(rounds):
            order = list(arms)
            random.Random(r).shuffle(order)
            for key in order:
                res.setdefault(key, []).append(sample(arms[key]))
    cold = {k: med(x["cold_ms"] for x in res[a]) for k, a in alias.items()}
    print(f"\nablation (Fig. 13) on {host_isa()}, 2 threads, {rounds} interleaved rounds, fresh process per "
          f"sample; cold ms, medians (predicted under each); {cold_protocol()}")
    print(f"{'model':24s} {'differ':>6s} " + " ".join(f"{n:>11s}" for n, _ in ABLATION) + "  + kernels / baseline")
    faster = 0
    for m in names:
        base, kern = cold[(m, "baseline")], cold[(m, "kernels")]
        faster += bool(differ[m]) and kern < 0.95 * base
        same = " (same plan)" if alias[(m, "kernels")] == alias[(m, "baseline")] else ""
        print(f"{m:24s} {differ[m]:6d} " + " ".join(f"{cold[(m, a)]:11.2f}" for _, a in ABLATION)
              + f"  {kern / base:.2f}{same}")
        print(f"{'  predicted':24s} {'':6s} " + " ".join(f"{predicted[(m, a)]:11.2f}" for _, a in ABLATION))
    print(f"{'geomean':24s} {'':6s} " + " ".join(f"{geomean([cold[(m, a)] for m in names]):11.2f}"
                                                for _, a in ABLATION))
    mixed = sum(bool(differ[m]) for m in names)
    print(f"warm and cold plans differ on {mixed} of {len(names)} models; \"+ kernels\" at least 5 % faster than "
          f"the baseline on {faster} of those {mixed}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    models = args[0].split(",") if args else ["squeezenet", "mobilenet_v2", "resnet18", "googlenet"]
    rounds = int(args[1]) if len(args) > 1 else 5
    if "--ablation" in sys.argv:
        return ablation(models, rounds)
    if any(m.startswith("corpus:") for m in models):
        raise SystemExit("corpus models take --ablation (the onnxruntime arms feed zoo models only)")
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="coldbrew-plans-") as d:
        arms, predicted, sizes, alias, scheduled = {}, {}, {}, {}, []
        for m in models:
            proto = zoo().build(m)
            onnx_path = f"{d}/{m}.onnx"
            with open(onnx_path, "wb") as f:
                f.write(proto.SerializeToString())
            save_ort_best(onnx_path, f"{d}/{m}.ort")
            front = front_end(proto)
            table = profile(front, 2, tuning=tune(front, 2), direct=[])
            paths = compile_arms(proto, table, d, m)
            scheduled.append(paths["cold"])
            plans = {arm: plan_of_bundle(path) for arm, path in paths.items()}
            for arm, first in same_plans(plans).items():
                alias[(m, arm)] = (m, first)
            for arm, path in paths.items():
                if alias[(m, arm)] == (m, arm):
                    arms[(m, arm)] = [path]
                predicted[(m, arm)] = simulate(plans[arm], table)["latency_ms"]
                sizes[(m, arm)] = os.path.getsize(path)
            alias[(m, "ort-default")], alias[(m, "ort-best")] = (m, "ort-default"), (m, "ort-best")
            arms[(m, "ort-default")] = [onnx_path, "--ort"]
            arms[(m, "ort-best")] = [f"{d}/{m}.ort", "--ort-best"]
            arms[(m, AA)], alias[(m, AA)] = arms[alias[(m, "cold")]], (m, AA)
            print(f"{m}: compiled", flush=True)
        # (the scheduler's bundle, measured under another arm's name where
        # that arm's plan is the same)
        biggest = max(scheduled, key=os.path.getsize)
        res, bw, alone, cached = {}, [], {}, {}
        for r in range(rounds):
            bw.append(bandwidth_mb_s(biggest))
            order = list(arms) + [(m, x) for m in models for x in ("read alone", "file cached")]
            random.Random(r).shuffle(order)
            for key in order:
                m, arm = key
                bundle = arms[alias[(m, "cold")]][0]  # the scheduler's, as its arm measures it
                if arm == "read alone":  # brought in, nothing run
                    alone.setdefault(m, []).append(cold_read_ms(bundle))
                elif arm == "file cached":  # its cold start from a file in the page cache
                    cached.setdefault(m, []).append(sample([bundle, "--file-cached"])["cold_ms"])
                else:
                    res.setdefault(key, []).append(sample(arms[key]))
    save_samples(res, rounds)
    cold = {k: med(x["cold_ms"] for x in res[a]) for k, a in alias.items()}
    warm = {k: med(med(x["runs_ms"]) for x in res[a]) for k, a in alias.items()}
    mb_s = med(bw)
    print(f"\nplans on {host_isa()}, 2 threads, {rounds} interleaved rounds, fresh process per sample; "
          f"storage {mb_s:.0f} MB/s (median of {len(bw)}); ms, medians; {cold_protocol()}")
    print(f"{'model':14s} " + " ".join(f"{a:>11s}" for a in COMPARED) + "  best?  simulator order = measured?")
    for m in models:
        meas = [cold[(m, a)] for a in COMPARED]
        pred = [predicted[(m, a)] for a in COMPARED]
        best, strict, ties = model_verdict(cold, predicted, m, 0.05)
        print(f"{m:14s} " + " ".join(f"{v:11.2f}" for v in meas) + f"  {'yes' if best else 'no':5s}  "
              f"{'yes' if strict else 'no'} strictly, {'yes' if ties else 'no'} with ties")
        print(f"{'  q1-q3':14s} " + " ".join(f"{spread(res[alias[(m, a)]]):>11s}" for a in COMPARED))
        print(f"{'  predicted':14s} " + " ".join(f"{v:11.2f}" for v in pred))
        same = [f"{a} = {alias[(m, a)][1]}" for a in COMPARED if alias[(m, a)] != (m, a)]
        if same:
            print(f"{'  same plan':14s} " + ", ".join(same))
    wins, agree, agree_ties = verdicts(cold, predicted, models, 0.05)
    print(f"scheduler's plan fastest (within 5%) on {wins} of {len(models)} models; simulator ranks the plans in "
          f"the measured order on {agree} of {len(models)} strictly, on {agree_ties} with ties (5 %)")
    gaps, noise = aa_noise(cold, models)
    print(f"A/A control (the scheduler's bundle, two medians of {rounds} samples each, one plan): "
          + ", ".join(f"{m} {100 * g:.1f} %" for m, g in gaps.items()) + f"; median {100 * noise:.1f} %")
    if noise > 0.05:
        wins, _, agree_ties = verdicts(cold, predicted, models, noise)
        print(f"with the run's noise as the margin ({100 * noise:.1f} %): fastest on {wins} of {len(models)}; "
              f"simulator ranks as measured with ties on {agree_ties} of {len(models)}")
    print("\nablation (Fig. 13): cold ms")
    print(f"{'model':14s} " + " ".join(f"{name:>11s}" for name, _ in ABLATION))
    for m in models:
        print(f"{m:14s} " + " ".join(f"{cold[(m, a)]:11.2f}" for _, a in ABLATION))
    print(f"{'geomean':14s} " + " ".join(f"{geomean([cold[(m, a)] for m in models]):11.2f}" for _, a in ABLATION))
    print("\nfloor: max(faster warm of coldbrew and onnxruntime, bundle bytes / bandwidth)")
    print(f"{'model':14s} {'cold':>8s} {'floor':>8s} {'/floor':>7s} {'ort best':>9s} {'vs best':>8s} "
          f"{'ort dflt':>9s} {'vs dflt':>8s} {'cb warm':>8s} {'ort warm':>9s}")
    ratios = {"floor": [], "best": [], "dflt": []}
    read_warm = {}  # the diagnostic's: (the bundle read alone, the faster warm)
    for m in models:
        c = cold[(m, "cold")]
        fastest_warm = min(min(warm[(m, a)] for a in COMPARED), warm[(m, "ort-default")], warm[(m, "ort-best")])
        floor = max(fastest_warm, sizes[(m, "cold")] / 1e6 / mb_s * 1e3)
        if None not in alone[m]:
            read_warm[m] = (med(alone[m]), fastest_warm)
        best, dflt = cold[(m, "ort-best")], cold[(m, "ort-default")]
        ratios["floor"].append(c / floor)
        ratios["best"].append(best / c)
        ratios["dflt"].append(dflt / c)
        print(f"{m:14s} {c:8.2f} {floor:8.2f} {c / floor:7.2f} {best:9.2f} {best / c:8.2f} {dflt:9.2f} "
              f"{dflt / c:8.2f} {min(warm[(m, a)] for a in COMPARED):8.2f} "
              f"{min(warm[(m, 'ort-default')], warm[(m, 'ort-best')]):9.2f}")
    print(f"geomean: cold / floor {geomean(ratios['floor']):.2f} (goal <= 1.3); onnxruntime best cold / coldbrew "
          f"{geomean(ratios['best']):.2f} (goal >= 1.5); onnxruntime default / coldbrew {geomean(ratios['dflt']):.2f} "
          "(goal >= 4)")
    if read_warm:
        print("\ndiagnostic, not the criterion: the floor with the bundle's own cold read (the scheduler's bundle "
              "brought in alone, the runtime's way, in every round; median) in place of bytes / bandwidth")
        print("and the scheduler's bundle started cold from a file already in the page cache (a fresh process, "
              "the file read into memory before its clock): the cold start with no storage in it")
        print(f"{'model':14s} {'MB':>7s} {'bytes/bw':>9s} {'read alone':>11s} {'floor':>8s} {'cold':>8s} {'/floor':>7s} "
              f"{'file cached':>12s} {'/warm':>7s}")
        own, first = [], []
        for m, (read, fastest_warm) in read_warm.items():
            c, h, fl = cold[(m, "cold")], med(cached[m]), max(read, fastest_warm)
            own.append(c / fl)
            first.append(h / fastest_warm)
            print(f"{m:14s} {sizes[(m, 'cold')] / 1e6:7.2f} {sizes[(m, 'cold')] / 1e6 / mb_s * 1e3:9.2f} {read:11.2f} "
                  f"{fl:8.2f} {c:8.2f} {c / fl:7.2f} {h:12.2f} {h / fastest_warm:7.2f}")
        print(f"geomean over {len(read_warm)} models: cold / that floor {geomean(own):.2f}; from a file "
              f"in the page cache / the faster warm {geomean(first):.2f} (/warm: the first result's "
              "cost in a fresh process with no storage read at all)")


if __name__ == "__main__":
    main()
