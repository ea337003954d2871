"""GPU (Vulkan) cold start: coldbrew's first-ever launch, a later launch and
warm latency, beside ncnn's Vulkan backend and PyTorch on CUDA started cold,
on whatever GPU runs it.

    python bench/gpu.py compile DIR [models...] [--pnnx EXE]  # here: Vulkan bundles
                                   # (needs the compiler); with --pnnx also ncnn models
    python bench/gpu.py run DIR [models...] [--samples 3] [--torch] [--ncnn]   # on the GPU machine

Models: zoo names, or corpus:NAME (one float input; `compile` also writes
the ONNX file beside the bundle, which `run --torch` turns into a PyTorch
module with onnx2torch, then saved with torch.save, before the rounds).

`run` needs only numpy and the coldbrew package without TVM (PyTorch with
torchvision for --torch, PyPI's `ncnn` for --ncnn). Every sample is a fresh
process, the model's files evicted from the page cache first; samples of
every model and engine are interleaved in rounds; the medians are printed.
Every engine's output for one input is compared with coldbrew's (which the
test suite compares with onnxruntime) and the largest difference printed.
- first-ever: coldbrew's pipeline cache and the driver's shader disk cache
  (the folder __GL_SHADER_DISK_CACHE_PATH / MESA_SHADER_CACHE_DIR name, set
  here for every process) deleted before the process; its first run
  dispatches each layer as soon as it can, a GEMM convolution whose
  pipeline is not made yet through its first-run launches (conv_direct);
  "first-run layers" is how many layers did (median);
- first-ever, own launches: the same with COLDBREW_GPU_FIRST_RUN=plan, each
  layer waiting for its own pipelines; first-ever, whole:
  COLDBREW_GPU_FIRST_RUN=whole, the first run waiting for every pipeline
  (as before per-layer dispatch); all three sampled in every round; "gpu
  before last pipeline" is how long the first GPU submission preceded the
  last pipeline's end (median; the pipelines made by the first run's end);
- later: both caches as the previous launch left them;
- context: the Vulkan loader, instance and device (coldbrew's gpu_context
  phase), reported apart; load + first includes it;
- pipelines: from the first pipeline's start to the last one's end (worker
  threads make them while the weights upload);
- warm: median of 20 runs in one session after 3;
- ncnn: the zoo model converted by pnnx (ncnn's default fp16 weight storage);
  import apart, context (create_gpu_instance: loader, instance, devices)
  apart; load_param + load_model (pipelines and weight upload) + a first
  extract; first launch with the driver's shader cache deleted, later
  launch with it warm (ncnn keeps no pipeline cache of its own);
- PyTorch: import apart, CUDA context apart (torch.cuda.init and a first
  tensor), then torchvision's model with random weights (a corpus model:
  torch.load of its saved module) to the GPU and a first run
  (synchronized).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

nan = float("nan")

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
phases, spans = {}, {}
for e in sess.trace():
    phases[e["phase"]] = phases.get(e["phase"], 0.0) + (e["end_ns"] - e["start_ns"]) / 1e6
    lo, hi = spans.get(e["phase"], (e["start_ns"], e["end_ns"]))
    spans[e["phase"]] = (min(lo, e["start_ns"]), max(hi, e["end_ns"]))
phases["pipelines_wall"] = (spans["pipeline"][1] - spans["pipeline"][0]) / 1e6 if "pipeline" in spans else 0.0
phases["first_run_layers"] = sum(e.get("first_run_layers", 0) for e in sess.trace() if e["phase"] == "gpu_execute")
if "pipeline" in spans and "gpu_execute" in spans:  # the GPU's first submission before the last pipeline's end
    phases["gpu_ahead"] = max(0.0, (spans["pipeline"][1] - spans["gpu_execute"][0]) / 1e6)
    phases["gpu_execute"] = (spans["gpu_execute"][1] - spans["gpu_execute"][0]) / 1e6  # chunks overlap: their span
warm = []
if sys.argv[2] == "warm":
    for i in range(23):
        a = time.perf_counter(); sess.run(None, {inp.name: x}); b = time.perf_counter()
        if i >= 3: warm.append((b - a) * 1e3)
print(json.dumps({"import": (t1 - t0) * 1e3, "total": (t2 - t1) * 1e3, "phases": phases, "warm": warm,
                  "out": [float(v) for v in y[0].ravel()]}))
"""

