"""Per-target tuning: each conv / dense layer shape's kernel variant and
schedule parameters, chosen by measurement on the machine compiling.

The search, per distinct layer shape of a model: every applicable variant at
its default parameters (the target's register/cache model's pick), then the
rest of the parameter spaces of the two fastest. Candidates are timed the one way
coldbrew times a kernel (compiler/measure/protocol.py): the model's distinct shapes
become a model of independent layers, compiled once per candidate column,
and run warm by coldbrew's runtime in a process pinned to the plan's cores;
each layer's execute time comes from the runtime's trace.

Results are cached per target fingerprint and kernel code
($COLDBREW_CACHE/tune/<key>.json, one entry per layer shape), so the same
shapes (in this model or another) are measured once. Only the machine
compiling can be measured: for any other target `tune` returns None and
every layer keeps the model's pick, which the bundle labels "derived".
"""
import hashlib
import json
import os
import statistics
import tempfile

import numpy as np

from ..kernels import ConvSpec, DenseSpec, RecurrentSpec, applicable, get
from ..errors import CompileError
from .protocol import cache_dir, code_hash, core_classes, sample

WARM_RUNS = 10
FINALISTS = 2  # variants whose whole parameter space is measured


class Tuning:
    """Measured choices per layer shape: {key: {"best": variant, "params":
    {variant: params}, "execute_ms": {variant: ms}, "transform_ms": {variant: ms}}}."""

    def __init__(self, entries):
        self.entries = entries

    def digest(self):
        """What the measured choices are, in a few hex digits: a cost table
        measured with them is cached under it (compiler/measure/profile.py)."""
        return hashlib.sha256(json.dumps(self.entries, sort_keys=True).encode()).hexdigest()[:16]

    def best(self, spec):
        e = self.entries.get(spec_key(spec))
        return e["best"] if e else None

    def params(self, spec, variant):
        e = self.entries.get(spec_key(spec))
        return e["params"].get(variant) if e else None


def spec_key(spec):
    return repr(spec)


def anchors_of(front):
    """The anchors (conv / dense layers with their specs) of the front
    end's result, with the variants made for its target: the pipeline's
    passes up to select_variants (pipeline.variant_anchors)."""
    from ..pipeline import variant_anchors

    return variant_anchors(front)


def layers_model(specs, weights=None):
    """An ONNX model running each spec (ConvSpec or DenseSpec) as an
    independent layer on its own input x<k> (output y<k>), with the given
    weights (raw, ONNX layout) or seeded ones."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for k, spec in enumerate(specs):
        x, w, y = f"x{k}", f"w{k}", f"y{k}"
        data = weights[k] if weights else _seeded(spec, rng)
        if isinstance(spec, DenseSpec) and spec.in_scale:
            x, w = _quantized_dense(spec, x, w, data, nodes, inits)
        elif not isinstance(spec, RecurrentSpec):
            inits.append(numpy_helper.from_array(data, w))
        if isinstance(spec, RecurrentSpec):
            xs, ys = _cell_node(spec, x, y, data, nodes, inits)
        elif isinstance(spec, ConvSpec):
            nodes.append(helper.make_node("Conv", [x, w], [y], strides=list(spec.stride), pads=list(spec.pad),
                                          dilations=list(spec.dilation), group=spec.groups))
            xs, ys = [spec.n, spec.c, spec.h, spec.w], [spec.n, spec.k, spec.out_h, spec.out_w]
        else:
            nodes.append(helper.make_node("MatMul", [x, w], [y]))
            xs, ys = list(spec.input_shape), list(spec.output_shape)
        x = f"x{k}"
        inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, xs))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, ys))
    g = helper.make_graph(nodes, "coldbrew_layers", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m


def _seeded(spec, rng):
    """Weights for a spec: normal, or the int8 integers (bias column 0) a
    quantized cell's int8_weights stand for."""
    if isinstance(spec, RecurrentSpec) and spec.quantize_h:
        raw = rng.integers(-127, 128, spec.weight_shape).astype(np.float32)
        raw[..., -1] = 0
        return raw
    return (rng.standard_normal(spec.weight_shape) * 0.1).astype(np.float32)


