"""Helpers shared by the benchmarks: zoo access, onnxruntime sessions,
timing. Benchmarks print ratios measured side by side in the same run."""
import os
import statistics
import sys
import time

# numpy's OpenBLAS keeps worker threads spinning after its calls; on a
# 2-core machine they steal cycles from whichever engine is being timed
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/harness/ -> the repo
sys.path.insert(0, os.path.join(ROOT, "examples"))


def host_isa():
    """The host's CPU and vector unit, for every printed figure."""
    from coldbrew.targets import resolve

    t = resolve("host")
    v = t.vector
    return f"{t.cpu} {v.isa} ({v.lanes} fp32 lanes, {v.registers} vector registers)"


def zoo():
    import zoo as z

    return z


def model_source(name):
    """(model: ModelProto or ONNX path, input shapes or None, bound inputs
    or None) of a zoo model's name or "corpus:NAME" (bench/corpus/models.json,
    fetched by bench/corpus/fetch.py; its manifest's shapes and bound inputs)."""
    if not name.startswith("corpus:"):
        return zoo().build(name), None, None
    import onnx

    sys.path.insert(0, os.path.join(ROOT, "bench", "corpus"))
    import fetch

    (entry,) = fetch.models([name.split(":", 1)[1]])
    path = fetch.fetched(entry)
    if path is None:
        raise SystemExit(f"{name} is not fetched: python bench/corpus/fetch.py {entry['name']}")
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
             for i in onnx.load(path, load_external_data=False).graph.input}
    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    binds = {k: np.array(v["bind"], types[k]) for k, v in entry["inputs"].items() if "bind" in v}
    return path, shapes or None, binds or None


def ort_session(model, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def median_ms(fn, repeat=20, warmup=3):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def save_ort_best(onnx_path, ort_path, threads=2):
    """Optimize a model offline (ORT_ENABLE_ALL) and save it in ORT format."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = ort_path
    so.add_session_config_entry("session.save_model_format", "ORT")
    onnxruntime.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])


def ort_options(ort, threads, best=False):
    """onnxruntime session options: `threads` intra-op threads; `best` its
    best cold configuration (an ORT-format model loaded memory-mapped, used
    in place, optimizations and prepacking off)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if best:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        for key in ("session.use_memory_mapped_ort_model", "session.use_ort_model_bytes_directly",
                    "session.use_ort_model_bytes_for_initializers", "session.disable_prepacking"):
            so.add_session_config_entry(key, "1")
    return so
