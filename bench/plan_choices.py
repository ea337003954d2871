"""Where the warm and the cold plan choose differently: per model, the
layers whose variant `--plan warm` (the warm-fastest per layer, cached)
and `--plan cold` (the scheduler on the cost table) do not share, the
cold plan's weight form for each, and both plans' predicted cold start.

    python bench/plan_choices.py [MODEL ...] [--layers]

MODEL names a zoo model (examples/zoo.py; default: all ten) or, as
corpus:NAME, a corpus model (bench/corpus/models.json, fetched by
bench/corpus/fetch.py; its manifest's input shapes and bound inputs). The
cost table is this machine's (profiled here, or from the cache:
compiler/measure/profile.py), so the profile time printed is that of an
empty cache only when the table was measured now (0 when cached).
"""
import os
import sys
import time

from harness.common import host_isa, zoo

from coldbrew.compiler.measure.profile import profile
from coldbrew.compiler.plan.scheduler import choose


def _table(model):
    if not model.startswith("corpus:"):
        return profile(zoo().build(model))
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
    return profile(path, input_shapes=shapes or None, constants=binds or None)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show = "--layers" in sys.argv
    models = args or list(zoo().MODELS)
    print(f"warm plan against cold plan on {host_isa()}, 2 threads (predicted cold ms: the simulator's)")
    print(f"{'model':24s} {'layers':>6s} {'differ':>6s} {'profile s':>9s} {'cold plan':>10s} {'warm plan':>10s}")
    differ = 0
    for m in models:
        t0 = time.perf_counter()
        table = _table(m)
        took = time.perf_counter() - t0
        warm, cold = choose(table, "warm"), choose(table, "cold")
        diff = [n for n, v in cold["variants"].items() if v != warm["variants"].get(n)]
        differ += bool(diff)
        name = m.split(":")[-1]
        print(f"{name:24s} {len(table['layers']):6d} {len(diff):6d} {took if not table['cached'] else 0:9.1f} "
              f"{cold['predicted_ms']:10.2f} {warm['predicted_ms']:10.2f}", flush=True)
        for n in diff if show else ():
            print(f"    {n}: warm {warm['variants'].get(n)}, cold {cold['variants'][n]} {cold['forms'].get(n)}")
    print(f"the plans differ on {differ} of {len(models)} models")


if __name__ == "__main__":
    main()