def _quantized_dense(spec, x, w, data, nodes, inits):
    """A dense spec on a quantized grid as a QDQ model writes it: x through
    QuantizeLinear and DequantizeLinear (in_scale, uint8 zero point
    in_shift), int8 weights per column dequantized; (its input, weights)."""
    from onnx import TensorProto, helper, numpy_helper

    scale = np.maximum(np.abs(data).max(axis=0), 1e-12) / 127
    q = np.clip(np.rint(data / scale), -127, 127).astype(np.int8)
    inits += [numpy_helper.from_array(np.array(spec.in_scale, np.float32), f"{x}_s"),
              helper.make_tensor(f"{x}_z", TensorProto.UINT8, [], [spec.in_shift]),
              numpy_helper.from_array(q, f"{w}_q"), numpy_helper.from_array(scale.astype(np.float32), f"{w}_s")]
    nodes += [helper.make_node("QuantizeLinear", [x, f"{x}_s", f"{x}_z"], [f"{x}_q"]),
              helper.make_node("DequantizeLinear", [f"{x}_q", f"{x}_s", f"{x}_z"], [f"{x}_dq"]),
              helper.make_node("DequantizeLinear", [f"{w}_q", f"{w}_s"], [w], axis=1)]
    return f"{x}_dq", w


def _cell_node(spec, x, y, raw, nodes, inits):
    """The ONNX cell (LSTM, GRU, RNN) of a RecurrentSpec whose recurrence
    has the raw weights `raw` (R with its bias column), on an input of one
    feature (the projection a cell's layer leaves to a dense layer is as
    small as it gets); (input shape, output shape)."""
    from onnx import helper, numpy_helper

    h, n = spec.hidden, spec.gates * spec.hidden
    if spec.quantize_h:
        return _quantized_cell_node(spec, x, y, raw, nodes, inits)
    w = np.full((spec.dirs, n, 1), 0.5, np.float32)
    bias = np.concatenate([np.zeros((spec.dirs, n), np.float32), raw[:, :, h]], axis=1)
    names = [f"{x}_{t}" for t in "WRB"]
    for name, value in zip(names, (w, np.ascontiguousarray(raw[:, :, :h]), bias)):
        inits.append(numpy_helper.from_array(value, name))
    attrs = {"hidden_size": h, "direction": "bidirectional" if spec.dirs == 2 else
             "reverse" if spec.reverse else "forward"}
    if spec.kind == "gru":
        attrs["linear_before_reset"] = spec.linear_before_reset
    if spec.kind == "rnn":
        attrs["activations"] = [spec.activation] * spec.dirs
    nodes.append(helper.make_node(spec.kind.upper(), [x] + names, [y], **attrs))
    return [spec.seq, spec.batch, 1], list(spec.output_shape)


def _quantized_cell_node(spec, x, y, raw, nodes, inits):
    """onnxruntime's DynamicQuantizeLSTM whose recurrent weights are the
    integers `raw` holds (R with a zero bias column); as _cell_node."""
    from onnx import helper, numpy_helper

    h, dirs = spec.hidden, spec.dirs
    values = {"W": np.ones((dirs, 1, 4 * h), np.int8), "R": raw[:, :, :h].transpose(0, 2, 1).astype(np.int8),
              "B": np.zeros((dirs, 8 * h), np.float32), "ws": np.full(dirs, 0.01, np.float32),
              "wz": np.zeros(dirs, np.int8), "rs": np.full(dirs, 0.01, np.float32), "rz": np.zeros(dirs, np.int8)}
    for name, value in values.items():
        inits.append(numpy_helper.from_array(value, f"{x}_{name}"))
    ins = [x] + [f"{x}_{t}" for t in "WRB"] + ["", "", "", ""] + [f"{x}_{t}" for t in ("ws", "wz", "rs", "rz")]
    direction = "bidirectional" if dirs == 2 else "reverse" if spec.reverse else "forward"
    nodes.append(helper.make_node("DynamicQuantizeLSTM", ins, [y], domain="com.microsoft", direction=direction,
                                  hidden_size=h))
    return [spec.seq, spec.batch, 1], list(spec.output_shape)