NCNN_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, ncnn
t1 = time.perf_counter()
ncnn.create_gpu_instance()
t2 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
net = ncnn.Net()
net.opt.use_vulkan_compute = True
net.load_param(sys.argv[1] + ".ncnn.param")
net.load_model(sys.argv[1] + ".ncnn.bin")
def infer():
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x, batch_index=0).clone())
    _, out = ex.extract("out0")
    return np.array(out).ravel()
y = infer()
t3 = time.perf_counter()
warm = []
if sys.argv[2] == "warm":
    for i in range(23):
        a = time.perf_counter(); infer(); b = time.perf_counter()
        if i >= 3: warm.append((b - a) * 1e3)
print(json.dumps({"import": (t1 - t0) * 1e3, "context": (t2 - t1) * 1e3, "total": (t3 - t1) * 1e3, "warm": warm,
                  "out": [float(v) for v in y]}), flush=True)
del net
ncnn.destroy_gpu_instance()
"""

TORCH_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, torchvision
t1 = time.perf_counter()
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
if sys.argv[1].endswith(".pt"):  # a corpus model converted by onnx2torch, its input shape beside it
    m = torch.load(sys.argv[1], weights_only=False).eval().cuda()
    x = torch.randn(*json.load(open(sys.argv[1][:-3] + ".json"))["shape"], device="cuda")
else:
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


TO_TORCH = r"""
import json, sys, onnx, torch
from onnx2torch import convert
torch.save(convert(onnx.load(sys.argv[1])), sys.argv[2])
"""


def tag(name):
    return name.replace(":", "_")


def compile_bundles(out, models, pnnx=None):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import onnx
    from harness.common import model_source

    from coldbrew.compiler import compile_model

    os.makedirs(out, exist_ok=True)
    for name in models:
        model, shapes, binds = model_source(name)
        path = os.path.join(out, f"{tag(name)}.brew")
        compile_model(model, path, target="vulkan", input_shapes=shapes, constants=binds)
        print(f"compiled {name}", flush=True)
        if name.startswith("corpus:"):  # the ONNX file and the input's shape, for PyTorch there
            from coldbrew.compiler.bundle.reader import input_specs

            ((_, shape, dtype),) = input_specs(path)
            assert dtype == "float32", f"{name}: the GPU benchmark feeds one float input"
            shutil.copy(model, os.path.join(out, f"{tag(name)}.onnx"))
            with open(os.path.join(out, f"{tag(name)}.json"), "w") as f:
                json.dump({"shape": shape}, f)
            continue
        if pnnx:  # pnnx writes next to its input: convert in a scratch folder, keep the ncnn pair
            with tempfile.TemporaryDirectory() as tmp:
                onnx.save(model, os.path.join(tmp, f"{name}.onnx"))
                shape = ",".join(str(int(d.dim_value)) for d in model.graph.input[0].type.tensor_type.shape.dim)
                r = subprocess.run([pnnx, f"{name}.onnx", f"inputshape=[{shape}]"], cwd=tmp, capture_output=True,
                                   text=True)
                if r.returncode:
                    print(f"pnnx failed on {name}: {(r.stdout + r.stderr).strip()[-300:]}", flush=True)
                    continue
                for ext in ("ncnn.param", "ncnn.bin"):
                    shutil.move(os.path.join(tmp, f"{name}.{ext}"), os.path.join(out, f"{name}.{ext}"))
            print(f"converted {name} for ncnn", flush=True)


def child(code, args, env):
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:  # a result printed before a failing exit still counts; the exit is noted
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]}
    out = json.loads(lines[-1])
    if r.returncode:
        out["exit"] = r.returncode
    return out


def med(samples, key):
    vals = [s[key] for s in samples if key in s]
    return statistics.median(vals) if vals else float("nan")


def med_phase(samples, phase):
    vals = [s["phases"].get(phase, 0.0) for s in samples if "phases" in s]
    return statistics.median(vals) if vals else float("nan")


def _protocol():
    """compiler/measure/protocol.py (the standard library only), loaded by
    path: the compiler package itself needs TVM, which a GPU machine may lack."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cb_protocol", os.path.join(ROOT, "compiler", "measure", "protocol.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(out, models, samples, torch, ncnn):
    evict = _protocol().evict

    caches = tempfile.mkdtemp(prefix="cb-gpu-caches-")
    env = dict(os.environ, COLDBREW_CACHE_DIR=os.path.join(caches, "coldbrew"),
               __GL_SHADER_DISK_CACHE_PATH=os.path.join(caches, "driver"), __GL_SHADER_DISK_CACHE="1",
               __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1", MESA_SHADER_CACHE_DIR=os.path.join(caches, "driver"))
    res = {m: {"first": [], "plan": [], "whole": [], "later": [], "torch": [], "ncnn_first": [], "ncnn_later": []}
           for m in models}
    for name in models:  # corpus models for PyTorch: converted once, before the rounds
        stem = os.path.join(out, tag(name))
        if torch and name not in TORCHVISION and os.path.exists(stem + ".onnx") and not os.path.exists(stem + ".pt"):
            r = subprocess.run([sys.executable, "-c", TO_TORCH, stem + ".onnx", stem + ".pt"], capture_output=True,
                               text=True)
            if r.returncode:
                print(f"onnx2torch could not convert {name}: {(r.stdout + r.stderr).strip()[-300:]}", flush=True)
    mode_env = {"first": env, "plan": dict(env, COLDBREW_GPU_FIRST_RUN="plan"),
                "whole": dict(env, COLDBREW_GPU_FIRST_RUN="whole")}
    for r in range(samples):  # rounds: every model and engine once per round
        for name in models:
            path = os.path.join(out, f"{tag(name)}.brew")
            for key in ("first", "plan", "whole"):
                shutil.rmtree(caches, ignore_errors=True)
                os.makedirs(caches)
                evict(path)
                res[name][key].append(child(COLDBREW_CHILD, [path, "cold"], mode_env[key]))
            evict(path)
            res[name]["later"].append(child(COLDBREW_CHILD, [path, "warm" if r == 0 else "cold"], env))
            stem = os.path.join(out, tag(name))
            if ncnn and os.path.exists(stem + ".ncnn.param"):
                shutil.rmtree(caches, ignore_errors=True)
                os.makedirs(caches)
                for ext in ("ncnn.param", "ncnn.bin"):
                    evict(f"{stem}.{ext}")
                res[name]["ncnn_first"].append(child(NCNN_CHILD, [stem, "cold"], env))
                for ext in ("ncnn.param", "ncnn.bin"):
                    evict(f"{stem}.{ext}")
                res[name]["ncnn_later"].append(child(NCNN_CHILD, [stem, "warm" if r == 0 else "cold"], env))
            if torch and (name in TORCHVISION or os.path.exists(stem + ".pt")):
                what = TORCHVISION.get(name, stem + ".pt")
                res[name]["torch"].append(child(TORCH_CHILD, [what, "warm" if r == 0 else "cold"], env))
    shutil.rmtree(caches, ignore_errors=True)
    return res


def report(res, samples):
    print(f"{samples} samples per figure, interleaved in rounds; medians in ms; fresh process per sample")
    print(f"{'model':<14} {'engine':<26} {'import':>7} {'context':>8} {'load+1st':>9} {'pipelines':>9} "
          f"{'1st exec':>9} {'warm':>7} {'gpu before last pipeline':>25} {'first-run layers':>17}")
    for name, r in res.items():
        for label, key in (("coldbrew first-ever", "first"), ("coldbrew first-ever, own", "plan"),
                           ("coldbrew first-ever, whole", "whole"), ("coldbrew later launch", "later")):
            s = [x for x in r[key] if "error" not in x]
            errs = [x["error"] for x in r[key] if "error" in x]
            if errs:
                print(f"{name:<14} {label:<26} failed: {errs[0]}")
            if not s:
                continue
            warm = [w for x in s for w in x["warm"]]
            print(f"{name:<14} {label:<26} {med(s, 'import'):>7.1f} {med_phase(s, 'gpu_context'):>8.1f} "
                  f"{med(s, 'total'):>9.1f} {med_phase(s, 'pipelines_wall'):>9.1f} {med_phase(s, 'gpu_execute'):>9.1f} "
                  f"{statistics.median(warm) if warm else float('nan'):>7.2f} {med_phase(s, 'gpu_ahead'):>25.1f} "
                  f"{med_phase(s, 'first_run_layers'):>17.0f}")
        first = [x for x in r["first"] if "error" not in x]
        for key, what in (("plan", "each layer waiting for its own pipelines"), ("whole", "whole first run")):
            other = [x for x in r[key] if "error" not in x]
            if first and other:
                print(f"{'':<14} first-ever load+1st, first-run launches / {what}: "
                      f"{med(first, 'total') / med(other, 'total'):.2f}x")
        ref = first[0]["out"] if first else None
        for label, key in (("ncnn first launch", "ncnn_first"), ("ncnn later launch", "ncnn_later")):
            n = [x for x in r[key] if "error" not in x]
            if r[key] and not n:
                print(f"{name:<14} {label:<26} failed: {r[key][0]['error']}")
            if not n:
                continue
            warm = [w for x in n for w in x["warm"]]
            diff = max(abs(a - b) for a, b in zip(n[0]["out"], ref)) if ref and len(ref) == len(n[0]["out"]) else nan
            print(f"{name:<14} {label:<26} {med(n, 'import'):>7.1f} {med(n, 'context'):>8.1f} "
                  f"{med(n, 'total'):>9.1f} {'':>9} {'':>9} {statistics.median(warm) if warm else nan:>7.2f}"
                  f"  max|ncnn - coldbrew| {diff:.3g}")
        nf = [x for x in r["ncnn_first"] if "error" not in x]
        if nf and first:
            ours = [x for x in r["later"] if "error" not in x and x["warm"]]
            nw = [w for x in r["ncnn_later"] if "error" not in x for w in x["warm"]]
            line = (f"{'':<14} ncnn first launch / coldbrew first-ever, load+1st without context: "
                    f"{(med(nf, 'total') - med(nf, 'context')) / (med(first, 'total') - med_phase(first, 'gpu_context')):.1f}x")
            if ours and nw:
                line += (f"; coldbrew warm / ncnn warm: "
                         f"{statistics.median([w for x in ours for w in x['warm']]) / statistics.median(nw):.2f}x")
            print(line)
        t = [x for x in r["torch"] if "error" not in x]
        if r["torch"] and not t:
            print(f"{name:<14} {'pytorch cuda cold':<26} failed: {r['torch'][0]['error']}")
        if t:
            warm = [w for x in t for w in x["warm"]]
            print(f"{name:<14} {'pytorch cuda cold':<26} {med(t, 'import'):>7.1f} {med(t, 'context'):>8.1f} "
                  f"{med(t, 'total'):>9.1f} {'':>9} {'':>9} {statistics.median(warm) if warm else float('nan'):>7.2f}")
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
    ap.add_argument("--ncnn", action="store_true", help="also ncnn's Vulkan backend (models from compile --pnnx)")
    ap.add_argument("--pnnx", help="compile: the pnnx executable (PyPI pnnx) to convert the models for ncnn")
    args = ap.parse_args()
    if args.mode == "compile":
        compile_bundles(args.dir, args.models, args.pnnx)
        return
    res = run(args.dir, args.models, args.samples, args.torch, args.ncnn)
    report(res, args.samples)


if __name__ == "__main__":
    main()
