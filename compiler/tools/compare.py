"""`coldbrew compare MODEL BUNDLE`: the bundle run layer by layer against
onnxruntime on the same input, naming the first layer whose output departs
from onnxruntime's value of the same ONNX tensor.

Each layer's outputs come from the runtime's observed run
(cb_session_run_observed: every step's outputs handed over right after the step,
a GPU session's read back step by step), in this process, or through a
runner program (examples/c/run_bundle.c --dump-layers, e.g. under
qemu-user for an aarch64 bundle). The bundle records, per tensor, the ONNX
tensor it holds (Tensor.source) and its layout where blocked
(Tensor.layout); onnxruntime runs the model with those tensors as extra
outputs. A tensor the compiler made (no ONNX name) is skipped and counted.
"""
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field

import numpy as np

from . import check
from ..bundle.reader import dim_values, read, shape_now, text
from ..ir.forms import DTYPES
from ..passes.block_layout import from_blocked


class CompareError(Exception):
    pass


@dataclass
class Report:
    matched: int = 0                               # layer outputs within the tolerance
    skipped: list = field(default_factory=list)    # (tensor name, why)
    first: dict = None                             # the first departing output, or None

    def lines(self):
        out = [f"compared   {self.matched} layer outputs with onnxruntime's"
               + (f", {len(self.skipped)} skipped" if self.skipped else "")]
        out += [f"  skipped  {name}: {why}" for name, why in self.skipped]
        f = self.first
        if f is None and not self.matched:
            return out + ["result     no layer output could be compared (none holds a tensor of the model's)"]
        if f is None:
            return out + ["result     every layer compared matches"]
        return out + [
            f"result     step {f['step']}, layer {f['layer']} departs: {f['why']}",
            f"  op       {f['op']}, variant {f['variant']}",
            f"  tensor   {f['tensor']} = ONNX '{f['source']}', from {f['node']}" + (
                f" (layout {f['layout']})" if f["layout"] else "")]


def random_inputs(model, specs, seed=0):
    """Seeded inputs for [(name, shape, dtype name)] that mean something to
    the ONNX `model` (check.inputs: floats normal, ids from the model's
    vocabulary, masks with padding); an integer input of unknown meaning is
    named, to be given with --input."""
    try:
        return check.inputs(model, {name: {"shape": shape} for name, shape, _ in specs}, seed)
    except ValueError as e:
        raise CompareError(f"{e}; or give it with --input NAME=FILE.npy") from None


def compare(model, bundle, inputs=None, tolerance=1e-3, runner=None, seed=0):
    """The Report of `bundle` (a path) against `model` (a path or ModelProto)
    on `inputs` ({name: array}; the bundle's other inputs seeded random).
    `runner`: a command (list or string) that runs examples/c/run_bundle.c's
    interface, e.g. qemu-aarch64 ... run_bundle, for bundles this process
    cannot run; None: the runtime here."""
    b = read(bundle)[0]
    specs = [(text(b.tensors[i].name), [int(d) for d in b.tensors[i].shape], DTYPES[b.tensors[i].dtype])
             for i in b.inputs]
    names = [n for n, _, _ in specs]
    given = dict(inputs or {})
    seeded = random_inputs(_load(model), [x for x in specs if x[0] not in given], seed)
    feeds = {**{k: v for k, v in seeded.items() if k in names and k not in given}, **given}
    unknown = sorted(set(inputs or {}) - {n for n, _, _ in specs})
    if unknown:
        raise CompareError(f"no bundle input named {unknown[0]!r}; its inputs are {[n for n, _, _ in specs]}")
    observed = _run(bundle, feeds, [n for n, _, _ in specs], runner)
    values = dim_values(b, [list(feeds[n].shape) for n in names], {t: data for _, t, data in observed})  # this run's
    wanted = {text(b.tensors[t].source) for _, t, _ in observed} - {""}
    refs, producer = _reference(model, feeds, wanted)
    report = Report()
    for step, t, data in observed:
        desc = b.tensors[t]
        name, source = text(desc.name), text(desc.source)
        if not source or source not in refs:
            report.skipped.append((name, "made by the compiler (no ONNX tensor)" if not source else
                                   f"ONNX tensor '{source}' is not in the model's main graph"))
            continue
        why = _departure(_as_onnx(data, desc, values), refs[source], tolerance)
        if why is None:
            report.matched += 1
            continue
        s = b.plan.steps[step]
        layer = b.layers[s.layer]
        report.first = {"step": step, "layer": text(layer.name), "op": text(layer.op), "variant": text(s.variant),
                        "tensor": name, "source": source, "layout": text(desc.layout), "why": why,
                        "node": producer.get(source, "?")}
        break
    return report


