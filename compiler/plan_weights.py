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
