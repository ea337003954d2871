"""The cold-run protocol: the one way coldbrew times a cold start, used by
the profiler that fills the cost table, the tuner, and every benchmark
that judges the plan made from it (bench/).

A cold sample, step by step:

    1. cold_process(cmd)   the whole page cache dropped (root only), then a
                           fresh process, pinned where the caller says
    2. the process imports its engine (benchmarks time this apart) and
       makes its inputs
    3. cold_start(paths)   settle_memory(): fresh memory written and freed
                           (the CPU caches cleared, the heap and page cache
                           starting on memory as a freshly started app
                           finds it); then evict(path) for each artifact
    4. the clock: load + first result

Storage is measured the same way the runtime reads a bundle:
cold_read_ms(path) brings a file in through populate_read (mapped, huge
folios asked for, 2 MB at a time) after the same steps 1 and 3;
read_rate(paths) is the storage bandwidth every figure uses.

Kernel samples (the profiler's and the tuner's): sample(bundle, cores,
threads, warm) runs steps 2-4 on a bundle in a worker that imports only the
runtime (no TVM: what it measures is what an app pays), with the runtime's
trace on, then `warm` more runs. Step 1 is left out there: it matters for
what a sample times before its cold_start (an engine's import, which the
benchmarks report apart), and the kernel samples time only what follows
(the open's phases and each layer's read, transform and execute, from the
trace), while a dropped page cache made every sample's Python start from
storage (the profile tests took several times longer); it returns {"open": {phase: ms}, "read" |
"transform" | "execute_first" | "execute": {layer: [ms, ...]}}.
"""
import json
import os
import subprocess
import sys
import time

STREAM_CHUNK = 2 << 20  # the runtime's read and check stripes (CB_STREAM_CHUNK)
WARM_MIN = 3  # warm runs a sample keeps however long they take


def cache_dir():
    """Where measurements are cached: $COLDBREW_CACHE, else ~/.cache/coldbrew."""
    return os.environ.get("COLDBREW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coldbrew")


def core_classes(target):
    """[(class name, core ids)] fastest first, limited to cores this process may use."""
    usable = os.sched_getaffinity(0)
    classes = [(c.name, [i for i in c.ids if i in usable]) for c in target.core_classes]
    classes = [(n, ids) for n, ids in classes if ids]
    return classes or [("core", sorted(usable))]


def drop_page_cache():
    """Write back and drop the whole page cache (root only): step 1, before
    a sample's process starts, so that it imports its engine from storage
    and finds memory as a freshly started app does. True when dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def can_drop_page_cache():
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def describe():
    """The words every cold figure's header carries."""
    if can_drop_page_cache():
        return ("cold protocol: page cache dropped before each sample's process, memory settled and artifact "
                "evicted after its import")
    return "page cache NOT dropped (drop_caches needs root): only the artifact evicted after the import"


def cold_process(cmd, drop=True, **kw):
    """Step 1 and the sample's fresh process: subprocess.run(cmd, **kw).
    `drop=False` keeps the page cache: for a sample that times nothing
    before its cold_start (the kernel samples, timed from the runtime's
    trace), where the drop would only slow the process's own start."""
    if drop:
        drop_page_cache()
    return subprocess.run(cmd, **kw)


SETTLE_BYTES = 1 << 30


def settle_memory(nbytes=SETTLE_BYTES):
    """Write `nbytes` of fresh memory and free it (step 3, after the
    engine's import and the inputs, before the artifact's eviction). It
    clears the CPU caches of what came before, and it gives every engine
    the same memory to start on: on a VM that hands freed memory back to
    its host, the first write to a 2 MB block handed back costs about
    4.7 ms of the writing thread's CPU instead of 0.1-0.2 ms, and how much
    of it a sample meets depends on what the samples before it freed
    (alexnet's bundle, 6 rounds interleaved with onnxruntime samples:
    median 169 ms, 95-211, without this step; 94-100 ms medians with every
    sample settling). At most a quarter of what is available;
    CB_SETTLE_MB sets the size in MiB (0: off), to compare protocols."""
    import numpy as np

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


