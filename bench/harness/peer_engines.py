"""The engines bench/peers.py compares, each in two halves:

- `convert(model_path, work, threads)` (in the driver, untimed): the
  engine's artifact(s) from the ONNX model, returned as a list of paths
  (the first is what its loader opens); raises on failure;
- `load(paths, threads)` and `run(handle, feeds)` (in a fresh child
  process per sample, timed by `child`).

    python bench/harness/peer_engines.py child ENGINE INPUTS.npz OUT.npz WARM THREADS ARTIFACT...

prints one JSON line: import_ms (the engine's modules, timed apart),
load_ms, first_run_ms, cold_ms (load + first), warm_ms (WARM runs after
the first), peak_rss_kb, bytes_read (from storage, /proc/self/io), and
writes the first run's outputs to OUT.npz (checked by the driver against
onnxruntime's). Every artifact is evicted from the page cache before the
load. Nothing here installs anything: engines missing from the machine
fail their conversion and the table says so (`pip install -e .[bench]`).
"""
import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/harness/ -> the repo
sys.path.insert(0, os.path.join(ROOT, "bench"))  # harness.common, run as the child script too


def evict(path):
    """compiler/measure.evict, imported only when called: a child times its
    engine's import, and coldbrew is one of the engines."""
    from coldbrew.compiler.measure.protocol import evict as drop

    drop(path)


def _peak_rss_kb():
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not
    inherited from the driver across fork + exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM"))
    except (OSError, StopIteration):
        return -1


def _io_read_bytes():
    try:
        with open("/proc/self/io") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes"))
    except (OSError, StopIteration):
        return -1


def _files(paths):
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        else:
            out.append(p)
    return out


def artifact_bytes(paths):
    return sum(os.path.getsize(f) for f in _files(paths))


# --- coldbrew (its plans are compiled by the driver: bench/peers.py) ---

def coldbrew_load(paths, threads, mode="cold"):
    import coldbrew

    return coldbrew.load(paths[0], mode=mode)


def coldbrew_run(sess, feeds):
    return sess.run(None, feeds)


# --- onnxruntime ---

def ort_convert_best(model, work, threads):
    """Optimized offline (ORT_ENABLE_ALL), saved in ORT format."""
    from harness.common import save_ort_best

    out = os.path.join(work, "model.ort")
    save_ort_best(model, out, threads)
    return [out]


def ort_load(paths, threads, best=False):
    import onnxruntime as ort
    from harness.common import ort_options

    return ort.InferenceSession(paths[0], ort_options(ort, threads, best), providers=["CPUExecutionProvider"])


def ort_run(sess, feeds):
    return sess.run(None, feeds)


# --- ncnn (converted by pnnx) ---

