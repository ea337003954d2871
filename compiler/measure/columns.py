"""The profile's column bundles, compiled side by side.

A profile compiles one bundle per column (compiler/measure/profile.py),
and the compiles were most of its time: LLVM's code generation and the
weight transforms of every layer, one column after the other on one core
(u2netp, 202 layers: 8 compiles, 125 of its 233 s). Here the columns are
compiled by up to one worker process per core this process may use, each
a `python -m coldbrew.compiler.measure.columns` that imports the compiler
once, runs the first passes once per model, and then takes jobs from its
stdin until it is closed (a fresh interpreter, not multiprocessing's: an
app's script that compiles at import time is never imported again).

A job is a pickled file (the model's path, target, input bindings, forced
variants and options, and which layers to describe); the worker compiles
the bundle and pickles back, per layer asked for, what the profile keeps
of the compiled Graph: name, op, variant, weight form, and the bytes whose
cold reads the profile times (raw, transformed, narrowed, stored direct).
A failed compile comes back as its message and is raised here as a
CompileError. With one core, or one job, everything runs in this process.
"""
import os
import pickle
import subprocess
import sys
import threading

from ..errors import CompileError

_FRONTS = {}  # model path -> front_end's result, per process


def records(graph, names=None, direct=False):
    """What the profile keeps of a compiled column: per layer (of `names`,
    or all) a dict of name, op, variant, weight form and, for an fp32
    column, has_transform, transform_rearranges and the bytes of its forms
    (raw, cached, narrow {precision: bytes}); for a direct column, the
    weights as stored (`stored`) where the layer's form is direct."""
    out = []
    for layer in graph.layers:
        if names is not None and layer.name not in names:
            continue
        rec = {"name": layer.name, "op": layer.op, "variant": layer.variant, "weight_form": layer.weight_form}
        if direct:
            if layer.weight_form == "direct":
                rec["stored"] = b"".join(graph.tensors[i].data.tobytes() for i in dict.fromkeys(layer.args)
                                         if graph.tensors[i].kind == "weight")
        else:
            anchor = next((graph.tensors[i].anchor for i in layer.args if graph.tensors[i].anchor is not None), None)
            rec.update(has_transform=bool(layer.transform), raw=_raw_bytes(graph, layer),
                       cached=_cached_bytes(graph, layer), narrow=_narrow_bytes(graph, layer),
                       transform_rearranges=anchor.variant.transform_rearranges if anchor else True)
        out.append(rec)
    return out


def _raw_bytes(graph, layer):
    tensors = [graph.tensors[i] for i in dict.fromkeys(list(layer.args) + list(layer.transform_args))]
    return b"".join(t.data.tobytes() for t in tensors if t.kind == "weight")


def _cached_bytes(graph, layer):
    return b"".join((t.anchor.transformed if t.kind == "prepared" else t.data).tobytes()
                    for t in (graph.tensors[i] for i in layer.args) if t.kind in ("weight", "prepared"))


def _narrow_bytes(graph, layer):
    """{precision: stored bytes} of a variant layer's weights narrowed
    (compiler/passes/plan_weights.py: the anchor's raw weights fp16, or int8 +
    scales; the layer's other weights stay fp32); {} for other layers."""
    from ..ir.forms import NARROW
    from ..ir.narrow import narrow_weights
    from ..kernels.build import output_axis

    ids = list(dict.fromkeys(list(layer.args) + list(layer.transform_args)))
    anchor = next((graph.tensors[i].anchor for i in ids if graph.tensors[i].anchor is not None), None)
    if anchor is None:
        return {}
    raw = layer.transform_args[0] if layer.transform else next(i for i in ids if graph.tensors[i].anchor is anchor)
    rest = b"".join(graph.tensors[i].data.tobytes() for i in ids if graph.tensors[i].kind == "weight" and i != raw)
    return {p: b"".join(a.tobytes() for a in narrow_weights(graph.tensors[raw].data, p, output_axis(anchor.spec))[0])
            + rest for p in NARROW}


def _front_key(job):
    return job["model"], repr(job["input_shapes"]), repr(sorted((job["constants"] or {}).keys()))


def _run(job):
    """Compile one job (a dict: model path, bundle path, target, input
    shapes, constants, tuning, compile options, `names`, `direct`): its
    records, or raises."""
    from ..options import Options
    from ..pipeline import compile_graph, front_end

    key = _front_key(job)
    front = _FRONTS.get(key)
    if front is None:
        options = Options(target=job["target"], input_shapes=job["input_shapes"], constants=job["constants"])
        front = _FRONTS[key] = front_end(job["model"], options)
    graph = compile_graph(job["model"], job["bundle"], front, tuning=job["tuning"], **job["options"])[1]
    return records(graph, job["names"], job["direct"])


def compile_all(jobs, step, workers=None, front=None):
    """[records per job], compiled by `workers` processes (default: one per
    core this process may use, at most one per job); step(what) reports
    each compile as it starts. `front`: the first passes' result for the
    jobs' model, used where the compiles run in this process."""
    workers = min(workers or len(os.sched_getaffinity(0)), len(jobs))
    if workers <= 1:
        keys = {_front_key(j) for j in jobs}
        if front is not None and len(keys) == 1:
            _FRONTS[next(iter(keys))] = front
        try:
            out = []
            for job in jobs:
                step(job["what"])
                out.append(_run(job))
            return out
        finally:  # this process lives on: its fronts go with the jobs
            for key in keys:
                _FRONTS.pop(key, None)
    results, lock, pending = [None] * len(jobs), threading.Lock(), list(range(len(jobs)))
    errors = []

    def serve(w):
        err = open(os.path.join(os.path.dirname(jobs[0]["bundle"]), f"compile_worker{w}.err"), "w+")
        proc = subprocess.Popen([sys.executable, "-m", "coldbrew.compiler.measure.columns"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            while True:
                with lock:
                    if not pending or errors:
                        break
                    k = pending.pop(0)
                    step(jobs[k]["what"])
                path = f"{jobs[k]['bundle']}.job"
                with open(path, "wb") as f:
                    pickle.dump(jobs[k], f)
                proc.stdin.write(path + "\n")
                proc.stdin.flush()
                if not proc.stdout.readline():
                    err.seek(0)
                    raise RuntimeError(f"column compile worker failed: {err.read().strip()[-2000:]}")
                with open(path + ".out", "rb") as f:
                    ok, value = pickle.load(f)
                os.remove(path)
                os.remove(path + ".out")
                if not ok:
                    raise CompileError(value)
                results[k] = value
        except Exception as e:
            with lock:
                errors.append(e)
        finally:
            proc.stdin.close()
            proc.wait()
            proc.stdout.close()
            err.close()

    threads = [threading.Thread(target=serve, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _serve():
    """The worker: a job file's path per stdin line; its result pickled
    next to it (`.out`: (True, records) or (False, message)), then a line
    on the standard output as it was (what the compile itself prints goes
    to the standard error)."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        path = line.strip()
        with open(path, "rb") as f:
            job = pickle.load(f)
        try:
            result = (True, _run(job))
        except Exception as e:  # the parent raises it as a CompileError, with this message
            msg = str(e).strip().splitlines()
            result = (False, f"{type(e).__name__}: {msg[-1] if msg else ''}")
        with open(path + ".out", "wb") as f:
            pickle.dump(result, f)
        print("done", file=reply, flush=True)


if __name__ == "__main__":
    _serve()
