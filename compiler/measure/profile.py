"""`coldbrew profile`: measure the device cost table of a model on a target.

For every layer x candidate kernel variant the table holds the weight bytes
raw and transformed, the cold read time of each form (file evicted from the
page cache), the transform time and the execute time per core class, with 1
thread and with the plan's execution thread count, as medians with min/max
over repeats. Execute times come twice: `execute_first_ms` is the first run
in a fresh process (what a cold start pays), `execute_ms` the warm median.

Everything is measured by coldbrew's own runtime, on real bundles
(compiler/measure/protocol.py, the one way coldbrew times a kernel): the
candidates are spread over a few "columns" (bundles that force, per layer,
one not yet measured variant, with raw weights so the transform kernels are
in them too), and each column runs in worker processes pinned to one core
class; every cold sample is a fresh process that evicts the bundle first.
Samples are taken in rounds (every column and core config, then the default
bundle, again and again), so that a drift of the machine during the profile
spreads over all medians rather than skewing some layers' variants.
Layers without variants (pooling, elementwise ...) are measured in the
first column, and so are the open costs (verification of the header and
code, code load, session creation). Each column is also compiled with the
direct fp16 and the direct int8 weight forms (compiler/passes/plan_weights.py:
their kernels read the narrow weights in place), sampled on every core
config in the same rounds: the direct candidates' first and warm execution
(a plan with fewer execution threads is predicted from its own thread
count's times) and their read. Only the forms a plan can use are
measured: a compile with fp32 weights asks for none (two thirds of the
compiles and samples fewer), one with fp16 weights for the direct fp16.
The columns are compiled side by side, a worker process per core
(compiler/measure/columns.py).

The kernels are compiled with the schedule parameters `compile` gives
them: a tuned compile (compiler/measure/tune.py; the host's default) measures its
tuning first and profiles the tuned kernels, so the plan is made from the
times of the code it ships.

Tables are cached (COLDBREW_CACHE, default ~/.cache/coldbrew) under a key
of model hash, input bindings, target fingerprint, threads, the tuning's
digest and coldbrew version, so profiling or compiling the same model for
the same target again does not re-measure. Targets marked `modeled`
(devices we do not have) get the host table scaled per core class and
phase (targets/), and say so.
"""
import copy
import dataclasses
import hashlib
import json
import os
import statistics
import tempfile
import time

from ..ir.forms import DIRECT_FORMS
from ..kernels import get
from .columns import compile_all
from .protocol import cache_dir, code_hash, cold_read_ms, core_classes, evict, sample

FORMAT = "coldbrew-costs"
VERSION = 7  # 2: read times of the narrow weight forms (fp16, int8); 3: the direct fp16 form; 4: check_ms_per_byte;
# 5: the direct int8 form; 6: the direct forms on every core config; 7: storage bandwidth read the runtime's way
CHECK_MS_PER_BYTE = 1.25e-7  # a table without its own measurement: 8 GB/s
REPEAT = {"cold": 5, "default": 9, "warm": 10, "reads": 5}  # "default": cold samples of the shipped plan
ROUNDS_S, ROUNDS_MIN = 40.0, 3  # cold rounds: as many as the first one's time fits in ROUNDS_S, at least 3
WARM_MS = 400  # a sample's warm runs stop here (at least protocol.WARM_MIN): u2netp's 10 took 3.5 s a sample


def stat(samples):
    samples = [float(s) for s in samples]
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def _speed(target, name):
    return next((c.relative_speed for c in target.core_classes if c.name == name), 1.0)


# ---- cold reads ----

def _read_times(regions, tmp, repeat):
    """Cold pread time (ms) of each byte string in `regions`, each in its own
    page-aligned slot of a scratch file evicted before every pass."""
    path = os.path.join(tmp, "reads.bin")
    offsets, pos = [], 0
    with open(path, "wb") as f:
        for data in regions:
            offsets.append(pos)
            f.seek(pos)
            f.write(data)
            pos = (pos + len(data) + 2 * 4096 - 1) // 4096 * 4096 + 4096  # a gap page against read-ahead
    samples = [[] for _ in regions]
    for _ in range(repeat):
        evict(path)
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for k, (off, data) in enumerate(zip(offsets, regions)):
            t = time.perf_counter()
            got = os.pread(fd, len(data), off) if data else b""
            samples[k].append((time.perf_counter() - t) * 1e3)
            assert len(got) == len(data)
        os.close(fd)
    return [stat(s) for s in samples]


