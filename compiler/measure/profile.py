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
import hashlib
import json
import os
import statistics
import tempfile
import time

from ..ir.forms import DIRECT_FORMS, NARROW
from ..kernels import get
from .protocol import cache_dir, code_hash, cold_read_ms, core_classes, evict, sample

FORMAT = "coldbrew-costs"
VERSION = 7  # 2: read times of the narrow weight forms (fp16, int8); 3: the direct fp16 form; 4: check_ms_per_byte;
# 5: the direct int8 form; 6: the direct forms on every core config; 7: storage bandwidth read the runtime's way
CHECK_MS_PER_BYTE = 1.25e-7  # a table without its own measurement: 8 GB/s
REPEAT = {"cold": 5, "default": 9, "warm": 10, "reads": 5}  # "default": cold samples of the shipped plan


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


def _layer_bytes(graph, layer):
    """(raw bytes, transformed bytes, raw regions, transformed regions) of a layer's weights."""
    tensors = [graph.tensors[i] for i in dict.fromkeys(list(layer.args) + list(layer.transform_args))]
    raw_b = b"".join(t.data.tobytes() for t in tensors if t.kind == "weight")
    cached_b = b"".join((t.anchor.transformed if t.kind == "prepared" else t.data).tobytes()
                        for t in (graph.tensors[i] for i in layer.args) if t.kind in ("weight", "prepared"))
    return len(raw_b), len(cached_b), raw_b, cached_b


def _narrow_bytes(graph, layer):
    """{precision: stored bytes} of a variant layer's weights narrowed
    (compiler/passes/plan_weights.py: the anchor's raw weights fp16, or int8 +
    scales; the layer's other weights stay fp32); {} for other layers."""
    from ..kernels.build import output_axis
    from ..ir.narrow import narrow_weights

    ids = list(dict.fromkeys(list(layer.args) + list(layer.transform_args)))
    anchor = next((graph.tensors[i].anchor for i in ids if graph.tensors[i].anchor is not None), None)
    if anchor is None:
        return {}
    raw = layer.transform_args[0] if layer.transform else next(i for i in ids if graph.tensors[i].anchor is anchor)
    rest = b"".join(graph.tensors[i].data.tobytes() for i in ids if graph.tensors[i].kind == "weight" and i != raw)
    return {p: b"".join(a.tobytes() for a in narrow_weights(graph.tensors[raw].data, p, output_axis(anchor.spec))[0])
            + rest for p in NARROW}


def cache_key(model_hash, target, threads, input_shapes=None, constants=None, tuning=None, direct=tuple(DIRECT_FORMS)):
    from ..pipeline import version

    h = hashlib.sha256()
    import coldbrew

    code = code_hash([os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(coldbrew.__file__))])
    h.update(json.dumps([model_hash, target.fingerprint(), threads, version(), code, FORMAT, VERSION,
                         sorted((input_shapes or {}).items()), tuning.digest() if tuning else None,
                         sorted(direct)]).encode())
    for name in sorted(constants or {}):
        h.update(name.encode())
        h.update(bytes(memoryview(constants[name]).cast("B")))
    return h.hexdigest()[:24]


def profile(model, target="host", threads=2, input_shapes=None, constants=None, progress=None, force=False,
            repeat=None, tuning=None, front=None, direct=None):
    """The cost table (a dict) of `model` on `target`, measured or from the cache.

    `progress(done, total, what)` is called as the work advances; `repeat`
    overrides sample counts (REPEAT's keys); `tuning` (compiler/measure/tune.py) gives
    the layers' measured schedule parameters, so the table times the kernels
    a tuned compile ships (else each variant's derived parameters); `front`
    (compiler.front_end's result for this model and these inputs, e.g. the
    one the tuner used) spares the measurement the first passes. `direct`
    names the narrow precisions whose direct weight forms are measured
    (None: all of them; a plan for fp32 weights uses none, and leaving
    them out takes two thirds of the columns away); a cached table that
    measured all of them serves any request."""
    from coldbrew.targets import resolve

    from ..passes import load_onnx

    tgt = resolve(target) if isinstance(target, str) else target
    proto, model_hash = load_onnx.read_model(model)
    if getattr(tgt, "modeled", False):
        host = profile(proto, "host", threads, input_shapes, constants, progress, force, repeat, tuning, front, direct)
        return modeled_table(host, tgt)
    forms = tuple(p for p in DIRECT_FORMS if direct is None or p in direct)
    keys = [cache_key(model_hash, tgt, threads, input_shapes, constants, tuning, d)
            for d in dict.fromkeys([forms, tuple(DIRECT_FORMS)])]
    paths = [os.path.join(cache_dir(), "costs", f"{key}.json") for key in keys]
    for path in paths if not force else ():
        table = _cached(path)
        if table:
            return table
    table = _measure(proto, model_hash, tgt, threads, input_shapes, constants, progress or (lambda *a: None),
                     {**REPEAT, **(repeat or {})}, tuning, front, forms)
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


