"""Helpers shared by the benchmarks: zoo access, onnxruntime sessions,
timing. Benchmarks print ratios measured side by side in the same run."""
import os
import statistics
import subprocess
import sys
import time

# numpy's OpenBLAS keeps worker threads spinning after its calls; on a
# 2-core machine they steal cycles from whichever engine is being timed
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def ort_session(model, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def drop_page_cache():
    """Write back and drop the whole page cache (root only): the cold
    protocol's first step, before a sample's process starts, so that its
    engine is imported from storage (import timed apart) and finds memory
    as a freshly started app does. True when dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


SETTLE_BYTES = 1 << 30


def settle_memory(nbytes=SETTLE_BYTES):
    """Write `nbytes` of fresh memory and free it: a cold sample's last step
    before its clock starts (after its engine's import and its inputs,
    before the artifact's eviction). It clears the CPU caches of what came
    before, and it gives every engine the same memory to start on. This
    machine is a VM that hands freed memory back to its host; the first
    write to a 2 MB block handed back costs about 4.7 ms of the writing
    thread's CPU instead of 0.1-0.2 ms, and how much of it a sample meets
    depends on what the samples before it freed (alexnet's coldbrew
    bundle through the peer benchmark's child, 6 rounds interleaved with
    onnxruntime-default alexnet samples: median 169 ms, 95-211, without
    this step; 94-100 ms medians with every sample settling). Memory freed
    here is taken again first, so the sample's page cache and heap start
    on memory as a phone's freshly started app finds it. At most a quarter
    of what is available; CB_SETTLE_MB sets the size in MiB (0: off), to
    compare protocols."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(ln.split()[1]) << 10 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail = 4 * nbytes
    n = min(int(os.environ.get("CB_SETTLE_MB", nbytes >> 20)) << 20, avail // 4) // 4
    if n:
        buf = np.empty(n, np.float32)
        buf.fill(1.0)
        del buf
        try:  # the process's peak resident set starts again from here (Linux 4.0 on)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def cold_process(cmd, **kw):
    """One cold sample's fresh process under the cold protocol: the whole
    page cache dropped first; the process then imports its engine, evicts
    its artifact and times load + first result. subprocess.run(cmd, **kw)'s
    result."""
    drop_page_cache()
    return subprocess.run(cmd, **kw)


def read_alone_ms(path):
    """Milliseconds to bring file `path` alone in from storage, cold (page
    cache dropped, memory settled), the way coldbrew's runtime reads a
    bundle (compiler.measure.populate_read: mapped, 2 MB at a time). The
    floors' bytes / bandwidth takes the rate of a 128 MB read; a file of a
    few MB comes in slower than that (the first request's latency, the
    read-ahead's ramp), and this is what the file itself gets. None where
    the kernel cannot populate (before Linux 5.14)."""
    from coldbrew.compiler.measure.protocol import evict, populate_read

    drop_page_cache()
    settle_memory()
    evict(path)
    t = time.perf_counter()
    done = populate_read(path)
    return (time.perf_counter() - t) * 1e3 if done else None


def cold_protocol():
    """The words every cold figure's header carries: whether cold_process
    can drop the page cache here."""
    if os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return ("cold protocol: page cache dropped before each sample's process, memory settled and artifact "
                "evicted after its import")
    return "page cache NOT dropped (drop_caches needs root): only the artifact evicted after the import"


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