def ncnn_convert(model, work, threads, fp16=True):
    import onnx

    import importlib.util

    # the package's own executable: its Python wrapper imports PyTorch, the binary needs none
    spec = importlib.util.find_spec("pnnx")
    if spec is None:
        raise RuntimeError("pnnx is not installed (pip install -e .[bench])")
    exe = os.path.join(spec.submodule_search_locations[0], "pnnx")
    m = onnx.load(model, load_external_data=False)
    shapes = ",".join("[" + ",".join(str(d.dim_value) for d in i.type.tensor_type.shape.dim) + "]"
                      for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer})
    os.makedirs(work, exist_ok=True)
    local = os.path.join(work, "model.onnx")  # pnnx writes its outputs beside its input
    if not os.path.exists(local):
        shutil.copyfile(model, local)
    r = subprocess.run([exe, "model.onnx", f"inputshape={shapes}", f"fp16={int(fp16)}"], cwd=work,
                       capture_output=True, text=True, timeout=600)
    if r.returncode or not os.path.exists(os.path.join(work, "model.ncnn.bin")):
        raise RuntimeError(f"pnnx failed: {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    names = [i.name for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer}]
    with open(os.path.join(work, "io.json"), "w") as f:
        json.dump({"inputs": names, "outputs": len(m.graph.output)}, f)
    return [os.path.join(work, "model.ncnn.param"), os.path.join(work, "model.ncnn.bin"),
            os.path.join(work, "io.json")]


def ncnn_load(paths, threads):
    import ncnn

    net = ncnn.Net()
    net.opt.num_threads = threads
    net.load_param(paths[0])
    net.load_model(paths[1])
    with open(paths[2]) as f:
        io = json.load(f)
    return net, io


def ncnn_run(handle, feeds):
    import ncnn
    import numpy as np

    net, io = handle
    ex = net.create_extractor()
    for k, name in enumerate(io["inputs"]):  # pnnx names inputs in0, in1, ... in model order
        x = feeds[name]
        ex.input(f"in{k}", ncnn.Mat(x, batch_index=0).clone() if x.ndim == 4 else ncnn.Mat(x).clone())
    outs = []
    for k in range(io["outputs"]):
        _, m = ex.extract(f"out{k}")
        outs.append(np.array(m)[None])
    return outs


# --- OpenVINO (compiled-model cache) ---

def openvino_load(paths, threads):
    import openvino as ov

    core = ov.Core()
    cache = os.path.join(os.path.dirname(paths[0]), "ov_cache")
    core.set_property({"CACHE_DIR": cache})
    return core.compile_model(paths[0], "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})


def openvino_run(compiled, feeds):
    res = compiled(feeds)
    return [res[o] for o in compiled.outputs]


# --- TVM stock (Relax ONNX frontend, default pipeline, no tuning) ---

def tvm_convert(model, work, threads):
    import onnx
    import onnxruntime as ort
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    folded = _ort_basic(model, work, ort)
    mod = from_onnx(onnx.load(folded), keep_params_in_input=False)
    ex = relax.build(mod, target=tvm.target.Target({"kind": "llvm"}))
    out = os.path.join(work, "model.so")
    ex.export_library(out)
    return [out]


def _ort_basic(model, work, ort):
    """The model with its computed shapes folded (onnxruntime ORT_ENABLE_BASIC):
    TVM's and IREE's importers reject computed Reshape shapes."""
    out = os.path.join(work, "basic.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = out
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return out


def tvm_load(paths, threads):
    import tvm
    from tvm import relax

    os.environ["TVM_NUM_THREADS"] = str(threads)
    return relax.VirtualMachine(tvm.runtime.load_module(paths[0]), tvm.cpu())


def tvm_run(vm, feeds):
    import tvm

    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    outs = out if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
    return [o.numpy() for o in outs]


# --- IREE (llvm-cpu, data tiling on) ---

def iree_convert(model, work, threads):
    import onnxruntime as ort

    folded = _ort_basic(model, work, ort)
    bindir = os.path.dirname(sys.executable)
    mlir, vmfb = os.path.join(work, "model.mlir"), os.path.join(work, "model.vmfb")
    for cmd in ([os.path.join(bindir, "iree-import-onnx"), folded, "--opset-version", "17", "-o", mlir],
                [os.path.join(bindir, "iree-compile"), mlir, "--iree-hal-target-backends=llvm-cpu",
                 "--iree-llvmcpu-target-cpu=host", "--iree-opt-data-tiling=true", "-o", vmfb]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        if r.returncode:
            raise RuntimeError(f"{os.path.basename(cmd[0])} failed: {(r.stdout + r.stderr).strip()[-300:]}")
    return [vmfb]


def iree_load(paths, threads):
    import iree.runtime as rt

    with open(paths[0], "rb") as f:
        return rt.load_vm_flatbuffer(f.read(), driver="local-task")


def iree_run(module, feeds):
    names = [n for n in module.vm_module.function_names if not n.startswith("__") and "$" not in n]
    out = module[names[0]](*feeds.values())  # iree-import-onnx names it after the graph
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [o.to_host() if hasattr(o, "to_host") else o for o in outs]


# --- MNN (the wheel's converter module, never its telemetry path) ---

def mnn_convert(model, work, threads):
    __import__("MNN")  # registers the converter's extension module (_tools)
    import _tools

    out = os.path.join(work, "model.mnn")
    _tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--modelFile", model, "--MNNModel", out, "--bizCode", "coldbrew"])
    if not os.path.exists(out):
        raise RuntimeError("MNN's converter wrote no model")
    return [out]


def mnn_load(paths, threads):
    import MNN

    return MNN.nn.load_module_from_file(paths[0], [], [], runtime_manager=None, backend=MNN.expr.CPU,
                                        num_thread=threads)


def mnn_run(module, feeds):
    import MNN

    ins = [MNN.expr.const(v, list(v.shape), MNN.expr.NCHW) for v in feeds.values()]
    outs = module.forward(ins)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return [MNN.expr.convert(o, MNN.expr.NCHW).read() for o in outs]


# name -> (convert or None: the ONNX file itself, or "coldbrew": the driver compiles, load, run)
ENGINES = {
    "coldbrew": (None, coldbrew_load, coldbrew_run),
    "onnxruntime": (None, ort_load, ort_run),
    "onnxruntime best": (ort_convert_best, lambda p, t: ort_load(p, t, best=True), ort_run),
    "ncnn fp16": (ncnn_convert, ncnn_load, ncnn_run),
    "ncnn fp32": (lambda m, w, t: ncnn_convert(m, w, t, fp16=False), ncnn_load, ncnn_run),
    "MNN": (mnn_convert, mnn_load, mnn_run),
    "TVM": (tvm_convert, tvm_load, tvm_run),
    "IREE": (iree_convert, iree_load, iree_run),
    "OpenVINO": (None, openvino_load, openvino_run),
}


MODULES = {"coldbrew": "coldbrew", "onnxruntime": "onnxruntime", "ncnn": "ncnn", "MNN": "MNN", "TVM": "tvm",
           "IREE": "iree.runtime", "OpenVINO": "openvino"}


def child(engine, inputs, out, warm, threads, paths, mode="cold"):
    """One fresh-process sample (see the module's docstring)."""
    import numpy as np  # every engine's feeds: not part of any engine's import

    t0 = time.perf_counter()
    base = "coldbrew" if engine.startswith("coldbrew") else engine.split(" [")[0]  # "coldbrew fp16 [cache]" -> coldbrew
    _, load, run = ENGINES[base]
    # the engine's own modules, imported before the clock starts on the load
    __import__(MODULES[base.split()[0]])
    t_import = time.perf_counter() - t0
    feeds = dict(np.load(inputs))
    from coldbrew.compiler.measure.protocol import cold_start

    cold_start(_files(paths))  # memory settled, every artifact evicted
    io0 = _io_read_bytes()
    t1 = time.perf_counter()
    handle = load(paths, threads, mode) if engine.startswith("coldbrew") else load(paths, threads)
    t2 = time.perf_counter()
    outs = run(handle, feeds)
    t3 = time.perf_counter()
    io1 = _io_read_bytes()
    later = []
    for _ in range(warm):
        a = time.perf_counter()
        run(handle, feeds)
        later.append((time.perf_counter() - a) * 1e3)
    np.savez(out, *[np.asarray(o) for o in outs])
    return {"import_ms": t_import * 1e3, "load_ms": (t2 - t1) * 1e3, "first_run_ms": (t3 - t2) * 1e3,
            "cold_ms": (t3 - t1) * 1e3, "warm_ms": later, "bytes_read": io1 - io0 if io0 >= 0 else -1,
            "peak_rss_kb": _peak_rss_kb()}


if __name__ == "__main__":
    if len(sys.argv) < 8 or sys.argv[1] != "child":
        sys.exit(__doc__)
    _, _, engine, inputs, out, warm, threads, *rest = sys.argv
    mode = "continuous" if engine.endswith("continuous]") else "cold"
    print(json.dumps(child(engine, inputs, out, int(warm), int(threads), rest, mode)))
