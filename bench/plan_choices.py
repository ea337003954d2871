"""Where the warm and the cold plan choose differently, and how long a
plan takes to make: per model, the layers whose variant `--plan warm`
(the warm-fastest per layer, cached) and `--plan cold` (the scheduler on
the cost table) do not share, the cold plan's weight form for each, both
plans' predicted cold start, and the time of `coldbrew compile --plan
cold` (fp32 weights): the profile, then the compile of the planned bundle.

    python bench/plan_choices.py [MODEL ...] [--layers] [--fresh]

MODEL names a zoo model (examples/zoo.py; default: all ten) or, as
corpus:NAME, a corpus model (bench/corpus/models.json, fetched by
bench/corpus/fetch.py; its manifest's input shapes and bound inputs). The
cost table is this machine's (compiler/measure/profile.py): profiled here
or from the cache, so the times are those of an empty cache only when the
table was measured now; `--fresh` starts from an empty cache (a temporary
COLDBREW_CACHE: tables, tuning) and counts the models planned within the
issue's limits (2 minutes for a zoo model, 3 for a corpus model).
"""
import os
import sys
import tempfile
import time

from harness.common import host_isa, model_source, zoo

from coldbrew.compiler import compile_model
from coldbrew.compiler.measure.profile import profile
from coldbrew.compiler.options import Options
from coldbrew.compiler.pipeline import front_end
from coldbrew.compiler.plan.scheduler import choose

LIMIT_S = {"zoo": 120, "corpus": 180}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show, fresh = "--layers" in sys.argv, "--fresh" in sys.argv
    if fresh:
        os.environ["COLDBREW_CACHE"] = tempfile.mkdtemp(prefix="coldbrew-cache-")
    models = args or list(zoo().MODELS)
    print(f"warm plan against cold plan on {host_isa()}, 2 threads (predicted cold ms: the simulator's); "
          f"{'an empty cache, ' + os.environ['COLDBREW_CACHE'] if fresh else 'cached tables where there are (times 0)'}")
    print(f"{'model':24s} {'layers':>6s} {'differ':>6s} {'profile s':>9s} {'compile s':>9s} {'total s':>8s} "
          f"{'cold plan':>10s} {'warm plan':>10s}")
    differ, within, failed = 0, 0, []
    for m in models:
        src, shapes, binds = model_source(m)
        name = m.split(":")[-1]
        t0 = time.perf_counter()
        try:
            front = front_end(src, Options(input_shapes=shapes, constants=binds))
            table = profile(front, direct=[])  # what compile_model asks for
            t1 = time.perf_counter()
            compile_model(src, input_shapes=shapes, constants=binds, plan="cold")  # the table above, from the cache
        except Exception as e:  # one model's failure is reported, the others still measured
            failed.append(name)
            print(f"{name:24s} failed: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}", flush=True)
            continue
        t2 = time.perf_counter()
        took, total = (0, 0) if table["cached"] else (t1 - t0, t2 - t0)
        within += total <= LIMIT_S["corpus" if m.startswith("corpus:") else "zoo"]
        warm, cold = choose(table, "warm"), choose(table, "cold")
        diff = [n for n, v in cold["variants"].items() if v != warm["variants"].get(n)]
        differ += bool(diff)
        print(f"{name:24s} {len(table['layers']):6d} {len(diff):6d} {took:9.1f} {t2 - t1:9.1f} {total:8.1f} "
              f"{cold['predicted_ms']:10.2f} {warm['predicted_ms']:10.2f}", flush=True)
        for n in diff if show else ():
            print(f"    {n}: warm {warm['variants'].get(n)}, cold {cold['variants'][n]} {cold['forms'].get(n)}")
    print(f"the plans differ on {differ} of {len(models)} models" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if fresh:
        print(f"planned from an empty cache within the limit (zoo {LIMIT_S['zoo']} s, corpus {LIMIT_S['corpus']} s): "
              f"{within} of {len(models)}")


if __name__ == "__main__":
    main()
