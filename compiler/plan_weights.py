"""Pass `plan_weights`: per layer, ship raw weights plus the variant's
transform kernel, or the already-transformed (cached) weights.

form: "cached" | "raw", or {"*": form, "<anchor id>": form}. A raw layer's
transformed weights become a `prepared` tensor that the runtime fills once
with the transform kernel; a cached layer reads them straight from the
bundle. Variants whose transform is the identity always read raw weights.

queues: which worker prepares (reads, checks, transforms) each layer's
weights on the first run: 0 the executing thread, right before the layer;
q >= 1 preparation worker q, ahead of execution, in plan order. An int, or
{"*": q, "<layer>": q}.
"""
from .graph import Tensor

NAME = "plan_weights"


MAX_QUEUES = 8  # the runtime's preparation workers


def run(graph, form="cached", queues=0):
    forms = form if isinstance(form, dict) else {"*": form}
    queues = queues if isinstance(queues, dict) else {"*": queues}
    for layer in graph.layers:
        q = queues.get(layer.name, queues.get("*", 0))
        if not isinstance(q, int) or not 0 <= q <= MAX_QUEUES:
            raise ValueError(f"preparation queue must be an integer 0..{MAX_QUEUES}, not {q!r}")
        layer.prep_queue = q
    for layer in graph.layers:
        weights = [i for i in layer.args if graph.tensors[i].kind == "weight" and graph.tensors[i].cached]
        for idx in weights:
            t = graph.tensors[idx]
            a = t.anchor
            want = forms.get(a.id, forms.get("*", "cached"))
            if want not in ("raw", "cached"):
                raise ValueError(f"weight form must be raw or cached, not {want!r}")
            layer.weight_form = want
            if want == "cached":
                continue
            raw = graph.add_tensor(Tensor(f"{t.name}.raw", t.dtype, tuple(a.raw.shape), "weight", a.raw))
            t.kind, t.data, t.cached = "prepared", None, False
            sym = f"cb_transform_{a.index}"
            graph.kernels[sym] = scheduled_transform(a.variant, a.transform_func)
            layer.transform, layer.transform_args = sym, [raw, idx]
    return graph


def scheduled_transform(variant, func):
    """The variant's own transform schedule, else the generic one."""
    from tvm import s_tir

    from .kernels.schedule_util import generic

    sch = s_tir.Schedule(func)
    if not variant.schedule_transform(sch):
        generic(sch, variant.isa.lanes)
    return sch.mod["main"]


# GPU bundles (compiler/kernels/gpu_conv.py): a variant with a runtime weight
# transform (Winograd's U = G g G^T) either ships U (cached) or the raw
# weights, transformed at load by the runtime on the opening CPU thread
# while worker threads make the pipelines. "auto" gives raw weights to the
# layers, in plan order, whose transforms fit under that window, and caches
# the rest (modeled figures, see below).
GPU_PIPELINE_WINDOW_S = 0.08   # modeled: a desktop driver compiles one pipeline in 80-107 ms (issue 11's facts)
GPU_TRANSFORM_S_PER_PAIR = 30e-9  # modeled: one (out, in) channel pair's 3x3 -> 4x4 transform in C, ~30 ns


def run_gpu(graph, anchors, form="auto"):
    """Weight forms of a GPU graph's variant layers; `form` "auto", "raw",
    "cached", or {"*": ..., "<anchor id>": ...}."""
    from .kernels import gpu_conv

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
