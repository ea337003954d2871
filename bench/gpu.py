"""GPU (Vulkan) cold start: coldbrew's first-ever launch, a later launch and
warm latency, beside PyTorch on CUDA started cold, on whatever GPU runs it.

    python bench/gpu.py compile DIR [models...]     # here: Vulkan bundles (needs the compiler)
    python bench/gpu.py run DIR [models...] [--samples 3] [--torch]   # on the GPU machine

`run` needs only numpy and the coldbrew package without TVM (and PyTorch
with torchvision for --torch). Every sample is a fresh process, the bundle evicted from the
page cache first; samples of every model and engine are interleaved in
rounds; the medians are printed.
- first-ever: coldbrew's pipeline cache and the driver's shader disk cache
  (the folder __GL_SHADER_DISK_CACHE_PATH / MESA_SHADER_CACHE_DIR name, set
  here for every process) deleted before the process;
- later: both caches as the previous launch left them;
- context: the Vulkan loader, instance and device (coldbrew's gpu_context
  phase), reported apart; load + first includes it;
- warm: median of 20 runs in one session after 3;
- PyTorch: import apart, CUDA context apart (torch.cuda.init and a first
  tensor), then torchvision's model with random weights to the GPU and a
  first run (synchronized).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHVISION = {"squeezenet": "squeezenet1_1", "mobilenet_v2": "mobilenet_v2", "resnet50": "resnet50",
               "resnet18": "resnet18", "googlenet": "googlenet", "alexnet": "alexnet"}
MODELS = ["resnet50", "mobilenet_v2", "squeezenet"]

COLDBREW_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, coldbrew
t1 = time.perf_counter()
sess = coldbrew.load(sys.argv[1], trace=True)
inp = sess.get_inputs()[0]
x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
y = sess.run(None, {inp.name: x})
t2 = time.perf_counter()
phases = {}
for e in sess.trace():
    phases[e["phase"]] = phases.get(e["phase"], 0.0) + (e["end_ns"] - e["start_ns"]) / 1e6
warm = []
if sys.argv[2] == "warm":
    for i in range(23):
        a = time.perf_counter(); sess.run(None, {inp.name: x}); b = time.perf_counter()
        if i >= 3: warm.append((b - a) * 1e3)
print(json.dumps({"import": (t1 - t0) * 1e3, "total": (t2 - t1) * 1e3, "phases": phases, "warm": warm}))
"""

TORCH_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, torchvision
t1 = time.perf_counter()
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
m = getattr(torchvision.models, sys.argv[1])(weights=None).eval().cuda()
x = torch.randn(1, 3, 224, 224, device="cuda")
with torch.no_grad():
    y = m(x)
torch.cuda.synchronize()
t3 = time.perf_counter()
warm = []
if sys.argv[2] == "warm":
    with torch.no_grad():
        for i in range(23):
            a = time.perf_counter(); m(x); torch.cuda.synchronize(); b = time.perf_counter()
            if i >= 3: warm.append((b - a) * 1e3)
print(json.dumps({"import": (t1 - t0) * 1e3, "context": (t2 - t1) * 1e3, "total": (t3 - t1) * 1e3, "warm": warm}))
"""


def compile_bundles(out, models):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import zoo
    from coldbrew.compiler import compile_model

    os.makedirs(out, exist_ok=True)
    for name in models:
        compile_model(zoo.build(name), os.path.join(out, f"{name}.brew"), target="vulkan")
        print(f"compiled {name}", flush=True)


def child(code, args, env):
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def med(samples, key):
    vals = [s[key] for s in samples if key in s]
    return statistics.median(vals) if vals else float("nan")


def med_phase(samples, phase):
    vals = [s["phases"].get(phase, 0.0) for s in samples if "phases" in s]
    return statistics.median(vals) if vals else float("nan")


def run(out, models, samples, torch):
    from coldbrew.compiler.measure import evict  # no TVM: the runtime side of the compiler package

    caches = tempfile.mkdtemp(prefix="cb-gpu-caches-")
    env = dict(os.environ, COLDBREW_CACHE_DIR=os.path.join(caches, "coldbrew"),
               __GL_SHADER_DISK_CACHE_PATH=os.path.join(caches, "driver"), __GL_SHADER_DISK_CACHE="1",
               __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1", MESA_SHADER_CACHE_DIR=os.path.join(caches, "driver"))
    res = {m: {"first": [], "later": [], "torch": []} for m in models}
    for r in range(samples):  # rounds: every model and engine once per round
        for name in models:
            path = os.path.join(out, f"{name}.brew")
            shutil.rmtree(caches, ignore_errors=True)
            os.makedirs(caches)
            evict(path)
            res[name]["first"].append(child(COLDBREW_CHILD, [path, "cold"], env))
            evict(path)
            res[name]["later"].append(child(COLDBREW_CHILD, [path, "warm" if r == 0 else "cold"], env))
            if torch and name in TORCHVISION:
                res[name]["torch"].append(child(TORCH_CHILD, [TORCHVISION[name], "warm" if r == 0 else "cold"], env))
    shutil.rmtree(caches, ignore_errors=True)
    return res


def report(res, samples):
    print(f"{samples} samples per figure, interleaved in rounds; medians in ms; fresh process per sample")
    print(f"{'model':<14} {'engine':<26} {'import':>7} {'context':>8} {'load+1st':>9} {'pipelines':>9} "
          f"{'1st exec':>9} {'warm':>7}")
    for name, r in res.items():
        for label, key in (("coldbrew first-ever", "first"), ("coldbrew later launch", "later")):
            s = [x for x in r[key] if "error" not in x]
            errs = [x["error"] for x in r[key] if "error" in x]
            if errs:
                print(f"{name:<14} {label:<26} failed: {errs[0]}")
            if not s:
                continue
            warm = [w for x in s for w in x["warm"]]
            print(f"{name:<14} {label:<26} {med(s, 'import'):>7.1f} {med_phase(s, 'gpu_context'):>8.1f} "
                  f"{med(s, 'total'):>9.1f} {med_phase(s, 'code_load'):>9.1f} {med_phase(s, 'gpu_execute'):>9.1f} "
                  f"{statistics.median(warm) if warm else float('nan'):>7.2f}")
        t = [x for x in r["torch"] if "error" not in x]
        if r["torch"] and not t:
            print(f"{name:<14} {'pytorch cuda cold':<26} failed: {r['torch'][0]['error']}")
        if t:
            warm = [w for x in t for w in x["warm"]]
            print(f"{name:<14} {'pytorch cuda cold':<26} {med(t, 'import'):>7.1f} {med(t, 'context'):>8.1f} "
                  f"{med(t, 'total'):>9.1f} {'':>9} {'':>9} {statistics.median(warm) if warm else float('nan'):>7.2f}")
            first = [x for x in r["first"] if "error" not in x]
            if first:
                print(f"{'':<14} pytorch load+1st / coldbrew first-ever load+1st (both with context): "
                      f"{med(t, 'total') / med(first, 'total'):.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compile", "run"])
    ap.add_argument("dir")
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--torch", action="store_true", help="also PyTorch on CUDA (torchvision models)")
    args = ap.parse_args()
    if args.mode == "compile":
        compile_bundles(args.dir, args.models)
        return
    res = run(args.dir, args.models, args.samples, args.torch)
    report(res, args.samples)


if __name__ == "__main__":
    main()
