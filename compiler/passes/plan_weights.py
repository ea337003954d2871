"""Pass `plan_weights`: per layer, ship raw weights plus the variant's
transform kernel, or the already-transformed (cached) weights, and in
which precision.

form: "cached" | "raw" | "direct", or {"*": form, "<anchor id>": form}. A
raw layer's transformed weights become a `prepared` tensor that the runtime
fills once with the transform kernel; a cached layer reads them straight
from the bundle. Variants whose transform is the identity always read raw
weights. "direct" goes with a narrow precision: the transformed weights
are stored fp16 or int8 and the execute kernel reads them in place,
widening each value in registers as it loads it (select_variants makes that
kernel; int8 values are summed unscaled and each output is multiplied by
its channel's scale, an fp32 weight of the layer); nothing is prepared on
the first run and no transform code is shipped, at the price of a
conversion per weight load in every run. It applies where the variant's
transform only rearranges values (not Winograd) and, for fp16, the weights
fit fp16; elsewhere "direct" means "cached".

precision: "fp32" | "fp16" | "int8", or {"*": p, "<anchor id>": p}: the
precision a variant layer's weights are stored in (weight-only: activations
and arithmetic stay fp32), widened to fp32 once, on the first run, into the
prepared tensor the kernel reads:

    fp16, direct   the kernel's layout in fp16, read in place by the kernel
    int8, direct   the kernel's layout in int8, read in place by the kernel,
                   with one fp32 scale per output channel (max |w| / 127)
                   applied to the kernel's sums
    fp16, cached   the kernel's layout in fp16, widened by the runtime's own
                   transform (cb.widen_f16: F16C / NEON; no code in the
                   bundle). For variants whose transform only rearranges
                   values (packing; and variants without a transform); a
                   Winograd layer's fp16 weights are stored raw.
    fp16, raw      raw fp16, widened inside the variant's transform kernel
    int8           raw int8 with one fp32 scale per output channel
                   (max |w| / 127), widened (value x scale) inside the
                   variant's transform kernel, or by a widening kernel

A quantized model's int8 weights (widened by DequantizeLinear nodes with
zero point 0; fold_constants records their scales) are stored int8 again
whatever the precision asked but fp16, with the model's own scales: exact
(error 0), a quarter of the bytes. In a variant layer they feed the
variant's int8 transform; in a layer without one, the runtime's own
cb.widen_i8 (int8 x scale, one scale per tensor or per entry of one axis).

Each narrowed layer records the relative error of its stored weights (max
|w' - w| / max |w|). A layer whose weights do not fit fp16 (|w| > 65504)
stays fp32, with a note. With fp16, the weights of layers without a variant
(recurrent and attention layers run on generic kernels: each fp32 weight of
at least GENERIC_MIN values that only that layer uses) are stored fp16 as
well and widened by cb.widen_f16, which takes (fp16, prepared) pairs; a
variant layer's other weights (biases) stay fp32.

queues: which worker prepares (reads, checks, transforms) each layer's
weights on the first run: 0 the executing thread, right before the layer;
q >= 1 preparation worker q, ahead of execution, in plan order. An int, or
{"*": q, "<layer>": q}.
"""
import numpy as np

from ..errors import CompileError
from ..ir.graph import Tensor
from ..ir.forms import PRECISIONS
from ..ir.narrow import choice
from ..ir.narrow import fits_fp16, model_scale, narrow_weights, weight_error

NAME = "plan_weights"


MAX_QUEUES = 8  # the runtime's preparation workers
FORMS = ("raw", "cached", "direct")


def apply(graph, form="cached", queues=0, precision="fp32", qdq_scales=()):
    forms = form if isinstance(form, dict) else {"*": form}
    precisions = precision if isinstance(precision, dict) else {"*": precision}
    queues = queues if isinstance(queues, dict) else {"*": queues}
    for layer in graph.layers:
        q = choice(queues, layer.name, 0)
        if not isinstance(q, int) or not 0 <= q <= MAX_QUEUES:
            raise ValueError(f"preparation queue must be an integer 0..{MAX_QUEUES}, not {q!r}")
        layer.prep_queue = q
    for layer in graph.layers:
        weights = [i for i in layer.args if graph.tensors[i].kind == "weight" and graph.tensors[i].anchor is not None]
        for idx in weights:
            t = graph.tensors[idx]
            a = t.anchor
            want = choice(forms, a.id, "cached")
            if want not in FORMS:
                raise ValueError(f"weight form must be one of {', '.join(FORMS)}, not {want!r}")
            p = choice(precisions, a.id, "fp32")
            if p not in PRECISIONS:
                raise ValueError(f"weight precision must be one of {', '.join(PRECISIONS)}, not {p!r}")
            if a.direct:  # stored narrow by select_variants (which measured their error); the kernel reads them
                layer.weight_form, layer.weight_precision, layer.weight_error = "direct", a.direct, a.direct_error
                continue
            want = "cached" if want == "direct" else want
            own = model_scale(a.raw, _output_axis(a), qdq_scales) if p != "fp16" and qdq_scales else None
            if own is not None and _narrow(graph, layer, idx, "int8", want, own):
                continue  # a quantized model's int8 weights, stored int8 again with their own scales: exact
            if p != "fp32" and _narrow(graph, layer, idx, p, want):
                continue
            if not t.cached:
                continue  # identity transform: the kernel reads the raw weights
            layer.weight_form = want
            if want == "cached":
                continue
            raw = graph.add_tensor(Tensor(f"{t.name}.raw", t.dtype, tuple(a.raw.shape), "weight", a.raw))
            t.kind, t.data, t.cached = "prepared", None, False
            sym = f"cb_transform_{a.index}"
            graph.kernels[sym] = scheduled_transform(a.variant, a.transform_func)
            layer.transform, layer.transform_args = sym, [raw, idx]
    for name, ids in generic_narrowable(graph).items():
        layer = next(x for x in graph.layers if x.name == name)
        if choice(precisions, name, "fp32") == "fp16":
            _narrow_generic(graph, layer, ids)
        elif qdq_scales:
            _narrow_generic_qdq(graph, layer, ids, qdq_scales)
    return graph