def _measure(proto, model_hash, tgt, threads, input_shapes, constants, progress, repeat, tuning, front=None,
             forms=tuple(DIRECT_FORMS)):
    from ..pipeline import compile_graph, front_end
    from .tune import anchors_of

    t_start = time.perf_counter()
    front = front or front_end(proto, input_shapes, constants)  # shared by every column's compile
    anchors = anchors_of(proto, tgt, front=front)
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

    def compile_column(path, c, **options):
        chosen = None if c is None else direct_columns[c] if options.get("weights") == "direct" else columns[c]
        return compile_graph(proto, path, tgt, input_shapes, constants, variants=chosen, threads=threads,
                             front=front, tuning=tuning, **options)[1]

    layers = {}
    with tempfile.TemporaryDirectory(prefix="coldbrew-profile-") as tmp:
        step("storage")
        storage = _storage(tmp)
        bundles, graphs, default = _compile_columns(compile_column, len(columns), len(direct_columns), forms, tmp,
                                                    step)
        runs, default_runs = _sample_rounds(bundles, default, configs, rounds, repeat, step)
        load = {k: stat(v) for k, v in default_runs["open"].items()}
        load["bundle_bytes"] = os.path.getsize(default)
        for c, graph in enumerate(graphs["fp32"]):
            _add_column(layers, graph, runs["fp32"][c], tmp, repeat["reads"], defaults)
        _share(layers, groups)  # a direct column may give a layer a candidate a sibling measured
        for p in forms:
            for graph, runs_c in zip(graphs[p], runs[p]):
                _add_direct(layers, graph, runs_c, tmp, repeat["reads"], DIRECT_FORMS[p])
        _share(layers, groups)
        _add_cached(layers, {configs[-1][:2]: {"execute_first_cached": default_runs["execute_first"]}})
    progress(step.total, step.total, "done")
    return {"widen_ms_per_byte": widen_rate(), "check_ms_per_byte": check_rate(),
            "format": FORMAT, "version": VERSION, "model": proto.graph.name or "model", "model_hash": model_hash,
            "target": tgt.name, "fingerprint": tgt.fingerprint(), "modeled": False, "threads": threads,
            "classes": [{"name": n, "ids": ids, "relative_speed": _speed(tgt, n)} for n, ids in classes],
            "storage": storage, "load": load, "layers": list(layers.values()), "repeat": repeat,
            "tuned": bool(tuning), "direct_measured": list(forms),
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


def _compile_columns(compile_column, n, n_direct, forms, tmp, step):
    """({"fp32" | precision: [bundle path per column]}, the same of Graphs,
    the default bundle's path): every column with raw weights and with the
    direct weights of each narrow precision in `forms`, and the default
    plan as shipped (cached weights: its open costs and first executions)."""
    bundles, graphs = {"fp32": [], **{p: [] for p in forms}}, {"fp32": [], **{p: [] for p in forms}}
    for c in range(n):
        step(f"compile column {c + 1}/{n}")
        bundles["fp32"].append(os.path.join(tmp, f"column{c}.brew"))
        graphs["fp32"].append(compile_column(bundles["fp32"][-1], c, weights="raw"))
    for p in forms:
        for c in range(n_direct):
            step(f"compile column {c + 1}/{n_direct}, direct {p} weights")
            bundles[p].append(os.path.join(tmp, f"column{c}.direct_{p}.brew"))
            graphs[p].append(compile_column(bundles[p][-1], c, weights="direct", precision=p))
    step("compile the default bundle")
    default = os.path.join(tmp, "default.brew")
    compile_column(default, None)
    return bundles, graphs, default


def _sample_rounds(bundles, default, configs, rounds, repeat, step):
    """Cold samples (the last round with warm runs) of every bundle on
    every core config, and repeat["default"] of the default bundle on the
    last config: ({"fp32" | precision: [{(class, threads): samples} per
    column]}, the default's samples). Taken in rounds over all of them, so
    each measurement's median spans the whole profile rather than one
    stretch of it (shared machines drift)."""
    runs = {kind: [{cfg[:2]: {} for cfg in configs} for _ in paths] for kind, paths in bundles.items()}
    default_runs, default_left = {}, repeat["default"]
    n = max(len(paths) for paths in bundles.values())
    for k in range(rounds):
        warm = repeat["warm"] if k == rounds - 1 else 0
        for c in range(n):
            for kind in (kind for kind, paths in bundles.items() if c < len(paths)):
                for cls, threads, cores in configs:
                    extra = "" if kind == "fp32" else f", direct {kind}"
                    step(f"round {k + 1}/{rounds}: column {c + 1}/{len(bundles[kind])}{extra} on {cls} x{threads}")
                    sample(bundles[kind][c], cores, threads, warm, runs[kind][c][(cls, threads)])
        step(f"round {k + 1}/{rounds}: default bundle")
        for _ in range(-(-default_left // (rounds - k))):  # the rest, spread over the rounds left
            sample(default, configs[-1][2], configs[-1][1], 0, default_runs)
            default_left -= 1
    return runs, default_runs


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


def _add_column(layers, graph, runs, tmp, reads, defaults):
    """Merge one column's measurements into `layers` (name -> layer entry);
    `defaults`: {anchor id: the compiler's default variant}."""
    new = []
    for layer in graph.layers:
        entry = layers.setdefault(layer.name, {"name": layer.name, "op": layer.op, "candidates": []})
        if any(c["variant"] == layer.variant for c in entry["candidates"]):
            continue  # measured in an earlier column
        raw_b, cached_b, raw, cached = _layer_bytes(graph, layer)
        narrow = _narrow_bytes(graph, layer)
        anchor = next((graph.tensors[i].anchor for i in layer.args if graph.tensors[i].anchor is not None), None)
        cand = {"variant": layer.variant, "raw_bytes": raw_b, "transformed_bytes": cached_b,
                "has_transform": bool(layer.transform),
                "default": defaults.get(layer.name, layer.variant) == layer.variant,
                "transform_rearranges": anchor.variant.transform_rearranges if anchor else True,
                **{f"{p}_bytes": len(b) for p, b in narrow.items()}}
        for key in ("transform", "execute_first", "execute"):
            cand[f"{key}_ms"] = _per_config(runs, key, layer.name)
        entry["candidates"].append(cand)
        new.append((cand, raw, cached, narrow))
    regions = [r for _, r, _, _ in new] + [c for _, _, c, _ in new]
    narrow_at = {}
    for k, (_, _, _, narrow) in enumerate(new):
        for p, b in narrow.items():
            narrow_at[(k, p)] = len(regions)
            regions.append(b)
    times = _read_times(regions, tmp, reads)
    for k, (cand, _, _, narrow) in enumerate(new):
        cand["read_ms"] = {"raw": times[k], "cached": times[len(new) + k],
                           **{p: times[narrow_at[(k, p)]] for p in narrow}}


def _add_direct(layers, graph, runs, tmp, reads, form):
    """Merge a direct column's measurements into the candidates of the
    same variant, under `form` (graph.DIRECT_FORMS: "direct" for fp16,
    "direct_int8"): `<form>_bytes`, read_ms[form] (the narrow transformed
    weights and the layer's other weights, as the bundle stores them),
    `execute_first_<form>_ms` and `execute_<form>_ms`."""
    new = []
    for layer in graph.layers:
        if layer.weight_form != "direct":
            continue
        cand = next(c for c in layers[layer.name]["candidates"] if c["variant"] == layer.variant)
        if f"execute_{form}_ms" in cand:
            continue  # measured in an earlier column
        stored = b"".join(graph.tensors[i].data.tobytes() for i in dict.fromkeys(layer.args)
                          if graph.tensors[i].kind == "weight")
        cand[f"{form}_bytes"] = len(stored)
        for key in ("execute_first", "execute"):
            cand[f"{key}_{form}_ms"] = _per_config(runs, key, layer.name)
        new.append((cand, stored))
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

    from coldbrew.runtime import _lib

    fn = _lib.cb_widen_f16
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
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

    from coldbrew.runtime import _lib

    data = np.frombuffer(os.urandom(nbytes), np.uint8)
    fn = _lib.cb_checksum64
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_uint64]
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
