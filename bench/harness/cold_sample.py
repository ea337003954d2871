"""One cold-run sample, in a fresh process (DESIGN.md's protocol): import
the engine first (reported apart), evict the model file from the page
cache, then time load + first result (the inputs are made before the
clock starts; onnxruntime's, which need its session, between load and run).
Prints one JSON line.

    python bench/harness/cold_sample.py BUNDLE [--trace] [--threads N] [--mode continuous] [--runs N]
    python bench/harness/cold_sample.py MODEL.onnx --ort [--threads N] [--runs N]
    python bench/harness/cold_sample.py MODEL.ort --ort-best [--threads N] [--runs N]

--runs N times N more runs after the first, back to back (runs_ms).
--shape NAME=1x3x640x480 feeds that input at that shape (a bundle whose
input is sized at run time, and onnxruntime on the model at the same size).
--file-cached reads the file into the page cache where the others evict
it: a fresh process on a file already in memory, the cold start with no
storage in it (what is left is the runtime's and the first run's own).
--exec-shares 2,1 splits parallel loops unevenly (coldbrew.load's
exec_shares); --home-core C waits (untimed) until the process runs on core
C before loading, so the runtime's executing thread is placed there and its
worker on the next core.

--ort-best is onnxruntime's best cold configuration: a model optimized
offline (ORT_ENABLE_ALL) and saved in ORT format (bench/harness/common.py's
save_ort_best), loaded memory-mapped with optimizations off, initializers
used in place and weight prepacking off.
"""
import json
import sys
import time

ORT_BEST = "--ort-best" in sys.argv
ORT = "--ort" in sys.argv or ORT_BEST
t_import = time.perf_counter()
import numpy as np  # noqa: E402

if ORT:
    import onnxruntime as ort
    from common import ort_options  # bench/harness/ is this script's folder
else:
    import coldbrew
t_import = time.perf_counter() - t_import
from coldbrew.compiler.measure.protocol import cold_start  # noqa: E402  (after the engine's import)
if not ORT:  # the tool that reads the inputs from the header: not the engine's import
    from coldbrew.compiler.bundle.reader import input_specs


def evict(path):
    """The protocol's cold start (memory settled, the file evicted);
    --file-cached: then the file read whole back into the page cache."""
    cold_start(path)
    if "--file-cached" in sys.argv:  # read whole into the page cache instead
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def ort_sample(path, threads):
    evict(path)
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, ort_options(ort, threads or 2, ORT_BEST), providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(_shapes().get(i.name, [d if isinstance(d, int) else 1 for d in i.shape]))
             .astype(np.float32 if "float" in i.type else np.int64) for i in sess.get_inputs()}
    t2 = time.perf_counter()
    sess.run(None, feeds)
    t3 = time.perf_counter()
    out = {"import_ms": t_import * 1e3, "load_ms": (t1 - t0) * 1e3, "first_run_ms": (t3 - t2) * 1e3,
           "cold_ms": (t1 - t0 + t3 - t2) * 1e3}
    return _later_runs(out, lambda: sess.run(None, feeds))


def _later_runs(out, run):
    """Runs after the first, back to back (--runs N): continuous mode's 2nd,
    3rd, ..., or warm latency."""
    n = int(_opt("--runs", 0))
    later = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        later.append((time.perf_counter() - t) * 1e3)
    if n:
        out["runs_ms"] = later
    return out


def main():
    path = sys.argv[1]
    trace = "--trace" in sys.argv
    threads = int(_opt("--threads", 0))
    mode = _opt("--mode", "cold")
    if ORT:
        print(json.dumps(ort_sample(path, threads)))
        return
    shares = _opt("--exec-shares", None)
    shares = [int(x) for x in shares.split(",")] if shares else None
    home = _opt("--home-core", None)
    # the app's inputs, made before the clock starts (shapes from the header):
    # load and first run are timed back to back, so no untimed gap between
    # them lets the runtime's streamer read the file off the clock
    rng = np.random.default_rng(0)
    feeds = {name: (rng.standard_normal(_shapes().get(name, shape)) if dtype.startswith("float")
                    else np.zeros(_shapes().get(name, shape))).astype(dtype) for name, shape, dtype in input_specs(path)}
    evict(path)
    if home is not None:
        _wait_for_core(int(home))
    t0 = time.perf_counter()
    sess = coldbrew.load(path, threads=threads, trace=trace, mode=mode, exec_shares=shares)
    t1 = time.perf_counter()
    sess.run(None, feeds)
    t3 = time.perf_counter()
    out = {"import_ms": t_import * 1e3, "load_ms": (t1 - t0) * 1e3, "first_run_ms": (t3 - t1) * 1e3,
           "cold_ms": (t3 - t0) * 1e3, "t0_ns": int(t0 * 1e9)}
    if trace:
        out["events"] = sess.trace()
    print(json.dumps(_later_runs(out, lambda: sess.run(None, feeds))))


def _wait_for_core(core):
    import ctypes

    getcpu = ctypes.CDLL(None).sched_getcpu
    while getcpu() != core:
        time.sleep(0.0005)


def _shapes():
    """{input: shape} of the --shape options."""
    out = {}
    for k, a in enumerate(sys.argv[:-1]):
        if a == "--shape":
            name, _, dims = sys.argv[k + 1].rpartition("=")
            out[name] = [int(d) for d in dims.split("x")]
    return out


def _opt(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    main()