def evict(path):
    """Drop a file from the page cache so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_start(paths):
    """Step 3: memory settled, then every artifact in `paths` evicted."""
    settle_memory()
    for path in [paths] if isinstance(paths, str) else paths:
        evict(path)


MADV_POPULATE_READ = 22  # Linux 5.14; Python's mmap module names it from 3.13 on


def populate_read(path, size=None):
    """Read `path` the way coldbrew's runtime reads a bundle: mapped, huge
    folios asked for, brought in 2 MB at a time (MADV_POPULATE_READ), no
    copy. False where the kernel cannot (before 5.14): the runtime then
    reads with MADV_WILLNEED and faults, which plain read() calls
    measure."""
    import mmap

    size = os.path.getsize(path) if size is None else size
    if not size:
        return True  # nothing to bring in (and nothing to map)
    with open(path, "rb", buffering=0) as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)
            for off in range(0, size, STREAM_CHUNK):
                m.madvise(MADV_POPULATE_READ, off, min(STREAM_CHUNK, size - off))
            return True
        except OSError:
            return False
        finally:
            m.close()


def _read_plain(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def cold_read_ms(path):
    """Milliseconds to bring `path` in from storage, cold (steps 1 and 3),
    the runtime's way (populate_read; plain read() calls where the kernel
    cannot populate a mapping)."""
    drop_page_cache()
    cold_start(path)
    t = time.perf_counter()
    if not populate_read(path):
        cold_start(path)
        t = time.perf_counter()
        _read_plain(path)
    return (time.perf_counter() - t) * 1e3


def read_rate(paths):
    """Bytes per second of a cold read of `paths` on this machine now (the
    median over the files, each read by cold_read_ms): the storage
    bandwidth of the cost table and of every benchmark's floor."""
    import statistics

    paths = [paths] if isinstance(paths, str) else paths
    return statistics.median(os.path.getsize(p) / cold_read_ms(p) * 1e3 for p in paths)


def code_hash(roots):
    """Hash of the code under `roots` (Python sources and built libraries):
    measurements taken with other kernels or another runtime are stale."""
    import hashlib

    h = hashlib.sha256()
    for root in roots:
        for dirpath, dirnames, files in os.walk(root):
            dirnames.sort()
            for name in sorted(files):
                if name.endswith((".py", ".so")):
                    with open(os.path.join(dirpath, name), "rb") as f:
                        h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def _worker(args):
    """Settle memory and evict the bundle (cold_start), open it, run it once (the cold run: open phases,
    read, transform, first execute per layer), then `warm` more runs."""
    os.sched_setaffinity(0, set(args["cores"]))
    import numpy as np

    import coldbrew

    out = {"open": {}, "read": {}, "transform": {}, "execute_first": {}, "execute": {}}

    def collect(events, execute_key):
        for e in events:
            ms = (e["end_ns"] - e["start_ns"]) / 1e6
            if e["step"] < 0:
                out["open"][e["phase"]] = ms
            else:
                key = execute_key if e["phase"] == "execute" else e["phase"]
                out[key].setdefault(e["layer"], []).append(ms)

    cold_start(args["bundle"])
    t = time.perf_counter()
    sess = coldbrew.load(args["bundle"], threads=args["threads"], trace=True)
    load_ms = (time.perf_counter() - t) * 1e3
    rng = np.random.default_rng(0)
    x = {i.name: (rng.standard_normal(i.shape) if i.dtype.kind == "f" else np.zeros(i.shape)).astype(i.dtype)
         for i in sess.get_inputs()}
    t = time.perf_counter()
    sess.run(None, x)
    run_ms = (time.perf_counter() - t) * 1e3
    events = sess.trace()
    collect(events, "execute_first")
    out["open"]["session"] = max(0.0, load_ms - out["open"]["verify"] - out["open"]["code_load"])
    # what the first run costs beyond its traced phases: binding inputs and
    # outputs, the step loop, waking the pool
    out["open"]["run_overhead"] = max(0.0, run_ms - sum((e["end_ns"] - e["start_ns"]) / 1e6
                                                         for e in events if e["step"] >= 0))
    budget, start, n = args.get("warm_ms"), time.perf_counter(), 0
    for k in range(args["warm"] + (1 if args["warm"] else 0)):
        if budget and n >= WARM_MIN and (time.perf_counter() - start) * 1e3 > budget:
            break  # a slow model's warm medians from fewer runs: each run is long enough to time
        sess.run(None, x)
        if k:  # the second run still settles caches
            collect(sess.trace(), "execute")
            n += 1
    return out


def sample(bundle, cores, threads, warm=0, into=None, warm_ms=None):
    """One cold sample in a fresh process pinned to `cores` (then `warm`
    runs, or fewer, at least WARM_MIN, once they have taken `warm_ms`),
    merged into `into` (lists of samples per phase and layer)."""
    into = {} if into is None else into
    args = {"bundle": bundle, "cores": list(cores), "threads": threads, "warm": warm, "warm_ms": warm_ms}
    proc = cold_process([sys.executable, "-m", "coldbrew.compiler.measure.protocol", json.dumps(args)], drop=False,
                        capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement worker failed: {proc.stderr.strip()[-2000:]}")
    for key, per in json.loads(proc.stdout).items():
        for name, v in per.items():
            into.setdefault(key, {}).setdefault(name, []).extend(v if isinstance(v, list) else [v])
    return into


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
