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

from harness.common import host_isa, zoo

from coldbrew.compiler import compile_model
from coldbrew.compiler.measure.profile import profile
from coldbrew.compiler.plan.scheduler import choose

LIMIT_S = {"zoo": 120, "corpus": 180}


def _source(model):
    """(model: ModelProto or path, input shapes, bound inputs) of a zoo or corpus: model."""
    if not model.startswith("corpus:"):
        return zoo().build(model), None, None
    import numpy as np
    import onnx

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
    import fetch

    (entry,) = fetch.models([model.split(":", 1)[1]])
    path = fetch.fetched(entry)
    if path is None:
        raise SystemExit(f"{model} is not fetched: python bench/corpus/fetch.py {entry['name']}")
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
             for i in onnx.load(path, load_external_data=False).graph.input}
    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    binds = {k: np.array(v["bind"], types[k]) for k, v in entry["inputs"].items() if "bind" in v}
    return path, shapes or None, binds or None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show, fresh = "--layers" in sys.argv, "--fresh" in sys.argv
    if fresh:
        os.environ["COLDBREW_CACHE"] = tempfile.mkdtemp(prefix="coldbrew-cache-")
    models = args or list(zoo().MODELS)
    print(f"warm plan against cold plan on {host_isa()}, 2 threads (predicted cold ms: the simulator's); "
          f"{'an empty cache' if fresh else 'cached tables where there are (times 0)'}")
    print(f"{'model':24s} {'layers':>6s} {'differ':>6s} {'profile s':>9s} {'compile s':>9s} {'total s':>8s} "
          f"{'cold plan':>10s} {'warm plan':>10s}")
    differ, within = 0, 0
    for m in models:
        src, shapes, binds = _source(m)
        t0 = time.perf_counter()
        table = profile(src, input_shapes=shapes, constants=binds, direct=[])  # what compile_model asks for
        t1 = time.perf_counter()
        compile_model(src, input_shapes=shapes, constants=binds, plan="cold")  # the table above, from the cache
        t2 = time.perf_counter()
        took, total = (0, 0) if table["cached"] else (t1 - t0, t2 - t0)
        within += total <= LIMIT_S["corpus" if m.startswith("corpus:") else "zoo"]
        warm, cold = choose(table, "warm"), choose(table, "cold")
        diff = [n for n, v in cold["variants"].items() if v != warm["variants"].get(n)]
        differ += bool(diff)
        name = m.split(":")[-1]
        print(f"{name:24s} {len(table['layers']):6d} {len(diff):6d} {took:9.1f} {t2 - t1:9.1f} {total:8.1f} "
              f"{cold['predicted_ms']:10.2f} {warm['predicted_ms']:10.2f}", flush=True)
        for n in diff if show else ():
            print(f"    {n}: warm {warm['variants'].get(n)}, cold {cold['variants'][n]} {cold['forms'].get(n)}")
    print(f"the plans differ on {differ} of {len(models)} models")
    if fresh:
        print(f"planned from an empty cache within the limit (zoo {LIMIT_S['zoo']} s, corpus {LIMIT_S['corpus']} s): "
              f"{within} of {len(models)}")


if __name__ == "__main__":
    main()