def cache_path(target):
    import coldbrew


    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    key = f"{target.fingerprint()}-{code_hash([kernels, os.path.dirname(os.path.abspath(coldbrew.__file__))])}"
    return os.path.join(cache_dir(), "tune", f"{key}.json")


def tune(front, threads=2, progress=None, force=False):
    """The Tuning of the layer shapes of `front` (compiler.front_end's
    result) on its target (their entries only), measured or from the
    cache; None when the target is not the machine compiling."""
    tgt = front.target
    if tgt.name != "host":
        return None
    progress = progress or (lambda *a: None)
    path = cache_path(tgt)
    entries = {}
    if os.path.exists(path) and not force:
        with open(path) as f:
            entries = json.load(f)
    anchors = anchors_of(front)
    mine = {spec_key(a.spec): a.spec for a in anchors}
    todo = [spec for key, spec in mine.items() if key not in entries]
    if todo:
        entries.update(measure_shapes(todo, tgt, threads, progress))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return Tuning({key: entries[key] for key in mine})


def measure_shapes(specs, target, threads, progress):
    """Search every spec's variants and parameters; {key: entry}."""
    from ..options import Options
    from ..pipeline import compile_graph, front_end

    isa = target.vector
    model = layers_model(specs)
    front = front_end(model, Options(target=target))
    anchors = anchors_of(front)
    cores = core_classes(target)[0][1][:threads]
    found = {a.id: {"execute_ms": {}, "transform_ms": {}, "params": {}} for a in anchors}

    def run_columns(columns, stage):
        with tempfile.TemporaryDirectory(prefix="coldbrew-tune-") as tmp:
            todo = list(columns)
            for c, choice in enumerate(todo):
                progress(c, len(todo), f"tune {stage}: column {c + 1}/{len(todo)}")
                bundle = os.path.join(tmp, f"column{c}.brew")
                try:
                    compile_graph(model, bundle, front, variants=choice, weights="raw", threads=threads)
                except CompileError:  # a candidate TVM cannot generate code for is none: the rest, one at a time
                    todo += [{aid: cand} for aid, cand in choice.items()] if len(choice) > 1 else []
                    continue
                runs = sample(bundle, cores, threads, warm=WARM_RUNS)
                for aid, (name, params) in choice.items():
                    f, key = found[aid], json.dumps([name, params], sort_keys=True)
                    if key in f["execute_ms"]:
                        continue  # this anchor has fewer candidates than the column count
                    f["execute_ms"][key] = statistics.median(runs["execute"][aid])
                    f["transform_ms"][key] = sum(runs.get("transform", {}).get(aid, [0.0]))

    def columns_of(lists):
        width = max(len(v) for v in lists.values())
        return [{aid: c[min(k, len(c) - 1)] for aid, c in lists.items()} for k in range(width)]

    # stage 1: every variant at its default parameters
    lists = {a.id: [(v.name, v.space(a.spec)[0]) for v in applicable(a.spec, a.variant.op, isa)] for a in anchors}
    run_columns(columns_of(lists), "variants")
    # stage 2: the rest of the spaces of the FINALISTS fastest variants
    lists = {}
    for a in anchors:
        fastest = [json.loads(key)[0] for key, _ in sorted(found[a.id]["execute_ms"].items(), key=lambda kv: kv[1])]
        rest = [(name, p) for name in fastest[:FINALISTS] for p in get(name, isa).space(a.spec)[1:]]
        if rest:
            lists[a.id] = rest
    if lists:
        run_columns(columns_of(lists), "parameters")
    out = {}
    for a in anchors:
        f = found[a.id]
        ranked = sorted(f["execute_ms"].items(), key=lambda kv: kv[1])
        if not ranked:
            continue  # no candidate compiled: the layer keeps the model's pick
        best_per_variant = {}
        for key, _ in ranked:
            name, params = json.loads(key)
            best_per_variant.setdefault(name, params)
        out[spec_key(a.spec)] = {"best": json.loads(ranked[0][0])[0], "params": best_per_variant,
                                 "execute_ms": dict(ranked), "transform_ms": f["transform_ms"]}
    return out
