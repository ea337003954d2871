"""Pass `plan_memory`: give every non-weight tensor an arena offset.

Lifetimes are step intervals (inputs live through the whole run, so a
caller may set them once and run again; outputs live to the end); tensors are placed largest first at the lowest 64-byte-aligned offset
that does not overlap any placed tensor whose lifetime intersects. GPU
graphs align to 256 bytes, the largest storage-buffer offset alignment a
Vulkan device may ask for (each tensor is bound at its offset).
A tensor that aliases part of another (compiler/passes/elide_copies.py) takes no
place of its own: its root's region lives from the first step that touches
any of its parts to the last, and the part lies at its byte offset in it.

With sizes set at run time the plan holds every tensor at its largest
size over the declared ranges. A plan made for smaller sizes holds for
every size at or below them, so a second one is made at the typical sizes
(`size_classes`: each tensor at its largest there, the inputs and outputs
where the first plan put them, since a caller sets an input before the
next input's shape is known): the runtime takes it for a run whose sizes
are all at or below the typical ones, and a small size's tensors lie on
as few pages as a bundle compiled for it would use (each page a fault the
first time a fresh process touches it).
"""
import dataclasses

from ..ir import dims, loops
from ..ir.graph import resolve

NAME = "plan_memory"
ALIGN = 64
GPU_ALIGN = 256


def apply(graph, align=ALIGN):
    first, last = _lifetimes(graph)
    sizes = {i: graph.tensors[i].nbytes for i in first}
    offsets, graph.arena_size = _place(sizes, first, last, {}, align)
    for i, offset in offsets.items():
        graph.tensors[i].arena_offset = offset
    for i in graph.aliases:
        r, offset = resolve(graph, i)
        graph.tensors[i].arena_offset = graph.tensors[r].arena_offset + offset
    graph.size_classes = [c for c in [_typical_class(graph, first, last, align)] if c]
    # prepared weights live as long as the session: one slot each
    pos = 0
    for t in graph.tensors:
        if t.kind == "prepared":
            t.arena_offset = pos
            pos += _align(max(t.nbytes, 1), align)
    graph.prepared_size = pos
    return graph


def _align(n, align):
    return (n + align - 1) // align * align


def _lifetimes(graph):
    """({root tensor: first step}, {root tensor: last step}) of every
    tensor the arena holds (aliases by their roots)."""
    n = len(graph.layers)
    first, last = {}, {}

    def root(i):
        return resolve(graph, i)[0]

    for i in graph.inputs:
        first[root(i)] = -1
    for step, layer in enumerate(graph.layers):
        for a in layer.args:
            if graph.tensors[a].kind in ("weight", "prepared", "dim"):
                continue
            first.setdefault(root(a), step)
            last[root(a)] = step
    for i in graph.outputs + graph.inputs:
        last[root(i)] = n
    loops.lifetimes(graph, first, last)  # a loop's body runs again: what it reads lives on
    return first, last


def _place(sizes, first, last, pinned, align):
    """({tensor: offset}, arena bytes): the `pinned` ones ({tensor: offset})
    where they are, the others largest first at the lowest offset free
    through their lifetime."""
    placed = [(o, _align(max(sizes[i], 1), align), first[i], last[i]) for i, o in pinned.items()]
    offsets, arena = dict(pinned), max((o + s for o, s, _, _ in placed), default=0)
    for i in sorted((i for i in first if i not in pinned), key=lambda i: (-sizes[i], i)):
        size = _align(max(sizes[i], 1), align)
        busy = sorted((o, s) for o, s, f, l in placed if not (l < first[i] or last[i] < f))
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, _align(o + s, align))
        offsets[i] = offset
        placed.append((offset, size, first[i], last[i]))
        arena = max(arena, offset + size)
    return offsets, arena


def _typical_class(graph, first, last, align):
    """The plan at the typical sizes: {"dims": {dim tensor: its largest
    size}, "offsets" and "nbytes" per tensor, "arena": bytes}; None where
    no input dimension's typical size is below its largest."""
    held = {t.dim: i for i, t in enumerate(graph.tensors) if t.kind == "dim" and not t.dim.counted}
    if not any(d.typical and d.typical < d.max for d in held):
        return None
    capped = {dataclasses.replace(d, max=d.typical or d.max) if d in held else d: v
              for d, v in graph.variables.items()}
    nbytes = [_largest_bytes(t, capped) for t in graph.tensors]
    io = {resolve(graph, i)[0] for i in graph.inputs + graph.outputs}
    offsets, arena = _place({i: nbytes[i] for i in first}, first, last,
                            {i: graph.tensors[i].arena_offset for i in io}, align)
    out = [offsets.get(i, 0) for i in range(len(graph.tensors))]
    for i in graph.aliases:
        r, offset = resolve(graph, i)
        out[i] = offsets[r] + offset
    return {"dims": {i: d.typical or d.max for d, i in held.items()}, "offsets": out, "nbytes": nbytes,
            "arena": arena}


def _largest_bytes(t, capped):
    """Tensor t's bytes at its largest over the `capped` ranges."""
    if t.extents is None or t.kind == "dim":
        return t.nbytes
    return dataclasses.replace(t, shape=dims.largest(t.extents, capped)).nbytes


def run(c):
    c.graph = apply(c.graph, GPU_ALIGN if c.on_gpu else ALIGN)
    return c
