"""Pass `plan_memory`: give every non-weight tensor an arena offset.

Lifetimes are step intervals (inputs live through the whole run, so a
caller may set them once and run again; outputs live to the end); tensors are placed largest first at the lowest 64-byte-aligned offset
that does not overlap any placed tensor whose lifetime intersects. GPU
graphs align to 256 bytes, the largest storage-buffer offset alignment a
Vulkan device may ask for (each tensor is bound at its offset).
A tensor that aliases part of another (compiler/passes/elide_copies.py) takes no
place of its own: its root's region lives from the first step that touches
any of its parts to the last, and the part lies at its byte offset in it.
"""
from ..ir import loops
from ..ir.graph import resolve

NAME = "plan_memory"
ALIGN = 64
GPU_ALIGN = 256


def apply(graph, align=ALIGN):
    def _align(n):
        return (n + align - 1) // align * align

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
    order = sorted(first, key=lambda i: (-graph.tensors[i].nbytes, i))
    placed = []  # (offset, size, first, last)
    arena = 0
    for i in order:
        size = _align(max(graph.tensors[i].nbytes, 1))
        busy = sorted((o, s) for o, s, f, l in placed if not (l < first[i] or last[i] < f))
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, _align(o + s))
        graph.tensors[i].arena_offset = offset
        placed.append((offset, size, first[i], last[i]))
        arena = max(arena, offset + size)
    graph.arena_size = arena
    for i in graph.aliases:
        r, offset = resolve(graph, i)
        graph.tensors[i].arena_offset = graph.tensors[r].arena_offset + offset
    # prepared weights live as long as the session: one slot each
    pos = 0
    for t in graph.tensors:
        if t.kind == "prepared":
            t.arena_offset = pos
            pos += _align(max(t.nbytes, 1))
    graph.prepared_size = pos
    return graph


def run(c):
    c.graph = apply(c.graph, GPU_ALIGN if c.on_gpu else ALIGN)
    return c