GENERIC_MIN = 1024  # values: smaller constants are not worth a widening


def generic_narrowable(graph):
    """{layer name: [weight tensor ids]} that fp16 may narrow in layers
    without a variant: fp32 weights of at least GENERIC_MIN values within
    the fp16 range, used by that layer alone."""
    uses = {}
    for layer in graph.layers:
        for i in set(layer.args) | set(layer.transform_args):
            uses[i] = uses.get(i, 0) + 1
    out = {}
    for layer in graph.layers:
        if layer.transform or any(graph.tensors[i].anchor is not None for i in layer.args):
            continue
        ids = [i for i in dict.fromkeys(layer.args) if _narrowable(graph.tensors[i]) and uses[i] == 1]
        if ids:
            out[layer.name] = ids
    return out


def _narrowable(t):
    if t.kind != "weight" or t.dtype != "float32" or t.anchor is not None or t.data is None:
        return False
    return t.data.size >= GENERIC_MIN and fits_fp16(t.data)


def _widened_by_runtime(graph, idx, data):
    """Weight tensor `idx` becomes the prepared fp32 tensor that cb.widen_f16
    fills from `data` stored fp16 in its layout; the fp16 tensor's id."""
    t = graph.tensors[idx]
    half = np.asarray(data, np.float32).astype(np.float16)
    n = graph.add_tensor(Tensor(f"{t.name}.fp16", "float16", tuple(half.shape), "weight", half))
    t.kind, t.data, t.cached = "prepared", None, False
    return n


def _narrow_generic(graph, layer, ids):
    pairs, err = [], 0.0
    for idx in ids:
        raw = np.asarray(graph.tensors[idx].data, np.float32)
        err = max(err, weight_error(raw, narrow_weights(raw, "fp16", 0)[1]))
        pairs += [_widened_by_runtime(graph, idx, raw), idx]
    layer.transform, layer.transform_args = WIDEN_F16, pairs
    layer.weight_form, layer.weight_precision, layer.weight_error = "cached", "fp16", err


WIDEN_F16 = "cb.widen_f16"  # the runtime's own transforms (runtime/src/cpu/widen.c)
WIDEN_I8 = "cb.widen_i8"


def _narrow_generic_qdq(graph, layer, ids, qdq_scales):
    """A quantized model's int8 weights in a layer without a variant (a
    transformer's projections): each weight that is exactly int8 values
    times one of the model's scales, along some axis, is stored int8 with
    that scale and widened by cb.widen_i8, which takes (int8, scale,
    prepared) triples; the others stay fp32."""
    triples = []
    for idx in ids:
        t = graph.tensors[idx]
        raw = np.asarray(t.data, np.float32)
        found = next(((axis, s) for axis in range(raw.ndim)
                      if (s := model_scale(raw, axis, qdq_scales)) is not None), None)
        if found is None:
            continue
        axis, scale = found
        stored, _ = narrow_weights(raw, "int8", axis, scale)
        shape = [1] * raw.ndim
        if np.any(stored[1] != stored[1][0]):
            shape[axis] = -1
        else:  # one scale for the tensor
            stored[1] = stored[1][:1]
        q = graph.add_tensor(Tensor(f"{t.name}.int8", "int8", raw.shape, "weight", stored[0]))
        s = stored[1].reshape(shape)
        scale_id = graph.add_tensor(Tensor(f"{t.name}.scale", "float32", s.shape, "weight", s))
        t.kind, t.data, t.cached = "prepared", None, False
        triples += [q, scale_id, idx]
    if triples:
        layer.transform, layer.transform_args = WIDEN_I8, triples
        layer.weight_form, layer.weight_precision, layer.weight_error = "cached", "int8", 0.0


def _output_axis(a):
    from ..kernels.build import output_axis

    return output_axis(a.spec)


