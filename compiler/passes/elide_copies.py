"""Pass `elide_copies`: layers that only copy bytes become arena aliases.

A concatenation whose axis has only unit dimensions before it (channels of
a batch-1 NCHW tensor) lays its inputs end to end: input k is the byte
range of the output after inputs 0..k-1. A reshape (flatten, squeeze)
keeps its input's bytes as they are. Such a layer is dropped; each input
becomes an alias of its bytes in the output (`graph.aliases`: tensor ->
(output, byte offset)), so the layers that write the inputs write the
output in place, and plan_memory gives the output one region that lives
as long as any of its parts.

An input is aliased only when it is an intermediate of this graph (not a
model input or output, not a weight), appears once in the layer's inputs,
has the output's dtype, starts at a multiple of 64 bytes in the output (the
runtime's tensor alignment), and is not already part of another alias; one
that is not keeps the copy layer whole; so does a concatenation of parts
sized at run time (where each part starts depends on the sizes). Aliases chain: a concatenation's
output may itself be a part of a later one. CPU graphs only (a GPU binds
each tensor at an aligned offset).
"""
import re

import numpy as np

NAME = "elide_copies"
ALIGN = 64  # every arena tensor starts at a multiple of this (the runtime checks it)

# a fused layer made of one concatenation and/or reshapes, in that order
# (FuseOps names a fused function after its ops in dataflow order)
_COPY = re.compile(r"(concatenate\d*)?((?:(?:^|_)(?:reshape|squeeze|expand_dims|flatten)\d*)*)")


def _concat_axis(shapes, out_shape):
    """The axis the inputs are concatenated along, or None when it is not
    certain: the one axis their shapes differ in, else (equal shapes) the
    one the output grows along, when the output is not reshaped."""
    if any(len(s) != len(shapes[0]) for s in shapes):
        return None
    differ = [a for a in range(len(shapes[0])) if len({s[a] for s in shapes}) > 1]
    if len(differ) == 1:
        return differ[0]
    if differ or out_shape is None or len(out_shape) != len(shapes[0]):
        return None
    grown = [a for a in range(len(out_shape)) if out_shape[a] != shapes[0][a]]
    return grown[0] if len(grown) == 1 else None


def _parts(graph, layer):
    """[(input, byte offset in the output)] when `layer` only lays its
    inputs' bytes end to end (a concatenation whose axis has only unit
    dimensions before it, and/or reshapes), else None."""
    m = _COPY.fullmatch(layer.op)
    if not m or not layer.op or layer.num_outputs != 1:
        return None
    *ins, out = layer.args
    o = graph.tensors[out]
    if sum(graph.tensors[i].nbytes for i in ins) != o.nbytes:
        return None
    if m.group(1):  # a concatenation
        if any(graph.tensors[i].extents is not None for i in ins):
            return None  # sized at run time: its parts' offsets are too (a real copy)
        shapes = [graph.tensors[i].shape for i in ins]
        axis = _concat_axis(shapes, None if m.group(2) else o.shape) if len(ins) > 1 else None
        if axis is None or int(np.prod(shapes[0][:axis], dtype=np.int64)) != 1:
            return None  # unknown, or the parts interleave in the output: a real copy
    elif len(ins) != 1:
        return None
    parts, at = [], 0
    for i in ins:
        parts.append((i, at))
        at += graph.tensors[i].nbytes
    return parts


def _aliasable(graph, parts, out, aliases):
    """Every part an intermediate of the output's dtype, once, aligned, in no other alias."""
    ins = [i for i, _ in parts]
    return len(set(ins)) == len(ins) and all(
        graph.tensors[i].kind == "intermediate" and i not in aliases and offset % ALIGN == 0
        and graph.tensors[i].dtype == graph.tensors[out].dtype for i, offset in parts)


def apply(graph):
    aliases, kept = {}, []
    for layer in graph.layers:
        parts, out = _parts(graph, layer), layer.args[-1]
        if parts is None or not _aliasable(graph, parts, out, aliases):
            kept.append(layer)
            continue
        aliases.update((i, (out, offset)) for i, offset in parts)
    graph.layers = kept
    used = {layer.kernel for layer in kept} | {layer.transform for layer in kept if layer.transform}
    graph.kernels = {sym: f for sym, f in graph.kernels.items() if sym in used}
    graph.aliases = aliases
    return graph


def run(c):
    c.graph = apply(c.graph)
    return c