def _storage(tmp):
    """Cold sequential bandwidth (MB/s: a 32 MiB file read by the protocol's
    cold_read_ms, the runtime's way) and 4 KiB latency (us)."""
    path = os.path.join(tmp, "storage.bin")
    size = 32 << 20
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    bw, lat = [], []
    for _ in range(3):
        bw.append(size / cold_read_ms(path) / 1e3)
        evict(path)
        fd = os.open(path, os.O_RDONLY)
        t = time.perf_counter()
        os.pread(fd, 4096, size // 2)
        lat.append((time.perf_counter() - t) * 1e6)
        os.close(fd)
    os.remove(path)
    return {"read_mb_s": statistics.median(bw), "latency_us": statistics.median(lat), "measured": True}


# ---- columns ----

def _groups(anchors):
    """[(anchor ids, candidate names)] per distinct layer shape: anchors of
    one spec with the same candidates, the compiler's default first."""
    groups = {}
    for a in anchors:
        names = [a.variant.name] + [v for v in a.alternatives if v != a.variant.name]
        groups.setdefault((a.spec, tuple(names)), []).append(a.id)
    return [(ids, list(names)) for (_, names), ids in groups.items()]


def _columns(groups, keep=None):
    """Per-anchor variant choices, one dict per column, that measure every
    candidate of every layer shape once: a shape's g layers take its
    candidates g at a time (the k-th column gives its j-th layer candidate
    k * g + j), so a shape repeated g times with n candidates needs
    ceil(n / g) columns; column 0 holds each shape's default. `keep(name)`
    narrows the candidates (a layer with none left keeps its default)."""
    lists = [(ids, [n for n in names if keep is None or keep(n)] or names[:1]) for ids, names in groups]
    width = max((-(-len(names) // len(ids)) for ids, names in lists), default=1)
    return [{aid: names[i] if (i := k * len(ids) + j) < len(names) else names[0]
             for ids, names in lists for j, aid in enumerate(ids)} for k in range(width)]


def _share(layers, groups):
    """Layers of one shape take each other's measurements: per candidate,
    each field a layer did not measure itself comes from the first of its
    shape's layers that did (they differ by their fused epilogues and by
    what ran before them, which the profile leaves out)."""
    for ids, _ in groups:
        own = {i: copy.deepcopy(layers[i]["candidates"]) for i in ids if i in layers}
        for i in own:
            mine = {c["variant"]: c for c in layers[i]["candidates"]}
            for j in own:
                for c in own[j] if j != i else ():
                    m = mine.get(c["variant"])
                    if m is None:
                        m = mine[c["variant"]] = {**copy.deepcopy(c), "read_ms": {}}
                        layers[i]["candidates"].append(m)
                    for k, v in c.items():
                        m.setdefault(k, copy.deepcopy(v))
                    for k, v in c.get("read_ms", {}).items():
                        m["read_ms"].setdefault(k, v)


def cache_key(model_hash, target, threads, input_shapes=None, constants=None, tuning=None, direct=tuple(DIRECT_FORMS)):
    from ..pipeline import version

    h = hashlib.sha256()
    import coldbrew

    code = code_hash([os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(coldbrew.__file__))])
    h.update(json.dumps([model_hash, target.fingerprint(), threads, version(), code, FORMAT, VERSION,
                         sorted((input_shapes or {}).items()), tuning.digest() if tuning else None,
                         sorted(direct)], default=repr).encode())  # a range's Dim by its fields
    for name in sorted(constants or {}):
        h.update(name.encode())
        h.update(bytes(memoryview(constants[name]).cast("B")))
    return h.hexdigest()[:24]


def profile(front, threads=2, progress=None, force=False, repeat=None, tuning=None, direct=None):
    """The cost table (a dict) of the model whose front end's result is
    `front` (compiler.front_end's, for a target and input bindings), on its
    target, measured or from the cache.

    `progress(done, total, what)` is called as the work advances; `repeat`
    overrides sample counts (REPEAT's keys); `tuning` (compiler/measure/tune.py) gives
    the layers' measured schedule parameters, so the table times the kernels
    a tuned compile ships (else each variant's derived parameters). `direct`
    names the narrow precisions whose direct weight forms are measured
    (None: all of them; a plan for fp32 weights uses none, and leaving
    them out takes two thirds of the columns away); a cached table that
    measured all of them serves any request."""
    tgt, shapes, constants = front.target, front.options.input_shapes, front.options.constants
    if getattr(tgt, "modeled", False):
        host = dataclasses.replace(front, options=dataclasses.replace(front.options, target="host"))
        return modeled_table(profile(host, threads, progress, force, repeat, tuning, direct), tgt)
    forms = tuple(p for p in DIRECT_FORMS if direct is None or p in direct)
    keys = [cache_key(front.model_hash, tgt, threads, shapes, constants, tuning, d)
            for d in dict.fromkeys([forms, tuple(DIRECT_FORMS)])]
    paths = [os.path.join(cache_dir(), "costs", f"{key}.json") for key in keys]
    for path in paths if not force else ():
        table = _cached(path)
        if table:
            return table
    table = _measure(front, threads, progress or (lambda *a: None), {**REPEAT, **(repeat or {})}, tuning, forms)
    path = paths[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp_path = f"{path}.{os.getpid()}.tmp"
    with open(tmp_path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(tmp_path, path)
    table["cached"] = False
    return table


def _cached(path):
    """The table cached at `path` (its "cached" set), or None."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        table = json.load(f)
    if table.get("format") != FORMAT or table.get("version") != VERSION:
        return None
    table["cached"] = True
    return table


def _measure(front, threads, progress, repeat, tuning, forms=tuple(DIRECT_FORMS)):
    from ..passes import load_onnx
    from .tune import anchors_of

    t_start = time.perf_counter()
    tgt, (proto, model_hash) = front.target, load_onnx.read_model(front.model)
    anchors = anchors_of(front)
    groups = _groups(anchors)
    defaults = {a.id: a.variant.name for a in anchors}
    columns = _columns(groups)
    # a transform that computes new values (Winograd's) has no direct form: the
    # direct columns measure the rest (dense and recurrent layers decide their own)
    direct_columns = _columns(groups, lambda name: not name.startswith("conv2d.")
                              or get(name, tgt.vector).transform_rearranges) if forms else []
    classes = core_classes(tgt)
    configs = _configs(classes, threads)
    rounds, narrow = max(1, repeat["cold"]), len(forms)
    width = len(columns) + narrow * len(direct_columns)
    step = _Steps(progress, width + 2 + rounds * (width * len(configs) + 1) + 1)

    layers = {}
    with tempfile.TemporaryDirectory(prefix="coldbrew-profile-") as tmp:
        step("storage")
        storage = _storage(tmp)
        model = os.path.join(tmp, "model.onnx")
        with open(model, "wb") as f:  # the column compiles' source, in this process or a worker
            f.write(proto.SerializeToString())
        job = {"model": model, "target": tgt, "input_shapes": front.options.input_shapes,
               "constants": front.options.constants, "tuning": tuning}
        bundles, recs, default = _compile_columns(job, columns, direct_columns, forms, threads, tmp, step, front)
        runs, default_runs, rounds = _sample_rounds(bundles, default, configs, rounds, repeat, step)
        load = {k: stat(v) for k, v in default_runs["open"].items()}
        load["bundle_bytes"] = os.path.getsize(default)
        for c, rec in enumerate(recs["fp32"]):
            _add_column(layers, rec, runs["fp32"][c], tmp, repeat["reads"], defaults)
        _share(layers, groups)  # a direct column may give a layer a candidate a sibling measured
        for p in forms:
            for rec, runs_c in zip(recs[p], runs[p]):
                _add_direct(layers, rec, runs_c, tmp, repeat["reads"], DIRECT_FORMS[p])
        _share(layers, groups)
        _add_cached(layers, {configs[-1][:2]: {"execute_first_cached": default_runs["execute_first"]}})
    progress(step.total, step.total, "done")
    return {"widen_ms_per_byte": widen_rate(), "check_ms_per_byte": check_rate(),
            "format": FORMAT, "version": VERSION, "model": proto.graph.name or "model", "model_hash": model_hash,
            "target": tgt.name, "fingerprint": tgt.fingerprint(), "modeled": False, "threads": threads,
            "classes": [{"name": n, "ids": ids, "relative_speed": _speed(tgt, n)} for n, ids in classes],
            "storage": storage, "load": load, "layers": list(layers.values()), "repeat": repeat,
            "tuned": bool(tuning), "direct_measured": list(forms), "rounds": rounds,
            "profile_s": round(time.perf_counter() - t_start, 1)}


class _Steps:
    """The profile's progress: step(what) reports the next step of `total`."""

    def __init__(self, progress, total):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, what):
        self.progress(self.done, self.total, what)
        self.done += 1


def _configs(classes, threads):
    """(core class, threads, core ids) to measure: one core of each class,
    and `threads` of them."""
    configs = []
    for name, ids in classes:
        configs.append((name, 1, ids[:1]))
        if threads > 1:
            wide = ids[:threads] if len(ids) >= threads else sorted(os.sched_getaffinity(0))[:threads]
            configs.append((name, threads, wide))
    return configs


def _compile_columns(job, columns, direct_columns, forms, threads, tmp, step, front):
    """({"fp32" | precision: [bundle path per column]}, the same of their
    layer records (compiler/measure/columns.py), the default bundle's path):
    every column with raw weights and with the direct weights of each
    narrow precision in `forms`, and the default plan as shipped (cached
    weights: its open costs and first executions), compiled side by side.
    A column's records are the layers it measures first: all of column
    0's, then the anchors whose variant no earlier column had."""
    jobs, keys = [], []
    for kind, cols in [("fp32", columns)] + [(p, direct_columns) for p in forms]:
        for c, chosen in enumerate(cols):
            new = None if c == 0 else {a for a, v in chosen.items() if all(prev[a] != v for prev in cols[:c])}
            options = {"variants": chosen, "threads": threads, "weights": "raw"}
            what = f"compile column {c + 1}/{len(cols)}"
            if kind != "fp32":
                options.update(weights="direct", precision=kind)
                what += f", direct {kind} weights"
            name = f"column{c}.brew" if kind == "fp32" else f"column{c}.direct_{kind}.brew"
            jobs.append({**job, "bundle": os.path.join(tmp, name), "options": options, "names": new,
                         "direct": kind != "fp32", "what": what})
            keys.append(kind)
    default = os.path.join(tmp, "default.brew")
    jobs.append({**job, "bundle": default, "options": {"variants": None, "threads": threads}, "names": set(),
                 "direct": False, "what": "compile the default bundle"})
    out = compile_all(jobs, step, front=front)
    bundles, recs = {"fp32": [], **{p: [] for p in forms}}, {"fp32": [], **{p: [] for p in forms}}
    for kind, j, rec in zip(keys, jobs, out):
        bundles[kind].append(j["bundle"])
        recs[kind].append(rec)
    return bundles, recs, default


def _sample_rounds(bundles, default, configs, rounds, repeat, step):
    """Cold samples (the last round with warm runs) of every bundle on
    every core config, and repeat["default"] of the default bundle on the
    last config: ({"fp32" | precision: [{(class, threads): samples} per
    column]}, the default's samples, the rounds taken). Taken in rounds
    over all of them, so each measurement's median spans the whole profile
    rather than one stretch of it (shared machines drift). Where the first
    round took long, fewer rounds (ROUNDS_S of them, at least ROUNDS_MIN)."""
    runs = {kind: [{cfg[:2]: {} for cfg in configs} for _ in paths] for kind, paths in bundles.items()}
    default_runs, default_left = {}, repeat["default"]
    n = max(len(paths) for paths in bundles.values())
    per_round = sum(len(paths) for paths in bundles.values()) * len(configs) + 1
    k, t_round = 0, time.perf_counter()
    while k < rounds:
        if k == 1 and rounds > ROUNDS_MIN:  # a slow model: fewer rounds (its samples are long enough to time)
            fewer = max(ROUNDS_MIN, min(rounds, int(ROUNDS_S / max(time.perf_counter() - t_round, 1e-3))))
            step.total -= (rounds - fewer) * per_round
            rounds = fewer
        t_round = time.perf_counter()
        warm = repeat["warm"] if k == rounds - 1 else 0
        for c in range(n):
            for kind in (kind for kind, paths in bundles.items() if c < len(paths)):
                for cls, threads, cores in configs:
                    extra = "" if kind == "fp32" else f", direct {kind}"
                    step(f"round {k + 1}/{rounds}: column {c + 1}/{len(bundles[kind])}{extra} on {cls} x{threads}")
                    sample(bundles[kind][c], cores, threads, warm, runs[kind][c][(cls, threads)], WARM_MS)
        step(f"round {k + 1}/{rounds}: default bundle")
        for _ in range(-(-default_left // (rounds - k))):  # the rest, spread over the rounds left
            sample(default, configs[-1][2], configs[-1][1], 0, default_runs)
            default_left -= 1
        k += 1
    return runs, default_runs, rounds


def _per_config(runs, key, layer):
    """{core class: {threads: stat}} of one layer's `key` samples in `runs`
    ({(class, threads): sample results})."""
    per = {}
    for (cls, n), res in runs.items():
        samples = res.get(key, {}).get(layer)
        if samples:
            per.setdefault(cls, {})[str(n)] = stat(samples)
    return per


def _add_cached(layers, cached_runs):
    """The default bundle's first executions (weights read from the bundle
    rather than just written by the transform) on each layer's default candidate."""
    for entry in layers.values():
        for c in entry["candidates"]:
            if c["default"]:
                c["execute_first_cached_ms"] = _per_config(cached_runs, "execute_first_cached", entry["name"])


def _add_column(layers, records, runs, tmp, reads, defaults):
    """Merge one column's measurements into `layers` (name -> layer entry):
    `records` its layers' (compiler/measure/columns.py), `defaults`
    {anchor id: the compiler's default variant}."""
    new = []
    for rec in records:
        entry = layers.setdefault(rec["name"], {"name": rec["name"], "op": rec["op"], "candidates": []})
        if any(c["variant"] == rec["variant"] for c in entry["candidates"]):
            continue  # measured in an earlier column
        cand = {"variant": rec["variant"], "raw_bytes": len(rec["raw"]), "transformed_bytes": len(rec["cached"]),
                "has_transform": rec["has_transform"],
                "default": defaults.get(rec["name"], rec["variant"]) == rec["variant"],
                "transform_rearranges": rec["transform_rearranges"],
                **{f"{p}_bytes": len(b) for p, b in rec["narrow"].items()}}
        for key in ("transform", "execute_first", "execute"):
            cand[f"{key}_ms"] = _per_config(runs, key, rec["name"])
        entry["candidates"].append(cand)
        new.append((cand, rec))
    regions = [r["raw"] for _, r in new] + [r["cached"] for _, r in new]
    narrow_at = {}
    for k, (_, rec) in enumerate(new):
        for p, b in rec["narrow"].items():
            narrow_at[(k, p)] = len(regions)
            regions.append(b)
    times = _read_times(regions, tmp, reads)
    for k, (cand, rec) in enumerate(new):
        cand["read_ms"] = {"raw": times[k], "cached": times[len(new) + k],
                           **{p: times[narrow_at[(k, p)]] for p in rec["narrow"]}}


def _add_direct(layers, records, runs, tmp, reads, form):
    """Merge a direct column's measurements into the candidates of the
    same variant, under `form` (graph.DIRECT_FORMS: "direct" for fp16,
    "direct_int8"): `<form>_bytes`, read_ms[form] (the narrow transformed
    weights and the layer's other weights, as the bundle stores them),
    `execute_first_<form>_ms` and `execute_<form>_ms`."""
    new = []
    for rec in records:
        if rec["weight_form"] != "direct":
            continue
        cand = next(c for c in layers[rec["name"]]["candidates"] if c["variant"] == rec["variant"])
        if f"execute_{form}_ms" in cand:
            continue  # measured in an earlier column
        cand[f"{form}_bytes"] = len(rec["stored"])
        for key in ("execute_first", "execute"):
            cand[f"{key}_{form}_ms"] = _per_config(runs, key, rec["name"])
        new.append((cand, rec["stored"]))
    times = _read_times([b for _, b in new], tmp, reads)
    for (cand, _), t in zip(new, times):
        cand["read_ms"][form] = t


def widen_rate(nbytes=16 << 20, repeat=5):
    """ms per fp32 byte written of widening fp16 weights on one thread: the
    runtime's own widening (cb_widen_f16, F16C where the CPU has it) of
    `nbytes` of output into fresh memory each time, as the first run writes
    a prepared area nothing has touched yet (its page faults count): the
    median of `repeat`."""
    import ctypes
    import mmap

    import numpy as np

    from coldbrew.runtime import testing_function

    fn = testing_function("cb_widen_f16", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64)
    n = nbytes // 4
    half = np.ones(n, np.float16)
    times = []
    for _ in range(repeat):
        area = mmap.mmap(-1, n * 4)  # fresh pages, huge where the kernel offers them (runtime.c big_alloc)
        if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
            area.madvise(mmap.MADV_HUGEPAGE)
        out = np.frombuffer(area, np.float32)
        t = time.perf_counter()
        fn(half.ctypes.data, out.ctypes.data, n)
        times.append((time.perf_counter() - t) * 1e3)
        del out
        area.close()
    return statistics.median(times) / nbytes


def check_rate(nbytes=32 << 20, repeat=5):
    """ms per byte of the CPU's part of a cold read: the runtime's weight
    checksum (cb_checksum64) over bytes just arrived in memory, on one
    thread, the median of `repeat`. The disk's part is the storage
    bandwidth; the simulator adds the two per tensor."""
    import ctypes

    import numpy as np

    from coldbrew.runtime import testing_function

    data = np.frombuffer(os.urandom(nbytes), np.uint8)
    fn = testing_function("cb_checksum64", ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(data.ctypes.data, nbytes)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times) / nbytes


def modeled_table(host, target):
    """A host table scaled to a modeled target: per core class, read,
    transform and execute times multiplied by the class's `scale`."""
    import copy

    t = copy.deepcopy(host)
    t.update({"target": target.name, "fingerprint": target.fingerprint(), "modeled": True,
              "modeled_from": host["fingerprint"],
              "classes": [{"name": c.name, "ids": list(c.ids), "relative_speed": c.relative_speed}
                          for c in target.core_classes]})
    host_cls = host["classes"][0]["name"]
    storage = getattr(target, "storage", None)
    if storage:
        t["storage"] = {"read_mb_s": storage["read_mb_s"], "latency_us": storage["latency_us"], "measured": False}
    first = target.core_classes[0].scale

    def scaled(s, f):
        return {k: (v * f if k != "n" else v) for k, v in s.items()}

    for layer in t["layers"]:
        for cand in layer["candidates"]:
            cand["read_ms"] = {form: scaled(s, first["read"]) for form, s in cand["read_ms"].items()}
            direct = [(f"{k}_{d}_ms", "execute") for d in DIRECT_FORMS.values() for k in ("execute_first", "execute")
                      if f"{k}_{d}_ms" in cand]
            for key, phase in (("transform_ms", "transform"), ("execute_first_ms", "execute"),
                               ("execute_first_cached_ms", "execute"), ("execute_ms", "execute"), *direct):
                base = cand.get(key, {}).get(host_cls, {})
                cand[key] = {c.name: {n: scaled(s, c.scale[phase]) for n, s in base.items()}
                             for c in target.core_classes}
    t["widen_ms_per_byte"] = host.get("widen_ms_per_byte", 0.0) * first["transform"]
    t["check_ms_per_byte"] = host.get("check_ms_per_byte", CHECK_MS_PER_BYTE) * first["transform"]
    cpu_bound = ("session", "run_overhead")  # the rest of opening is reading the file
    t["load"] = {k: (scaled(v, first["execute" if k in cpu_bound else "read"]) if isinstance(v, dict) else v)
                 for k, v in t["load"].items()}
    return t