def _narrow(graph, layer, idx, precision, form, scale=None):
    """Store weight tensor `idx` of `layer` in `precision` (see the module's
    table), widened on the first run into the fp32 tensor its kernel reads;
    False when the weights do not fit (they stay fp32)."""
    from ..kernels.build import output_axis, transform_func

    t = graph.tensors[idx]
    a = t.anchor
    raw = np.asarray(a.raw, np.float32)
    if precision == "fp16" and not fits_fp16(raw):
        graph.notes.append(f"{a.id}: weights exceed the fp16 range (max |w| {float(np.max(np.abs(raw))):.3g}); kept fp32")
        return False
    stored, wide = narrow_weights(raw, precision, output_axis(a.spec), scale)
    layer.weight_precision, layer.weight_error = precision, weight_error(raw, wide)
    in_layout = precision == "fp16" and a.variant.transform_rearranges and (form == "cached" or not t.cached)
    if in_layout:  # the kernel's own layout, fp16: rearranged values round exactly as the raw ones do
        n = _widened_by_runtime(graph, idx, a.transformed if t.cached else raw)
        layer.transform, layer.transform_args, layer.weight_form = WIDEN_F16, [n, idx], "cached"
        return True
    names = [f"{t.name}.{precision}", f"{t.name}.scale"]
    ids = [graph.add_tensor(Tensor(n, str(d.dtype), tuple(d.shape), "weight", d)) for n, d in zip(names, stored)]
    t.kind, t.data, t.cached = "prepared", None, False
    sym = f"cb_transform_{a.index}"
    graph.kernels[sym] = scheduled_transform(a.variant, transform_func(a.variant, a.spec, a.params, precision))
    layer.transform, layer.transform_args, layer.weight_form = sym, [*ids, idx], "raw"
    return True


def scheduled_transform(variant, func):
    """The variant's own transform schedule, else the generic one. A narrow
    transform's widening is inlined into the variant's transform first."""
    from tvm import s_tir

    from ..kernels.build import WIDEN
    from ..kernels.generic import generic

    sch = s_tir.Schedule(func)
    try:
        sch.compute_inline(sch.get_sblock(WIDEN))  # feeds the variant's transform
    except s_tir.ScheduleError:
        pass  # none (fp32), or it is the whole transform (writes the output)
    if not variant.schedule_transform(sch):
        generic(sch, variant.isa.lanes)
    return sch.mod["main"]


# GPU bundles (compiler/gpu/conv.py): a variant with a runtime weight
# transform (Winograd's U = G g G^T) either ships U (cached) or the raw
# weights, transformed at load by the runtime on the opening CPU thread
# while worker threads make the pipelines. "auto" gives raw weights to the
# layers, in plan order, whose transforms fit under that window, and caches
# the rest (modeled figures, see below).
GPU_PIPELINE_WINDOW_S = 0.08   # modeled: a desktop driver compiles one pipeline in 80-107 ms
GPU_TRANSFORM_S_PER_PAIR = 30e-9  # modeled: one (out, in) channel pair's 3x3 -> 4x4 transform in C, ~30 ns


def apply_gpu(graph, anchors, form="auto"):
    """Weight forms of a GPU graph's variant layers; `form` "auto", "raw",
    "cached", or {"*": ..., "<anchor id>": ...}."""
    from ..gpu import conv as gpu_conv

    forms = form if isinstance(form, dict) else {"*": form}
    budget = GPU_PIPELINE_WINDOW_S
    by_id = {a.id: a for a in anchors}
    for layer in graph.layers:
        a = by_id.get(layer.name)
        if a is None:
            continue
        v = gpu_conv.get(a.variant.name)
        want = forms.get(a.id, forms.get("*", "auto")) or "auto"
        if want not in ("auto", "raw", "cached"):
            raise ValueError(f"weight form must be raw, cached or auto, not {want!r}")
        if not v.transform:
            layer.weight_form = "raw"  # read as they are: nothing to choose
            continue
        if want == "auto":
            cost = a.conv.k * a.conv.c * GPU_TRANSFORM_S_PER_PAIR
            want = "raw" if cost <= budget else "cached"
            budget -= cost if want == "raw" else 0
        w = layer.args[1]
        raw = graph.tensors[w]
        layer.weight_form = want
        if want == "cached":
            raw.data = gpu_conv.winograd_weights(raw.data)
            raw.shape, raw.cached = raw.data.shape, True
            continue
        prepared = graph.add_tensor(Tensor(f"{raw.name}.u", raw.dtype, v.transformed_shape(a.conv), "prepared"))
        layer.transform, layer.transform_args = v.transform, [w, prepared]
    return graph


def run(c):
    try:
        c.graph = (apply_gpu(c.graph, c.anchors, c.choices.weights) if c.on_gpu
                   else apply(c.graph, c.choices.weights, c.choices.queues, c.choices.precision, c.qdq_scales))
    except ValueError as e:
        raise CompileError(str(e)) from None
    return c
