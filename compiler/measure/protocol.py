"""Timing kernels: the one way coldbrew measures a kernel.

A kernel is timed where it will run: inside a bundle, by coldbrew's own
runtime and thread pool, in a fresh process pinned to chosen cores, from the
runtime's trace (per plan step: read, transform, execute, with the open
phases). The profiler (compiler/measure/profile.py) takes its cold samples and warm
runs this way, and the tuner (compiler/measure/tune.py) its search.

    populate_read(path)   read a file the runtime's way (the profile's
        storage bandwidth and the peer benchmark's floor time it)
    sample(bundle, cores, threads, warm)   one fresh process: evict the bundle,
        open it, run once (the cold run), then `warm` more runs; returns
        {"open": {phase: ms}, "read" | "transform" | "execute_first" |
        "execute": {layer: [ms, ...]}}

The worker side imports only the runtime (no TVM): what it measures is what
an app pays.
"""
import json
import os
import subprocess
import sys
import time

STREAM_CHUNK = 2 << 20  # the runtime's read and check stripes (CB_STREAM_CHUNK)


def cache_dir():
    """Where measurements are cached: $COLDBREW_CACHE, else ~/.cache/coldbrew."""
    return os.environ.get("COLDBREW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coldbrew")


def core_classes(target):
    """[(class name, core ids)] fastest first, limited to cores this process may use."""
    usable = os.sched_getaffinity(0)
    classes = [(c.name, [i for i in c.ids if i in usable]) for c in target.core_classes]
    classes = [(n, ids) for n, ids in classes if ids]
    return classes or [("core", sorted(usable))]


def evict(path):
    """Drop a file from the page cache so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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


def flush_cpu_caches(nbytes=96 << 20):
    """Write and read a buffer larger than the last-level cache, so a cold
    sample does not find the previous process's data still cached."""
    import numpy as np

    buf = np.empty(nbytes // 4, np.float32)
    buf.fill(1.0)
    return float(buf[::1024].sum())


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
    """Evict the bundle, open it, run it once (the cold run: open phases,
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

    flush_cpu_caches()
    evict(args["bundle"])
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
    for k in range(args["warm"] + (1 if args["warm"] else 0)):
        sess.run(None, x)
        if k:  # the second run still settles caches
            collect(sess.trace(), "execute")
    return out


def sample(bundle, cores, threads, warm=0, into=None):
    """One cold sample in a fresh process pinned to `cores` (then `warm`
    runs), merged into `into` (lists of samples per phase and layer)."""
    into = {} if into is None else into
    args = {"bundle": bundle, "cores": list(cores), "threads": threads, "warm": warm}
    proc = subprocess.run([sys.executable, "-m", "coldbrew.compiler.measure.protocol", json.dumps(args)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement worker failed: {proc.stderr.strip()[-2000:]}")
    for key, per in json.loads(proc.stdout).items():
        for name, v in per.items():
            into.setdefault(key, {}).setdefault(name, []).extend(v if isinstance(v, list) else [v])
    return into


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
