"""One cold-run sample, in a fresh process (DESIGN.md's protocol): import
the engine first (reported apart), evict the model file from the page
cache, then time load + first result (making the inputs is not timed).
Prints one JSON line.

    python bench/cold_sample.py BUNDLE [--trace] [--threads N] [--mode continuous] [--runs N]
    python bench/cold_sample.py MODEL.onnx --ort [--threads N]
"""
import json
import os
import sys
import time

ORT = "--ort" in sys.argv
t_import = time.perf_counter()
import numpy as np  # noqa: E402

if ORT:
    import onnxruntime as ort
else:
    import coldbrew
t_import = time.perf_counter() - t_import


def evict(path):
    """Drop the file from the page cache, and the previous process's data
    from the CPU caches (a buffer larger than the last-level cache)."""
    buf = np.empty(24 << 20, np.float32)
    buf.fill(1.0)
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def ort_sample(path, threads):
    evict(path)
    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(
        np.float32 if "float" in i.type else np.int64) for i in sess.get_inputs()}
    t2 = time.perf_counter()
    sess.run(None, feeds)
    t3 = time.perf_counter()
    return {"import_ms": t_import * 1e3, "load_ms": (t1 - t0) * 1e3, "first_run_ms": (t3 - t2) * 1e3,
            "cold_ms": (t1 - t0 + t3 - t2) * 1e3}


def main():
    path = sys.argv[1]
    trace = "--trace" in sys.argv
    threads = int(_opt("--threads", 0))
    mode, runs = _opt("--mode", "cold"), int(_opt("--runs", 0))
    if ORT:
        print(json.dumps(ort_sample(path, threads)))
        return
    evict(path)
    t0 = time.perf_counter()
    sess = coldbrew.load(path, threads=threads, trace=trace, mode=mode)
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)  # the app's inputs: made outside the timed part
    feeds = {i.name: (rng.standard_normal(i.shape) if i.dtype.kind == "f" else np.zeros(i.shape)).astype(i.dtype)
             for i in sess.get_inputs()}
    t2 = time.perf_counter()
    sess.run(None, feeds)
    t3 = time.perf_counter()
    out = {"import_ms": t_import * 1e3, "load_ms": (t1 - t0) * 1e3, "first_run_ms": (t3 - t2) * 1e3,
           "cold_ms": (t1 - t0 + t3 - t2) * 1e3, "t0_ns": int(t0 * 1e9)}
    if trace:
        out["events"] = sess.trace()
    later = []  # runs after the first, back to back (continuous mode's 2nd, 3rd, ...)
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        later.append((time.perf_counter() - t) * 1e3)
    if runs:
        out["runs_ms"] = later
    print(json.dumps(out))


def _opt(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    main()
