"""The cold path, before and after: a bundle in the previous layout (weights
before the code, verified whole at open) on the previous runtime, against the
current layout and runtime with preparation inline and with preparation on a
worker ahead of execution; onnxruntime default alongside. Samples of every
arm are interleaved in rounds (bench/harness/cold_sample.py: fresh process, file
evicted, load + first result).

    python bench/experiments/cold_path.py MODEL[,MODEL...] [ROUNDS] --old-rev REV

The previous arm needs the writer and the runtime of git revision REV: the
script builds that runtime into a temporary folder and loads that writer.
Kernels are untuned (the same in every arm).
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness
from harness.common import ROOT, geomean, zoo  # noqa: E402
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402

from coldbrew.compiler import compile_model  # noqa: E402
import coldbrew.compiler.passes.write_bundle as wb  # noqa: E402


def previous(rev, tmp):
    """(write_bundle module, runtime library path) of git revision `rev`."""
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    # the writer's path at REV: compiler/passes/ since the compiler's folders, compiler/ before
    writer = next(p for p in ("compiler/passes/write_bundle.py", "compiler/write_bundle.py")
                  if subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{rev}:{p}"], capture_output=True).returncode == 0)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "runtime", "schemas", writer],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    subprocess.run([sys.executable, os.path.join(src, "runtime", "build.py"), os.path.join(tmp, "lib")], check=True,
                   capture_output=True)
    spec = importlib.util.spec_from_file_location("coldbrew.compiler.previous_write_bundle",
                                                  os.path.join(src, writer))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, os.path.join(tmp, "lib", "libcoldbrew.so")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rev = sys.argv[sys.argv.index("--old-rev") + 1] if "--old-rev" in sys.argv else None
    if rev in args:
        args.remove(rev)
    models = args[0].split(",") if args else ["mobilenet_v2", "resnet50", "squeezenet", "googlenet"]
    rounds = int(args[1]) if len(args) > 1 else 5
    sampler = os.path.join(ROOT, "bench", "harness", "cold_sample.py")
    with tempfile.TemporaryDirectory(prefix="coldbrew-coldpath-") as d:
        old = previous(rev, d) if rev else None
        arms = []
        for m in models:
            proto = zoo().build(m)
            onnx_path = f"{d}/{m}.onnx"
            with open(onnx_path, "wb") as f:
                f.write(proto.SerializeToString())
            if old:
                current = wb.run
                wb.run = old[0].run
                try:
                    compile_model(proto, f"{d}/{m}.old.brew", tune=False)
                finally:
                    wb.run = current
                arms.append((m, "previous", [f"{d}/{m}.old.brew"], {"COLDBREW_LIB": old[1]}))
            compile_model(proto, f"{d}/{m}.new.brew", tune=False)
            compile_model(proto, f"{d}/{m}.ahead.brew", tune=False, queues={"*": 1, "c0": 0})
            arms += [(m, "inline", [f"{d}/{m}.new.brew"], {}), (m, "worker", [f"{d}/{m}.ahead.brew"], {}),
                     (m, "onnxruntime", [onnx_path, "--ort"], {})]
        res = {}
        for _ in range(rounds):
            for m, arm, argv, env in arms:
                out = cold_process([sys.executable, sampler, *argv, "--threads", "2"], capture_output=True,
                                   text=True, env={**os.environ, **env}, check=True)
                res.setdefault((m, arm), []).append(json.loads(out.stdout))
    totals = {}
    print(f"cold start, {rounds} interleaved rounds, 2 threads (load + first result, ms; medians; {cold_protocol()})")
    for (m, arm), v in res.items():
        tot = statistics.median(x["load_ms"] + x["first_run_ms"] for x in v)
        totals.setdefault(arm, []).append(tot)
        print(f"{m:14s} {arm:12s} load {statistics.median(x['load_ms'] for x in v):7.2f}  "
              f"first {statistics.median(x['first_run_ms'] for x in v):7.2f}  total {tot:7.2f}")
    for arm, v in totals.items():
        print(f"geomean {arm:12s} {geomean(v):7.2f} ms")


if __name__ == "__main__":
    main()