def _run(bundle, feeds, names, runner):
    """[(step, tensor index, bytes)] of every executed step's outputs; the
    arena starts as NaN bytes (COLDBREW_POISON_ARENA), so a value a layer
    leaves unwritten departs."""
    arrays = [np.ascontiguousarray(feeds[n]) for n in names]
    before = os.environ.get("COLDBREW_POISON_ARENA")
    os.environ["COLDBREW_POISON_ARENA"] = "1"
    try:
        return _observed(bundle, names, arrays, runner)
    finally:  # the caller's later sessions are not poisoned
        if before is None:
            del os.environ["COLDBREW_POISON_ARENA"]
        else:
            os.environ["COLDBREW_POISON_ARENA"] = before


def _observed(bundle, names, arrays, runner):
    """_run's outputs, the environment set."""
    if runner is None:
        import coldbrew

        with coldbrew.load(bundle) as sess:
            return sess.run_layers(dict(zip(names, arrays)))
    cmd = shlex.split(runner) if isinstance(runner, str) else list(runner)
    with tempfile.TemporaryDirectory() as work:
        files = []
        for k, x in enumerate(arrays):
            files.append(os.path.join(work, f"input{k}.bin"))
            x.tofile(files[-1])
        layers = os.path.join(work, "layers")
        os.mkdir(layers)
        r = subprocess.run(cmd + ["--dump-layers", layers, bundle, os.path.join(work, "output"), *files],
                           capture_output=True, text=True)
        if r.returncode:
            raise CompareError(f"the runner exited {r.returncode}: {r.stderr.strip()}")
        out = []
        for f in os.listdir(layers):
            step, tensor = (int(x) for x in f[len("step"):-len(".bin")].split("-"))
            with open(os.path.join(layers, f), "rb") as fh:
                out.append((step, tensor, fh.read()))
        return sorted(out, key=lambda o: o[:2])


def _load(model):
    """`model` (a path or ModelProto) as a ModelProto of its own."""
    import onnx

    m = onnx.ModelProto()
    try:
        m.CopyFrom(model if isinstance(model, onnx.ModelProto) else onnx.load(model))
    except Exception as e:
        raise CompareError(f"{model}: not an ONNX model ({type(e).__name__}: {e})") from None
    return m


def _reference(model, feeds, wanted):
    """onnxruntime's value of each `wanted` tensor of the main graph, and
    each tensor's producing node ("Relu node 'relu1'")."""
    import onnx
    import onnxruntime as ort

    m = _load(model)
    producer = {o: f"{n.op_type} node '{n.name or o}'" for n in m.graph.node for o in n.output}
    have = {o.name for o in m.graph.output}
    extra = sorted(w for w in wanted if w in producer and w not in have)
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(w) for w in extra)
    graph_inputs = {i.name for i in m.graph.input} - {t.name for t in m.graph.initializer}
    try:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        values = sess.run(None, {k: v for k, v in feeds.items() if k in graph_inputs})
    except Exception as e:
        raise CompareError(f"onnxruntime cannot run the model: {str(e).strip().splitlines()[-1]}") from None
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, values)), producer


def _as_onnx(data, desc, values):
    """A layer output's bytes as the ONNX tensor's array (blocked NCHW{b}c
    back to NCHW, its padded channels dropped later by _departure); its
    shape this run's (`values`: the dims', reader.dim_values)."""
    x = np.frombuffer(data, DTYPES[desc.dtype]).reshape(shape_now(desc, values))
    return from_blocked(x) if text(desc.layout) else x


def _departure(ours, ref, tolerance):
    """Why `ours` is not onnxruntime's `ref` (None: within tolerance by
    check.one, a non-finite value allowed where both have it)."""
    ref = np.asarray(ref)
    if ours.ndim == 4 and ref.ndim == 4 and ours.shape[1] > ref.shape[1]:
        ours = ours[:, :ref.shape[1]]  # a blocked layout's padded channels
    if ours.size != ref.size:
        return f"shape {list(ours.shape)}, onnxruntime's {list(ref.shape)}"
    return check.one(ref, ours.reshape(ref.shape), tolerance, same_nonfinite=True)[1]
